"""The shared training loop (`labkit.core.loop`), driven by a fake engine without any framework:
step cadence, the preemption drill, checkpoint cadence, reading the loss one step late, the
non-finite loss check, metrics, progress and TensorBoard."""

from __future__ import annotations

import math
import signal
from dataclasses import replace

import pytest

from labkit.core import loop
from labkit.core.metrics import MetricsLog, load_metrics
from labkit.core.train_config import Preempted, TrainConfig

CONFIG = TrainConfig(steps=6, batch_size=8, progress=False)


class FakeEngine:
    """Records what the loop asks of it, in order. Step `s` has loss `losses[s]` (default
    1/(s+1)); `agreed_stop_at` plays another process that received SIGTERM."""

    def __init__(self, losses: dict[int, float] | None = None, agreed_stop_at: int | None = None,
                 checkpoints: bool = True):
        self.events: list[tuple] = []
        self.losses = losses or {}
        self.agreed_stop_at = agreed_stop_at
        self.checkpoints = checkpoints
        self.next_step = 0  # the step whose batch comes next
        self.stop_requests: list[bool] = []

    def next_batch(self) -> int:
        self.events.append(("batch", self.next_step))
        self.next_step += 1
        return self.next_step - 1

    def run_step(self, batch: int, stop_requested: bool) -> tuple[int, bool]:
        self.events.append(("run", batch))
        self.stop_requests.append(stop_requested)
        return batch, stop_requested

    def read_step(self, handle: tuple[int, bool]) -> loop.StepOutcome:
        step, stop_requested = handle
        self.events.append(("read", step))
        stop = stop_requested or step == self.agreed_stop_at
        return loop.StepOutcome(self.losses.get(step, 1.0 / (step + 1)), stop, skipped=step == 1)

    def save(self, step: int, wait: bool) -> None:
        self.events.append(("save", step, wait))

    def wait_for_saves(self) -> None:
        self.events.append(("wait_for_saves",))

    def engine(self) -> loop.Engine:
        saves = {"save": self.save, "wait_for_saves": self.wait_for_saves} if self.checkpoints else {}
        return loop.Engine(self.next_batch, self.run_step, self.read_step,
                           lr=lambda step: 0.1 * step, peak_memory=lambda: 1234,
                           final_run_info=lambda: {"final": "yes"}, **saves)

    def of(self, kind: str) -> list[tuple]:
        return [e for e in self.events if e[0] == kind]


def _run(config: TrainConfig = CONFIG, fake: FakeEngine | None = None, **kwargs):
    fake = fake or FakeEngine()
    log = loop.run(config, fake.engine(), MetricsLog({"framework": "fake"}), **kwargs)
    return fake, log


def test_every_step_runs_once_in_order_and_is_reported():
    seen = []
    fake, log = _run(on_step=lambda step, row: seen.append((step, row["loss"])))
    assert [s["step"] for s in log.steps] == list(range(6))
    assert seen == [(s, 1.0 / (s + 1)) for s in range(6)]
    assert fake.of("run") == [("run", s) for s in range(6)]
    row = log.steps[1]
    assert (row["lr"], row["peak_memory_bytes"], row["skipped"]) == (0.1, 1234, True)
    assert row["data_time_s"] >= 0 and row["samples_per_s"] == pytest.approx(8 / row["step_time_s"])
    assert log.run["resumed_from_step"] is None and log.run["final"] == "yes"


def test_a_resumed_run_starts_at_its_step_and_says_so(tmp_path):
    fake = FakeEngine()
    fake.next_step = 4
    _, log = _run(fake=fake, start=4, role=loop.ProcessRole(metrics_path=str(tmp_path / "m.json")))
    assert [s["step"] for s in log.steps] == [4, 5]
    assert load_metrics(tmp_path / "m.json")["run"]["resumed_from_step"] == 3
    fake, log = _run(fake=FakeEngine(), start=6)  # nothing left to do
    assert log.steps == [] and fake.of("run") == []


def test_a_run_whose_checkpoint_holds_its_last_step_keeps_the_metrics_file(tmp_path):
    out = tmp_path / "m.json"
    _run(role=loop.ProcessRole(metrics_path=str(out)))
    written = out.read_text()
    fake, log = _run(start=CONFIG.steps, role=loop.ProcessRole(metrics_path=str(out)))
    assert fake.events == [] and out.read_text() == written  # nothing trained, nothing rewritten
    assert log.run["already_complete"] and len(log.steps) == CONFIG.steps
    _, log = _run(start=CONFIG.steps, role=loop.ProcessRole(metrics_path=str(tmp_path / "none.json")))
    assert log.run["already_complete"] and not (tmp_path / "none.json").exists()


def test_checkpoints_every_k_steps_and_waits_for_the_last():
    fake, _ = _run(replace(CONFIG, steps=10, checkpoint_every=3))
    assert fake.of("save") == [("save", 2, False), ("save", 5, False), ("save", 8, False),
                               ("save", 9, True)]
    assert fake.events[-1] == ("wait_for_saves",)
    fake, _ = _run(replace(CONFIG, checkpoint_every=3), FakeEngine(checkpoints=False))
    assert fake.of("save") == []


