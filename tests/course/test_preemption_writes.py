"""Notebook 07's background checkpoint writes: verdicts from repeated measurements, set beside
the checkpoint benchmark's figures (a fixture results file here)."""

from __future__ import annotations

import pytest

from labkit.course.preemption import writes
from tests.conftest import RESULTS_FIXTURES

MEASURED = {"parameters": 5e6, "state_mb": 63.0, "step_ms": 50.0, "threads": 2, "steps_after": 5,
            "sync_ms": [200.0, 210.0, 220.0], "stall_ms": [10.0, 12.0, 11.0],
            "sync_total_ms": [450.0, 460.0, 470.0], "background_total_ms": [440.0, 480.0, 520.0]}


def test_save_conclusions_give_a_verdict_only_when_the_ranges_part(monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(RESULTS_FIXTURES))
    monkeypatch.setattr(writes, "CHECKPOINT_STALL", "checkpoint-stall.json")
    text = writes.save_conclusions(MEASURED, writes.checkpoint_reference())
    assert text[1].endswith("faster.")  # the stall: ranges apart
    assert "the 5 training steps after it" in text[2] and "no measurable difference here" in text[2]
    assert "shortened the wait, but not measurably the total" in text[3]
    assert "benchmarks/results/checkpoint-stall.json" in text[4] and "2000-01-01" in text[4]
    assert "background stall 60 ms (0.10×)" in text[4] and "until written 900 ms (1.50×)" in text[4]
    busy = {**MEASURED, "stall_ms": [150.0, 205.0, 300.0]}
    assert "not even the wait" in writes.save_conclusions(busy, None)[3]
    roomy = {**MEASURED, "background_total_ms": [250.0, 260.0, 270.0]}
    assert "less time in all" in writes.save_conclusions(roomy, None)[3]


def test_a_missing_results_file_is_said_not_invented(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    assert writes.checkpoint_reference() is None
    assert "installed without its repository" in writes.save_conclusions(MEASURED, None)[-1]


@pytest.mark.slow
def test_background_save_measures_both_ways_and_cleans_up(tmp_path):
    pytest.importorskip("torch")
    m = writes.background_save(3, steps_after=2, n_layer=1, n_embd=64, block_size=8, directory=str(tmp_path))
    assert len(m["sync_ms"]) == len(m["stall_ms"]) == len(m["waited_ms"]) == 3  # the warm-up dropped
    assert len(m["sync_total_ms"]) == len(m["background_total_ms"]) == 3
    assert all(t >= s for t, s in zip(m["sync_total_ms"], m["sync_ms"], strict=True))
    assert m["state_mb"] > 1 and m["parameters"] > 500_000
    assert not list(tmp_path.rglob("COMMITTED"))  # every checkpoint removed after it was timed
