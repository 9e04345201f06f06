"""What a running job reports: JSON log lines Cloud Logging turns into structured entries
(`labkit.core.joblog`), the progress bars that give way to them in a job, and the training
loop's reports in that mode (step lines, system samples, warnings and failures)."""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace

import pytest

from labkit.core import joblog, loop, progress
from labkit.core.metrics import MetricsLog
from labkit.core.train_config import Preempted
from labkit.vertex.faults import StepReader
from tests.core.test_loop import CONFIG, loss_of, report

JOB = {"CLOUD_ML_JOB_ID": "1234567890"}


def lines_of(text: str) -> list[dict]:
    """Every line of `text` parsed as JSON: fails on any line that is not."""
    return [json.loads(raw) for raw in text.splitlines() if raw.strip()]


@pytest.fixture
def in_job(monkeypatch):
    for name in ("LABKIT_LOG_FORMAT", "LABKIT_LOG_EVERY_S", "LABKIT_PROGRESS", "LABKIT_NO_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUD_ML_JOB_ID", JOB["CLOUD_ML_JOB_ID"])


def test_json_lines_in_a_vertex_job_or_when_forced():
    assert not joblog.json_lines({})
    assert joblog.json_lines(JOB)
    assert not joblog.json_lines(JOB, kernel=True)  # a notebook run as a job keeps its bars
    assert joblog.json_lines({"LABKIT_LOG_FORMAT": "json"}, kernel=True)
    assert not joblog.json_lines({**JOB, "LABKIT_LOG_FORMAT": "text"})
    with pytest.raises(ValueError, match="LABKIT_LOG_FORMAT must be one of json, text"):
        joblog.json_lines({"LABKIT_LOG_FORMAT": "yaml"})
    assert joblog.every_s({}) == 0.0 and joblog.every_s({"LABKIT_LOG_EVERY_S": "30"}) == 30.0
    with pytest.raises(ValueError, match="LABKIT_LOG_EVERY_S"):
        joblog.every_s({"LABKIT_LOG_EVERY_S": "-1"})


def test_a_line_is_one_json_object_with_severity_message_and_top_level_fields():
    text = joblog.line("step done", "WARNING", step=3, loss=math.nan, lr=math.inf, nested={"a": -math.inf})
    assert "\n" not in text and "\r" not in text
    record = json.loads(text)  # strict JSON: NaN and Infinity would not parse elsewhere
    assert list(record)[:2] == ["severity", "message"]
    assert record == {"severity": "WARNING", "message": "step done", "step": 3, "loss": "nan",
                      "lr": "inf", "nested": {"a": "-inf"}}
    with pytest.raises(ValueError, match="severity must be one of DEFAULT"):
        joblog.line("x", "VERBOSE")
    assert joblog.parse("plain text\n" + text + "\n{not json\n[1]\n") == [record]


def test_the_logs_explorer_query_names_the_job_and_the_kind_of_line():
    assert joblog.logs_query("123") == ('resource.type="ml_job" resource.labels.job_id="123" '
                                        'jsonPayload.event="step"')
    assert joblog.logs_query("123", None) == 'resource.type="ml_job" resource.labels.job_id="123"'


def test_step_lines_carry_the_step_figures_and_the_emulators_step_count(capsys):
    lines = joblog.StepLines(3, "train cnn", every=0)
    for step in range(3):
        row = {"step": step, "loss": 1.0 / (step + 1), "step_time_s": 0.5, "samples_per_s": 16.0,
               "lr": 0.1, "data_time_s": None}
        assert lines.write(row, {"gpu_util": 90.0, "gpu_mem_gib": 1.5})
    records = lines_of(capsys.readouterr().out)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["severity"] == "INFO" and r["event"] == "step" and r["steps"] == 3 for r in records)
    assert records[1]["loss"] == 0.5 and records[1]["gpu_util"] == 90.0 and "data_time_s" not in records[1]
    assert "steps_per_s" not in records[0] and records[2]["steps_per_s"] > 0
    # The emulator reads a replica's step from each line as the bar's count of steps done.
    assert [StepReader()(json.dumps(r)) for r in records] == [1, 2, 3]
    assert records[2]["message"].startswith("train cnn 3/3 [loss 0.3333, 16.0 samples/s, 500.0 ms/step, GPU 90%")


def test_step_lines_can_be_thinned_but_keep_the_first_last_and_non_finite(capsys):
    lines = joblog.StepLines(6, "train gpt", every=3600)
    written = [lines.write({"step": s, "loss": math.nan if s == 3 else 1.0, "step_time_s": 0.1,
                            "samples_per_s": 80.0}) for s in range(6)]
    assert written == [True, False, False, True, False, True]
    records = lines_of(capsys.readouterr().out)
    assert [(r["step"], r["severity"]) for r in records] == [(0, "INFO"), (3, "ERROR"), (5, "INFO")]
    assert records[1]["loss"] == "nan"


def test_warnings_become_warning_lines_and_the_hook_is_restored(capsys):
    shown = warnings.showwarning
    with joblog.warnings_as_lines(), warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("the bucket is slow", UserWarning, stacklevel=1)
    assert warnings.showwarning is shown
    out, err = capsys.readouterr()
    (record,) = lines_of(out)
    assert record["severity"] == "WARNING" and record["message"] == "UserWarning: the bucket is slow"
    assert record["source"].startswith(__file__) and err == ""


