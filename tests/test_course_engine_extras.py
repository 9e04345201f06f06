"""What the engine does beyond the recipes: figures read from the results files (checked against
the files' own numbers) and verdicts from repeated measurements."""

from __future__ import annotations

import statistics

import pytest

from labkit.course import engine_extras


def test_the_agreement_ab_is_read_from_its_file():
    ab = engine_extras.agreement_ab()
    assert ab is not None and ab["source"].endswith("agreement-ab.txt")
    cnn = ab["models"]["cnn"]
    assert len(cnn["before_ms"]) == len(cnn["after_ms"]) == 4
    assert statistics.median(cnn["before_ms"]) == pytest.approx(18.95)  # RESULTS.md's table
    assert statistics.median(cnn["after_ms"]) == pytest.approx(16.95)
    text = " ".join(engine_extras.agreement_conclusions(0.5, 0.02, ab))
    assert "0.50 ms (median), 2.5% of the recipe's median step (20.0 ms)" in text
    assert "cnn" in text and "faster" in text  # the cnn ranges do not overlap


def test_cuda_graph_gains_come_from_the_h100_files():
    rows = engine_extras.cuda_graph_gains()
    resnet = next(r for r in rows if r["workload"].startswith("ResNet-50"))
    assert resnet["gain"] == pytest.approx(5536.5 / 5131.2, rel=1e-3) and resnet["unit"] == "images/s"
    assert all(r["device"].startswith("NVIDIA H100") and r["source"].startswith("benchmarks/results/") for r in rows)
    text = " ".join(engine_extras.cuda_graph_conclusions(rows, "cpu"))
    assert "none of this is measured here" in text and "1.079×" in text
    assert "measured here" not in " ".join(engine_extras.cuda_graph_conclusions(rows, "cuda:0"))


def test_save_conclusions_give_a_verdict_only_when_the_ranges_part():
    measured = {"parameters": 5e6, "state_mb": 63.0, "step_ms": 50.0, "threads": 2, "steps_after": 5,
                "sync_ms": [200.0, 210.0, 220.0], "stall_ms": [10.0, 12.0, 11.0],
                "sync_total_ms": [450.0, 460.0, 470.0], "background_total_ms": [440.0, 480.0, 520.0]}
    text = engine_extras.save_conclusions(measured, engine_extras.checkpoint_reference())
    assert text[1].endswith("faster.")  # the stall: ranges apart
    assert "the 5 training steps after it" in text[2] and "no measurable difference here" in text[2]
    assert "shortened the wait, but not measurably the total" in text[3]
    assert "2026-11-22-cpu-checkpoint-stall.json" in text[4] and "(1.59×)" in text[4]
    busy = {**measured, "stall_ms": [150.0, 205.0, 300.0]}
    assert "not even the wait" in engine_extras.save_conclusions(busy, None)[3]
    roomy = {**measured, "background_total_ms": [250.0, 260.0, 270.0]}
    assert "less time in all" in engine_extras.save_conclusions(roomy, None)[3]


def test_missing_results_files_are_said_not_invented(monkeypatch, tmp_path):
    monkeypatch.setattr(engine_extras, "RESULTS_DIR", tmp_path)
    assert engine_extras.agreement_ab() is None and engine_extras.checkpoint_reference() is None
    assert engine_extras.cuda_graph_gains() == []
    assert "installed without its repository" in engine_extras.cuda_graph_conclusions([], "cpu")[0]


@pytest.mark.slow
def test_background_save_measures_both_ways_and_cleans_up(tmp_path):
    pytest.importorskip("torch")
    m = engine_extras.background_save(3, steps_after=2, n_layer=1, n_embd=64, block_size=8,
                                      directory=str(tmp_path))
    assert len(m["sync_ms"]) == len(m["stall_ms"]) == len(m["waited_ms"]) == 3  # the warm-up dropped
    assert len(m["sync_total_ms"]) == len(m["background_total_ms"]) == 3
    assert all(t >= s for t, s in zip(m["sync_total_ms"], m["sync_ms"], strict=True))
    assert m["state_mb"] > 1 and m["parameters"] > 500_000
    assert not list(tmp_path.rglob("COMMITTED"))  # every checkpoint removed after it was timed


@pytest.mark.slow
def test_allreduce_latency_is_measured_between_processes():
    pytest.importorskip("torch")
    assert engine_extras.allreduce_latency_ms(2) > 0
