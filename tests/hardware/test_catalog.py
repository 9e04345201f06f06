"""The machine price list and the accelerator catalog: every price row carries its rate card, a
source pinned to a commit and a read date; a machine is priced by its own row (or its host row
plus its attached GPUs' row), never a scaled neighbour; the catalog takes its prices from the
list, and its GPU rows their datasheet figures from the GPU table (`labkit.hardware.gpus`); the
shipped files keep the sanity rules; a malformed file fails with a message naming the file, the row and
the column."""

from __future__ import annotations

import csv
import datetime as dt
import re
import shutil

import pytest

from labkit.hardware import facts, gpus
from labkit.hardware.catalog import (
    CATALOG_PATH,
    COLUMNS,
    DATASHEET,
    MACHINE_PRICE_COLUMNS,
    MACHINE_PRICES_PATH,
    PRICE_BASES,
    VERTEX_BASIS,
    CatalogEntry,
    CatalogError,
    catalog_rows,
    find,
    load_catalog,
    load_machine_prices,
    machine_price,
    machine_price_problems,
    sanity_problems,
)
from labkit.vertex.machines import GPU_COUNTS, TRAINING_MACHINE_TYPES

PINNED = r"https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/"
# A price of its own for a catalog row (the shipped rows take theirs from the price list).
OWN_PRICE = {"price_basis": "Compute Engine", "on_demand_usd_hr": "1.0", "spot_usd_hr": "0.4",
             "price_source": "https://example.com/prices", "price_read_on": "2026-11-29"}


def test_every_price_row_is_sourced_dated_and_on_a_known_rate_card():
    prices = load_machine_prices()
    assert len(prices) >= 100
    for p in prices:
        assert re.match(PINNED, p.price_source), p.key  # a public file at a fixed commit
        assert p.price_read_on >= dt.date(2026, 11, 1) and p.region == "us-central1", p.key
        assert p.price_basis in PRICE_BASES and p.on_demand_usd_hr > 0, p.key
        if p.spot_usd_hr is None:
            assert "Spot" in p.note, p.key
    raw = list(csv.DictReader(MACHINE_PRICES_PATH.open(encoding="utf-8")))
    assert all(r["price_source"] and r["price_read_on"] for r in raw) and len(raw) == len(prices)
    assert machine_price_problems(prices) == []


def test_every_training_machine_type_has_a_price_unless_no_source_has_one():
    """Every machine type training offers, CPU machines included, is in the list; the three
    without a public us-central1 price stay unpriced rather than borrow one."""
    priced = {p.machine_type for p in load_machine_prices()}
    assert [m for m in TRAINING_MACHINE_TYPES if m not in priced] == [
        "a4x-highgpu-4g", "a4-highgpu-8g", "tpu7x-standard-4t"]


def test_accelerator_optimized_machines_are_priced_by_their_own_rows():
    prices = load_machine_prices()
    for machine, carried in GPU_COUNTS.items():
        if machine.startswith(("a2-", "a3-highgpu", "g2-", "g4-")):
            ((accelerator, (count,)),) = carried.items()
            quote = machine_price(prices, machine, accelerator, count)
            assert quote is not None and len(quote.parts) == 1, machine
            assert quote.parts[0].key == (machine, accelerator, count)
    g2 = {n: machine_price(prices, f"g2-standard-{n}", "NVIDIA_L4", c).hourly()
          for n, c in ((8, 1), (32, 1), (48, 4))}
    assert g2[32] == pytest.approx(1.734376367) and g2[32] > 2 * g2[8]  # not one L4's share of g2-standard-8
    assert g2[48] == pytest.approx(4.001665148) and g2[48] > 1.15 * 4 * g2[8]


def test_n1_gpus_are_the_host_row_plus_the_attached_gpu_row():
    prices = load_machine_prices()
    quote = machine_price(prices, "n1-standard-16", "NVIDIA_TESLA_V100", 4)
    host, gpus_row = quote.parts
    assert host.key == ("n1-standard-16", "", 0) and gpus_row.key == ("", "NVIDIA_TESLA_V100", 4)
    assert quote.hourly() == pytest.approx(0.759996 + 9.92)
    assert quote.hourly(spot=True) == pytest.approx(0.26804 + 3.968)
    assert machine_price(prices, "n1-standard-16", "NVIDIA_TESLA_V100", 3) is None  # no row: no guess
    assert machine_price(prices, "a4-highgpu-8g", "NVIDIA_B200", 8) is None


def test_vertex_ai_rate_is_used_where_one_was_read():
    """n1-standard-4 is on Vertex AI's own rate card, 15% above Compute Engine's; Vertex AI's
    Spot rate for it was not read, so the row has none (and says why)."""
    (row,) = machine_price(load_machine_prices(), "n1-standard-4").parts
    assert row.price_basis == VERTEX_BASIS and row.spot_usd_hr is None
    assert row.on_demand_usd_hr == facts.VERTEX_TRAINING_N1_STANDARD_4.value
    assert row.on_demand_usd_hr / facts.COMPUTE_N1_STANDARD_4.value == pytest.approx(1.15, abs=0.005)
    assert "billed by job duration and machine type" in row.note


