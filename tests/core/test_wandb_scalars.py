"""Weights & Biases, optional (`labkit.core.wandb_scalars`): an offline run receives the scalars
TensorBoard gets; without the package a run goes on after one line; `wandb_project` is a flag."""

from __future__ import annotations

import struct
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.core import wandb_scalars
from labkit.core.config import ParameterError
from labkit.core.train_config import TrainConfig, from_argv, to_argv
from tests.core.test_loop import CONFIG, loss_of, report

BLOCK = 32768  # the .wandb file: LevelDB log blocks after a 7-byte header


def wandb_records(path: Path) -> list[bytes]:
    """The records of an offline run's ``.wandb`` file: LevelDB log framing (7-byte headers:
    checksum, length, type 1 full / 2 first / 3 middle / 4 last) after W&B's own 7-byte header."""
    data, pos, out, part = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # padding up to the next block
            pos += left
            continue
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            out.append(part)
    return out


def history(run_dir: Path, wait_s: float = 30.0) -> list[dict[str, float]]:
    """Each `run.log` call of an offline run, as {key: value}. W&B's service process may still
    be writing the file when `finish()` returns: read it once its closing record is there."""
    import json

    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("*.wandb")
    deadline = time.monotonic() + wait_s
    while True:
        records = []
        for raw in wandb_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            records.append(record)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


def test_an_offline_wandb_run_receives_the_scalars(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("CLOUD_ML_JOB_ID", "42")  # a Vertex job: the run id is the job's
    monkeypatch.setenv("LABKIT_LOG_FORMAT", "text")

    def sampler():
        return {"gpu_util": 55.0}

    report(replace(CONFIG, wandb_project="labkit-test"), system=sampler)
    (run_dir,) = (tmp_path / "wandb_dir" / "wandb").glob("offline-run-*-vertex-42")
    rows = history(run_dir)
    assert [r["step"] for r in rows] == list(range(CONFIG.steps))
    assert [r["train/loss"] for r in rows] == pytest.approx([loss_of(s) for s in range(CONFIG.steps)])
    assert {"train/samples_per_s", "train/step_time_s", "train/lr"} <= set(rows[0])
    assert all(r["system/gpu_util"] == 55.0 for r in rows)


def test_without_the_wandb_package_training_goes_on_after_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets where it is not installed
    monkeypatch.delenv("CLOUD_ML_JOB_ID", raising=False)
    monkeypatch.delenv("LABKIT_LOG_FORMAT", raising=False)
    log = report(replace(CONFIG, wandb_project="p"))
    assert len(log.steps) == CONFIG.steps
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'labkit[wandb]'" in err and "wandb_project='p'" in err


def test_the_run_id_follows_the_vertex_job_and_trial():
    assert wandb_scalars.run_id({}) is None
    assert wandb_scalars.run_id({"CLOUD_ML_JOB_ID": "77"}) == "vertex-77"
    assert wandb_scalars.run_id({"CLOUD_ML_JOB_ID": "77", "CLOUD_ML_TRIAL_ID": "3"}) == "vertex-77-trial-3"


def test_wandb_project_is_a_flag_that_names_a_project():
    config = TrainConfig(wandb_project="labkit-runs")
    assert "--wandb-project" in to_argv(config) and from_argv(to_argv(config)) == config
    assert TrainConfig().wandb_project is None and "--wandb-project" not in to_argv(TrainConfig())
    with pytest.raises(ParameterError, match="wandb_project.*WANDB_ENTITY"):
        TrainConfig(wandb_project="team/runs")
    for bad in ("", "a:b", "x" * 129, "  "):
        with pytest.raises(ParameterError, match="wandb_project"):
            TrainConfig(wandb_project=bad)
