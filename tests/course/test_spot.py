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


def test_sensitivity_findings_are_read_from_the_grid():
    rows = spot.sensitivity(scenario(checkpoint_write_s=10.0), [0.01, 0.1, 1.0, 3.0, 6.0], [600, 1800])
    found = spot.sensitivity_findings(rows, 100.0)
    first_pays = min(r["preemptions/h"] for r in rows if (r["SIGTERM checkpoint saves $"] or 0) >= 1.0)
    assert found.sigterm_pays_from == first_pays and found.on_demand_usd == 100.0
    assert found.sigterm_most_usd == max(r["SIGTERM checkpoint saves $"] or 0 for r in rows)
    assert found.never_finishes_from == 6.0 and found.stops_saving_from is None  # Spot saves at every rate
    calm = spot.sensitivity(scenario(checkpoint_write_s=60.0), [0.01, 20.0], [600])
    found = spot.sensitivity_findings(calm, 100.0)
    assert found.sigterm_pays_from is None and found.sigterm_most_usd < spot.WORTH_SHARE * 100.0
    assert found.stops_saving_from == 20.0
    with pytest.raises(ParameterError, match="rows"):
        spot.sensitivity_findings([], 100.0)


def test_time_checkpoint_write_to_a_folder_writes_there_and_removes_it(tmp_path):
    checkpoint.save(str(tmp_path / "src"), 3, {"model.pt": b"x" * 1000})
    dest = tmp_path / "dest"
    dest.mkdir()
    write = spot.time_checkpoint_write(str(tmp_path / "src"), to=str(dest), min_bytes=5_000, repeats=3)
    assert len(write.seconds.values) == 3 and write.nbytes == 5_000
    assert list(dest.iterdir()) == []  # each timed folder removed


def test_the_published_cloud_storage_rate_is_gcsfuse_s_write_benchmark_per_writer():
    rate = spot.published_cloud_rate("no bucket here")
    assert rate.place == "Cloud Storage" and not rate.measured and rate.label == "Cloud Storage (published)"
    assert rate.bytes_per_s == pytest.approx(4624.59e6 / 10)
    assert "gcsfuse/blob/master/docs/benchmarks.md" in rate.how and "v3.4.3" in rate.how
    assert "read 2026-11-29" in rate.how and rate.how.endswith("not measured here: no bucket here")
    assert rate.seconds(1.5e9) == pytest.approx(1.5e9 / 462.459e6)
    with pytest.raises(ParameterError, match="bytes_per_s"):
        spot.WriteRate("local disk", 0.0, "", True)


def test_cloud_storage_is_measured_only_with_a_bucket_credentials_and_the_real_service():
    from labkit.core.gcp import CloudContext

    def ctx(bucket="gs://b", credentials="key file"):
        return CloudContext("p", "us-central1", bucket, credentials)

    assert "LABKIT_BUCKET" in spot.cloud_unmeasurable(ctx(bucket=None), {})
    assert "credentials" in spot.cloud_unmeasurable(ctx(credentials=None), {})
    for stand_in in ({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}, {"LABKIT_LOCAL_GCS": "/tmp/x"}):
        assert "not Cloud Storage" in spot.cloud_unmeasurable(ctx(), stand_in)
    rate = spot.cloud_write_rate("/nowhere", ctx(bucket=None), env={})
    assert not rate.measured and "set LABKIT_BUCKET" in rate.how  # nothing written, the page cited


def test_the_interval_comes_from_the_rate_it_is_given():
    slow = spot.WriteRate("Cloud Storage", 100e6, "published", False)
    fast = spot.WriteRate("local disk", 2e9, "measured", True)
    s = scenario(checkpoint_write_s=0.0, checkpoint_on_sigterm=True)
    cloud, local = (spot.checkpoint_interval(s, 6e9, r) for r in (slow, fast))
    assert cloud.write_s == pytest.approx(60.0) and local.write_s == pytest.approx(3.0)
    assert not cloud.scenario.spot.checkpoint_on_sigterm  # the table is for hard kills
    assert cloud.young_daly_s == pytest.approx(young_daly_interval(60.0, 0.1))
    assert round(cloud.young_daly_s) in [r.interval_s for r in cloud.rows]
    assert cloud.cheapest == min(cloud.rows, key=lambda r: r.spot_cost)
    assert cloud.cheapest.interval_s > local.cheapest.interval_s  # slower writes, rarer checkpoints
    rows = spot.interval_rows([cloud, local])
    assert rows[0]["checkpoint written to"] == "Cloud Storage (published)" and rows[0]["6 GB write (s)"] == 60.0
    name, minutes, unit, note = spot.interval_headline([cloud, local])
    assert "Cloud Storage (published) rate of 100 MB/s" in name and unit == "min"
    assert minutes == cloud.cheapest.interval_s / 60
    assert f"local disk (measured) rate, 2,000 MB/s: {local.cheapest.interval_s / 60:.1f} min" in note
    never = spot.checkpoint_interval(scenario(preemptions_per_hour=0.0), 1e9, fast)
    assert never.young_daly_s == math.inf and [r.interval_s for r in never.rows] == list(spot.ROUND_INTERVALS_S)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_checkpoint_is_timed_through_gs_and_removed_from_the_bucket(tmp_path):
    """Through gcsfs to the local Cloud Storage server, as to a real bucket."""
    import subprocess
    import sys

    from labkit.core.launcher import child_env
    from labkit.vertex.storage import LocalStorage

    checkpoint.save(str(tmp_path / "src"), 2, {"model.pt": b"y" * 4096})
    (tmp_path / "buckets" / "bkt").mkdir(parents=True)
    code = ("from labkit.course.preemption import spot\n"
            f"w = spot.time_checkpoint_write({str(tmp_path / 'src')!r}, to='gs://bkt/probe', min_bytes=100_000)\n"
            "print(w.nbytes, len(w.seconds.values))\n")
    with LocalStorage(tmp_path / "buckets", tmp_path / "state") as server:
        out = subprocess.run([sys.executable, "-c", code], env=child_env(server.client_env()),
                             capture_output=True, text=True, timeout=150)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == ["100000", "3"]
        assert server.stats()["requests"] > 0
    assert not [p for p in (tmp_path / "buckets" / "bkt").rglob("*") if p.is_file()]  # all removed
