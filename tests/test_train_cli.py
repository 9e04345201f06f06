"""`labkit train` end to end in subprocesses: metrics file, the preemption drill (exit 143, resume
finishes the remaining steps with identical losses), a real SIGTERM, and local DDP replicas."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from labkit.train import TrainConfig, to_argv
from tests.conftest import REPO

pytest.importorskip("torch")

COMMON = ["--framework", "torch", "--model", "cnn", "--batch-size", "8", "--num-samples", "40",
          "--no-progress"]


def train(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", "train", *COMMON, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def steps_of(path) -> list[tuple[int, float]]:
    return [(s["step"], s["loss"]) for s in json.loads(path.read_text())["steps"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_preemption_drill_resumes_with_identical_losses(tmp_path):
    full = train("--steps", "9", "--metrics-out", str(tmp_path / "full.json"))
    assert full.returncode == 0, full.stderr
    ck = str(tmp_path / "ck")
    first = train("--steps", "9", "--checkpoint-dir", ck, "--checkpoint-every", "2",
                  "--metrics-out", str(tmp_path / "a.json"), "--preempt-at", "4")
    assert first.returncode == 143, first.stdout + first.stderr
    assert "resume" in first.stdout
    second = train("--steps", "9", "--checkpoint-dir", ck, "--checkpoint-every", "2",
                   "--metrics-out", str(tmp_path / "b.json"))
    assert second.returncode == 0, second.stderr
    a, b = steps_of(tmp_path / "a.json"), steps_of(tmp_path / "b.json")
    assert [s for s, _ in a] == [0, 1, 2, 3, 4] and [s for s, _ in b] == [5, 6, 7, 8]
    assert a + b == steps_of(tmp_path / "full.json")  # bitwise: floats compared exactly


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_external_sigterm_checkpoints_and_exits_143(tmp_path):
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "labkit", "train", *COMMON, "--steps", "10000", "--checkpoint-dir", str(ck),
           "--checkpoint-every", "1", "--input-latency-ms", "20", "--metrics-out", str(tmp_path / "m.json")]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(ck.glob("step-*/COMMITTED")) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out + err
    last = steps_of(tmp_path / "m.json")[-1][0]
    assert (ck / f"step-{last:08d}" / "COMMITTED").exists()  # the step in flight was finished and saved


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nproc_per_node_runs_ddp_replicas(tmp_path):
    r = train("--steps", "3", "--nproc-per-node", "2", "--metrics-out", str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["run"]["world_size"] == 2 and len(data["steps"]) == 3


def test_bad_flag_values_are_refused():
    r = train("--precision", "fp8", "--steps", "1")
    assert r.returncode != 0 and "invalid choice" in r.stderr
    r = train("--steps", "0")
    assert r.returncode == 2 and "parameter 'steps' must be >= 1" in r.stdout


def test_to_argv_round_trips_the_config():
    from labkit.cli import build_parser

    cfg = TrainConfig(model="gpt", steps=7, lr=3e-4, grad_clip=None, compile=True, preempt_at=3,
                      input_latency_ms=2.5, checkpoint_dir="gs://bucket/run")
    args = build_parser().parse_args(["train", *to_argv(cfg)])
    from dataclasses import fields

    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    assert values.pop("grad_clip") == 0.0  # "off" travels as 0
    assert values == {f.name: getattr(cfg, f.name) for f in fields(TrainConfig) if f.name != "grad_clip"}


def test_a_setting_the_machine_cannot_run_is_named_without_a_traceback():
    r = train("--steps", "1", "--cuda-graph-step", "--device", "cpu")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "parameter 'cuda_graph_step' needs a CUDA GPU" in r.stdout and "Traceback" not in r.stderr
    r = train("--steps", "1", "--cuda-graph-step", "--nproc-per-node", "2")  # refused before any replica starts
    assert r.returncode == 2 and "parameter 'cuda_graph_step' needs a single process" in r.stdout
