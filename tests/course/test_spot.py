"""Spot: the preemption model (`labkit.hardware.spot`) and notebook 07's checkpoint interval vs
lost work vs cost (`labkit.course.preemption.spot`), which prices each interval with that model."""

from __future__ import annotations

import math

import pytest

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.course.preemption import spot
from labkit.course.tables import table
from labkit.hardware.spot import SpotModel, young_daly_interval


def model(**kw):
    base = dict(preemptions_per_hour=0.1, restart_min=5.0, checkpoint_write_s=60.0, checkpoint_on_sigterm=False)
    return SpotModel(**(base | kw))


def scenario(**kw):
    return spot.SpotScenario(work_hours=10.0, on_demand_usd_hr=10.0, spot_usd_hr=3.0, spot=model(**kw))


def test_row_arithmetic():
    r = spot.row(scenario(), 1200.0)
    assert r.checkpoint_overhead == pytest.approx(0.05)
    assert r.lost_per_preemption_s == 600.0
    busy = 10 * 1.05
    wall = busy / (1 - 0.1 * 900 / 3600)  # preemptions strike during the wall time they lengthen
    assert r.wall_hours == pytest.approx(wall)
    assert r.spot_cost == pytest.approx(wall * 3.0) and r.on_demand_cost == pytest.approx(busy * 10.0)
    assert r.expected_preemptions == pytest.approx(0.1 * wall)
    assert 0 < r.saving < 1


def test_overhead_is_the_one_model_the_estimator_uses():
    m = SpotModel(preemptions_per_hour=0.2, checkpoint_every_min=30, restart_min=6)
    lost_per_hour = 0.2 * (15 + 6) / 60
    assert m.overhead == pytest.approx(lost_per_hour / (1 - lost_per_hour))
    assert m.wall_hours(10.0) == pytest.approx(10.0 / (1 - lost_per_hour))
    assert SpotModel(preemptions_per_hour=10.0, checkpoint_every_min=60).overhead == math.inf


def test_cheapest_interval_is_near_young_daly():
    best = young_daly_interval(60.0, 0.1)
    assert best == pytest.approx(math.sqrt(2 * 60 * 36000))
    rows = spot.tradeoff(scenario(), [best / 8, best / 2, best, best * 2, best * 8])
    assert min(rows, key=lambda r: r.spot_cost).interval_s == best


def test_sigterm_checkpoint_removes_lost_work_only_when_it_fits_the_notice():
    assert model(checkpoint_on_sigterm=True, checkpoint_write_s=10).lost_per_preemption_s == 0.0
    assert model(checkpoint_on_sigterm=True, checkpoint_write_s=40, checkpoint_every_min=10).lost_per_preemption_s == 300
    assert young_daly_interval(60, 0) == math.inf
    text = table(spot.table_rows(spot.tradeoff(scenario(), [600, 1200])))
    assert "saving (%)" in text.splitlines()[0] and len(text.splitlines()) == 4


def test_bad_model_names_parameter():
    with pytest.raises(ParameterError, match="preemptions_per_hour"):
        model(preemptions_per_hour=-1)
    with pytest.raises(ParameterError, match="work_hours"):
        spot.SpotScenario(-1.0, 1.0, 1.0, model())


def test_time_checkpoint_write(tmp_path):
    checkpoint.save(str(tmp_path), 3, {"model.pt": b"x" * 1000}, {"k": 1})
    write = spot.time_checkpoint_write(str(tmp_path), min_bytes=10_000, repeats=2)
    assert len(write.seconds.values) == 2 and write.nbytes == 10_000  # topped up to min_bytes
    assert write.bandwidth == pytest.approx(10_000 / write.seconds.median)
    assert spot.time_checkpoint_write(str(tmp_path), min_bytes=500, repeats=1).nbytes == 1000
    with pytest.raises(FileNotFoundError):
        spot.time_checkpoint_write(str(tmp_path / "none"))


def test_capacity_options_compare_on_demand_spot_and_flex_start_with_sources():
    from labkit.hardware import facts

    s = spot.SpotScenario(24.0, 10.0, 4.0, model(preemptions_per_hour=0.05))
    on_demand, spot_opt, flex = spot.capacity_options(s, 1800.0, "catalog row X")
    assert [o.name for o in (on_demand, spot_opt, flex)] == ["on-demand", "Spot", "DWS flex-start"]
    busy = spot.row(s, 1800.0).on_demand_cost / 10.0  # the work and its checkpoint writes
    assert busy > 24.0 and on_demand.job_usd == (busy * 10.0,) * 2 and spot_opt.usd_per_hour == (4.0, 4.0)
    assert spot_opt.wall_hours > busy  # preemptions stretch a Spot job
    assert flex.usd_per_hour == (10.0 * (1 - facts.DWS_MAX_DISCOUNT.value), 10.0) and flex.wall_hours == busy
    assert flex.job_usd == pytest.approx((busy * 5.0, busy * 10.0))
    assert all(o.sources and all("read 2026-" in src or src == "catalog row X" for src in o.sources)
               for o in (on_demand, spot_opt, flex))
    assert any(facts.VERTEX_DWS_URL in src for src in flex.sources)
    rows = spot.capacity_rows([on_demand, spot_opt, flex])
    assert rows[2]["USD/h"] == "$5.00-10.00" and "maxWaitDuration" in rows[2]["rules"]


def test_sensitivity_shows_where_spot_and_the_sigterm_checkpoint_pay():
    rows = spot.sensitivity(scenario(checkpoint_write_s=10.0), [0.01, 0.1, 1.0, 3.0], [600, 1800, 7200])
    assert [r["preemptions/h"] for r in rows] == [0.01, 0.1, 1.0, 3.0]
    at_30 = [r["saving at 30 min (%)"] for r in rows]
    assert at_30[0] > at_30[1] > at_30[2]  # more preemptions, less saved
    assert at_30[3] is None and rows[3]["saving at 120 min (%)"] is None  # restarts outpace the work
    sigterm = [r["SIGTERM checkpoint saves $"] for r in rows[:3]]
    assert 0 < sigterm[0] < sigterm[1] < sigterm[2]  # worth more the more often Spot strikes
    for r in rows[:3]:
        assert r["saving with it (%)"] > max(v for k, v in r.items() if k.startswith("saving at") and v)
        hard = spot.tradeoff(scenario(checkpoint_write_s=10.0, preemptions_per_hour=r["preemptions/h"]),
                             [600, 1800, 7200])
        assert r["cheapest interval (min)"] * 60 == min(hard, key=lambda t: t.spot_cost).interval_s
    # A checkpoint too slow for the notice saves nothing on SIGTERM.
    slow = spot.sensitivity(scenario(checkpoint_write_s=60.0), [1.0], [600])
    assert slow[0]["SIGTERM checkpoint saves $"] == 0.0


def test_sensitivity_text_is_read_from_the_grid():
    rows = spot.sensitivity(scenario(checkpoint_write_s=10.0), [0.01, 0.1, 1.0, 3.0, 6.0], [600, 1800])
    text = spot.sensitivity_text(rows, 100.0)
    first_worth = min(r["preemptions/h"] for r in rows if (r["SIGTERM checkpoint saves $"] or 0) >= 1.0)
    assert f"from {first_worth:g} preemptions/h" in text
    assert "never finishes from 6 preemptions/h" in text and "Spot saves at every rate" in text
    calm = spot.sensitivity(scenario(checkpoint_write_s=60.0), [0.01, 20.0], [600])
    text = spot.sensitivity_text(calm, 100.0)
    assert "under 1%" in text and "Spot stops saving from 20 preemptions/h" in text
