"""Notebook 04's CUDA-graph gains, read from the H100 results files (fixtures here, so rerunning
a benchmark changes no test)."""

from __future__ import annotations

import pytest

from labkit.course.precision import cuda_graphs
from tests.conftest import RESULTS_FIXTURES


def test_cuda_graph_gains_come_from_the_results_files(monkeypatch):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(RESULTS_FIXTURES))
    monkeypatch.setattr(cuda_graphs, "RESNET_H100", "torch-resnet.json")
    monkeypatch.setattr(cuda_graphs, "GPT_LEVERS_H100", "gpt-levers-graphs.json")
    rows = cuda_graphs.cuda_graph_gains()
    assert [r["gain"] for r in rows] == pytest.approx([1.25, 1.1, 1.2])
    assert rows[0]["workload"].startswith("ResNet-50") and rows[0]["unit"] == "images/s"
    assert rows[1]["workload"] == "GPT-2 small, batch 12" and rows[2]["configuration"].endswith("fp8 head")
    assert all(r["source"].startswith("benchmarks/results/") and r["date"] == "2000-01-01" for r in rows)
    text = " ".join(cuda_graphs.cuda_graph_conclusions(rows, "cpu"))
    assert "4,000 to 5,000 images/s (1.250×)" in text and "none of this is measured here" in text
    assert "measured here" not in " ".join(cuda_graphs.cuda_graph_conclusions(rows, "cuda:0"))


def test_missing_results_files_are_said_not_invented(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    assert cuda_graphs.cuda_graph_gains() == []
    assert "installed without its repository" in cuda_graphs.cuda_graph_conclusions([], "cpu")[0]
