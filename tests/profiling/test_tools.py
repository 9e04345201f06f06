"""The GPU sampler on a machine without a GPU, the `labkit profile` command, and the
TensorFlow profiler path (real tf.profiler, real tf.data)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.core.frameworks import has_tf
from labkit.profiling.gpu_sampler import GpuSampler
from tests.conftest import REPO


def test_sampler_without_gpu_records_nothing_and_says_why():
    from labkit.core.devices import detect

    s = GpuSampler(interval_s=0.01)
    with s:
        pass
    if detect().has_gpu:
        pytest.skip("this machine has a GPU; covered by the gpu-marked test")
    assert not s.available and s.summary() is None and "no NVIDIA GPU" in s.reason


@pytest.mark.gpu
def test_sampler_with_gpu():
    import time

    with GpuSampler(interval_s=0.05) as s:
        time.sleep(0.3)
    assert s.summary() and s.summary()["samples"] >= 2


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_labkit_profile_cli(tmp_path):
    out = tmp_path / "p"
    cmd = [sys.executable, "-m", "labkit", "profile", "--input-latency-ms", "30", "--batch-size", "16",
           "--width", "32", "--depth", "1", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "input-bound" in proc.stdout and "03_input_pipelines" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "input-bound"
    again = subprocess.run([sys.executable, "-m", "labkit", "profile", "--trace", summary["trace"]],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert again.returncode == 0 and "input-bound" in again.stdout


@pytest.mark.slow
def test_labkit_profile_bad_parameter(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "labkit", "profile", "--batch-size", "0", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "batch_size" in proc.stdout


@pytest.mark.slow
@pytest.mark.skipif(not has_tf(), reason="TensorFlow not installed")
def test_tf_profile_that_asked_for_a_gpu_never_runs_on_the_cpu(tmp_path):
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    if subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.strip() != "0":
        pytest.skip("TensorFlow sees a GPU here: --device cuda runs on it")
    proc = subprocess.run([sys.executable, "-m", "labkit", "profile", "--framework", "tf", "--device", "cuda",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and "parameter 'device' needs a GPU that TensorFlow can use" in proc.stdout
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not has_tf(), reason="TensorFlow not installed")
def test_tf_profiler_input_bound_then_compute_bound(tmp_path):
    from labkit.profiling.analysis import step_breakdown
    from labkit.profiling.tf_profiler import TFWorkloadConfig, run_tf_workload, tf_profile
    from labkit.profiling.verdict import diagnose

    kinds = []
    for i, cfg in enumerate([TFWorkloadConfig(input_latency_ms=40, width=32, steps=5),
                             TFWorkloadConfig(batch_size=256, width=512, depth=2, steps=5)]):
        with tf_profile(tmp_path / f"tb{i}") as prof:
            timer = run_tf_workload(cfg, prof)
        b = step_breakdown(timer.timeline, skip_first=1)
        assert sum(b.fractions.values()) == pytest.approx(1.0)
        assert prof.trace_files(), "tf.profiler wrote no xplane trace"
        kinds.append(diagnose(b).kind)
    assert kinds == ["input-bound", "compute-bound"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_labkit_profile_a_train_run(tmp_path):
    pytest.importorskip("labkit.torch.engine")
    cmd = [sys.executable, "-m", "labkit", "profile", "--model", "cnn", "--batch-size", "8",
           "--input-latency-ms", "200", "--cpu-threads", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "labkit train --model cnn" in proc.stdout and "input-bound" in proc.stdout
