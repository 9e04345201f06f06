"""Notebook 04's ladder findings: the numbers and verdicts its sentences are written from. A rung
is faster or slower than the first only when the spread of the repeated runs says so."""

from __future__ import annotations

import pytest

from labkit.core.config import ParameterError
from labkit.core.stats import NO_DIFFERENCE
from labkit.course import precision


def _row(key: str, runs: list[float], loss: float = 2.0, device: str = "cpu", activation: float | None = 8.0):
    median = sorted(runs)[len(runs) // 2]
    return {"key": key, "rung": f"{key} rung", "precision": key, "samples_per_s": median, "runs_samples_per_s": runs,
            "final_loss": loss, "activation_mib": activation, "device": device}


def _ladder(*rows):
    rows = list(rows)
    for r in rows:
        r["speedup"] = r["samples_per_s"] / rows[0]["samples_per_s"]
    return rows


def test_each_rung_carries_its_ratio_range_and_verdict():
    rows = _ladder(_row("fp32", [100, 102, 98], loss=2.5, activation=16.0), _row("bf16", [180, 185, 175], loss=2.49),
                   _row("fp16", [60, 62, 58]))
    found = precision.findings(rows, frozenset())
    assert found.device == "cpu" and found.first.verdict == "reference"
    bf16, fp16 = found.others
    assert (bf16.key, bf16.samples_per_s, bf16.low, bf16.high, bf16.runs) == ("bf16", 180, 175, 185, 3)
    assert bf16.speedup == pytest.approx(1.8) and bf16.verdict == "faster"
    assert fp16.verdict == "slower" and fp16.speedup == pytest.approx(0.6)
    assert (bf16.final_loss, found.first.final_loss, found.first.activation_mib) == (2.49, 2.5, 16.0)
    assert found.best == bf16
    assert not found.tf32_on_cpu


def test_a_higher_median_whose_runs_overlap_is_no_measurable_difference():
    rows = _ladder(_row("fp32", [90, 100, 110]), _row("bf16", [105, 108, 95]))
    found = precision.findings(rows, frozenset())
    assert found.best.key == "bf16" and found.best.speedup > 1
    assert found.best.verdict == NO_DIFFERENCE


def test_fewer_runs_than_a_verdict_needs_give_no_verdict():
    rows = _ladder(_row("fp32", [100]), _row("bf16", [200]))
    assert precision.findings(rows, frozenset()).rung("bf16").verdict == "fewer than 3 runs: no verdict"


def test_the_first_rung_can_be_the_best():
    rows = _ladder(_row("fp32", [100, 101, 99]), _row("tf32", [80, 81, 79]))
    found = precision.findings(rows, frozenset())
    assert found.best == found.first and found.best.verdict == "reference"
    assert found.tf32_on_cpu  # a tf32 rung on a CPU
    gpu = [{**r, "device": "cuda:0"} for r in rows]
    assert not precision.findings(gpu, frozenset()).tf32_on_cpu


def test_an_empty_ladder_is_refused_by_name():
    with pytest.raises(ParameterError, match="rows"):
        precision.findings([])