def test_the_drill_stops_after_checkpointing_the_step_it_hit(tmp_path):
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        out = tmp_path / "m.json"
        with pytest.raises(Preempted) as info:
            _run(replace(CONFIG, checkpoint_every=2, preempt_at=2),
                 role=loop.ProcessRole(metrics_path=str(out)), fake=(fake := FakeEngine()))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert info.value.step == 2
    assert fake.of("save") == [("save", 1, False), ("save", 2, True)]
    assert fake.stop_requests == [False, False, True]  # the step saw its own SIGTERM
    written = load_metrics(out)
    assert [s["step"] for s in written["steps"]] == [0, 1, 2] and written["run"]["final"] == "yes"
    assert calls == [signal.SIGTERM]  # the handler installed before ours is called after the save


def test_a_stop_agreed_by_another_process_stops_this_one_at_the_same_step():
    with pytest.raises(Preempted) as info:
        _run(fake=(fake := FakeEngine(agreed_stop_at=3)), role=loop.ProcessRole(processes=2))
    assert info.value.step == 3 and fake.of("save") == [("save", 3, True)]


def test_reading_late_reads_each_step_after_the_next_is_dispatched_and_drains_before_saving():
    fake, late = _run(replace(CONFIG, checkpoint_every=3), read_loss_late=True)
    _, now = _run(replace(CONFIG, checkpoint_every=3))
    assert late.losses == now.losses
    order = [e[:2] for e in fake.events if e[0] in ("run", "read", "save")]
    assert order == [("run", 0), ("run", 1), ("read", 0), ("run", 2), ("read", 1), ("read", 2),
                     ("save", 2), ("run", 3), ("run", 4), ("read", 3), ("run", 5), ("read", 4),
                     ("read", 5), ("save", 5)]
    with pytest.raises(ValueError, match="read_loss_late needs a single process"):
        _run(read_loss_late=True, role=loop.ProcessRole(processes=2))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_stops_the_run_naming_the_step(tmp_path, bad):
    out = tmp_path / "m.json"
    with pytest.raises(FloatingPointError, match=f"loss is {bad} at step 2"):
        _run(fake=(fake := FakeEngine({2: bad})), role=loop.ProcessRole(metrics_path=str(out)))
    assert [s["step"] for s in load_metrics(out)["steps"]] == [0, 1, 2]  # the bad step is shown
    assert fake.of("save") == [] and fake.events[-1] == ("wait_for_saves",)


def test_throughput_and_mfu_follow_from_the_step_time():
    rates = loop.Throughput(batch_size=8, tokens_per_sample=16, flops_per_sample=1e9,
                            peak_flops=1e12, devices=2)
    assert rates.rates(0.5) == (16.0, 256.0, pytest.approx(16 * 1e9 / 2 / 1e12))
    assert loop.Throughput(8).rates(2.0) == (4.0, None, None)
    _, log = _run(throughput=rates)
    row = log.steps[0]
    assert row["mfu"] == pytest.approx(8 / row["step_time_s"] * 1e9 / 2 / 1e12)
    assert row["tokens_per_s"] == pytest.approx(row["samples_per_s"] * 16)


def test_checkpoint_policy():
    policy = loop.CheckpointPolicy(steps=10, every=4)
    assert [s for s in range(10) if policy.saves_after(s, stop=False)] == [3, 7, 9]
    assert policy.saves_after(5, stop=True) and policy.waits_after(5, stop=True)
    assert not policy.waits_after(3, stop=False) and policy.waits_after(9, stop=False)
    assert not loop.CheckpointPolicy(10, 4, enabled=False).saves_after(9, stop=True)


def test_progress_bar_on_the_main_process_only(capsys, monkeypatch):
    monkeypatch.delenv("LABKIT_NO_PROGRESS", raising=False)
    _run(replace(CONFIG, progress=True))
    assert "6/6 [" in capsys.readouterr().err  # what the local Vertex emulator watches
    _run(replace(CONFIG, progress=True), role=loop.ProcessRole(is_main=False))
    monkeypatch.setenv("LABKIT_NO_PROGRESS", "1")
    _run(replace(CONFIG, progress=True))
    assert "/6 [" not in capsys.readouterr().err


def test_tensorboard_scalars_are_readable_event_records(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2

    from labkit.data import read_records

    _run(replace(CONFIG, tensorboard_dir=str(tmp_path / "tb")))
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    events = [event_pb2.Event.FromString(r) for r in read_records([str(f) for f in files])]
    assert events[0].file_version == "brain.Event:2"
    losses = [(e.step, v.simple_value) for e in events[1:] for v in e.summary.value
              if v.tag == "train/loss"]
    assert losses == [(s, pytest.approx(1.0 / (s + 1))) for s in range(6)]
    assert {v.tag for v in events[1].summary.value} >= {"train/step_time_s", "train/lr"}


def test_the_reporter_alone_records_and_checks_a_step():
    log = MetricsLog()
    with loop.Reporter(CONFIG, loop.Throughput(8), log) as reporter:
        row = reporter.record(3, 0.5, 2.0, lr=0.01)
        assert row == log.steps[0] and row["samples_per_s"] == 4.0
        with pytest.raises(FloatingPointError, match="step 4"):
            reporter.record(4, math.nan, 1.0)
    assert len(log.steps) == 2
