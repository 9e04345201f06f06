"""`labkit.tf.straggler`: one slow worker under MultiWorkerMirrored and ParameterServerStrategy,
each run as an emulated Vertex AI job (workerpool0 the chief, workerpool1 the workers,
workerpool2 the parameter server). The claims are step counts over the same windows of wall
time, interleaved with and without the slowed worker, never durations."""

from __future__ import annotations

import statistics
import time

import pytest

from labkit.core.config import ParameterError
from labkit.core.train_config import TrainConfig
from labkit.tf.straggler import ASYNC, SYNC, StragglerConfig, parser


def test_the_settings_are_checked_and_travel_as_flags():
    with pytest.raises(ParameterError, match="windows"):
        StragglerConfig(windows=1)
    with pytest.raises(ParameterError, match="delay_ms"):
        StragglerConfig(delay_ms=-1)
    job = StragglerConfig(windows=4, window_s=0.5, warmup_s=0.25, slow_worker=1, delay_ms=250,
                          out="/gcs/b/x.json")
    args = parser().parse_args(job.argv())
    assert StragglerConfig(windows=args.windows, window_s=args.window_s, warmup_s=args.warmup_s,
                           slow_worker=args.slow_worker, delay_ms=args.delay_ms, out=args.out) == job
    assert [job.slowed(w) for w in (-1, 0, 1, 2, 3)] == [False, False, True, False, True]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_wait_op_waits_once_after_its_input():
    """SleepDataset also waits before saying the data has ended: without `take(1)` the op would
    wait twice its delay."""
    tf = pytest.importorskip("tensorflow")
    from labkit.tf.straggler import wait_op

    @tf.function
    def waited(us):
        return wait_op(us, tf.constant([1.0, 2.0]))

    assert float(waited(tf.constant(0, tf.int64))) == 3.0  # traced; returns its input's sum
    start = time.perf_counter()
    waited(tf.constant(300_000, tf.int64))
    assert 0.29 <= time.perf_counter() - start < 0.55


def _job(strategy: str, tmp_path):
    from labkit.course import parameter_server as ps

    config = TrainConfig(framework="tf", model="cnn", batch_size=32, lr=0.01, num_samples=512,
                         device="cpu", progress=False)
    straggler = StragglerConfig(windows=4, window_s=1.0, warmup_s=0.5, delay_ms=300)
    spec = ps.job_spec(config, straggler, strategy, output_uri=f"gs://labkit-test/{strategy}")
    return ps.run({strategy: spec}, tmp_path, timeout_s=240)[strategy]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_slowed_worker_stalls_the_synchronous_job(tmp_path):
    pytest.importorskip("tensorflow")
    run = _job(SYNC, tmp_path)
    assert sorted(r.name for r in run.job.runs) == ["workerpool0[0]", "workerpool1[0]"]
    assert run.result["strategy"] == SYNC and run.result["workers_computing"] == 2
    full = sum(w["updates"] for w in run.windows(False))
    slowed = sum(w["updates"] for w in run.windows(True))
    assert full > 0 and slowed < 0.6 * full, (full, slowed)  # every step waits for the straggler
    assert {u["staleness"] for u in run.updates} == {0}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_slowed_worker_does_not_stall_the_asynchronous_job_and_its_loss_falls(tmp_path):
    pytest.importorskip("tensorflow")
    run = _job(ASYNC, tmp_path)
    assert sorted(r.name for r in run.job.runs) == ["workerpool0[0]", "workerpool1[0]", "workerpool1[1]",
                                                    "workerpool2[0]"]
    assert all(r.exit_code == 0 for r in run.job.runs)  # the serving tasks leave once the chief is done
    assert run.result["strategy"] == ASYNC and run.result["parameter_servers"] == 1

    def count(slowed: bool, slow: bool) -> int:
        return sum(1 for u in run.updates if u["window"] in {w["index"] for w in run.windows(slowed)}
                   and (u["worker"] == run.slow_worker) == slow)

    # The other worker keeps its pace while the slowed one waits; the job keeps most of its rate.
    assert count(True, False) >= 0.8 * count(False, False), run.result["windows"]
    slowed_total = sum(w["updates"] for w in run.windows(True))
    assert slowed_total >= 0.5 * sum(w["updates"] for w in run.windows(False))
    assert count(True, True) < count(True, False)
    # The straggler's updates were computed on older weights than the other worker's.
    assert statistics.fmean(run.staleness(True, True)) > statistics.fmean(run.staleness(True, False))
    versions = [u["version"] for u in run.updates]
    assert versions == list(range(1, len(versions) + 1))  # every update counted once
    losses = run.losses
    assert statistics.fmean(losses[-10:]) < 0.9 * statistics.fmean(losses[:10])
