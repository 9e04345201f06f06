"""Notebook 10's checkpoint measurement: which rank wrote which file, the table, verdict and
numbers computed from a report, the benchmark's reference table, and the measurement itself on
two local processes (slow)."""

from __future__ import annotations

import pytest

from labkit.core.stats import NO_DIFFERENCE
from labkit.course import sharded_checkpoints as sc


def _report(full_ms, dcp_ms, rank_ms=(5, 6, 7)) -> dict:
    return {"world_size": 2, "seconds": {"full state": [m / 1000 for m in full_ms],
                                         "rank files": [m / 1000 for m in rank_ms],
                                         "dcp": [m / 1000 for m in dcp_ms]},
            "bytes_by_rank": {"full state": [2_000_000, 0], "rank files": [1_000_000, 1_000_000],
                              "dcp": [1_100_000, 1_000_000]},
            "files": {"full state": ["model.pt", "train.pt"], "rank files": ["rank0.pt", "rank1.pt"],
                      "dcp": [".metadata", "__0_0.distcp", "__1_0.distcp", "train.pt"]},
            "dcp_reload_identical": True}


def test_each_file_counts_for_the_rank_that_wrote_it():
    files = {".metadata": {"size": 1}, "__0_0.distcp": {"size": 10}, "__1_0.distcp": {"size": 100},
             "__1_1.distcp": {"size": 1000}, "train.pt": {"size": 10_000}, "rng-rank1.pt": {"size": 100_000},
             "rank0.pt": {"size": 1_000_000}, "comm-rank1.pt": {"size": 10_000_000}, "model.pt": {"size": 0}}
    assert sc.bytes_by_rank(files, 2) == [1_010_011, 10_101_100]


def test_the_table_verdict_and_findings_come_from_the_report():
    report = _report(full_ms=(100, 110, 120), dcp_ms=(40, 45, 50))
    rows = {r["format"]: r for r in sc.rows(report)}
    assert rows["dcp"]["ms per save"] == 45.0 and rows["dcp"]["range ms"] == "40–50"
    assert (rows["full state"]["MB rank 0"], rows["full state"]["MB rank 1"]) == (2.0, 0.0)
    assert rows["rank files"]["resumable on"] == "the same layout only" and rows["dcp"]["files"] == 4
    faster = sc.time_comparison(report)
    assert faster.winner == "b" and faster.ratio == pytest.approx(45 / 110)
    assert sc.bytes_ratio(report) == pytest.approx(0.55)
    found = sc.findings(report)
    assert (found.world_size, found.full_by_rank, found.dcp_by_rank) == (2, (2_000_000, 0), (1_100_000, 1_000_000))
    assert found.bytes_ratio == pytest.approx(0.55) and found.time.ratio == pytest.approx(45 / 110)
    assert found.verdict == "faster" and found.reload_identical
    overlapping = sc.findings(_report(full_ms=(100, 110, 120), dcp_ms=(90, 105, 130)))
    assert overlapping.time.winner is None and overlapping.verdict == NO_DIFFERENCE
    assert sc.findings(_report(full_ms=(40, 45, 50), dcp_ms=(100, 110, 120))).verdict == "slower"


def test_the_reference_table_comes_from_the_benchmark_file():
    sizes = {"small": _report(full_ms=(100, 110, 120), dcp_ms=(40, 45, 50)) | {"parameters": 2_500_000},
             "large": _report(full_ms=(100, 110, 120), dcp_ms=(90, 105, 130)) | {"parameters": 90_000_000}}
    small, large = sc.reference_rows({"sizes": sizes})
    assert (small["state"], small["M parameters"], small["full state MB"]) == ("small", 2.5, 2.0)
    assert (small["full state ms"], small["rank files ms"], small["dcp ms"]) == (110, 6, 45)
    assert small["dcp vs full state"] == "faster" and small["busiest rank bytes, dcp / full"] == 0.55
    assert large["dcp vs full state"] == NO_DIFFERENCE and large["M parameters"] == 90.0
    ref = sc.reference()
    if ref is None:
        pytest.skip("no benchmarks/results beside this labkit")
    rows = sc.reference_rows(ref)
    assert [r["state"] for r in rows] == list(ref["sizes"]) and ref["file"].startswith("benchmarks/results/")
    assert all(0 < r["busiest rank bytes, dcp / full"] < 1 for r in rows)  # every rank writes a share


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_measurement_on_two_processes_writes_half_the_bytes_per_rank_with_dcp():
    pytest.importorskip("torch")
    from labkit.core.train_config import TrainConfig

    config = TrainConfig(model="gpt", steps=2, batch_size=8, device="cpu", progress=False, eval_samples=0)
    report = sc.measure(config, nproc=2, saves=3)
    assert report["dcp_reload_identical"] and report["world_size"] == 2
    assert all(len(report["seconds"][name]) == 3 for name in sc.FORMATS)
    full, dcp = report["bytes_by_rank"]["full state"], report["bytes_by_rank"]["dcp"]
    # about half each: at this tiny size DCP's index and per-tensor records add a tenth or so
    assert full[1] == 0 and all(0.45 * full[0] < b < 0.65 * full[0] for b in dcp)
    assert report["files"]["dcp"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-rank0.pt",
                                      "rng-rank1.pt", "train.pt"]
