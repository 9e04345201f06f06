"""`labkit train` in a Vertex AI job (its variables set, or through the local emulator): every
line it prints is a JSON log line with a severity, each step's figures are fields, and nothing
draws a carriage-return bar.

The runs that train (a few seconds each: a fresh Python importing torch) are `slow`; the fast
tier checks the training loop's lines in-process (tests/core/test_joblog.py) and, here, the
refusal, which stops before any framework is imported."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from labkit import vertex
from labkit.core import joblog
from tests.conftest import REPO


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """The runs train with torch in their own process: it must be installed, not imported here."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")


ARGS = ["--framework", "torch", "--model", "cnn", "--batch-size", "8", "--num-samples", "40",
        "--eval-samples", "0", "--device", "cpu"]


def job_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LABKIT_LOG", "LABKIT_PROGRESS", "LABKIT_NO_PROGRESS"))}
    return {**env, "CLOUD_ML_JOB_ID": "8123456789", **extra}


def train(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit", "train", *ARGS, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_labkit_train_in_a_job_prints_only_json_lines_with_the_step_figures(tmp_path):
    done = train("--steps", "4", "--tensorboard-dir", str(tmp_path / "tb"), env=job_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\r" not in done.stdout + done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]  # every line, or it fails
    assert all(r["severity"] in joblog.SEVERITIES and r["message"] for r in records)
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == [0, 1, 2, 3]
    assert all({"loss", "step_time_s", "samples_per_s", "lr"} <= set(r) and r["steps"] == 4 for r in steps)
    assert not [r for r in steps if "gpu_util" in r]  # a CPU run samples nothing
    assert records[-1]["event"] == "output" and "4 steps, final loss" in records[-1]["message"]


@pytest.mark.slow
def test_labkit_train_outside_a_job_is_unchanged(tmp_path):
    plain = train("--steps", "2", "--progress", env={**job_env(), "LABKIT_LOG_FORMAT": "text"})
    assert plain.returncode == 0 and "2/2 [" in plain.stderr and not joblog.parse(plain.stdout)


def test_in_a_job_a_refused_flag_is_one_error_line():
    bad = train("--steps", "0", env=job_env())
    assert bad.returncode == 2
    (record,) = [json.loads(line) for line in bad.stdout.splitlines()]
    assert record["severity"] == "ERROR" and "steps" in record["message"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_emulated_job_logs_json_lines_the_emulator_reads_steps_from(tmp_path):
    from labkit.vertex.emulator import run_local

    spec = vertex.training_job(dict(model="cnn", scale="smoke", steps=4, batch_size=8, num_samples=40,
                                    eval_samples=0, device="cpu"), output_uri="gs://bkt/joblog")
    job = run_local(spec, tmp_path / "job")
    assert job.succeeded, job.summary()
    chief = job.final()
    assert chief.last_step == 4  # the emulator read the steps from the JSON lines' messages
    lines = [line for line in chief.log().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records if r["event"] == "step"] == [0, 1, 2, 3]
    assert "\r" not in chief.log()
