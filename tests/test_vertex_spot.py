"""Checkpoint interval vs lost work vs cost on Spot."""

from __future__ import annotations

import math

import pytest

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.course import spot


def scenario(**kw):
    base = dict(work_hours=10.0, checkpoint_write_s=60.0, preemptions_per_hour=0.1,
                on_demand_usd_hr=10.0, spot_usd_hr=3.0, restart_overhead_s=300.0,
                checkpoint_on_sigterm=False)
    return spot.SpotScenario(**(base | kw))


def test_row_arithmetic():
    r = spot.row(scenario(), 1200.0)
    assert r.checkpoint_overhead == pytest.approx(0.05)
    assert r.lost_per_preemption_s == 600.0
    busy = 10 * 1.05
    wall = busy / (1 - 0.1 * 900 / 3600)
    assert r.wall_hours == pytest.approx(wall)
    assert r.spot_cost == pytest.approx(wall * 3.0) and r.on_demand_cost == pytest.approx(busy * 10.0)
    assert r.expected_preemptions == pytest.approx(0.1 * wall)
    assert 0 < r.saving < 1


def test_cheapest_interval_is_near_young_daly():
    s = scenario()
    best = spot.young_daly_interval(60.0, 0.1)
    assert best == pytest.approx(math.sqrt(2 * 60 * 36000))
    rows = spot.tradeoff(s, [best / 8, best / 2, best, best * 2, best * 8])
    assert min(rows, key=lambda r: r.spot_cost).interval_s == best


def test_sigterm_checkpoint_removes_lost_work_only_when_it_fits_the_notice():
    assert spot.lost_work_s(scenario(checkpoint_on_sigterm=True, checkpoint_write_s=10), 600) == 0.0
    assert spot.lost_work_s(scenario(checkpoint_on_sigterm=True, checkpoint_write_s=40), 600) == 300
    assert spot.young_daly_interval(60, 0) == math.inf
    assert "saving" in spot.table(spot.tradeoff(scenario(), [600, 1200]))


def test_bad_scenario_names_parameter():
    with pytest.raises(ParameterError, match="preemptions_per_hour"):
        scenario(preemptions_per_hour=-1)


def test_time_checkpoint_write(tmp_path):
    checkpoint.save(str(tmp_path), 3, {"model.pt": b"x" * 1000}, {"k": 1})
    seconds, size = spot.time_checkpoint_write(str(tmp_path))
    assert seconds > 0 and size == 1000
    with pytest.raises(FileNotFoundError):
        spot.time_checkpoint_write(str(tmp_path / "none"))
