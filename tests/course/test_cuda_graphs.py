"""Notebook 04's CUDA-graph gains, read from the H100 results files (fixtures here, so rerunning
a benchmark changes no test): numbers and verdicts, from which the notebook writes its sentences."""

from __future__ import annotations

import pytest

from labkit.course.precision import cuda_graphs
from tests.conftest import RESULTS_FIXTURES

STEP_GRAPH_RUNS = tuple(f"gpt-b12-run{i}.json" for i in (1, 2, 3))


@pytest.fixture
def fixtures(monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(RESULTS_FIXTURES))
    monkeypatch.setattr(cuda_graphs, "RESNET_H100", "torch-resnet.json")
    monkeypatch.setattr(cuda_graphs, "GPT_LEVERS_H100", "gpt-levers-graphs.json")
    monkeypatch.setattr(cuda_graphs, "STEP_GRAPH_H100", STEP_GRAPH_RUNS)


def test_cuda_graph_gains_come_from_the_results_files(fixtures):
    rows = cuda_graphs.cuda_graph_gains()
    assert [r["gain"] for r in rows] == pytest.approx([1.25, 1.1, 1.2])
    assert (rows[0]["without graphs"], rows[0]["with CUDA graphs"]) == (4000, 5000)
    assert rows[0]["workload"].startswith("ResNet-50") and rows[0]["unit"] == "images/s"
    assert rows[1]["workload"] == "GPT-2 small, batch 12" and rows[2]["configuration"].endswith("fp8 head")
    assert all(r["source"].startswith("benchmarks/results/") and r["date"] == "2000-01-01" for r in rows)
    # one run each: a ratio, but no verdict
    assert all(r["runs"] == 1 and r["verdict"] == "fewer than 3 runs: no verdict" for r in rows)


def test_the_whole_step_graph_gain_has_the_spread_of_three_runs(fixtures):
    w = cuda_graphs.whole_step_graph()
    assert (w["without"], w["with"], w["runs"]) == (484000, 502000, 3)
    assert (w["without_low"], w["without_high"], w["with_low"], w["with_high"]) == (482000, 486000, 501000, 503000)
    assert w["gain"] == pytest.approx(502 / 484) and w["verdict"] == "faster"
    assert w["workload"] == "GPT-2 small, batch 12" and w["device"] == "NVIDIA H100 80GB HBM3"
    assert w["sources"] == [f"benchmarks/results/{name}" for name in STEP_GRAPH_RUNS]


def test_overlapping_runs_give_no_measurable_difference(fixtures, monkeypatch):
    # the best settings against themselves: the same runs on both sides overlap
    monkeypatch.setattr(cuda_graphs, "STEP_GRAPH_GPT", cuda_graphs.BEST_GPT)
    w = cuda_graphs.whole_step_graph()
    assert w["gain"] == 1.0 and w["verdict"] == "no measurable difference here"


def test_missing_results_files_are_said_not_invented(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    assert cuda_graphs.cuda_graph_gains() == []
    assert cuda_graphs.whole_step_graph() is None
