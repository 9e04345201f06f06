"""Notebook 02's comparison of DDP and tf.distribute runs: the numbers and verdicts its sentences
are written from. A run is faster or slower than another only when the spread of their step
times says so."""

from __future__ import annotations

import pytest

from labkit.core.stats import NO_DIFFERENCE
from labkit.course import distribution


def _run(fw: str, n: int, times: list[float], heldout: dict | None = None) -> distribution.DistRun:
    from labkit.core.metrics import MetricsLog

    log = MetricsLog({"heldout": heldout} if heldout else {})
    log.steps = [{"step": i, "loss": 2.0, "step_time_s": t} for i, t in enumerate([9.9, *times])]
    return distribution.DistRun(fw, n, log, 1.0)


def test_the_faster_framework_is_a_verdict_on_the_spread_of_its_steps():
    comp = distribution.Comparison({("torch", 2): _run("torch", 2, [0.10, 0.11, 0.10, 0.12]),
                                    ("tf", 2): _run("tf", 2, [0.20, 0.21, 0.19, 0.22])})
    race = distribution.framework_race(comp, 2)
    assert race.a.framework == "torch" and race.b.framework == "tf"
    assert race.a_ms == pytest.approx((100, 110, 100, 120))  # the first step left out, in ms
    assert race.verdict == "slower" and race.faster is race.a and race.speedup == pytest.approx(105 / 205)
    comp.runs[("tf", 2)] = _run("tf", 2, [0.09, 0.13, 0.10, 0.12])  # ranges overlap
    race = distribution.framework_race(comp, 2)
    assert race.verdict == NO_DIFFERENCE and race.faster is None
    comp.runs[("tf", 2)] = _run("tf", 2, [0.2, 0.2])
    race = distribution.framework_race(comp, 2)
    assert race.comparison is None and race.verdict == "fewer than 3 timed steps: no verdict" and race.faster is None
    del comp.runs[("tf", 2)]
    assert distribution.framework_race(comp, 2) is None


def test_scaling_compares_step_times_with_one_process():
    comp = distribution.Comparison({("torch", 1): _run("torch", 1, [0.10, 0.11, 0.10, 0.12]),
                                    ("torch", 2): _run("torch", 2, [0.20, 0.21, 0.19, 0.22]),
                                    ("tf", 1): _run("tf", 1, [0.1, 0.1])})
    found = distribution.scaling(comp, 2)
    assert list(found) == ["torch"]  # tf has no 2-process run
    torch2 = found["torch"]
    assert torch2.verdict == "slower" and torch2.speedup == pytest.approx(105 / 205)
    assert torch2.ideal_ms == pytest.approx(52.5)  # half the median of 105 ms
    assert torch2.efficiency == pytest.approx(52.5 / 205)
    comp.runs[("tf", 2)] = _run("tf", 2, [0.1, 0.1])
    assert "no verdict" in distribution.scaling(comp, 2)["tf"].verdict
    assert distribution.scaling(comp, 1) == {}
    rows = {r["run"]: r for r in distribution.scaling_rows(comp)}
    assert rows["PyTorch DDP x2"]["vs 1 process"] == "slower"
    assert rows["PyTorch DDP x2"]["efficiency"] == pytest.approx(torch2.efficiency)


def test_learning_reads_each_runs_held_out_loss_against_chance():
    comp = distribution.Comparison({
        ("torch", 1): _run("torch", 1, [0.1], {"loss": 1.2, "samples": 256, "chance": 2.3026}),
        ("tf", 1): _run("tf", 1, [0.1], {"loss": 2.2, "samples": 256, "chance": 2.3026}),
        ("tf", 2): _run("tf", 2, [0.1])})
    torch1, tf1, tf2 = distribution.learning(comp)
    assert (torch1.heldout_loss, torch1.heldout_samples, torch1.steps, torch1.learned) == (1.2, 256, 2, True)
    assert torch1.verdict == "learned" and torch1.label == "PyTorch DDP x1"
    assert tf1.learned is False and tf1.verdict == "did not learn"  # 2.2 is not under 0.8 × 2.30
    assert tf2.heldout_loss is None and tf2.verdict == "no held-out loss measured"
