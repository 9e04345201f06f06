"""Machine prices and the accelerator catalog, in two CSV files you can update.

**The machine price list** (`machine_prices.csv`, `load_machine_prices`) is the one owner of
prices: one row per machine as its source prices it, never a scaled host. A row is a whole
machine (``g2-standard-32`` with its one L4, ``a2-highgpu-8g`` with eight A100s, a TPU VM slice
``ct6e-standard-4t`` of 16 chips, a CPU machine ``n1-highcpu-16``), or, where the source lists
the host and its GPUs separately, the host (no accelerator: ``n1-standard-8``,
``a3-ultragpu-8g``) and, in a row with no machine type, the GPUs attached to it (2 x
NVIDIA_TESLA_T4; 8 x NVIDIA_H200_141GB). `machine_price(prices, machine_type, accelerator_type,
count)` finds what one replica costs: the whole-machine row, else host row + attached-GPU row,
else None (then the machine is unpriced: nothing is guessed from another size).

Every row names its rate card (`price_basis`), source (`price_source`, a URL pinned to a commit)
and read date (`price_read_on`), in one region (us-central1):

- "Vertex AI custom training": Vertex AI's own training rate, where a source quoting
  https://cloud.google.com/vertex-ai/pricing could be read. Only n1-standard-4 could
  ($0.21849885/h against Compute Engine's $0.189999/h, 15% more); Vertex AI's Spot rate for a
  training machine appears in no source read (its Spot page says only that Spot jobs are
  "billed by job duration and machine type"), so that row has no Spot price.
- "Compute Engine": the same machine rented directly, from Google's Cloud Billing Catalog as
  exported by Cyclenerd/google-cloud-pricing-cost-calculator (generated 2026-07-30), or, for N1
  GPUs and the A3 Mega/Ultra hosts and GPUs, as listed by skypilot-org/skypilot-catalog. Vertex
  AI bills training at its own rates, so these are lower bounds for a Vertex AI job.
- "Cloud TPU": Cloud TPU's rate for the slice (host VMs included), also from the SkyPilot
  catalog; Vertex AI's own TPU rate was not read.

What no row covers: other regions, sustained-use and committed-use discounts, savings plans,
boot disks, network and storage; Spot prices change (up to once a day) and are as the source
last saw them.

**The accelerator catalog** (`catalog.csv`, `load_catalog`) lists the accelerator options the
course compares: the accelerator, how many, the machine type that carries them, memory per
accelerator, dense datasheet rates (the 16-bit tensor-core TFLOP/s, bf16, or fp16 on a GPU
without bf16 such as the T4; fp32 TFLOP/s) and memory bandwidth. A shipped GPU row leaves its
datasheet columns empty: its figures, source and read date are its accelerator's row in the GPU
table (`labkit.hardware.gpus`, `gpus.csv`), the one copy of them; a TPU row, or a row of your
own for an accelerator the table lacks, carries its own. A shipped row leaves its price columns
empty: its price is its machine's in the price list (`machine_price`), with that row's basis,
source and date, and, where the list has host and GPUs apart, the parts in the `accelerator_*`
and `host_*` columns. A row of your own may carry its own price instead (then `price_basis`,
`price_source` and `price_read_on` are required; parts must add up to the machine price). A GPU
that Google offers only in machines with several of them (the H200 comes eight to an
a3-ultragpu-8g) has a row for that machine; one GPU's share of it is the machine price divided
by `accelerator_count` (`CatalogEntry.hourly_per_accelerator`, and
`labkit.hardware.machines.catalog_price` for the GPU a notebook runs on). A row with no price
anywhere needs a `note` saying why. `sanity_problems` checks the rules every catalog must keep
(Spot below on-demand and within the documented discount, parts adding up to the total, a
bigger-memory variant of an accelerator never cheaper). Use your own file with
`load_catalog(path)`.
"""

from __future__ import annotations

import csv
import datetime as _dt
import os
from dataclasses import dataclass
from pathlib import Path

from labkit.hardware.gpus import GPU_TABLE_PATH, by_accelerator_type

