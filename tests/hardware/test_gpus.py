"""The GPU facts table: number formats by compute capability, names as drivers report them, and a
row derived for a GPU the table does not list."""

from __future__ import annotations

import pytest

from labkit.core.devices import GPU
from labkit.hardware import gpus


@pytest.mark.parametrize("row", gpus.TABLE, ids=lambda g: g.key)
def test_every_row_is_sourced_and_has_a_peak_for_each_format_it_runs(row):
    assert row.source.startswith("https://") and row.read_on
    for fmt in gpus.FORMATS:
        if row.supports(fmt):
            assert row.peak(fmt), f"{row.key}: no {fmt} peak"
            assert row.why_not(fmt) is None
        else:
            assert row.peak(fmt) is None and row.label in row.why_not(fmt)
    assert 10 < row.memory_gib < 150


def test_formats_follow_the_architecture():
    t4, l4, a100, h100 = (gpus.by_key(k) for k in ("t4", "l4", "a100-40gb", "h100"))
    assert not t4.supports("bf16") and not t4.supports("tf32") and t4.supports("fp16")
    assert t4.fastest_format() == "fp16" and a100.fastest_format() == "bf16"
    assert l4.supports("fp8") and h100.supports("fp8") and not a100.supports("fp8")
    assert "8.9" in a100.why_not("fp8") and "8.0" in t4.why_not("bf16")


@pytest.mark.parametrize("name, memory, key", [
    ("Tesla T4", 15.0, "t4"), ("NVIDIA L4", 22.5, "l4"), ("NVIDIA A100-SXM4-40GB", 39.4, "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "a100-80gb"), ("NVIDIA A100-SXM4", 79.2, "a100-80gb"),
    ("NVIDIA A100-SXM4", 39.4, "a100-40gb"), ("NVIDIA H100 80GB HBM3", 79.6, "h100"), ("NVIDIA H200", 139.8, "h200"),
    ("Tesla V100-SXM2-16GB", 15.8, "v100"),
])
def test_driver_names_find_their_row(name, memory, key):
    assert gpus.lookup(name, memory).key == key


def test_a_gpu_outside_the_table_gets_a_row_from_what_the_driver_says():
    assert gpus.lookup("NVIDIA L40S") is None  # "L4" is not a word of "L40S"
    facts = gpus.for_gpu(GPU(0, "NVIDIA L40S", 46 * 2**30, "8.9"))
    assert facts.derived and facts.supports("fp8") and facts.peak("bf16") is None
    assert facts.memory_gib == pytest.approx(46)


def test_the_reported_memory_is_what_counts():
    facts = gpus.for_gpu(GPU(0, "NVIDIA H100 80GB HBM3", int(79.19 * 2**30), "9.0"))
    assert facts.key == "h100" and facts.memory_gib == pytest.approx(79.19)
