"""Notebook 08's activation-checkpointing trade (`labkit.course.memory.checkpointing_tradeoff`):
the step-time cost comes from interleaved repeats, and its verdict and headline say "no
measurable difference here" when the two settings' runs overlap; gradient accumulation's
verdict comes from the gradients' largest relative difference."""

from __future__ import annotations

import pytest

from labkit.core import stats
from labkit.core.config import ParameterError
from labkit.core.train_config import TrainConfig
from labkit.notebooks import key_comparison


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global memory
    pytest.importorskip("torch")
    from labkit.course import memory  # imports labkit.torch


def trade(off_ms, on_ms) -> memory.CheckpointingTradeoff:
    return memory.CheckpointingTradeoff(stats.compare(off_ms, on_ms, higher_is_better=False), (10.0, 3.0),
                                        (5.4, 5.4), (None, None), "cpu", 6)


def test_overlapping_runs_give_no_cost_in_the_headline(capsys):
    busy = trade([50.0, 120.0, 55.0], [107.0, 110.0, 104.0])  # one slow spell: the ranges overlap
    assert busy.step_ms.winner is None and busy.step_verdict == stats.NO_DIFFERENCE
    assert len(busy.step_ms.a.values) == len(busy.step_ms.b.values) == 3
    key_comparison("activation checkpointing: step time with / without", busy.step_ms,
                   "without checkpointing", "with checkpointing", "ms")
    headline = capsys.readouterr().out
    assert headline.startswith(f"activation checkpointing: step time with / without: {stats.NO_DIFFERENCE} (")


def test_separate_runs_give_the_ratio_of_the_medians(capsys):
    clear = trade([50.0, 52.0, 51.0], [107.0, 110.0, 104.0])
    assert clear.step_ms.winner == "a" and clear.step_ms.ratio == pytest.approx(107.0 / 51.0)
    assert clear.step_verdict == "slower" and clear.memory_ratio == pytest.approx(0.3)
    off, on = clear.rows()
    assert (off["step_time_ms"], off["step_time_range_ms"], off["runs"]) == (51.0, "50–52", 3)
    assert on["activation_checkpointing"] and on["step_time_range_ms"] == "104–110"
    key_comparison("activation checkpointing: step time with / without", clear.step_ms,
                   "without checkpointing", "with checkpointing", "ms")
    assert "step time with / without: 2.1× (" in capsys.readouterr().out


def test_accumulation_is_called_exact_only_below_float_rounding():
    cfg = TrainConfig(model="cnn", scale="smoke", device="cpu", batch_size=8)
    gap = memory.accumulation_gradient_gap(cfg, 4)
    assert gap["max_rel_diff"] < memory.SAME_GRADIENTS_BELOW and gap["verdict"] == memory.SAME_GRADIENTS
    assert gap["micro_steps"] == 4 and 0 < gap["max_abs_grad"]
    batch_norm = memory.accumulation_gradient_gap(TrainConfig(model="resnet", scale="smoke", device="cpu",
                                                              batch_size=8), 4)
    assert batch_norm["verdict"] == memory.DIFFERENT_GRADIENTS  # batch statistics per micro-batch
    with pytest.raises(ValueError, match="micro_steps"):
        memory.accumulation_gradient_gap(cfg, 3)


def test_fewer_than_three_runs_are_refused_before_training():
    with pytest.raises(ParameterError, match="repeats"):
        memory.checkpointing_tradeoff(TrainConfig(model="cnn", scale="smoke", device="cpu"), repeats=2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_tradeoff_times_both_settings_in_turn():
    cfg = TrainConfig(model="gpt", scale="smoke", device="cpu", progress=False, batch_size=4)
    t = memory.checkpointing_tradeoff(cfg, steps=3, repeats=3)
    assert len(t.step_ms.a.values) == len(t.step_ms.b.values) == 3  # the warm-up runs dropped
    assert 0 < t.memory_ratio < 1 and t.device == "cpu" and t.peak_memory_mib == (None, None)
    assert t.final_loss[0] == pytest.approx(t.final_loss[1], rel=1e-5)  # recomputation keeps the maths
