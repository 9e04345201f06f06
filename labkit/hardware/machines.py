"""Which catalog row a machine is, and what an hour of it costs: this machine's GPU matched to its
row by name, a job's target machine looked up by row name, and the hourly price used to turn
measured machine-hours into dollars (the reader's own figure, else the catalog row's: the whole
machine for a one-GPU row, one GPU's share of it for a GPU that comes only in multi-GPU
machines, such as the H200 in an 8-GPU a3-ultragpu-8g). A catalog row's price is its machine's row
in the machine price list (`labkit.hardware.catalog.machine_price`), with that row's rate card,
source and read date; a job's cost per pool is `labkit.vertex.estimate_cost`'s."""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.config import ParameterError, check_float
from labkit.hardware.catalog import CatalogEntry, find, load_catalog


@dataclass(frozen=True)
class Price:
    """USD per hour of a machine, on-demand and Spot (None: no Spot price), with where the
    figures come from."""

    on_demand: float
    spot: float | None
    source: str

    def __post_init__(self) -> None:
        check_float("price_per_hour", self.on_demand, minimum=0.0)
        check_float("spot_price_per_hour", self.spot, minimum=0.0, allow_none=True)


def _words(name: str) -> set[str]:
    return set("".join(c if c.isalnum() else " " for c in name.upper()).split())


def gpu_rows(entries: list[CatalogEntry], gpu_name: str) -> list[CatalogEntry]:
    """Every GPU catalog row whose name matches `gpu_name` (the rule of `match_gpu`), the
    machines with the fewest accelerators first, then in file order."""
    words = _words(gpu_name)
    hits = [e for e in entries if not e.is_tpu and set(e.name.upper().split()) <= words]
    return sorted(hits, key=lambda e: e.accelerator_count)  # stable: file order within a count


def match_gpu(entries: list[CatalogEntry], gpu_name: str) -> CatalogEntry | None:
    """The single-accelerator catalog row for a GPU name such as "NVIDIA H100 80GB HBM3", or
    None. Every word of the row's name must be a word of the GPU's name ("L4" does not match
    "L40S"; "A100 80GB" needs "80GB")."""
    return next((e for e in gpu_rows(entries, gpu_name) if e.accelerator_count == 1), None)


def target_machine(name: str, catalog_path: str | None = None) -> CatalogEntry:
    """The catalog row named `name` (e.g. "H100 80GB"): the machine a Vertex job would ask for.
    An unknown name raises ParameterError naming `target` and the rows there are."""
    entries = load_catalog(catalog_path)
    try:
        return find(entries, name)
    except KeyError:
        raise ParameterError("target", name, "is not a catalog row; one of: "
                             + ", ".join(e.name for e in entries)) from None


def price_for_this_machine(price_per_hour: float | None = None, spot_price_per_hour: float | None = None,
                           catalog_path: str | None = None) -> Price | None:
    """The reader's own price when given; else the catalog's price for this machine's GPU
    (`catalog_price`): a whole machine (accelerator plus host VM, on-demand and Spot, on the rate
    card its row names), or one GPU's share of a machine with several; None when neither exists
    (a CPU has no row)."""
    if price_per_hour is not None:
        return Price(price_per_hour, spot_price_per_hour, "price_per_hour parameter")
    from labkit.core import devices

    gpus = devices.detect().gpus
    if not gpus:
        return None
    return catalog_price(load_catalog(catalog_path), gpus[0].name)


def catalog_price(entries: list[CatalogEntry], gpu_name: str) -> Price | None:
    """The hourly price of one GPU named `gpu_name`: the priced row with the fewest accelerators
    among the rows `gpu_rows` matches. A single-accelerator row gives its whole machine's price;
    a GPU the catalog prices only in machines with several (an H200 comes eight to an
    a3-ultragpu-8g) gets one GPU's share, the machine's price divided by its accelerator count,
    and `Price.source` says so. None when no matching row has a price."""
    entry = next((e for e in gpu_rows(entries, gpu_name) if e.has_price), None)
    if entry is None or entry.on_demand_usd_hr is None:
        return None
    n, on_demand, spot = entry.accelerator_count, entry.on_demand_usd_hr, entry.spot_usd_hr
    read = f"read {entry.price_read_on} from {entry.price_source}"
    if n == 1:
        return Price(on_demand, spot, f"catalog row {entry.name} ({entry.machine_type}, {entry.region}, "
                                      f"{entry.price_basis} rate), {read}")
    divided = f"on-demand ${on_demand:.4f}/h" + ("" if spot is None else f", Spot ${spot:.4f}/h")
    return Price(on_demand / n, entry.hourly_per_accelerator(spot=True),
                 f"one GPU's share of catalog row {entry.name} ({entry.machine_type} with {n} x "
                 f"{entry.accelerator_type}, {entry.region}, {entry.price_basis} rate): the machine's "
                 f"price ({divided}) divided by its {n} GPUs, {read}")
