"""Notebook 02's functions: batch semantics, LR rules, curve gaps, and skipping a missing framework."""

from __future__ import annotations

import subprocess
import sys

import pytest

from labkit.core.metrics import MetricsLog, StepMetrics
from labkit.course import distribution as dist
from labkit.course.tables import table


def test_batch_semantics_cut_the_global_batch():
    rows = dist.batch_semantics(64, (1, 2, 8), grad_accum=2)
    assert [r["per-replica micro-batch"] for r in rows] == [32, 16, 4]
    bad = dist.batch_semantics(64, (3,))[0]
    assert not bad["valid"]


def test_lr_rules():
    rows = dist.lr_scaling_rows(0.01, 32, (1, 4))
    assert rows[1]["linear rule lr"] == pytest.approx(0.04)
    assert rows[1]["sqrt rule lr"] == pytest.approx(0.02)
    assert rows[1]["global batch"] == 128


def test_curve_gap_and_table():
    a, b = MetricsLog(), MetricsLog()
    for i, (x, y) in enumerate([(2.0, 2.0), (1.5, 1.25), (1.0, 1.0)]):
        a.append(StepMetrics(step=i, loss=x))
        b.append(StepMetrics(step=i, loss=y))
    assert dist.curve_gap(a, b) == pytest.approx(0.25)
    text = table([{"run": "x", "v": 1.23456}])
    assert "1.23" in text and text.splitlines()[0].startswith("run")


def test_missing_tensorflow_is_skipped_with_its_reason(hide_frameworks):
    code = ("from labkit.course import distribution as d; from labkit.core.train_config import TrainConfig;"
            "c = d.compare(TrainConfig(), processes=(1,), frameworks_=('tf',));"
            "print(len(c.runs), c.skipped['tf'])")
    r = subprocess.run([sys.executable, "-c", code], env=hide_frameworks("tensorflow"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("0 TensorFlow is not installed")
