"""The decisions the training loops share (`labkit.core.loop`), without any framework: what a
step reports (`Reporter`: metrics, throughput, progress, TensorBoard, the non-finite loss
check), when to checkpoint (`CheckpointPolicy`), and the small parts a loop calls in turn
(`begin`, `StepClock`, `timed`, `save_checkpoint`, `stopped`, `keep_heldout`,
`already_complete`, `write_metrics`). The loops that call them are tested with their
frameworks (tests/torch/test_trainer.py)."""

from __future__ import annotations

import math
import signal
import time
from dataclasses import replace

import pytest

from labkit.core import hypertune, loop
from labkit.core.metrics import MetricsLog, load_metrics
from labkit.core.preemption import PreemptionGuard
from labkit.core.train_config import Preempted, TrainConfig

CONFIG = TrainConfig(steps=6, batch_size=8, progress=False)


def loss_of(step: int) -> float:
    return 1.0 / (step + 1)


def report(config: TrainConfig = CONFIG, *, losses: dict[int, float] | None = None,
           log: MetricsLog | None = None, throughput: loop.Throughput | None = None,
           **reporter_args) -> MetricsLog:
    """Steps 0 … `config.steps - 1` reported through a `Reporter` as a loop reports them: step
    `s` has loss `losses[s]` (default 1/(s+1)), a step time of 0.5 s and lr 0.1·s.
    `reporter_args`: `is_main`, `start`, `on_step`, `system`."""
    log = MetricsLog() if log is None else log
    losses = losses or {}
    with loop.Reporter(config, throughput or loop.Throughput(config.batch_size), log,
                       **reporter_args) as reporter:
        for step in range(config.steps):
            reporter.record(step, losses.get(step, loss_of(step)), 0.5, data_time=0.01, lr=0.1 * step)
    return log


def test_the_reporter_records_each_step_and_checks_its_loss():
    log, seen = MetricsLog(), []
    with loop.Reporter(CONFIG, loop.Throughput(8), log, on_step=lambda s, row: seen.append((s, row))) as reporter:
        row = reporter.record(3, 0.5, 2.0, data_time=0.25, lr=0.01, skipped=True, peak_memory=1234)
        assert row == log.steps[0] and seen == [(3, row)]
        assert (row["samples_per_s"], row["data_time_s"], row["lr"]) == (4.0, 0.25, 0.01)
        assert (row["skipped"], row["peak_memory_bytes"]) == (True, 1234)
        with pytest.raises(FloatingPointError, match="^loss is nan at step 4$"):
            reporter.record(4, math.nan, 1.0)
    assert [s["step"] for s in log.steps] == [3, 4]  # the bad step is reported before the check


def test_throughput_and_mfu_follow_from_the_step_time():
    rates = loop.Throughput(batch_size=8, tokens_per_sample=16, flops_per_sample=1e9,
                            peak_flops=1e12, devices=2)
    assert rates.rates(0.5) == (16.0, 256.0, pytest.approx(16 * 1e9 / 2 / 1e12))
    assert loop.Throughput(8).rates(2.0) == (4.0, None, None)
    row = report(throughput=rates).steps[0]  # a step time of 0.5 s
    assert (row["samples_per_s"], row["tokens_per_s"]) == (16.0, 256.0)
    assert row["mfu"] == pytest.approx(16 * 1e9 / 2 / 1e12)


def test_checkpoint_policy():
    policy = loop.CheckpointPolicy(steps=10, every=4)
    assert [s for s in range(10) if policy.saves_after(s, stop=False)] == [3, 7, 9]
    assert policy.saves_after(5, stop=True) and policy.waits_after(5, stop=True)
    assert not policy.waits_after(3, stop=False) and policy.waits_after(9, stop=False)
    assert not loop.CheckpointPolicy(10, 4, enabled=False).saves_after(9, stop=True)
    assert loop.CheckpointPolicy.of(replace(CONFIG, checkpoint_every=2), enabled=True) == loop.CheckpointPolicy(6, 2)


def test_progress_bar_on_the_main_process_only(capsys, monkeypatch):
    monkeypatch.delenv("LABKIT_NO_PROGRESS", raising=False)
    report(replace(CONFIG, progress=True))
    assert "6/6 [" in capsys.readouterr().err  # what the local Vertex emulator watches
    report(replace(CONFIG, progress=True), is_main=False)
    monkeypatch.setenv("LABKIT_NO_PROGRESS", "1")
    report(replace(CONFIG, progress=True))
    assert "/6 [" not in capsys.readouterr().err


