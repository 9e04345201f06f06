"""Notebook 02's figures on the engine's DDP agreement: read from a results file (a fixture here,
so rerunning the benchmark changes no test) and set beside this run's all-reduce latency."""

from __future__ import annotations

import statistics

import pytest

from labkit.course import distribution
from tests.conftest import RESULTS_FIXTURES


@pytest.fixture
def fixture_results(monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(RESULTS_FIXTURES))
    monkeypatch.setattr(distribution, "AGREEMENT_AB", "ddp-agreement-ab.txt")


def test_the_agreement_ab_is_read_from_its_file(fixture_results):
    ab = distribution.agreement_ab()
    assert ab is not None and ab["source"] == "benchmarks/results/ddp-agreement-ab.txt"
    cnn = ab["models"]["cnn"]
    assert cnn["before_ms"] == [19.0, 20.0, 21.0] and cnn["after_ms"] == [16.0, 17.0, 18.0]
    assert statistics.median(ab["models"]["gpt"]["before_ms"]) == pytest.approx(28.5)
    text = " ".join(distribution.agreement_conclusions(0.5, 0.02, ab))
    assert "0.50 ms (median), 2.5% of the recipe's median step (20.0 ms)" in text
    cnn_line, gpt_line = distribution.agreement_conclusions(0.5, 0.02, ab)[1:]
    assert "cnn" in cnn_line and "faster" in cnn_line  # the ranges part
    assert "gpt" in gpt_line and "no measurable difference here" in gpt_line  # the ranges overlap


def test_a_missing_results_file_is_said_not_invented(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    assert distribution.agreement_ab() is None
    assert "installed without its repository" in distribution.agreement_conclusions(0.5, 0.02, None)[-1]


@pytest.mark.slow
def test_allreduce_latency_is_measured_between_processes():
    pytest.importorskip("torch")
    assert distribution.allreduce_latency_ms(2) > 0


def _run(fw: str, n: int, times: list[float]) -> distribution.DistRun:
    from labkit.core.metrics import MetricsLog

    log = MetricsLog()
    log.steps = [{"step": i, "loss": 2.0, "step_time_s": t} for i, t in enumerate([9.9, *times])]
    return distribution.DistRun(fw, n, log, 1.0)


def test_the_faster_framework_is_a_verdict_on_the_spread_of_its_steps():
    comp = distribution.Comparison({("torch", 2): _run("torch", 2, [0.10, 0.11, 0.10, 0.12]),
                                    ("tf", 2): _run("tf", 2, [0.20, 0.21, 0.19, 0.22])})
    faster, sentence = distribution.framework_verdict(comp, 2)
    assert faster == "torch" and "slower" in sentence and "n=4" in sentence  # the first step left out
    comp.runs[("tf", 2)] = _run("tf", 2, [0.09, 0.13, 0.10, 0.12])  # ranges overlap
    assert distribution.framework_verdict(comp, 2) == (None, distribution.framework_verdict(comp, 2)[1])
    assert "no measurable difference" in distribution.framework_verdict(comp, 2)[1]
    comp.runs[("tf", 2)] = _run("tf", 2, [0.2, 0.2])
    assert distribution.framework_verdict(comp, 2) == (
        None, "fewer than 3 timed steps per framework at 2 processes: no verdict")


def test_the_scaling_answer_compares_step_times_with_one_process():
    comp = distribution.Comparison({("torch", 1): _run("torch", 1, [0.10, 0.11, 0.10, 0.12]),
                                    ("torch", 2): _run("torch", 2, [0.20, 0.21, 0.19, 0.22]),
                                    ("tf", 1): _run("tf", 1, [0.1, 0.1])})
    (line,) = distribution.scaling_answer(comp, 2)
    assert line.startswith("PyTorch DDP x2: 0.51× x1") and "slower" in line
    assert "ideal strong scaling would take 52.5 ms" in line  # half the median of 105 ms
    comp.runs[("tf", 2)] = _run("tf", 2, [0.1, 0.1])
    assert "tf.distribute MWMS: fewer than 3 timed steps: no verdict" in distribution.scaling_answer(comp, 2)
