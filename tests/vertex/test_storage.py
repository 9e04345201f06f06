"""Cloud Storage as a job sees it (`labkit.core.gcs`) and the tuning-metric file
(`labkit.core.hypertune`), checked against what Vertex and cloudml-hypertune do."""

from __future__ import annotations

import json

import pytest

from labkit.core import gcs, hypertune

VERTEX_ENV = {"AIP_MODEL_DIR": "gs://bkt/run/model/", "AIP_CHECKPOINT_DIR": "gs://bkt/run/checkpoints/",
              "AIP_TENSORBOARD_LOG_DIR": "gs://bkt/run/logs/", "AIP_TRAINING_DATA_URI": "gs://bkt/data/*.jsonl",
              "AIP_DATA_FORMAT": "jsonl", "HOME": "/root"}


def test_every_aip_address_maps_to_its_mount_path():
    assert gcs.aip_mount_paths(VERTEX_ENV) == {
        "AIP_CHECKPOINT_DIR": "/gcs/bkt/run/checkpoints/", "AIP_MODEL_DIR": "/gcs/bkt/run/model/",
        "AIP_TENSORBOARD_LOG_DIR": "/gcs/bkt/run/logs/", "AIP_TRAINING_DATA_URI": "/gcs/bkt/data/*.jsonl"}
    local = gcs.aip_mount_paths({**VERTEX_ENV, gcs.LOCAL_GCS_ENV: "/tmp/fake"})
    assert local["AIP_CHECKPOINT_DIR"] == "/tmp/fake/bkt/run/checkpoints/"
    assert gcs.mount_path("/gcs/bkt/x", {gcs.LOCAL_GCS_ENV: "/tmp/fake"}) == "/tmp/fake/bkt/x"
    assert gcs.mount_path("relative/x", {}) == "relative/x" and gcs.aip_mount_paths({}) == {}
    assert gcs.fuse_path("gs://bkt/x") == "/gcs/bkt/x" and gcs.fuse_path("/data") == "/data"


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
