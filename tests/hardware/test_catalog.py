"""The accelerator catalog: every row carries a price source and a read date, whose rate card
the price is, and the price of the whole machine; the shipped file keeps the sanity rules and
agrees with the GPU datasheet table (`labkit.hardware.gpus`); a malformed file fails with a
message naming the file, the row and the column."""

from __future__ import annotations

import csv
import datetime as dt
import shutil

import pytest

from labkit.hardware import gpus
from labkit.hardware.catalog import (
    CATALOG_PATH,
    COLUMNS,
    PRICE_BASES,
    CatalogEntry,
    CatalogError,
    catalog_rows,
    find,
    load_catalog,
    sanity_problems,
)


def test_shipped_catalog_rows_all_have_source_and_date():
    entries = load_catalog()
    assert len(entries) >= 7
    for e in entries:
        assert e.price_source.startswith("https://"), e.name
        assert e.datasheet_source.startswith("https://"), e.name
        assert isinstance(e.price_read_on, dt.date) and e.price_read_on.year >= 2025, e.name
        if not e.has_price:
            assert e.note, f"{e.name} has no price and no note saying why"


def test_shipped_catalog_covers_the_course_options():
    names = {e.name for e in load_catalog()}
    for wanted in ("T4", "L4", "A100 40GB", "A100 80GB", "H100 80GB", "H200", "TPU v5e", "TPU v6e"):
        assert wanted in names


def test_every_shipped_gpu_row_has_a_price():
    """Notebook 09 prices the GPU it runs on from these rows: none may be empty."""
    for e in load_catalog():
        assert e.has_price and e.spot_usd_hr is not None, e.name


def test_the_t4_machine_is_its_host_plus_its_gpu():
    t4 = find(load_catalog(), "T4")
    assert t4.machine_type == "n1-standard-8" and t4.accelerator_count == 1
    assert t4.hourly() == pytest.approx(t4.accelerator_on_demand_usd_hr + t4.host_on_demand_usd_hr)
    assert t4.hourly(spot=True) == pytest.approx(t4.accelerator_spot_usd_hr + t4.host_spot_usd_hr)


def test_the_h200_row_is_the_whole_8_gpu_machine():
    h200 = find(load_catalog(), "H200")
    assert h200.accelerator_type == "NVIDIA_H200_141GB" and h200.machine_type == "a3-ultragpu-8g"
    assert h200.accelerator_count == 8
    assert h200.hourly_per_accelerator() == pytest.approx(h200.hourly() / 8)
    assert h200.hourly_per_accelerator(spot=True) == pytest.approx(h200.hourly(spot=True) / 8)
    assert h200.peak_tflops("bf16") == pytest.approx(8 * h200.peak_bf16_tflops)
    (row,) = catalog_rows([h200])
    assert row["count"] == 8 and row["on-demand $/h"] == h200.hourly()
    assert row["on-demand $/accelerator-h"] == pytest.approx(h200.hourly() / 8)


def test_datasheet_columns_agree_with_the_gpu_table():
    """The catalog repeats datasheet figures that `labkit.hardware.gpus.TABLE` also holds; for
    every GPU both list (the same Vertex accelerator type) they are the same numbers: the dense
    16-bit tensor-core rate (bf16, or fp16 on a GPU without bf16 such as the T4), fp32, memory
    bandwidth; and the table's memory (what the driver reports) is a little under the catalog's
    marketed size."""
    table = {g.accelerator_type: g for g in gpus.TABLE}
    shared = [e for e in load_catalog() if e.accelerator_type in table]
    assert {e.accelerator_type for e in shared} >= {gpus.by_key(k).accelerator_type for k in
                                                     ("t4", "l4", "a100-40gb", "a100-80gb", "h100", "h200")}
    for e in shared:
        g = table[e.accelerator_type]
        assert e.peak_bf16_tflops == g.peak_tflops[g.fastest_format()], (e.name, g.key)
        assert e.peak_fp32_tflops == g.peak_tflops["fp32"], (e.name, g.key)
        assert e.memory_bw_gbs == g.memory_bw_gbs, (e.name, g.key)
        assert 0.9 * e.memory_gb <= g.memory_gib <= e.memory_gb, (e.name, g.key)


def test_shipped_catalog_keeps_the_sanity_rules():
    entries = load_catalog()
    assert sanity_problems(entries) == []
    for e in entries:
        if e.has_price:
            assert e.price_basis in PRICE_BASES, e.name
            assert e.spot_usd_hr is not None and e.spot_usd_hr < e.on_demand_usd_hr, e.name
    # the two A100 variants: the 80 GB machine costs more, on-demand and on Spot
    small, big = find(entries, "A100 40GB"), find(entries, "A100 80GB")
    assert big.hourly() > small.hourly() and big.hourly(spot=True) > small.hourly(spot=True)


