"""Notebook 02's parameter-server section: the two jobs' specs (Vertex's pools, the program each
replica runs) and what is drawn from the windows of their results. The jobs themselves run in
tests/tf/test_straggler.py; here the results are made up, so every figure can be checked."""

from __future__ import annotations

import json

import pytest

from labkit.core.stats import NO_DIFFERENCE
from labkit.core.train_config import TrainConfig
from labkit.course import parameter_server as ps


def _config() -> TrainConfig:
    return TrainConfig(model="cnn", scale="full", batch_size=64, lr=0.01, num_samples=1024, device="cuda")


def test_the_two_jobs_have_vertex_pools_and_run_the_straggler_program():
    config = ps.demo_config(_config())
    assert (config.device, config.scale, config.framework, config.batch_size) == ("cpu", "smoke", "tf", 64)
    specs = ps.jobs(config, ps.StragglerConfig(delay_ms=120))
    assert list(specs) == [ps.SYNC, ps.ASYNC]
    counts = {s: [p["replica_count"] for p in spec["worker_pool_specs"]] for s, spec in specs.items()}
    assert counts == {ps.SYNC: [1, 1], ps.ASYNC: [1, 2, 1]}
    command = specs[ps.ASYNC]["worker_pool_specs"][2]["container_spec"]["command"]
    assert command[:3] == ["python", "-m", "labkit.tf.straggler"] and "--delay-ms" in command
    assert command[command.index("--out") + 1] == "/gcs/labkit-course/02-straggler/parameter_server/straggler.json"
    assert ps.results_uri(specs[ps.ASYNC]) == "gs://labkit-course/02-straggler/parameter_server/straggler.json"
    with pytest.raises(ValueError, match="strategy"):
        ps.job_spec(config, ps.StragglerConfig(), "mirrored", output_uri="gs://b/x")


def test_each_replica_gets_the_tf_config_task_of_its_pool():
    from labkit.vertex.emulator import LocalPaths, replica_envs

    config = ps.demo_config(_config())
    envs = replica_envs(ps.jobs(config, ps.StragglerConfig())[ps.ASYNC], LocalPaths("/tmp/unused"))
    tasks = {key: json.loads(env["TF_CONFIG"])["task"]["type"] for key, env in envs.items()}
    assert tasks == {(0, 0): "chief", (1, 0): "worker", (1, 1): "worker", (2, 0): "ps"}
    assert "workerpool2[0]   ps" in ps.layout_text(ps.jobs(config, ps.StragglerConfig()))


def _result(strategy: str, counts: list[tuple[int, int]], staleness: dict[tuple[bool, int], int]) -> dict:
    """Made-up results: window w has counts[w] = (updates by worker 0, by worker 1), odd windows
    slowed; each update's staleness by (slowed window, worker)."""
    windows, updates, version = [], [], 0
    for w, (a, b) in enumerate(counts):
        slowed = w % 2 == 1
        windows.append({"index": w, "slowed": slowed, "seconds": 1.0, "updates": a + b, "first_version": version})
        for worker, n in ((0, a), (1, b)):
            for _ in range(n):
                version += 1
                updates.append({"loss": 2.0 - 0.01 * version, "window": w, "version": version,
                                "worker": worker, "staleness": 0 if strategy == ps.SYNC else staleness[(slowed, worker)]})
    return {"strategy": strategy, "windows": windows, "updates": updates, "params": 1000,
            "straggler": {"delay_ms": 100.0, "slow_worker": 0}, "config": {"batch_size": 64},
            "workers_computing": 2, "parameter_servers": 0 if strategy == ps.SYNC else 1}


@pytest.fixture
def runs() -> dict[str, ps.StragglerRun]:
    sync = _result(ps.SYNC, [(10, 10), (4, 4), (12, 12), (4, 4), (10, 10), (5, 5)], {})
    asyn = _result(ps.ASYNC, [(12, 12), (4, 16), (11, 12), (5, 15), (12, 11), (4, 17)],
                   {(False, 0): 1, (False, 1): 1, (True, 0): 3, (True, 1): 0})
    return {ps.SYNC: ps.StragglerRun(ps.SYNC, sync), ps.ASYNC: ps.StragglerRun(ps.ASYNC, asyn)}


