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
