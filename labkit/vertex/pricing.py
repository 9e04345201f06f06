"""Estimated cost per hour of a CustomJob spec, from the dated and sourced machine catalog.

Prices are read from `labkit.hardware.catalog` (one owner for prices): each catalog row prices
a whole machine (its accelerators and host VM) under a named rate card (`price_basis`), so a
pool with accelerators is priced at the row's price per accelerator (machine price / its
accelerator count) times the pool's accelerators and replicas: a machine of the same family with
more accelerators has a proportionally larger host. CPU-only pools (e.g. Reduction Server
replicas) are not in the catalog and are listed as unpriced in `CostEstimate.notes`, so a job
with them is a lower bound. Rows priced from Compute Engine's rate card are lower bounds for a
Vertex AI job too (the row says which basis; notebook 01 compares the two). An accelerator the
catalog does not price makes the estimate incomplete: `priced` is False and `text()` says which,
rather than print $0.00.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit.vertex.machines import check_machine, tpu_chips


@dataclass(frozen=True)
class AcceleratorPrice:
    on_demand: float
    spot: float
    source: str
    read_on: str


def accelerator_prices() -> dict[str, AcceleratorPrice]:
    """Hourly prices per accelerator (GPU or TPU chip) including its share of the host VM,
    keyed by Vertex accelerator type. Empty (with nothing priced) when the catalog cannot be
    read."""
    from labkit.hardware.catalog import CatalogError, load_catalog

    try:
        entries = load_catalog()
    except CatalogError:  # a broken catalog must not break a dry run: nothing is priced
        return {}
    out = {}
    for e in entries:
        od, sp = e.hourly_per_accelerator(), e.hourly_per_accelerator(spot=True)
        if od is None or sp is None or e.accelerator_type in out:
            continue
        out[e.accelerator_type] = AcceleratorPrice(od, sp, f"{e.price_basis} rate card: {e.price_source}",
                                                   str(e.price_read_on))
    return out


@dataclass
class CostEstimate:
    """USD per hour of a job's accelerators, on-demand and Spot; `usd_per_hour` is the one the
    spec's scheduling strategy pays. `unpriced` lists accelerators with no known price: then
    the estimate is incomplete (`priced` is False) and says so instead of a figure."""

    on_demand_usd_hr: float
    spot_usd_hr: float
    spot: bool
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)

    @property
    def usd_per_hour(self) -> float:
        return self.spot_usd_hr if self.spot else self.on_demand_usd_hr

    @property
    def priced(self) -> bool:
        """At least one accelerator priced and none unknown."""
        return bool(self.lines) and not self.unpriced

    def text(self) -> str:
        kind = "Spot" if self.spot else "on-demand"
        if self.unpriced:
            out = [f"estimated cost: unknown: no price for {', '.join(self.unpriced)} in the "
                   f"accelerator catalog (labkit/hardware/catalog.csv)"]
        elif not self.lines:
            out = ["estimated cost: not estimated: no accelerators (host VMs are not priced)"]
        else:
            out = [f"estimated cost: ${self.usd_per_hour:,.2f}/h ({kind}; on-demand "
                   f"${self.on_demand_usd_hr:,.2f}/h, Spot ${self.spot_usd_hr:,.2f}/h)"]
        out += ["  " + line for line in self.lines]
        out += ["  note: " + n for n in self.notes]
        out += ["  prices: " + s for s in self.sources]
        return "\n".join(out)


def estimate_cost(spec: Mapping[str, Any]) -> CostEstimate:
    """Accelerator cost per hour of `spec` (a CustomJobSpec dict). A machine/accelerator pairing
    Vertex does not offer is refused (ParameterError naming both), never priced."""
    prices = accelerator_prices()
    est = CostEstimate(0.0, 0.0, (spec.get("scheduling") or {}).get("strategy") == "SPOT")
    for i, pool in enumerate(spec.get("worker_pool_specs") or []):
        if not pool:
            continue
        machine = pool.get("machine_spec") or {}
        replicas = int(pool.get("replica_count", 1))
        acc, count = machine.get("accelerator_type"), int(machine.get("accelerator_count") or 0)
        where = f"workerpool{i}: {replicas} x {machine.get('machine_type')}"
        if machine.get("machine_type"):
            topology = machine.get("tpu_topology")
            check_machine(machine["machine_type"], acc or None, count,
                          f"worker_pool_specs[{i}].machine_spec.", tpu_topology=topology)
            chips = tpu_chips(machine["machine_type"], topology)
            if chips:  # a TPU VM: its topology says how many chips it holds
                acc, count = chips
        if not acc or not count:
            est.notes.append(f"{where} (no accelerator) not priced: CPU machines are not in the catalog")
            continue
        price = prices.get(acc)
        if price is None:
            est.unpriced.append(f"{acc} (workerpool{i})")
            continue
        od, sp = replicas * count * price.on_demand, replicas * count * price.spot
        est.on_demand_usd_hr += od
        est.spot_usd_hr += sp
        est.lines.append(f"{where} with {count} x {acc}: ${od:,.2f}/h on-demand, ${sp:,.2f}/h Spot")
        src = f"{price.source} (read {price.read_on})"
        if src not in est.sources:
            est.sources.append(src)
    return est
