"""Notebook 07's preemption drill holds every step number one way: counted from 0, as the metrics
file's `step` field and the checkpoint folders count them (`labkit.course.preemption.drill`), with
the verdict on the checkpoint the restarted job restored."""

from __future__ import annotations

import pytest

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.core.metrics import load_metrics
from labkit.course.preemption import drill


def _result(signal: str, signal_step: int | None, resumed_at: int | None, redone: int) -> drill.DrillResult:
    """A drill's result with only the numbers `restored` and `steps_computed_twice` read."""
    cfg = drill.DrillConfig(steps=12, checkpoint_every=4, preempt_step=7, signal=signal)
    return drill.DrillResult(cfg, None, None, [], [], resumed_at_step=resumed_at, redone_steps=redone,
                             signal_step=signal_step)


def test_a_sigterm_drill_restores_the_checkpoint_of_the_step_it_stopped_after():
    r = _result("SIGTERM", 7, 9, 0)  # signal during step 7, every replica stopped after step 8
    assert (r.checkpoint_step, r.restored, r.steps_computed_twice) == (8, drill.ON_THE_SIGNAL, [])
    # A SIGTERM whose step was not checkpointed: the newest committed one was periodic.
    assert _result("SIGTERM", 7, 4, 3).restored == drill.PERIODIC


def test_a_sigkill_drill_names_the_periodic_checkpoint_and_the_steps_trained_twice():
    r = _result("SIGKILL", 7, 4, 3)
    assert (r.checkpoint_step, r.restored, r.steps_computed_twice) == (3, drill.PERIODIC, [4, 5, 6])
    nothing = _result("SIGKILL", 2, 0, 2)
    assert nothing.restored == drill.NONE_COMMITTED and nothing.steps_computed_twice == [0, 1]
    assert _result("SIGTERM", 7, None, 0).restored == drill.NOT_RESUMED


def test_the_plan_names_the_checkpoint_steps_in_the_same_numbering():
    cfg = drill.DrillConfig(steps=12, checkpoint_every=4, preempt_step=7)
    assert cfg.periodic_checkpoints == [3, 7, 11]  # after 4, 8 and 12 steps: steps 3, 7, 11
    assert drill.DrillConfig(steps=5, checkpoint_every=0, preempt_step=2).periodic_checkpoints == [4]
    with pytest.raises(ParameterError, match="preempt_step"):
        drill.DrillConfig(steps=8, preempt_step=8)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_real_drill_tells_its_steps_as_its_metrics_file_and_checkpoints_number_them(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("LABKIT_PROGRESS", "off")  # as a headless notebook run may set it
    cfg = drill.DrillConfig(steps=8, preempt_step=4, checkpoint_every=3, input_latency_ms=100)
    r = drill.preemption_drill(cfg, tmp_path)
    assert r.losses_equal and r.signal_step is not None and r.signal_step >= cfg.preempt_step
    # The first attempt's metrics file ends with the step it stopped after, and that step's
    # checkpoint is the one the restarted job restored.
    first = load_metrics(r.preempted.snapshots[0][f"{cfg.bucket}/preempted/metrics.json"])
    stopped = first["steps"][-1]["step"]
    assert r.checkpoint_step == stopped and r.resumed_at_step == stopped + 1
    ckpts = checkpoint.committed_steps(str(r.preempted.local(f"{cfg.bucket}/preempted/checkpoints")))
    assert stopped in ckpts and r.attempt_steps[0] == (0, stopped) and r.attempt_steps[1] == (stopped + 1, 7)
    assert r.restored == drill.ON_THE_SIGNAL and r.checkpoint_step >= r.signal_step
    assert r.steps_computed_twice == [] and r.weights_equal and r.max_weight_difference == 0
    assert any(f"sent SIGTERM to workerpool1[0] during step {r.signal_step} " in e for e in r.events())
    rows = r.attempt_rows()
    assert {row["exit"] for row in rows if row["attempt"] == 0} == {143}
    assert {row["steps recorded"] for row in rows} == {f"0-{stopped}", f"{stopped + 1}-7"}
