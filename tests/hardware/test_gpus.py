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


def test_the_table_is_the_csv_and_its_formats_are_the_registry():
    """gpus.csv is the one copy of the GPU figures (the catalog reads it too: test_catalog), with
    a peak column for each format of `labkit.core.precisions` and no other."""
    import csv

    from labkit.core import precisions

    assert gpus.TABLE == gpus.load_table(gpus.GPU_TABLE_PATH)
    assert gpus.FORMATS == precisions.FORMAT_NAMES
    header = next(csv.reader(gpus.GPU_TABLE_PATH.open(encoding="utf-8")))
    assert [c for c in header if c.startswith("peak_")] == [f"peak_{f}_tflops" for f in precisions.FORMAT_NAMES]
    assert gpus.by_accelerator_type("NVIDIA_H100_80GB") is gpus.by_key("h100")
    assert gpus.by_accelerator_type("NVIDIA_B200") is None


@pytest.mark.parametrize("column, value, message", [
    ("peak_fp32_tflops", "", "is empty"), ("memory_bw_gbs", "fast", "not a number"),
    ("read_on", "26/11/2026", "ISO date"), ("datasheet_source", "the datasheet", "must be a URL"),
])
def test_a_malformed_table_names_the_file_row_and_column(tmp_path, column, value, message):
    import csv

    rows = list(csv.DictReader(gpus.GPU_TABLE_PATH.open(encoding="utf-8")))
    rows[2][column] = value
    path = tmp_path / "gpus.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=gpus.COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(gpus.GPUTableError, match=message) as err:
        gpus.load_table(path)
    assert f"{path}: row 4" in str(err.value) and column in str(err.value)