CATALOG_PATH = Path(__file__).with_name("catalog.csv")
MACHINE_PRICES_PATH = Path(__file__).with_name("machine_prices.csv")
VERTEX_BASIS = "Vertex AI custom training"

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
# The columns a GPU row takes from the GPU table when it leaves them all empty.
DATASHEET = ("memory_gb", "peak_bf16_tflops", "peak_fp32_tflops", "memory_bw_gbs", "datasheet_source")
MACHINE_PRICE_COLUMNS = (
    "machine_type", "accelerator_type", "accelerator_count", "on_demand_usd_hr", "spot_usd_hr",
    "price_basis", "region", "price_source", "price_read_on", "note",
)


class CatalogError(ValueError):
    """A catalog file is malformed; the message names the file, the row and the column."""


# --- the machine price list ------------------------------------------------------------------


@dataclass(frozen=True)
class MachinePrice:
    """One row of the machine price list: USD per hour of a whole machine, of a host without its
    accelerators (`accelerator_type` ""), or of accelerators attached to a host priced by its own
    row (`machine_type` ""). `spot_usd_hr` is None where the source gives no Spot price."""

    machine_type: str
    accelerator_type: str
    accelerator_count: int
    on_demand_usd_hr: float
    spot_usd_hr: float | None
    price_basis: str
    region: str
    price_source: str
    price_read_on: _dt.date
    note: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return self.machine_type, self.accelerator_type, self.accelerator_count

    def hourly(self, spot: bool = False) -> float | None:
        return self.spot_usd_hr if spot else self.on_demand_usd_hr

    def cite(self) -> str:
        return f"{self.price_basis} rate card: {self.price_source} (read {self.price_read_on.isoformat()})"


@dataclass(frozen=True)
class MachineQuote:
    """What one replica of a machine costs: its whole-machine row, or its host row and the row of
    the accelerators attached to it (`parts`, host first)."""

    machine_type: str
    accelerator_type: str
    accelerator_count: int
    parts: tuple[MachinePrice, ...]

    def hourly(self, spot: bool = False) -> float | None:
        """USD per hour of one replica; None (Spot) when a part has no Spot price."""
        prices = [p.hourly(spot) for p in self.parts]
        return None if None in prices else sum(prices)  # type: ignore[arg-type]

    @property
    def price_basis(self) -> str:
        bases = {p.price_basis for p in self.parts}
        return bases.pop() if len(bases) == 1 else " + ".join(p.price_basis for p in self.parts)

    @property
    def region(self) -> str:
        return self.parts[0].region


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


