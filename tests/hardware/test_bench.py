"""The micro-benchmarks run on this CPU and report positive, finite figures (never asserted
against a speed: timings on a shared machine are noise)."""

from __future__ import annotations

import math

import pytest

from labkit.core.config import ParameterError
from labkit.hardware.bench import BenchConfig, copy_bandwidth_gbs, matmul_tflops, measure_ceilings


def test_measure_ceilings_on_cpu():
    c = measure_ceilings(BenchConfig(device="cpu", matmul_size=128, copy_mb=4, repeats=2, warmup=1))
    assert c.device == "cpu" and c.device_name
    assert set(c.matmul_tflops) == {"fp32", "bf16"}
    for v in c.matmul_tflops.values():
        assert v > 0 and math.isfinite(v)
    assert c.copy_gbs > 0
    assert c.h2d_pinned_gbs is None and any("host↔device" in n for n in c.notes)
    assert {r["ceiling"] for r in c.rows()} >= {"matmul fp32", "memory copy (read+write)"}


def test_single_benchmarks():
    assert matmul_tflops(64, "fp32", "cpu", repeats=1, warmup=0) > 0
    assert copy_bandwidth_gbs(2**20, "cpu", repeats=1, warmup=0) > 0


def test_bad_config():
    with pytest.raises(ParameterError, match="matmul_size"):
        BenchConfig(matmul_size=1)
    with pytest.raises(ParameterError, match="dtypes"):
        BenchConfig(dtypes=("fp64",))


@pytest.mark.gpu
def test_gpu_ceilings():
    c = measure_ceilings(BenchConfig(device="cuda", matmul_size=2048, copy_mb=64))
    assert c.matmul_tflops["bf16"] > c.matmul_tflops["fp32"]
    assert c.h2d_pinned_gbs and c.h2d_pinned_gbs > 0
