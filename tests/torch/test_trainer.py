"""The PyTorch trainer's loop (`labkit.torch.trainer.Trainer.train`) on CPU, watched step by
step: each step dispatched and reported once in order (and, reading the loss late, each step
read once the next is dispatched), where a resume starts, a resume with nothing left to train,
the checkpoint cadence, the preemption drill and a loss that diverges. What
tests/torch/test_engine.py shows of the same runs (losses, bit-exact resumes, the chained
SIGTERM handler, background saves) is not repeated here; that every replica stops at the step
they agreed on needs two processes (tests/vertex/test_emulator.py's preemption drill)."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from labkit.core import checkpoint, loop
from labkit.core.metrics import load_metrics
from labkit.core.train_config import Preempted, TrainConfig


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, trainer, DistInfo
    torch = pytest.importorskip("torch")
    from labkit.torch import trainer
    from labkit.torch.distributed import DistInfo


BASE = TrainConfig(model="cnn", steps=6, batch_size=8, num_samples=32, eval_samples=0, progress=False,
                   device="cpu")


@pytest.fixture
def events(monkeypatch) -> list[tuple]:
    """What the loop does, in order, while the real work still runs: ("run", step) when it
    dispatches an optimizer step (the step is the LR schedule's count of steps taken, so a
    restored run counts on from its checkpoint), ("read", step) when it reports a step's loss,
    ("save", step, wait) when it checkpoints."""
    seen: list[tuple] = []
    dispatch, record, save = trainer.Trainer.train_step, loop.Reporter.record, trainer.Trainer.save

    def train_step(self, batches):
        seen.append(("run", self.c.scheduler.last_epoch))
        return dispatch(self, batches)

    def reported(self, step, *args, **kwargs):
        seen.append(("read", step))
        return record(self, step, *args, **kwargs)

    def saved(self, step, wait):
        seen.append(("save", step, wait))
        return save(self, step, wait)

    monkeypatch.setattr(trainer.Trainer, "train_step", train_step)
    monkeypatch.setattr(loop.Reporter, "record", reported)
    monkeypatch.setattr(trainer.Trainer, "save", saved)
    return seen


def _dirs(tmp_path, **changes) -> TrainConfig:
    return replace(BASE, checkpoint_dir=str(tmp_path / "ck"), metrics_out=str(tmp_path / "m.json"), **changes)


@pytest.mark.slow
@pytest.mark.parametrize("late, order", [
    (False, [("run", 0), ("read", 0), ("run", 1), ("read", 1), ("run", 2), ("read", 2), ("save", 2, False),
             ("run", 3), ("read", 3), ("run", 4), ("read", 4), ("run", 5), ("read", 5), ("save", 5, True)]),
    # Each step is read once the next is dispatched; a checkpoint's step is read before its save.
    (True, [("run", 0), ("run", 1), ("read", 0), ("run", 2), ("read", 1), ("read", 2), ("save", 2, False),
            ("run", 3), ("run", 4), ("read", 3), ("run", 5), ("read", 4), ("read", 5), ("save", 5, True)]),
], ids=["read-at-once", "read-late"])
def test_every_step_is_dispatched_and_reported_once_in_order(tmp_path, events, late, order):
    log = trainer.fit(_dirs(tmp_path, checkpoint_every=3), read_loss_late=late)
    assert events == order
    assert [s["step"] for s in log.steps] == list(range(6)) and log.run["resumed_from_step"] is None
    assert checkpoint.committed_steps(str(tmp_path / "ck")) == [2, 5]


def test_a_resumed_run_starts_at_its_step_and_says_so(tmp_path, events):
    first = trainer.fit(_dirs(tmp_path, steps=4))  # its checkpoint holds step 3
    events.clear()
    seen = []
    log = trainer.fit(_dirs(tmp_path), on_step=lambda step, row: seen.append(step))
    assert events == [("run", 4), ("read", 4), ("run", 5), ("read", 5), ("save", 5, True)]
    assert seen == [4, 5] and log.run["resumed_from_step"] == 3
    # The earlier attempt's steps come from its metrics file: the file holds every step once.
    written = load_metrics(tmp_path / "m.json")
    assert written["run"]["resumed_from_step"] == 3 and [s["step"] for s in written["steps"]] == list(range(6))
    assert written["steps"][:4] == first.steps


def test_a_run_whose_checkpoint_holds_its_last_step_keeps_the_metrics_file(tmp_path, events):
    config = _dirs(tmp_path, steps=4)
    trainer.fit(config)
    written = (tmp_path / "m.json").read_text()
    events.clear()
    log = trainer.fit(config)
    assert events == [] and (tmp_path / "m.json").read_text() == written  # nothing trained or rewritten
    assert log.run["already_complete"] and log.run["checkpointed_steps"] == 4 and len(log.steps) == 4
    other = tmp_path / "other.json"
    shorter = trainer.fit(replace(config, steps=3, metrics_out=str(other)))  # the checkpoint is past it
    assert shorter.run["already_complete"] and shorter.run["checkpointed_steps"] == 4
    assert shorter.steps == [] and not other.exists() and events == []


@pytest.mark.slow
def test_checkpoints_every_k_steps_and_waits_for_the_last(tmp_path, events):
    run = trainer.Trainer(_dirs(tmp_path, steps=7, checkpoint_every=3, keep_checkpoints=0), DistInfo(),
                          torch.device("cpu"))
    run.train()
    assert [e for e in events if e[0] == "save"] == [("save", 2, False), ("save", 5, False), ("save", 6, True)]
    assert not run.saver.in_flight and checkpoint.committed_steps(str(tmp_path / "ck")) == [2, 5, 6]
    events.clear()
    trainer.fit(replace(BASE, checkpoint_every=3))  # no checkpoint folder: no saves
    assert [e for e in events if e[0] == "save"] == [] and len(events) == 12


@pytest.mark.slow
def test_the_drill_stops_after_checkpointing_the_step_it_hit(tmp_path, events, monkeypatch):
    flags = []
    agree = trainer.agree

    def agreed(loss, stop, info, strategy=None):
        flags.append(stop)
        return agree(loss, stop, info, strategy)

    monkeypatch.setattr(trainer, "agree", agreed)
    with pytest.raises(Preempted) as info:
        trainer.fit(_dirs(tmp_path, checkpoint_every=2, preempt_at=2))
    assert (info.value.step, info.value.saved) == (2, True)
    assert events == [("run", 0), ("read", 0), ("run", 1), ("read", 1), ("save", 1, False),
                      ("run", 2), ("read", 2), ("save", 2, True)]
    assert flags == [False, False, True]  # the step that was hit carries its own stop request
    assert [s["step"] for s in load_metrics(tmp_path / "m.json")["steps"]] == [0, 1, 2]
    assert checkpoint.committed_steps(str(tmp_path / "ck")) == [1, 2]


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_the_file_shows_it(tmp_path, events):
    # AdamW moves every weight by about lr in its first step: at 1e30 the next forward overflows.
    with pytest.raises(FloatingPointError, match=r"^loss is (nan|inf|-inf) at step \d+$") as info:
        trainer.fit(_dirs(tmp_path, lr=1e30, checkpoint_every=1, keep_checkpoints=0))
    bad = int(re.search(r"step (\d+)$", str(info.value)).group(1))
    assert bad >= 1  # step 0's loss is computed before any update
    steps = load_metrics(tmp_path / "m.json")["steps"]
    assert [s["step"] for s in steps] == list(range(bad + 1))  # the bad step is shown
    assert all(math.isfinite(s["loss"]) for s in steps[:-1]) and not math.isfinite(steps[-1]["loss"])
    # The diverged step is not checkpointed; the saves before it are all written.
    assert [e for e in events if e[0] == "save"] == [("save", s, False) for s in range(bad)]
    assert checkpoint.committed_steps(str(tmp_path / "ck")) == list(range(bad))