def test_the_windows_give_the_rates_and_the_verdicts(runs):
    sync, asyn = runs[ps.SYNC], runs[ps.ASYNC]
    assert sync.rates(False) == [20, 24, 20] and sync.rates(True) == [8, 8, 10]
    assert ps.slowdown(sync).winner == "a" and ps.slowdown(sync).ratio == pytest.approx(8 / 20)
    assert asyn.worker_rates(True, slow=False) == [16, 15, 17]
    assert ps.others_slowdown(asyn).winner == "b"  # the other worker went faster, not slower
    assert asyn.staleness(True, True) == [3] * 13 and set(asyn.staleness(False)) == {1}
    t = ps.throughput(runs)
    assert t.a.values == (1280.0, 1536.0, 1280.0) and t.winner is None  # ranges overlap
    rows = ps.staleness_rows(asyn)
    assert [(r["windows"], r["updates"], r["mean"]) for r in rows] == [
        ("full speed", 35, 1), ("full speed", 35, 1), ("one worker slowed", 13, 3), ("one worker slowed", 48, 0)]
    table = ps.window_rows(runs)
    assert len(table) == 12 and table[7]["by the slowed worker"] == 4


def test_the_findings_are_computed_from_the_windows(runs):
    found = ps.findings(runs)
    assert (found.delay_ms, found.slow_worker) == (100.0, 0)
    assert found.sync_verdict == "slower" and found.sync.ratio == pytest.approx(8 / 20)  # medians
    assert found.asynchronous.ratio == pytest.approx(20 / 23) and found.async_verdict == "slower"
    assert found.others_verdict == "faster" and found.others_kept_pace  # it did not wait for the straggler
    assert found.throughput_verdict == NO_DIFFERENCE  # the throughput at full speed overlapped
    stale = found.staleness
    assert (stale.median, stale.mean, stale.max) == (1, 1, 1)
    assert (stale.slowed_mean, stale.other_mean) == (3, 0)
    assert found.compared_updates == 90  # the synchronous job's updates, fewer than the asynchronous one's
    last_tenth = slice(90 - 9, 90)
    assert found.sync_tail_loss == pytest.approx(sum(runs[ps.SYNC].losses[last_tenth]) / 9)
    assert found.async_tail_loss == pytest.approx(sum(runs[ps.ASYNC].losses[last_tenth]) / 9)


def test_a_window_kind_without_updates_has_no_staleness(runs):
    asyn = runs[ps.ASYNC]
    asyn.result["updates"] = [u for u in asyn.updates if u["window"] % 2 == 0]  # nothing in slowed windows
    assert ps.staleness(asyn) is None


def test_the_parameter_servers_traffic_against_a_ring(runs):
    t = ps.traffic(runs)
    assert (t.params, t.workers, t.updates_per_s) == (1000, 2, 23)
    assert t.server_bytes_per_update == 8000 and t.server_bytes_per_s == 8000 * 23
    assert t.ring_bytes_per_worker == 4000  # 2 (2 - 1) / 2 of 4,000 bytes


def test_a_recipe_run_gives_each_workers_updates_and_their_staleness():
    steps = [{"worker": 0, "staleness": 0}, {"worker": 1, "staleness": 1}, {"worker": 0, "staleness": 2},
             {"worker": 1, "staleness": 0}]
    r = ps.recipe_staleness(steps)
    assert r.by_worker == {0: 2, 1: 2} and r.updates == 4
    assert (r.mean, r.max, r.stale_share) == (0.75, 2, 0.5)


def test_the_plot_has_the_three_panels(runs, tmp_path):
    fig = ps.plot(runs, tmp_path / "ps.png")
    assert len(fig.axes) == 3 and (tmp_path / "ps.png").stat().st_size > 0
