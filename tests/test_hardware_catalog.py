"""The accelerator catalog: every row carries a price source and a read date, and a malformed
file fails with a message naming the file, the row and the column."""

from __future__ import annotations

import csv
import datetime as dt
import shutil

import pytest

from labkit.hardware.catalog import CATALOG_PATH, COLUMNS, CatalogError, find, load_catalog


def test_shipped_catalog_rows_all_have_source_and_date():
    entries = load_catalog()
    assert len(entries) >= 8
    for e in entries:
        assert e.price_source.startswith("https://"), e.name
        assert e.datasheet_source.startswith("https://"), e.name
        assert isinstance(e.price_read_on, dt.date) and e.price_read_on.year >= 2025, e.name
        if not e.has_price:
            assert e.note, f"{e.name} has no price and no note saying why"


def test_shipped_catalog_covers_the_course_options():
    names = {e.name for e in load_catalog()}
    for wanted in ("T4", "L4", "V100", "A100 40GB", "A100 80GB", "H100 80GB", "TPU v5e", "TPU v6e"):
        assert wanted in names


def test_hourly_adds_host_only_when_listed():
    a100 = find(load_catalog(), "A100 40GB")
    assert a100.hourly() == pytest.approx(a100.on_demand_usd_hr + a100.host_on_demand_usd_hr)
    assert a100.hourly(include_host=False) == pytest.approx(a100.on_demand_usd_hr)
    assert a100.hourly(spot=True) < a100.hourly()


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
        rows[0]["on_demand_usd_hr"] = ""
        rows[0]["note"] = ""
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
        rows[0]["on_demand_usd_hr"] = "0.5"
        rows[0]["price_read_on"] = "2027-01-31"
    entries = load_catalog(_copy(tmp_path, edit))
    assert entries[0].on_demand_usd_hr == 0.5
    assert entries[0].price_read_on == dt.date(2027, 1, 31)
