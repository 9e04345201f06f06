"""`labkit run NOTEBOOK --vertex`: dry run without a cloud; the notebook job runs for real
through the emulator."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit import vertex
from labkit.vertex.emulator import run_local

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "labkit" / "assets" / "hello.ipynb"


def _env(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK", "LABKIT_BUCKET"))}
    return env | {"HOME": str(tmp_path), "PYTHONPATH": str(REPO)}


@pytest.mark.slow
def test_run_vertex_without_cloud_is_a_dry_run(tmp_path):
    out = subprocess.run([sys.executable, "-m", "labkit", "run", str(HELLO), "--vertex", "-p", "size", "16",
                          "--machine-type", "g2-standard-8", "--accelerator-type", "NVIDIA_L4", "--accelerator-count", "1", "--spot",
                          "--replicas", "2"], capture_output=True, text=True, env=_env(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    spec_json = json.loads(text[:text.index("\nestimated cost")])
    assert spec_json["scheduling"]["strategy"] == "SPOT"
    assert spec_json["workerPoolSpecs"][1]["replicaCount"] == "1"
    assert '\\"size\\": 16' in text or '"size": 16' in text.replace('\\"', '"')
    for what in ("estimated cost", "credentials", "project", "region", "bucket", "nothing submitted"):
        assert what in text


@pytest.mark.slow
def test_run_vertex_rejects_unknown_parameter(tmp_path):
    out = subprocess.run([sys.executable, "-m", "labkit", "run", str(HELLO), "--vertex", "-p", "nope", "1"],
                         capture_output=True, text=True, env=_env(tmp_path), timeout=120)
    assert out.returncode == 2 and "'nope'" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_notebook_job_executes_through_the_emulator(tmp_path):
    spec = vertex.notebook_job(str(HELLO), {"size": 8}, output_uri="gs://bkt/nbjob")
    inputs = tmp_path / "gcs/bkt/nbjob/inputs"
    inputs.mkdir(parents=True)
    shutil.copy(HELLO, inputs / HELLO.name)  # what `submit` uploads
    job = run_local(spec, tmp_path, timeout_s=240)
    assert job.succeeded, job.summary() + job.final().log()[-3000:]
    executed = nbformat.read(tmp_path / "gcs/bkt/nbjob/notebooks" / HELLO.name, as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "size = 8" in injected[0].source
