"""Notebook 07's preemption drill says every step number one way: counted from 0, as the metrics
file's `step` field and the checkpoint folders count them (`labkit.course.preemption.drill`)."""

from __future__ import annotations

import re

import pytest

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.core.metrics import load_metrics
from labkit.course.preemption import drill


def test_a_sigterm_drill_reads_signal_in_step_s_checkpoint_c_resume_with_c_plus_1():
    story = drill.drill_story("SIGTERM", "workerpool1[0]", 7, 9, 0)
    assert story[0] == "SIGTERM reached workerpool1[0] during step 7 (steps 0-6 were done)."
    assert "agreed to stop after step 8" in story[1] and "checkpointed step 8 (step-00000008)" in story[1]
    assert story[2] == ("The restarted job restored the checkpoint of step 8 and continued with step 9: "
                        "no step computed twice.")
    # One numbering: no "index", no "0-based" aside, no count of steps passed off as a step.
    assert not re.search(r"index|0-based|1-based", " ".join(story))


def test_a_sigkill_drill_names_the_periodic_checkpoint_and_the_steps_trained_twice():
    story = drill.drill_story("SIGKILL", "workerpool1[0]", 7, 4, 3)
    assert story[0].startswith("SIGKILL reached workerpool1[0] during step 7")
    assert "newest committed checkpoint was step 3 (step-00000003)" in story[1]
    assert story[2].endswith("continued with step 4: 3 step(s) computed twice (steps 4-6).")
    assert drill.drill_story("SIGTERM", "workerpool0", 1, 2, 0)[0].endswith("(step 0 was done).")
    assert drill.drill_story("SIGKILL", "workerpool0", 2, 0, 2)[1].startswith(
        "No checkpoint was committed: the restarted job started again with step 0, 2 step(s)")


def test_the_plan_names_the_checkpoint_steps_in_the_same_numbering():
    cfg = drill.DrillConfig(steps=12, checkpoint_every=4, preempt_step=7)
    assert cfg.periodic_checkpoints == [3, 7, 11]  # after 4, 8 and 12 steps: steps 3, 7, 11
    assert "12 steps (0-11), a checkpoint after steps 3, 7, 11; SIGTERM to workerpool1[0] during step 7" in cfg.text()
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
    story = " ".join(r.story())
    assert f"during step {r.signal_step} " in story and f"checkpointed step {stopped} " in story
    assert f"continued with step {stopped + 1}:" in story
    assert f"resumed with step {stopped + 1} from the checkpoint of step {stopped}" in r.text()
    assert any(f"sent SIGTERM to workerpool1[0] during step {r.signal_step} " in e for e in r.events())
    rows = r.attempt_rows()
    assert {row["exit"] for row in rows if row["attempt"] == 0} == {143}
    assert {row["steps recorded"] for row in rows} == {f"0-{stopped}", f"{stopped + 1}-7"}