@pytest.mark.parametrize("column,value,message", [
    ("price_source", "my notes", "must be a URL"),
    ("price_read_on", "29/11/2026", "ISO date"),
    ("price_basis", "my guess", "price_basis"),
    ("on_demand_usd_hr", "", "on_demand_usd_hr"),
    ("accelerator_count", "2", "must be 0 without an accelerator_type"),
    ("note", "", "note must say why"),
])
def test_bad_price_rows_name_row_and_column(tmp_path, column, value, message):
    rows = list(csv.DictReader(MACHINE_PRICES_PATH.open(encoding="utf-8")))
    n1 = next(i for i, r in enumerate(rows) if r["machine_type"] == "n1-standard-4")
    rows[n1][column] = value
    path = tmp_path / "prices.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=MACHINE_PRICE_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(CatalogError, match=message) as err:
        load_machine_prices(path)
    assert f"row {n1 + 2}" in str(err.value) and str(path) in str(err.value)


def test_shipped_catalog_rows_take_their_price_from_the_price_list():
    """One owner: catalog.csv has no price of its own; each row is its machine's price-list row."""
    raw = list(csv.DictReader(CATALOG_PATH.open(encoding="utf-8")))
    assert all(not r["on_demand_usd_hr"] and not r["spot_usd_hr"] for r in raw)
    prices = load_machine_prices()
    for e in load_catalog():
        quote = machine_price(prices, e.machine_type, e.accelerator_type, e.accelerator_count)
        assert e.hourly() == quote.hourly() and e.hourly(spot=True) == quote.hourly(spot=True), e.name
        assert e.price_basis == quote.price_basis, e.name
        for part in quote.parts:
            assert part.price_source in e.price_source, e.name


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


def test_gpu_rows_take_their_datasheet_from_the_gpu_table_only():
    """The GPU table (`labkit.hardware.gpus`, gpus.csv) is the one copy of GPU datasheet figures:
    every shipped GPU row leaves the datasheet columns empty and gets the table row's dense
    16-bit tensor-core rate (bf16, or fp16 on a GPU without bf16 such as the T4), fp32 rate,
    bandwidth, marketed memory, source and read date. A second copy in the catalog fails here."""
    raw = {r["name"]: r for r in csv.DictReader(CATALOG_PATH.open(encoding="utf-8"))}
    shared = [e for e in load_catalog() if gpus.by_accelerator_type(e.accelerator_type)]
    assert {e.accelerator_type for e in shared} >= {gpus.by_key(k).accelerator_type for k in
                                                     ("t4", "l4", "a100-40gb", "a100-80gb", "h100", "h200")}
    for e in shared:
        g = gpus.by_accelerator_type(e.accelerator_type)
        assert not any(raw[e.name][c] for c in DATASHEET), f"{e.name}: datasheet figures copied into catalog.csv"
        assert e.peak_bf16_tflops == g.peak_tflops[g.fastest_format()], (e.name, g.key)
        assert e.peak_fp32_tflops == g.peak_tflops["fp32"] and e.memory_bw_gbs == g.memory_bw_gbs, e.name
        assert e.memory_gb == g.memory_gb and 0.9 * e.memory_gb <= g.memory_gib <= e.memory_gb, e.name
        assert (e.datasheet_source, e.datasheet_read_on) == (g.source, g.read_on), e.name
    assert find(load_catalog(), "T4").peak_bf16_tflops == gpus.by_key("t4").peak_tflops["fp16"]


def test_a_row_of_your_own_carries_its_datasheet_unless_the_gpu_table_has_it(tmp_path):
    def own_figures(rows):  # your own figures for a GPU in the table are yours
        rows[1] |= {"memory_gb": "24", "peak_bf16_tflops": "100", "peak_fp32_tflops": "",
                    "memory_bw_gbs": "250", "datasheet_source": "https://example.com/l4"}
    mine = load_catalog(_copy(tmp_path, own_figures))[1]
    assert (mine.peak_bf16_tflops, mine.datasheet_source, mine.datasheet_read_on) == (100, "https://example.com/l4", None)

    def unknown_gpu(rows):  # an accelerator the table lacks, with no figures of its own
        rows[1] |= {"accelerator_type": "NVIDIA_B200"} | OWN_PRICE
    with pytest.raises(CatalogError, match="row 3, column 'datasheet_source'.*not in the GPU table"):
        load_catalog(_copy(tmp_path, unknown_gpu))

    def half_copied(rows):
        rows[1]["memory_gb"] = "24"
    with pytest.raises(CatalogError, match="row 3, column 'datasheet_source'"):
        load_catalog(_copy(tmp_path, half_copied))


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
        rows[1] |= OWN_PRICE
        rows[1][column] = value
    path = _copy(tmp_path, edit)
    with pytest.raises(CatalogError, match=message) as err:
        load_catalog(path)
    assert "row 3" in str(err.value) and str(path) in str(err.value)


def test_missing_price_needs_a_note(tmp_path):
    def edit(rows):  # a machine the price list has no row for, and no price of its own
        rows[1]["machine_type"] = "a4-highgpu-8g"
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
        rows[1] |= OWN_PRICE | {"on_demand_usd_hr": "0.5", "price_read_on": "2027-01-31"}
    entries = load_catalog(_copy(tmp_path, edit))
    assert entries[1].on_demand_usd_hr == 0.5 and entries[1].spot_usd_hr == 0.4
    assert entries[1].price_read_on == dt.date(2027, 1, 31)
    assert entries[2].hourly() == load_catalog()[2].hourly()  # the others keep the list's prices


def test_accelerator_types_are_vertex_enum_names():
    """Each row's accelerator_type is what a Vertex job spec takes (checked against the real
    aiplatform enum); a row Vertex cannot take yet must say so in its note."""
    aip = pytest.importorskip("google.cloud.aiplatform_v1")
    known = set(aip.types.AcceleratorType.__members__)
    for e in load_catalog():
        if e.accelerator_type not in known:
            assert "Vertex" in e.note, f"{e.name}: {e.accelerator_type} unknown to the Vertex client"
