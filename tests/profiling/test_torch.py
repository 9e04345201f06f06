"""Real torch.profiler runs on this CPU: the verdict is right on a run built to be input-bound
(slow loader) and on one built to be compute-bound, the breakdown fractions sum to one, and the
trace files are written where Perfetto and TensorBoard expect them."""

from __future__ import annotations

import json

import pytest

from labkit.profiling.analysis import step_breakdown
from labkit.profiling.run import profile_workload
from labkit.profiling.torch_profiler import ProfileConfig, torch_profile
from labkit.profiling.workload import WorkloadConfig, run_workload


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("torch")


SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}


def test_input_bound_run(tmp_path):
    slow = WorkloadConfig(batch_size=32, width=64, depth=2, input_latency_ms=40)
    r = profile_workload(slow, ProfileConfig(out_dir=str(tmp_path), **SCHEDULE), label="slow loader",
                         sample_gpu=False)
    assert r.verdict.kind == "input-bound", r.text()
    assert r.verdict.notebook == "03_input_pipelines"
    assert r.breakdown.fractions["input"] >= 0.5
    assert sum(r.breakdown.fractions.values()) == pytest.approx(1.0)
    assert len(r.breakdown.steps) == 3
    for step in r.breakdown.steps:
        assert sum(step.fractions.values()) == pytest.approx(1.0)


def test_compute_bound_run(tmp_path):
    big = WorkloadConfig(batch_size=128, width=512, depth=3)
    r = profile_workload(big, ProfileConfig(out_dir=str(tmp_path), **SCHEDULE), label="big matmuls",
                         sample_gpu=False)
    assert r.verdict.kind == "compute-bound", r.text()
    assert r.breakdown.fractions["compute"] >= 0.6
    assert r.ops["matmul_share"] >= 0.5
    assert any("mm" in o.name for o in r.top[:3])
    assert sum(r.breakdown.fractions.values()) == pytest.approx(1.0)


def test_trace_files_for_perfetto_and_tensorboard(tmp_path):
    with torch_profile(ProfileConfig(out_dir=str(tmp_path), **SCHEDULE)) as prof:
        run_workload(WorkloadConfig(batch_size=8, width=32, depth=1, steps=5), on_step=prof.step)
    trace = json.loads(prof.trace_path.read_text())
    assert any(e.get("name", "").startswith("ProfilerStep#") for e in trace["traceEvents"])
    assert any(e.get("name") == "labkit/forward" for e in trace["traceEvents"])
    assert list(prof.tensorboard_dir.glob("*.pt.trace.json"))
    assert len(step_breakdown(prof.timeline()).steps) == 3


def test_too_few_steps_says_so(tmp_path):
    with torch_profile(ProfileConfig(out_dir=str(tmp_path), wait=1, warmup=1, active=5)) as prof:
        run_workload(WorkloadConfig(batch_size=4, width=8, depth=1, steps=2), on_step=prof.step)
    with pytest.raises(RuntimeError, match="schedule needs 7"):
        _ = prof.trace_path


def test_result_summary_json(tmp_path):
    r = profile_workload(WorkloadConfig(batch_size=8, width=32, depth=1),
                         ProfileConfig(out_dir=str(tmp_path), tensorboard=False, **SCHEDULE), sample_gpu=False)
    data = json.loads(r.write_json(tmp_path / "s.json").read_text())
    assert data["verdict"] == r.verdict.kind and data["samples_per_s"] > 0
    assert sum(data["fractions"].values()) == pytest.approx(1.0)


@pytest.mark.gpu
def test_gpu_run_has_device_timeline(tmp_path):
    r = profile_workload(WorkloadConfig(batch_size=256, width=2048, depth=4, device="cuda"),
                         ProfileConfig(out_dir=str(tmp_path), **SCHEDULE))
    assert r.breakdown.gpu_busy is not None and r.gpu is not None
    assert r.top[0].kind == "gpu"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_run_input_bound_then_fixed_by_workers(tmp_path):
    pytest.importorskip("labkit.torch.engine")
    import torch

    from labkit.core.train_config import TrainConfig
    from labkit.profiling.run import profile_training, set_cpu_threads

    previous = torch.get_num_threads()
    set_cpu_threads(1)
    try:
        slow = TrainConfig(model="cnn", batch_size=8, steps=6, input_latency_ms=150.0, num_samples=8 * 32)
        before = profile_training(slow, ProfileConfig(out_dir=str(tmp_path / "a"), **SCHEDULE), sample_gpu=False)
        fixed = TrainConfig(**{**slow.__dict__, "num_workers": 8})
        after = profile_training(fixed, ProfileConfig(out_dir=str(tmp_path / "b"), **SCHEDULE), sample_gpu=False)
    finally:
        torch.set_num_threads(previous)
    assert before.verdict.kind == "input-bound", before.text()
    assert after.breakdown.fractions["input"] < before.breakdown.fractions["input"], after.text()
    assert sum(after.breakdown.fractions.values()) == pytest.approx(1.0)
