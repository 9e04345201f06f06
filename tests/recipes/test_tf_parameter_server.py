"""The tf_parameter_server recipe, run as a learner runs it: in one process (the whole cluster as
in-process servers), and as an emulated Vertex AI job with a chief, two workers and a parameter
server, one process each in the pools Vertex lays them out in."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from tests.conftest import launch_output, recipe_env

SMALL = ["--batch-size", "16", "--num-samples", "64"]


@pytest.fixture(scope="module", autouse=True)
def _tf():
    pytest.importorskip("tensorflow")


def _losses(path) -> list[float]:
    return [s["loss"] for s in json.loads(path.read_text())["steps"]]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_with_one_worker_it_equals_labkit_train(tmp_path):
    """One worker applies the updates in order: asynchronous training is then the single-process
    run, and the recipe's losses are `labkit train`'s, bit for bit on a CPU."""
    argv = ["--model", "cnn", "--steps", "5", *SMALL, "--device", "cpu"]
    env = recipe_env(CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "labkit.recipes.tf_parameter_server", "--workers", "1", "--ps", "1",
                        *argv, "--metrics-out", str(tmp_path / "r.json")],
                       env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, launch_output(r)
    recipe = json.loads((tmp_path / "r.json").read_text())
    assert recipe["run"]["asynchronous"] and recipe["run"]["parameter_servers"] == 1
    assert {s["staleness"] for s in recipe["steps"]} == {0}
    e = subprocess.run([sys.executable, "-m", "labkit", "train", "--framework", "tf", *argv,
                        "--metrics-out", str(tmp_path / "e.json")], env=env, capture_output=True, text=True,
                       timeout=240)
    assert e.returncode == 0, launch_output(e)
    engine = _losses(tmp_path / "e.json")
    assert len(engine) == 5
    assert max(abs(a - b) for a, b in zip(_losses(tmp_path / "r.json"), engine, strict=True)) <= 1e-5


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_as_an_emulated_vertex_job_chief_two_workers_one_ps_it_trains(tmp_path):
    from labkit.vertex import PoolConfig, custom_job_spec, default_image, run_local

    out = "gs://labkit-test/ps-recipe"
    command = ["python", "-m", "labkit.recipes.tf_parameter_server", "--model", "cnn", "--steps", "40",
               "--batch-size", "32", "--num-samples", "512", "--lr", "0.01", "--device", "cpu",
               "--metrics-out", "/gcs/labkit-test/ps-recipe/metrics.json"]

    def pool(n: int) -> PoolConfig:
        return PoolConfig(replica_count=n, image_uri=default_image("tf"), command=command)

    spec = custom_job_spec(pool(1), pool(2), pool(1), output_uri=out)
    # Workers and the parameter server serve until Vertex stops them, once the chief has exited.
    job = run_local(spec, tmp_path, worker_grace_s=1.0, show_progress=False, timeout_s=240,
                    env={"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "4"})
    assert job.succeeded, job.summary() + "\n" + (job.failing().log()[-3000:] if job.failing() else "")
    assert job.final("workerpool0").exit_code == 0
    metrics = json.loads(job.local(f"{out}/metrics.json").read_text())
    assert metrics["run"]["workers"] == 2 and metrics["run"]["parameter_servers"] == 1
    steps = metrics["steps"]
    assert [s["step"] for s in steps] == list(range(40))
    assert {s["worker"] for s in steps} == {0, 1}  # both workers trained
    losses = [s["loss"] for s in steps]
    assert statistics.fmean(losses[-10:]) < 0.9 * statistics.fmean(losses[:10])
