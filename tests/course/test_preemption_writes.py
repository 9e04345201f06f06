"""Notebook 07's background checkpoint writes: numbers and verdicts from repeated measurements,
and the checkpoint benchmark's figures beside them (a fixture results file here)."""

from __future__ import annotations

import pytest

from labkit.core.stats import NO_DIFFERENCE
from labkit.course.preemption import writes
from tests.conftest import RESULTS_FIXTURES

MEASURED = {"parameters": 5e6, "state_mb": 63.0, "step_ms": 50.0, "threads": 2, "steps_after": 5,
            "sync_ms": [200.0, 210.0, 220.0], "stall_ms": [10.0, 12.0, 11.0],
            "sync_total_ms": [450.0, 460.0, 470.0], "background_total_ms": [440.0, 480.0, 520.0]}


def test_save_findings_give_a_verdict_only_when_the_ranges_part():
    found = writes.save_findings(MEASURED)
    assert (found.parameters, found.state_mb, found.steps_after, found.threads) == (5_000_000, 63.0, 5, 2)
    assert found.stall.a.median == 210.0 and found.stall.b.median == 11.0
    assert found.stall_verdict == "faster"  # the stall: ranges apart
    assert found.total_verdict == NO_DIFFERENCE  # 440-520 against 450-470
    assert found.outcome == writes.SHORTER_WAIT_ONLY
    busy = writes.save_findings({**MEASURED, "stall_ms": [150.0, 205.0, 300.0]})
    assert busy.stall_verdict == NO_DIFFERENCE and busy.outcome == writes.NO_SHORTER_WAIT
    roomy = writes.save_findings({**MEASURED, "background_total_ms": [250.0, 260.0, 270.0]})
    assert roomy.total_verdict == "faster" and roomy.outcome == writes.LESS_IN_ALL


def test_the_benchmark_figures_come_with_their_file(monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(RESULTS_FIXTURES))
    monkeypatch.setattr(writes, "CHECKPOINT_STALL", "checkpoint-stall.json")
    ref = writes.checkpoint_reference()
    assert "benchmarks/results/checkpoint-stall.json" in ref["source"] and ref["date"] == "2000-01-01"
    assert (ref["stall_ms"], ref["stall_over_write"], ref["lost_ms"], ref["lost_over_write"]) == (60, 0.10, 900, 1.50)


def test_a_missing_results_file_is_said_not_invented(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    assert writes.checkpoint_reference() is None


@pytest.mark.slow
def test_background_save_measures_both_ways_and_cleans_up(tmp_path):
    pytest.importorskip("torch")
    m = writes.background_save(3, steps_after=2, n_layer=1, n_embd=64, block_size=8, directory=str(tmp_path))
    assert len(m["sync_ms"]) == len(m["stall_ms"]) == len(m["waited_ms"]) == 3  # the warm-up dropped
    assert len(m["sync_total_ms"]) == len(m["background_total_ms"]) == 3
    assert all(t >= s for t, s in zip(m["sync_total_ms"], m["sync_ms"], strict=True))
    assert m["state_mb"] > 1 and m["parameters"] > 500_000
    assert not list(tmp_path.rglob("COMMITTED"))  # every checkpoint removed after it was timed