def test_tensorboard_scalars_are_readable_event_records(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2

    from labkit.data import read_records

    report(replace(CONFIG, tensorboard_dir=str(tmp_path / "tb")))
    report(replace(CONFIG, tensorboard_dir=str(tmp_path / "worker")), is_main=False)
    assert not (tmp_path / "worker").exists()  # only the main process writes
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    events = [event_pb2.Event.FromString(r) for r in read_records([str(f) for f in files])]
    assert events[0].file_version == "brain.Event:2"
    losses = [(e.step, v.simple_value) for e in events[1:] for v in e.summary.value
              if v.tag == "train/loss"]
    assert losses == [(s, pytest.approx(loss_of(s))) for s in range(6)]
    assert {v.tag for v in events[1].summary.value} >= {"train/step_time_s", "train/lr"}


def test_begin_records_the_resume_and_keeps_the_earlier_attempts_steps(tmp_path):
    path = str(tmp_path / "m.json")
    report(log=MetricsLog({"attempt": 1})).write(path)  # an earlier attempt reached step 5
    log = MetricsLog({"attempt": 2})
    loop.begin(log, path, 4)  # steps 4 and 5 are trained again: theirs are dropped
    assert log.run["resumed_from_step"] == 3 and [s["step"] for s in log.steps] == [0, 1, 2, 3]
    assert log.steps[2]["loss"] == loss_of(2)
    fresh = MetricsLog()
    loop.begin(fresh, path, 0)
    assert fresh.run["resumed_from_step"] is None and fresh.steps == []
    elsewhere = MetricsLog()
    loop.begin(elsewhere, None, 4)  # a process without a metrics file
    assert elsewhere.run["resumed_from_step"] == 3 and elsewhere.steps == []


def test_the_step_clock_times_from_lap_to_lap_and_leaves_paused_time_out():
    clock = loop.StepClock()
    time.sleep(0.05)
    with clock.paused():
        time.sleep(0.5)  # a held-out evaluation: no step's time
    first = clock.lap()
    time.sleep(0.02)
    second = clock.lap()
    assert 0.05 <= first < 0.5 and second >= 0.02


def test_timed_returns_the_value_and_the_seconds_it_took():
    value, seconds = loop.timed(lambda: time.sleep(0.02) or "batch")
    assert value == "batch" and seconds >= 0.02


def test_a_checkpoint_that_fails_on_a_stop_says_the_stop_has_none_and_keeps_the_metrics():
    saved, kept = [], []
    guard = PreemptionGuard()  # not entered: its signal is SIGTERM until one arrives
    loop.save_checkpoint(lambda step, wait: saved.append((step, wait)), 3, wait=True, stop=True,
                         guard=guard, on_failed_stop=lambda: kept.append("metrics"))
    assert saved == [(3, True)] and kept == []

    def full(step, wait):
        raise PermissionError(f"cannot write step {step}")

    with pytest.raises(PermissionError, match="^stopped by SIGTERM during step 3, but its checkpoint "
                                              "failed: cannot write step 3$") as info:
        loop.save_checkpoint(full, 3, wait=True, stop=True, guard=guard,
                             on_failed_stop=lambda: kept.append("metrics"))
    assert isinstance(info.value.__cause__, PermissionError) and kept == ["metrics"]

    def metrics_fail_too():
        raise OSError("the metrics file cannot be written either")

    guard.signum = signal.SIGINT
    with pytest.raises(OSError, match=r"^stopped by Ctrl-C \(SIGINT\) during step 4, but its checkpoint"):
        loop.save_checkpoint(full, 4, wait=True, stop=True, guard=guard, on_failed_stop=metrics_fail_too)


def test_a_checkpoint_that_fails_without_a_stop_raises_its_own_error():
    error, kept = OSError("no space left on device"), []

    def full(step, wait):
        raise error

    with pytest.raises(OSError) as info:
        loop.save_checkpoint(full, 2, wait=False, stop=False, guard=PreemptionGuard(),
                             on_failed_stop=lambda: kept.append("metrics"))
    assert info.value is error and kept == []


def test_a_stop_chains_the_earlier_handler_and_says_whether_it_saved():
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with PreemptionGuard() as guard:
            guard.trigger()  # the drill's SIGTERM: our handler only sets the flag
            assert guard.requested and calls == []
            stop = loop.stopped(guard, 2, saved=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert calls == [signal.SIGTERM]  # the earlier handler runs once the checkpoint is written
    assert isinstance(stop, Preempted) and (stop.step, stop.reason, stop.saved) == (2, "SIGTERM", True)
    assert str(stop) == "preempted during step 2; state checkpointed"
    assert "nothing saved" in str(loop.stopped(PreemptionGuard(), 4, saved=False))


def test_held_out_entries_go_to_the_run_section_and_the_last_steps_row():
    log = report()
    loop.keep_heldout(log, {"heldout": {"loss": 0.7, "samples": 32}})
    assert log.run["heldout"] == {"loss": 0.7, "samples": 32}
    assert log.steps[-1]["heldout_loss"] == 0.7 and "heldout_loss" not in log.steps[-2]
    before = log.to_dict()
    loop.keep_heldout(log, {})  # no held-out data: nothing changes
    assert log.to_dict() == before
    empty = MetricsLog()
    loop.keep_heldout(empty, {"heldout": {"loss": 0.7}})
    assert empty.run["heldout"] == {"loss": 0.7} and empty.steps == []


def test_held_out_loss_is_measured_at_checkpoints_only_in_a_trial_that_tunes_it(monkeypatch):
    monkeypatch.delenv(hypertune.TUNING_METRIC_ENV, raising=False)
    assert not loop.evaluates_at_checkpoints()
    monkeypatch.setenv(hypertune.TUNING_METRIC_ENV, "loss")
    assert not loop.evaluates_at_checkpoints()
    monkeypatch.setenv(hypertune.TUNING_METRIC_ENV, "heldout_loss")
    assert loop.evaluates_at_checkpoints()


def test_an_already_complete_run_keeps_the_metrics_file_of_the_run_that_trained(tmp_path):
    path = tmp_path / "m.json"
    report(log=MetricsLog({"attempt": 1})).write(path)
    written = path.read_text()
    log = loop.already_complete(MetricsLog({"attempt": 2}), str(path), 6)
    assert path.read_text() == written  # nothing rewritten
    assert log.run["attempt"] == 1 and len(log.steps) == 6
    assert log.run["already_complete"] and log.run["checkpointed_steps"] == 6
    fresh = loop.already_complete(MetricsLog({"attempt": 2}), str(tmp_path / "none.json"))
    assert fresh.run == {"attempt": 2, "already_complete": True} and not (tmp_path / "none.json").exists()
    other = tmp_path / "notes.json"
    other.write_text("not a metrics file")
    kept = loop.already_complete(MetricsLog({"attempt": 3}), str(other), 9)
    assert kept.run["attempt"] == 3 and kept.run["checkpointed_steps"] == 9
    assert other.read_text() == "not a metrics file"


def test_write_metrics_adds_the_final_entries_and_writes_only_where_this_process_has_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv(hypertune.TUNING_METRIC_ENV, raising=False)
    log = report()
    loop.write_metrics(log, str(tmp_path / "m.json"), {"memory_per_rank": 5})
    written = load_metrics(tmp_path / "m.json")
    assert written["run"]["memory_per_rank"] == 5 and [s["step"] for s in written["steps"]] == list(range(6))
    loop.write_metrics(log, None, {"final": "yes"})  # a replica: its log only
    assert log.run["final"] == "yes" and list(tmp_path.iterdir()) == [tmp_path / "m.json"]


class _FailingSaver:
    def __init__(self):
        self.waited = 0

    def wait(self):
        self.waited += 1
        raise OSError("bucket gone")


def test_the_save_in_flight_is_joined_and_never_hides_the_runs_own_error():
    saver = _FailingSaver()
    with pytest.raises(OSError, match="bucket gone"):
        with loop.saves_joined(saver):
            pass  # a run that ended well: the save's failure is the error
    with pytest.warns(UserWarning, match="failed too: bucket gone"):
        with pytest.raises(FloatingPointError, match="loss is nan"):
            with loop.saves_joined(saver):
                raise FloatingPointError("loss is nan at step 3")
    assert saver.waited == 2
    with loop.saves_joined(None):
        pass
