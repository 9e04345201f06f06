"""The accelerator catalog: machine options for Vertex AI training, with datasheet rates and
dated, sourced prices, kept in a CSV file you can update.

Each row is one option (an accelerator, how many of them, the machine type that carries them):
memory per accelerator, dense datasheet rates (bf16 tensor-core TFLOP/s, fp32 TFLOP/s), memory
bandwidth, and the on-demand and Spot prices per hour in one region. Every row must say where
its price comes from (`price_source`) and when it was read (`price_read_on`, ISO date): prices
change, and a figure without a date cannot be checked. A price may be left empty when no source
could be read, but then `note` must say why; the estimator skips such rows and says so.

The prices are Compute Engine rates for the accelerators (plus the host VM where the host
columns are filled). Vertex AI custom training bills the machine and accelerators at its own
rate card, which for many types equals or is close to these; check https://cloud.google.com/vertex-ai/pricing
for your region before you commit a budget. Use your own file with `load_catalog(path)`.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path

CATALOG_PATH = Path(__file__).with_name("catalog.csv")

COLUMNS = (
    "name", "accelerator_type", "machine_type", "accelerator_count", "memory_gb",
    "peak_bf16_tflops", "peak_fp32_tflops", "memory_bw_gbs", "region",
    "on_demand_usd_hr", "spot_usd_hr", "host_on_demand_usd_hr", "host_spot_usd_hr",
    "price_source", "price_read_on", "datasheet_source", "note",
)


class CatalogError(ValueError):
    """A catalog file is malformed; the message names the file, the row and the column."""


@dataclass(frozen=True)
class CatalogEntry:
    """One machine option. Rates are per accelerator; prices are for the whole row (all
    `accelerator_count` accelerators), per hour, in USD."""

    name: str
    accelerator_type: str
    machine_type: str
    accelerator_count: int
    memory_gb: float
    peak_bf16_tflops: float
    peak_fp32_tflops: float | None
    memory_bw_gbs: float
    region: str
    on_demand_usd_hr: float | None
    spot_usd_hr: float | None
    host_on_demand_usd_hr: float | None
    host_spot_usd_hr: float | None
    price_source: str
    price_read_on: _dt.date
    datasheet_source: str
    note: str = ""

    @property
    def is_tpu(self) -> bool:
        return self.accelerator_type.startswith("TPU")

    @property
    def has_price(self) -> bool:
        return self.on_demand_usd_hr is not None

    def peak_tflops(self, precision: str = "bf16") -> float | None:
        """Datasheet TFLOP/s of the whole row (all accelerators) for 'bf16' or 'fp32'."""
        per = self.peak_bf16_tflops if precision == "bf16" else self.peak_fp32_tflops
        return None if per is None else per * self.accelerator_count

    def hourly(self, spot: bool = False, include_host: bool = True) -> float | None:
        """USD per hour for the row, on-demand or Spot, with the host VM when it is listed."""
        price = self.spot_usd_hr if spot else self.on_demand_usd_hr
        if price is None:
            return None
        host = self.host_spot_usd_hr if spot else self.host_on_demand_usd_hr
        return price + (host or 0.0) if include_host else price


def _where(path: Path, line: int, column: str) -> str:
    return f"{path}: row {line}, column {column!r}"


def _number(raw: str, path: Path, line: int, column: str, *, required: bool) -> float | None:
    raw = raw.strip()
    if not raw:
        if required:
            raise CatalogError(f"{_where(path, line, column)} is empty; it needs a number")
        return None
    try:
        value = float(raw)
    except ValueError:
        raise CatalogError(f"{_where(path, line, column)} is not a number: {raw!r}") from None
    if value < 0:
        raise CatalogError(f"{_where(path, line, column)} is negative: {raw!r}")
    return value


def _parse_row(row: dict[str, str], path: Path, line: int) -> CatalogEntry:
    text = {k: (row.get(k) or "").strip() for k in COLUMNS}
    for column in ("name", "accelerator_type", "machine_type", "region", "price_source",
                   "price_read_on", "datasheet_source"):
        if not text[column]:
            raise CatalogError(f"{_where(path, line, column)} is empty: every row needs it")
    for column in ("price_source", "datasheet_source"):
        if not text[column].startswith(("http://", "https://")):
            raise CatalogError(f"{_where(path, line, column)} must be a URL, got {text[column]!r}")
    try:
        read_on = _dt.date.fromisoformat(text["price_read_on"])
    except ValueError:
        raise CatalogError(f"{_where(path, line, 'price_read_on')} must be an ISO date "
                           f"(YYYY-MM-DD), got {text['price_read_on']!r}") from None
    count = _number(text["accelerator_count"], path, line, "accelerator_count", required=True)
    if count is None or count < 1 or not float(count).is_integer():
        raise CatalogError(f"{_where(path, line, 'accelerator_count')} must be a whole number >= 1")
    nums = {c: _number(text[c], path, line, c, required=c in ("memory_gb", "peak_bf16_tflops", "memory_bw_gbs"))
            for c in ("memory_gb", "peak_bf16_tflops", "peak_fp32_tflops", "memory_bw_gbs",
                      "on_demand_usd_hr", "spot_usd_hr", "host_on_demand_usd_hr", "host_spot_usd_hr")}
    if nums["on_demand_usd_hr"] is None and not text["note"]:
        raise CatalogError(f"{_where(path, line, 'note')}: the price is empty, so the note must say why")
    return CatalogEntry(
        name=text["name"], accelerator_type=text["accelerator_type"], machine_type=text["machine_type"],
        accelerator_count=int(count), region=text["region"], price_source=text["price_source"],
        price_read_on=read_on, datasheet_source=text["datasheet_source"], note=text["note"],
        **nums,  # type: ignore[arg-type]
    )


def load_catalog(path: str | os.PathLike | None = None) -> list[CatalogEntry]:
    """Read and validate a catalog CSV (default: the one shipped with labkit)."""
    path = Path(path) if path else CATALOG_PATH
    if not path.exists():
        raise CatalogError(f"{path}: catalog file not found")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CatalogError(f"{path}: missing column(s) {', '.join(missing)}")
        entries = [_parse_row(row, path, i) for i, row in enumerate(reader, start=2)]
    names = [e.name for e in entries]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CatalogError(f"{path}: duplicate name(s) {', '.join(dupes)}")
    if not entries:
        raise CatalogError(f"{path}: no rows")
    return entries


def find(entries: list[CatalogEntry], name: str) -> CatalogEntry:
    for e in entries:
        if e.name == name:
            return e
    raise KeyError(f"no catalog entry named {name!r} (have: {', '.join(e.name for e in entries)})")


def catalog_rows(entries: list[CatalogEntry]) -> list[dict[str, object]]:
    """Plain dicts for display: one per entry, prices shown as given (None when missing)."""
    return [{
        "name": e.name, "machine": e.machine_type, "count": e.accelerator_count,
        "memory GB": e.memory_gb, "bf16 TFLOP/s": e.peak_bf16_tflops, "HBM GB/s": e.memory_bw_gbs,
        "on-demand $/h": e.hourly(spot=False), "Spot $/h": e.hourly(spot=True),
        "region": e.region, "price read on": e.price_read_on.isoformat(),
    } for e in entries]