def _url(raw: str, path: Path, line: int, column: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise CatalogError(f"{_where(path, line, column)} must be a URL, got {raw!r}")
    return raw


def _date(raw: str, path: Path, line: int, column: str) -> _dt.date:
    try:
        return _dt.date.fromisoformat(raw)
    except ValueError:
        raise CatalogError(f"{_where(path, line, column)} must be an ISO date (YYYY-MM-DD), "
                           f"got {raw!r}") from None


def _basis(raw: str, path: Path, line: int) -> str:
    if raw not in PRICE_BASES:
        raise CatalogError(f"{_where(path, line, 'price_basis')} must be one of "
                           f"{', '.join(PRICE_BASES)}, got {raw!r}")
    return raw


def _count(raw: str, path: Path, line: int, minimum: int) -> int:
    value = _number(raw, path, line, "accelerator_count", required=True)
    if value is None or value < minimum or not float(value).is_integer():
        raise CatalogError(f"{_where(path, line, 'accelerator_count')} must be a whole number >= {minimum}")
    return int(value)


def _parse_price_row(row: dict[str, str], path: Path, line: int) -> MachinePrice:
    text = {k: (row.get(k) or "").strip() for k in MACHINE_PRICE_COLUMNS}
    machine, accelerator = text["machine_type"], text["accelerator_type"]
    if not machine and not accelerator:
        raise CatalogError(f"{_where(path, line, 'machine_type')} and accelerator_type are both empty: "
                           "a row prices a machine, a host or attached accelerators")
    for column in ("region", "price_source", "price_read_on", "price_basis"):
        if not text[column]:
            raise CatalogError(f"{_where(path, line, column)} is empty: every row needs it")
    count = _count(text["accelerator_count"], path, line, 1 if accelerator else 0)
    if not accelerator and count:
        raise CatalogError(f"{_where(path, line, 'accelerator_count')} must be 0 without an accelerator_type")
    on_demand = _number(text["on_demand_usd_hr"], path, line, "on_demand_usd_hr", required=True)
    spot = _number(text["spot_usd_hr"], path, line, "spot_usd_hr", required=False)
    if spot is None and not text["note"]:
        raise CatalogError(f"{_where(path, line, 'note')}: the Spot price is empty, so the note must say why")
    return MachinePrice(machine, accelerator, count, on_demand, spot,  # type: ignore[arg-type]
                        _basis(text["price_basis"], path, line), text["region"],
                        _url(text["price_source"], path, line, "price_source"),
                        _date(text["price_read_on"], path, line, "price_read_on"), text["note"])


def load_machine_prices(path: str | os.PathLike | None = None) -> list[MachinePrice]:
    """Read and validate a machine price list (default: the one shipped with labkit); a
    malformed file raises CatalogError naming the file, the row and the column."""
    path = Path(path) if path else MACHINE_PRICES_PATH
    if not path.exists():
        raise CatalogError(f"{path}: machine price list not found")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in MACHINE_PRICE_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CatalogError(f"{path}: missing column(s) {', '.join(missing)}")
        rows = [_parse_price_row(row, path, i) for i, row in enumerate(reader, start=2)]
    keys = [r.key for r in rows]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise CatalogError(f"{path}: more than one row for {', '.join(map(str, dupes))}")
    if not rows:
        raise CatalogError(f"{path}: no rows")
    return rows


def machine_price(prices: list[MachinePrice], machine_type: str, accelerator_type: str | None = None,
                  accelerator_count: int = 0) -> MachineQuote | None:
    """The price of one replica of `machine_type` with `accelerator_count` x `accelerator_type`
    (a TPU VM: its chips): the row for exactly that machine, else its host row plus the row of
    that many attached accelerators, else None. Never a row of another size scaled."""
    accelerator = accelerator_type or ""
    count = accelerator_count if accelerator else 0
    by_key = {p.key: p for p in prices}
    whole = by_key.get((machine_type, accelerator, count))
    if whole is not None:
        return MachineQuote(machine_type, accelerator, count, (whole,))
    host, attached = by_key.get((machine_type, "", 0)), by_key.get(("", accelerator, count))
    if accelerator and host is not None and attached is not None:
        return MachineQuote(machine_type, accelerator, count, (host, attached))
    return None


def machine_price_problems(prices: list[MachinePrice], max_spot_discount: float | None = None) -> list[str]:
    """The rules a price list must keep, one sentence per row that breaks one: a Spot price is
    below the on-demand price and within the largest discount Google documents."""
    from labkit.hardware.facts import SPOT_MAX_DISCOUNT

    limit = SPOT_MAX_DISCOUNT.value if max_spot_discount is None else max_spot_discount
    out = []
    for p in prices:
        name = " x ".join(str(x) for x in p.key if x)
        if p.spot_usd_hr is None:
            continue
        if p.spot_usd_hr >= p.on_demand_usd_hr:
            out.append(f"{name}: Spot ${p.spot_usd_hr:.4f}/h is not below on-demand ${p.on_demand_usd_hr:.4f}/h")
        elif 1 - p.spot_usd_hr / p.on_demand_usd_hr > limit:
            out.append(f"{name}: Spot discount {1 - p.spot_usd_hr / p.on_demand_usd_hr:.0%} is more than "
                       f"the documented maximum {limit:.0%}")
    return out


# --- the accelerator catalog -----------------------------------------------------------------


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
    datasheet_read_on: _dt.date | None = None  # when `datasheet_source` was read (GPU table rows)

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


def _datasheet(text: dict[str, str], path: Path, line: int) -> dict[str, object]:
    """A row's datasheet fields: its accelerator's in the GPU table when it gives none of them,
    else its own (memory, 16-bit rate, bandwidth and source required)."""
    sheet = by_accelerator_type(text["accelerator_type"])
    if sheet is not None and not any(text[c] for c in DATASHEET):
        return dict(memory_gb=sheet.memory_gb, peak_bf16_tflops=sheet.peak(sheet.fastest_format()),
                    peak_fp32_tflops=sheet.peak("fp32"), memory_bw_gbs=sheet.memory_bw_gbs,
                    datasheet_source=sheet.source, datasheet_read_on=sheet.read_on)
    if not text["datasheet_source"]:
        raise CatalogError(f"{_where(path, line, 'datasheet_source')} is empty: a row whose accelerator is "
                           f"not in the GPU table ({GPU_TABLE_PATH.name}) needs its own datasheet")
    out: dict[str, object] = {c: _number(text[c], path, line, c, required=c != "peak_fp32_tflops")
                              for c in DATASHEET[:-1]}
    return out | {"datasheet_source": _url(text["datasheet_source"], path, line, "datasheet_source")}


def _parse_row(row: dict[str, str], path: Path, line: int, prices: list[MachinePrice]) -> CatalogEntry:
    text = {k: (row.get(k) or "").strip() for k in COLUMNS}
    for column in ("name", "accelerator_type", "machine_type", "region"):
        if not text[column]:
            raise CatalogError(f"{_where(path, line, column)} is empty: every row needs it")
    count = _count(text["accelerator_count"], path, line, 1)
    sheet = _datasheet(text, path, line)
    nums = {c: _number(text[c], path, line, c, required=False) for c in PRICES}
    # Price columns given are checked even where the machine price list supplies the price.
    basis = _basis(text["price_basis"], path, line) if text["price_basis"] else ""
    source = _url(text["price_source"], path, line, "price_source") if text["price_source"] else ""
    read_on = _date(text["price_read_on"], path, line, "price_read_on") if text["price_read_on"] else None
    fields = dict(name=text["name"], accelerator_type=text["accelerator_type"], machine_type=text["machine_type"],
                  accelerator_count=count, region=text["region"], note=text["note"], **sheet)
    quote = None if nums["on_demand_usd_hr"] is not None else \
        machine_price(prices, text["machine_type"], text["accelerator_type"], count)
    if quote is not None:  # the shipped way: the machine's price from the price list
        return CatalogEntry(**fields, **_quoted(quote))  # type: ignore[arg-type]
    if nums["on_demand_usd_hr"] is None and not text["note"]:
        raise CatalogError(f"{_where(path, line, 'note')}: the price is empty and the machine price list has "
                           f"no {text['machine_type']} with {count} x {text['accelerator_type']}, so the note "
                           "must say why")
    if nums["on_demand_usd_hr"] is not None and not basis:
        raise CatalogError(f"{_where(path, line, 'price_basis')} is empty: a row with its own price needs it")
    for column, value in (("price_source", source), ("price_read_on", read_on)):
        if not value:
            raise CatalogError(f"{_where(path, line, column)} is empty: a row without a price from the machine "
                               "price list needs it")
    return CatalogEntry(**fields, price_source=source, price_read_on=read_on,  # type: ignore[arg-type]
                        price_basis=basis or "Compute Engine", **nums)  # type: ignore[arg-type]


def _quoted(quote: MachineQuote) -> dict[str, object]:
    """CatalogEntry's price fields from a machine's quote: the whole machine, and host and
    accelerator parts where the price list has them apart."""
    parts = quote.parts
    sources = list(dict.fromkeys(p.price_source for p in parts))
    out: dict[str, object] = dict(
        on_demand_usd_hr=quote.hourly(), spot_usd_hr=quote.hourly(spot=True), price_basis=quote.price_basis,
        price_source=sources[0] if len(sources) == 1 else f"{parts[0].price_source} (host VM) + "
                                                          f"{parts[1].price_source} (accelerators)",
        price_read_on=min(p.price_read_on for p in parts))
    if len(parts) == 2:
        host, accelerators = parts
        out |= dict(host_on_demand_usd_hr=host.on_demand_usd_hr, host_spot_usd_hr=host.spot_usd_hr,
                    accelerator_on_demand_usd_hr=accelerators.on_demand_usd_hr,
                    accelerator_spot_usd_hr=accelerators.spot_usd_hr)
    return out


def load_catalog(path: str | os.PathLike | None = None,
                 prices: list[MachinePrice] | None = None) -> list[CatalogEntry]:
    """Read and validate a catalog CSV (default: the one shipped with labkit). A row without a
    price of its own takes its machine's from `prices` (default: the shipped machine price list)."""
    path = Path(path) if path else CATALOG_PATH
    if not path.exists():
        raise CatalogError(f"{path}: catalog file not found")
    prices = load_machine_prices() if prices is None else prices
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CatalogError(f"{path}: missing column(s) {', '.join(missing)}")
        entries = [_parse_row(row, path, i, prices) for i, row in enumerate(reader, start=2)]
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
