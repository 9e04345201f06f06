"""The accelerator catalog: machine options for Vertex AI training, with datasheet rates and
dated, sourced prices, kept in a CSV file you can update.

Each row is one machine a training replica can get: the accelerator, how many, the machine type
that carries them, memory per accelerator, dense datasheet rates (bf16 tensor-core TFLOP/s, fp32
TFLOP/s), memory bandwidth, and the price per hour of **the whole machine** (accelerators plus
the host VM: what a replica costs), on-demand and Spot, in one region. `price_basis` says whose
rate card the price is: "Vertex AI custom training" where Vertex publishes the machine's price,
else "Compute Engine" (the same machine rented directly) or "Cloud TPU". Vertex AI bills custom
training at its own rates, which can be higher than Compute Engine's for the same machine
(`labkit.hardware.facts.VERTEX_TRAINING_PREMIUM` shows one documented case), so a Compute Engine
price is a lower bound for a Vertex job. Where a source lists the accelerator and the host
separately, the parts go in the `accelerator_*` and `host_*` columns and must add up to the
machine price. A GPU that Google offers only in machines with several of them (the H200 comes
eight to an a3-ultragpu-8g) has a row for that machine; one GPU's share of it is the machine
price divided by `accelerator_count` (`CatalogEntry.hourly_per_accelerator`, and
`labkit.hardware.machines.catalog_price` for the GPU a notebook runs on).

Every row says where its price comes from (`price_source`, a URL) and when it was read
(`price_read_on`, ISO date): prices change, and a figure without a date cannot be checked. A
price may be left empty when no source could be read, but then `note` must say why; the
estimator skips such rows and says so. `sanity_problems` checks the rules every catalog must
keep (Spot below on-demand and within the documented discount, parts adding up to the total, a
bigger-memory variant of an accelerator never cheaper). Use your own file with
`load_catalog(path)`.
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
    "peak_bf16_tflops", "peak_fp32_tflops", "memory_bw_gbs", "region", "price_basis",
    "on_demand_usd_hr", "spot_usd_hr", "accelerator_on_demand_usd_hr", "accelerator_spot_usd_hr",
    "host_on_demand_usd_hr", "host_spot_usd_hr", "price_source", "price_read_on", "datasheet_source",
    "note",
)
PRICE_BASES = ("Vertex AI custom training", "Compute Engine", "Cloud TPU")
PRICES = ("on_demand_usd_hr", "spot_usd_hr", "accelerator_on_demand_usd_hr", "accelerator_spot_usd_hr",
          "host_on_demand_usd_hr", "host_spot_usd_hr")
PARTS_TOLERANCE_USD = 0.005  # parts are rounded to the cent or finer by the sources


class CatalogError(ValueError):
    """A catalog file is malformed; the message names the file, the row and the column."""


@dataclass(frozen=True)
class CatalogEntry:
    """One machine option. Rates are per accelerator; prices are for the whole machine (all
    `accelerator_count` accelerators and the host VM), per hour, in USD. The `accelerator_*` and
    `host_*` parts are set only where the source lists them separately."""

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
    price_source: str
    price_read_on: _dt.date
    datasheet_source: str
    price_basis: str = "Compute Engine"
    accelerator_on_demand_usd_hr: float | None = None
    accelerator_spot_usd_hr: float | None = None
    host_on_demand_usd_hr: float | None = None
    host_spot_usd_hr: float | None = None
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

    def hourly(self, spot: bool = False) -> float | None:
        """USD per hour of the whole machine (accelerators and host VM), on-demand or Spot."""
        return self.spot_usd_hr if spot else self.on_demand_usd_hr

    def hourly_per_accelerator(self, spot: bool = False) -> float | None:
        """One accelerator's share of the machine's hourly price (host included): the machine's
        price divided by `accelerator_count`; None without that price."""
        price = self.hourly(spot)
        return None if price is None else price / self.accelerator_count

    @property
    def spot_discount(self) -> float | None:
        """1 - Spot / on-demand (0.6 = 60% off), or None without both prices."""
        if not self.on_demand_usd_hr or self.spot_usd_hr is None:
            return None
        return 1.0 - self.spot_usd_hr / self.on_demand_usd_hr


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
            for c in ("memory_gb", "peak_bf16_tflops", "peak_fp32_tflops", "memory_bw_gbs", *PRICES)}
    if nums["on_demand_usd_hr"] is None and not text["note"]:
        raise CatalogError(f"{_where(path, line, 'note')}: the price is empty, so the note must say why")
    if nums["on_demand_usd_hr"] is not None and text["price_basis"] not in PRICE_BASES:
        raise CatalogError(f"{_where(path, line, 'price_basis')} must be one of "
                           f"{', '.join(PRICE_BASES)}, got {text['price_basis']!r}")
    return CatalogEntry(
        name=text["name"], accelerator_type=text["accelerator_type"], machine_type=text["machine_type"],
        accelerator_count=int(count), region=text["region"], price_source=text["price_source"],
        price_read_on=read_on, datasheet_source=text["datasheet_source"], note=text["note"],
        price_basis=text["price_basis"] or "Compute Engine",
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


def sanity_problems(entries: list[CatalogEntry], max_spot_discount: float | None = None) -> list[str]:
    """The rules a catalog must keep, one sentence per row that breaks one (empty: all kept):

    - a Spot price is below the on-demand price, and its discount is no more than the largest
      Google documents (`labkit.hardware.facts.SPOT_MAX_DISCOUNT`, unless `max_spot_discount`);
    - where a row lists its parts, accelerator + host = the machine price (on-demand and Spot);
    - of two rows with the same accelerator family, count and price basis, the one with more
      memory per accelerator is not cheaper (on-demand and Spot).
    """
    from labkit.hardware.facts import SPOT_MAX_DISCOUNT

    limit = SPOT_MAX_DISCOUNT.value if max_spot_discount is None else max_spot_discount
    out = []
    for e in entries:
        if e.on_demand_usd_hr is not None and e.spot_usd_hr is not None:
            if e.spot_usd_hr >= e.on_demand_usd_hr:
                out.append(f"{e.name}: Spot ${e.spot_usd_hr:.4f}/h is not below on-demand ${e.on_demand_usd_hr:.4f}/h")
            elif e.spot_discount is not None and e.spot_discount > limit:
                out.append(f"{e.name}: Spot discount {e.spot_discount:.0%} is more than the documented "
                           f"maximum {limit:.0%}")
        for kind in ("on_demand", "spot"):
            total = getattr(e, f"{kind}_usd_hr")
            parts = (getattr(e, f"accelerator_{kind}_usd_hr"), getattr(e, f"host_{kind}_usd_hr"))
            if any(p is not None for p in parts):
                if total is None or None in parts:
                    out.append(f"{e.name}: {kind} parts need the accelerator, the host and the total")
                elif abs(parts[0] + parts[1] - total) > PARTS_TOLERANCE_USD:  # type: ignore[operator]
                    out.append(f"{e.name}: {kind} accelerator ${parts[0]:.4f} + host ${parts[1]:.4f} "
                               f"!= machine ${total:.4f}")
    for a in entries:
        for b in entries:
            if (a is b or a.memory_gb <= b.memory_gb or _family(a) != _family(b)
                    or a.accelerator_count != b.accelerator_count or a.price_basis != b.price_basis):
                continue
            for spot in (False, True):
                pa, pb = a.hourly(spot), b.hourly(spot)
                if pa is not None and pb is not None and pa < pb:
                    out.append(f"{a.name} ({a.memory_gb:g} GB) costs ${pa:.4f}/h{' on Spot' if spot else ''}, "
                               f"less than {b.name} ({b.memory_gb:g} GB) at ${pb:.4f}/h")
    return out


def _family(e: CatalogEntry) -> str:
    """The accelerator without its memory size: "A100" for both "A100 40GB" and "A100 80GB"."""
    return " ".join(w for w in e.name.split() if not w.upper().endswith("GB"))


def catalog_rows(entries: list[CatalogEntry]) -> list[dict[str, object]]:
    """Plain dicts for display: one per entry, the machine's prices as given (None when missing),
    the on-demand price per accelerator (the same as the machine's for a one-accelerator row;
    an eighth of it for an 8-GPU machine) and whose rate card they are."""
    return [{
        "name": e.name, "machine": e.machine_type, "count": e.accelerator_count,
        "memory GB": e.memory_gb, "bf16 TFLOP/s": e.peak_bf16_tflops, "HBM GB/s": e.memory_bw_gbs,
        "on-demand $/h": e.hourly(spot=False), "Spot $/h": e.hourly(spot=True),
        "on-demand $/accelerator-h": e.hourly_per_accelerator(spot=False),
        "Spot discount": None if e.spot_discount is None else f"{e.spot_discount:.0%}",
        "price basis": e.price_basis if e.has_price else None,
        "region": e.region, "price read on": e.price_read_on.isoformat(),
    } for e in entries]
