"""Cloud Storage as a job sees it (`labkit.core.gcs`) and the tuning-metric file
(`labkit.core.hypertune`), checked against what Vertex and cloudml-hypertune do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.core import checkpoint, gcs, hypertune
from labkit.core.launcher import child_env

VERTEX_ENV = {"AIP_MODEL_DIR": "gs://b/run/model/", "AIP_CHECKPOINT_DIR": "gs://b/run/checkpoints/",
              "AIP_TENSORBOARD_LOG_DIR": "gs://b/run/logs/", "AIP_TRAINING_DATA_URI": "gs://b/data/*.jsonl",
              "AIP_DATA_FORMAT": "jsonl", "HOME": "/root"}


def test_every_aip_address_maps_to_its_mount_path():
    assert gcs.aip_mount_paths(VERTEX_ENV) == {
        "AIP_CHECKPOINT_DIR": "/gcs/b/run/checkpoints/", "AIP_MODEL_DIR": "/gcs/b/run/model/",
        "AIP_TENSORBOARD_LOG_DIR": "/gcs/b/run/logs/", "AIP_TRAINING_DATA_URI": "/gcs/b/data/*.jsonl"}
    local = gcs.aip_mount_paths({**VERTEX_ENV, gcs.LOCAL_GCS_ENV: "/tmp/fake"})
    assert local["AIP_CHECKPOINT_DIR"] == "/tmp/fake/b/run/checkpoints/"
    assert gcs.mount_path("/gcs/b/x", {gcs.LOCAL_GCS_ENV: "/tmp/fake"}) == "/tmp/fake/b/x"
    assert gcs.mount_path("relative/x", {}) == "relative/x" and gcs.aip_mount_paths({}) == {}
    assert gcs.fuse_path("gs://b/x") == "/gcs/b/x" and gcs.fuse_path("/data") == "/data"


def test_local_gcs_filesystem_is_a_bucket_folder(tmp_path):
    fs = gcs._local_gcs_class()(str(tmp_path))  # what register_local_gcs makes gs:// answer with
    with fs.open("b/deep/er/f.txt", "wb") as f:  # no folders to create first, as in a bucket
        f.write(b"x")
    assert (tmp_path / "b/deep/er/f.txt").read_bytes() == b"x"
    assert fs.ls("b/deep/er", detail=False) == ["b/deep/er/f.txt"]  # gcsfs-style paths


def test_replicas_get_gs_through_fsspec_only_when_emulated(tmp_path):
    """The sitecustomize the emulator puts on PYTHONPATH makes gs:// the stand-in folder for
    labkit.core.checkpoint; without LABKIT_LOCAL_GCS it leaves fsspec alone."""
    site = Path(gcs.__file__).resolve().parents[1] / "vertex" / "site"
    code = ("import fsspec; from labkit.core import checkpoint; "
            "checkpoint.save('gs://b/ck', 7, {'m': b'abc'}); "
            "print(type(fsspec.filesystem('gs')).__name__)")
    env = child_env({gcs.LOCAL_GCS_ENV: str(tmp_path)})
    env["PYTHONPATH"] = f"{site}:{env['PYTHONPATH']}"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "LocalGCSFileSystem"
    assert checkpoint.load(str(tmp_path / "b/ck")).files == {"m": b"abc"}
    env.pop(gcs.LOCAL_GCS_ENV)
    plain = subprocess.run([sys.executable, "-c", "import labkit.core.gcs as g; print(g.register_local_gcs())"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert plain.stdout.strip() == "False"


def test_hypertune_reports_match_cloudml_hypertune(tmp_path, monkeypatch):
    """Our reporter writes what Google's package writes (same file, same keys and values; only
    the timestamps differ), so the tuning service reads it the same way."""
    ref = pytest.importorskip("hypertune")
    monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "7")
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(tmp_path / "theirs" / "output.metrics"))
    theirs = ref.HyperTune()
    for step, value in ((10, 0.5), (20, 0.25)):
        theirs.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="loss", metric_value=value,
                                                   global_step=step)
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(tmp_path / "ours" / "output.metrics"))
    for step, value in ((10, 0.5), (20, 0.25)):
        hypertune.report_metric("loss", value, step)

    def lines(name):
        rows = [json.loads(line) for line in (tmp_path / name / "output.metrics").read_text().splitlines()]
        assert all(isinstance(r.pop("timestamp"), float) for r in rows)
        return rows

    assert lines("ours") == lines("theirs") == [
        {"checkpoint_path": "", "global_step": "10", "loss": "0.5", "trial": "7"},
        {"checkpoint_path": "", "global_step": "20", "loss": "0.25", "trial": "7"}]
    raw = (tmp_path / "ours" / "output.metrics").read_text().splitlines()[0]
    assert list(json.loads(raw)) == sorted(json.loads(raw))  # keys sorted, as the package writes
    assert hypertune.reported_values(hypertune.read_reports(), "loss") == [(10, 0.5), (20, 0.25)]


def test_hypertune_keeps_the_last_hundred_and_refuses_nan(tmp_path):
    env = {"CLOUD_ML_HP_METRIC_FILE": str(tmp_path / "m")}
    for i in range(105):
        hypertune.report_metric("acc", i / 100, i + 1, env=env)
    values = hypertune.reported_values(hypertune.read_reports(tmp_path / "m"), "acc")
    assert len(values) == 100 and values[0] == (6, 0.05) and values[-1] == (105, 1.04)
    with pytest.raises(ValueError, match="'acc'.*not finite"):
        hypertune.report_metric("acc", float("nan"), 1, env=env)