def _row(name, memory, od, spot, **parts):
    return CatalogEntry(name=name, accelerator_type="NVIDIA_X", machine_type="m", accelerator_count=1,
                        memory_gb=memory, peak_bf16_tflops=1.0, peak_fp32_tflops=None, memory_bw_gbs=1.0,
                        region="r", on_demand_usd_hr=od, spot_usd_hr=spot, price_source="https://x",
                        price_read_on=dt.date(2026, 11, 23), datasheet_source="https://y", **parts)


@pytest.mark.parametrize("rows,problem", [
    ([_row("X", 16, 1.0, 1.2)], "not below on-demand"),
    ([_row("X", 16, 1.0, 0.05)], "documented maximum"),
    ([_row("X", 16, 3.0, 1.0, accelerator_on_demand_usd_hr=2.0, host_on_demand_usd_hr=0.5)], "!= machine"),
    ([_row("X", 16, 3.0, 1.0, accelerator_on_demand_usd_hr=2.0)], "need the accelerator, the host"),
    ([_row("A100 40GB", 40, 3.0, 1.0), _row("A100 80GB", 80, 2.0, 1.5)], "less than A100 40GB"),
    ([_row("A100 40GB", 40, 3.0, 1.0), _row("A100 80GB", 80, 4.0, 0.9)], "on Spot"),
])
def test_each_sanity_rule_catches_its_defect(rows, problem):
    problems = sanity_problems(rows)
    assert len(problems) == 1 and problem in problems[0], problems


def test_parts_that_add_up_and_different_accelerators_pass():
    ok = _row("X", 16, 3.0, 1.0, accelerator_on_demand_usd_hr=2.5, host_on_demand_usd_hr=0.5,
              accelerator_spot_usd_hr=0.8, host_spot_usd_hr=0.2)
    assert sanity_problems([ok, _row("L4", 24, 0.9, 0.5), _row("T4", 16, 1.0, 0.4)]) == []


def test_hourly_is_the_whole_machine():
    a100 = find(load_catalog(), "A100 40GB")
    assert a100.hourly() == a100.on_demand_usd_hr and a100.hourly(spot=True) == a100.spot_usd_hr
    assert a100.spot_discount == pytest.approx(1 - a100.spot_usd_hr / a100.on_demand_usd_hr)


def test_price_basis_must_be_a_known_rate_card(tmp_path):
    def edit(rows):
        rows[1]["price_basis"] = "my guess"
    with pytest.raises(CatalogError, match="price_basis"):
        load_catalog(_copy(tmp_path, edit))


def _copy(tmp_path, edit):
    rows = list(csv.DictReader(CATALOG_PATH.open(encoding="utf-8")))
    edit(rows)
    path = tmp_path / "catalog.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


@pytest.mark.parametrize("column,value,message", [
    ("price_source", "", "price_source"),
    ("price_read_on", "", "price_read_on"),
    ("price_read_on", "22/11/2026", "ISO date"),
    ("price_source", "my notes", "must be a URL"),
    ("on_demand_usd_hr", "cheap", "not a number"),
    ("on_demand_usd_hr", "-1", "negative"),
    ("accelerator_count", "0", "accelerator_count"),
])
def test_bad_rows_name_row_and_column(tmp_path, column, value, message):
    def edit(rows):
        rows[1][column] = value
    path = _copy(tmp_path, edit)
    with pytest.raises(CatalogError, match=message) as err:
        load_catalog(path)
    assert "row 3" in str(err.value) and str(path) in str(err.value)


def test_missing_price_needs_a_note(tmp_path):
    def edit(rows):
        rows[1]["on_demand_usd_hr"] = ""
        rows[1]["note"] = ""
    with pytest.raises(CatalogError, match="note must say why"):
        load_catalog(_copy(tmp_path, edit))


def test_missing_column_and_missing_file(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("name,price_source\nT4,https://x\n")
    with pytest.raises(CatalogError, match="missing column"):
        load_catalog(path)
    with pytest.raises(CatalogError, match="not found"):
        load_catalog(tmp_path / "nope.csv")


def test_user_can_update_a_price(tmp_path):
    path = tmp_path / "mine.csv"
    shutil.copy(CATALOG_PATH, path)
    def edit(rows):
        rows[1]["on_demand_usd_hr"] = "0.5"
        rows[1]["price_read_on"] = "2027-01-31"
    entries = load_catalog(_copy(tmp_path, edit))
    assert entries[1].on_demand_usd_hr == 0.5
    assert entries[1].price_read_on == dt.date(2027, 1, 31)


def test_accelerator_types_are_vertex_enum_names():
    """Each row's accelerator_type is what a Vertex job spec takes (checked against the real
    aiplatform enum); a row Vertex cannot take yet must say so in its note."""
    aip = pytest.importorskip("google.cloud.aiplatform_v1")
    known = set(aip.types.AcceleratorType.__members__)
    for e in load_catalog():
        if e.accelerator_type not in known:
            assert "Vertex" in e.note, f"{e.name}: {e.accelerator_type} unknown to the Vertex client"