def test_notice_and_say_are_plain_outside_a_job_and_json_inside(capsys):
    joblog.notice("wandb is not installed", env={})
    joblog.say("labkit train: 5 steps", env={})
    out, err = capsys.readouterr()
    assert err == "labkit: wandb is not installed\n" and out == "labkit train: 5 steps\n"
    joblog.notice("wandb is not installed", env=JOB)
    joblog.say("labkit train: bad flag", "ERROR", env=JOB)
    notice, said = lines_of(capsys.readouterr().out)
    assert notice["severity"] == "WARNING" and said == {"severity": "ERROR", "message": "labkit train: bad flag",
                                                        "event": "output"}


def test_a_progress_bar_in_a_job_writes_json_lines_without_carriage_returns(in_job, capsys):
    assert progress.style(JOB, is_main=True, kernel=False) == progress.JSON_STYLE
    assert progress.style({**JOB, "LABKIT_PROGRESS": "off"}, is_main=True) == "off"
    assert progress.style({**JOB, "LABKIT_LOG_FORMAT": "text"}, is_main=True, kernel=False) == "terminal"
    assert list(progress.track(range(5), "write shards", unit="shard", is_main=True)) == [0, 1, 2, 3, 4]
    out, err = capsys.readouterr()
    assert "\r" not in out + err and err == ""
    records = lines_of(out)
    assert records and all(r["event"] == "progress" and r["desc"] == "write shards" for r in records)
    assert records[-1]["n"] == 5 and records[-1]["total"] == 5
    assert records[-1]["message"].startswith("write shards: 5/5 [")


class Sampler:
    """A system sampler with its own pace: a fresh sample on every other call."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return {"gpu_util": 10.0 * self.calls, "gpu_mem_gib": 2.0} if self.calls % 2 else None


def test_a_training_run_in_a_job_logs_one_json_line_per_step(in_job, capsys, tmp_path):
    pytest.importorskip("tensorboard")
    from labkit.core.scalars import event_files, read_scalars

    config = replace(CONFIG, progress=True, tensorboard_dir=str(tmp_path / "tb"))
    report(config, system=Sampler())
    out, err = capsys.readouterr()
    assert "\r" not in out + err and err == ""  # no bar: nothing on stderr at all
    records = lines_of(out)
    assert records[0]["event"] == "start" and records[0]["steps"] == 6
    steps = [r for r in records if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(6))
    for r in steps:
        assert r["severity"] == "INFO" and r["loss"] == pytest.approx(loss_of(r["step"]))
        assert {"step_time_s", "samples_per_s", "lr", "gpu_util", "gpu_mem_gib"} <= set(r)
    # the latest sample rides on every line; a fresh one arrives every other step
    assert [r["gpu_util"] for r in steps] == [10.0, 10.0, 30.0, 30.0, 50.0, 50.0]
    (path,) = event_files(tmp_path / "tb")
    scalars = read_scalars(path)
    assert [s for s, _ in scalars["system/gpu_util"]] == [0, 2, 4]
    assert [s for s, _ in scalars["train/samples_per_s"]] == list(range(6))


def test_without_a_sampler_nothing_is_sampled_and_outside_a_job_the_bar_stays(monkeypatch, capsys, tmp_path):
    pytest.importorskip("tensorboard")
    from labkit.core.scalars import event_files, read_scalars

    for name in ("CLOUD_ML_JOB_ID", "LABKIT_LOG_FORMAT", "LABKIT_NO_PROGRESS", "LABKIT_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    report(replace(CONFIG, progress=True, tensorboard_dir=str(tmp_path / "tb")))
    out, err = capsys.readouterr()
    assert "6/6 [" in err and not joblog.parse(out)  # tqdm's bar, as before
    (path,) = event_files(tmp_path / "tb")
    assert not [tag for tag in read_scalars(path) if tag.startswith("system/")]


def test_a_warning_during_training_and_a_divergence_have_their_severities(in_job, capsys):
    def warn_at_1(step, row):
        if step == 1:
            warnings.warn("checkpoint copy is late", RuntimeWarning, stacklevel=1)

    with warnings.catch_warnings(), pytest.raises(FloatingPointError):
        warnings.simplefilter("always")
        report(CONFIG, losses={3: math.nan}, on_step=warn_at_1)
    records = lines_of(capsys.readouterr().out)
    by_event = {r["event"]: r for r in records}
    assert by_event["warning"]["severity"] == "WARNING" and "checkpoint copy is late" in by_event["warning"]["message"]
    assert by_event["error"] == {"severity": "ERROR", "message": "FloatingPointError: loss is nan at step 3",
                                 "event": "error", "step": 3}
    assert [r["severity"] for r in records if r["event"] == "step"][-1] == "ERROR"


def test_a_preempted_run_says_so_as_a_warning_on_every_process(in_job, capsys):
    log = MetricsLog()
    with pytest.raises(Preempted), loop.Reporter(CONFIG, loop.Throughput(8), log, is_main=False) as reporter:
        for step in range(3):
            reporter.record(step, loss_of(step), 0.5)
        raise Preempted(2)  # what a loop raises once the stop after step 2 is checkpointed
    (record,) = lines_of(capsys.readouterr().out)  # a worker: no step lines, only how it ended
    assert record["severity"] == "WARNING" and record["event"] == "stopped" and record["step"] == 2
    assert "preempted during step 2" in record["message"]
