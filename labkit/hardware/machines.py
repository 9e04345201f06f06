"""Which catalog row a machine is, and what an hour of it costs: this machine's GPU matched to its
row by name, a job's target machine looked up by row name, and the hourly price used to turn
measured machine-hours into dollars (the reader's own figure, else the catalog row's)."""

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


def match_gpu(entries: list[CatalogEntry], gpu_name: str) -> CatalogEntry | None:
    """The single-accelerator catalog row for a GPU name such as "NVIDIA H100 80GB HBM3", or
    None. Every word of the row's name must be a word of the GPU's name ("L4" does not match
    "L40S"; "A100 80GB" needs "80GB")."""
    words = set("".join(c if c.isalnum() else " " for c in gpu_name.upper()).split())
    for e in entries:
        if e.accelerator_count == 1 and not e.is_tpu and set(e.name.upper().split()) <= words:
            return e
    return None


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
    """The reader's own price when given; else the catalog row of this machine's GPU (the whole
    machine: accelerator plus host VM, on-demand and Spot, on the rate card the row names); None
    when neither exists (a CPU has no row)."""
    if price_per_hour is not None:
        return Price(price_per_hour, spot_price_per_hour, "price_per_hour parameter")
    from labkit.core import devices

    gpus = devices.detect().gpus
    if not gpus:
        return None
    entry = match_gpu(load_catalog(catalog_path), gpus[0].name)
    if entry is None or not entry.has_price:
        return None
    return Price(entry.hourly(), entry.hourly(spot=True),
                 f"catalog row {entry.name} ({entry.machine_type}, {entry.region}, {entry.price_basis} "
                 f"rate), read {entry.price_read_on} from {entry.price_source}")
