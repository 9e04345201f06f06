"""Estimated cost per hour of a CustomJob spec, from the dated and sourced machine price list.

Each worker pool costs `replica_count` x the price of one of its machines, as the machine price
list (`labkit.hardware.catalog.load_machine_prices`, labkit/hardware/machine_prices.csv, the one
owner of prices) prices that machine type with that accelerator count
(`labkit.hardware.catalog.machine_price`): a whole-machine row (``g2-standard-32`` at its own
price, never four g2-standard-8s), a host row plus the row of its attached GPUs (an N1 machine
with T4s or V100s), a CPU machine (Reduction Server replicas on ``n1-highcpu-16``, parameter
servers, evaluators, CPU-only jobs), or a TPU VM slice as its topology's chips. A machine the
list does not price makes the estimate incomplete: `priced` is False and `text()` names it,
rather than print $0.00 or scale a neighbour's price.

Whose rate card: each row says. Only n1-standard-4 is priced at Vertex AI's own training rate
(15% above Compute Engine's); the rest are Compute Engine's or Cloud TPU's list prices, lower
bounds for a Vertex AI job, and `text()` says so. Vertex AI publishes no Spot rate for a training
machine in any source read, so a Spot job on a Vertex-priced row is unpriced on Spot. Not
priced at all: regions other than us-central1, sustained-use or committed-use discounts, boot
disks, network and storage.

`accelerator_prices()` gives one accelerator's share of the accelerator catalog's machines (host
included) for notebooks that reason per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit.hardware.catalog import (
    VERTEX_BASIS,
    CatalogError,
    MachineQuote,
    load_catalog,
    load_machine_prices,
    machine_price,
)
from labkit.hardware.facts import VERTEX_TRAINING_N1_STANDARD_4, VERTEX_TRAINING_PREMIUM
from labkit.vertex.machines import check_machine, tpu_chips

PRICE_LIST = "labkit/hardware/machine_prices.csv"
NOT_PRICED = "us-central1 list prices; boot disks, network, storage and discounts are not priced"


@dataclass(frozen=True)
class AcceleratorPrice:
    on_demand: float
    spot: float
    source: str
    read_on: str


def accelerator_prices() -> dict[str, AcceleratorPrice]:
    """Hourly prices per accelerator (GPU or TPU chip) including its share of the host VM,
    keyed by Vertex accelerator type: the accelerator catalog's machine price divided by its
    accelerator count. Empty (with nothing priced) when the catalog cannot be read."""
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
    """USD per hour of a job's machines, on-demand and Spot; `usd_per_hour` is the one the spec's
    scheduling strategy pays. `unpriced` lists machines with no known price: then the estimate is
    incomplete (`priced` is False) and says so instead of a figure. `spot_unpriced` lists machines
    with an on-demand price but no Spot price: `spot_usd_hr` is then NaN, and a Spot job is not
    priced. `bases` are the rate cards the figures come from; any but Vertex AI's makes the
    figure a lower bound (`lower_bound`)."""

    on_demand_usd_hr: float
    spot_usd_hr: float
    spot: bool
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)
    spot_unpriced: list[str] = field(default_factory=list)
    bases: list[str] = field(default_factory=list)

    @property
    def usd_per_hour(self) -> float:
        return self.spot_usd_hr if self.spot else self.on_demand_usd_hr

    @property
    def priced(self) -> bool:
        """Every pool priced, on the rate the spec pays."""
        return bool(self.lines) and not self.unpriced and not (self.spot and self.spot_unpriced)

    @property
    def lower_bound(self) -> bool:
        return any(b != VERTEX_BASIS for b in self.bases)

    def _headline(self) -> str:
        if self.unpriced:
            return (f"estimated cost: unknown: no price for {', '.join(self.unpriced)} in the machine price "
                    f"list ({PRICE_LIST})")
        if not self.lines:
            return "estimated cost: not estimated: the spec has no worker pools"
        missing = f"no Spot price for {', '.join(self.spot_unpriced)}"
        if self.spot and self.spot_unpriced:
            return f"estimated cost: unknown on Spot: {missing} (on-demand ${self.on_demand_usd_hr:,.2f}/h)"
        kind = "Spot" if self.spot else "on-demand"
        spot = f"Spot unknown: {missing}" if self.spot_unpriced else f"Spot ${self.spot_usd_hr:,.2f}/h"
        bound = " at least" if self.lower_bound else ""
        return (f"estimated cost:{bound} ${self.usd_per_hour:,.2f}/h ({kind}; on-demand "
                f"${self.on_demand_usd_hr:,.2f}/h, {spot})")

    def text(self) -> str:
        out = [self._headline()]
        out += ["  " + line for line in self.lines]
        if self.lines and self.lower_bound:
            others = ", ".join(b for b in self.bases if b != VERTEX_BASIS)
            out.append(f"  note: a lower bound: priced at {others} rates, not Vertex AI's own training rates "
                       f"(Vertex AI bills n1-standard-4 {VERTEX_TRAINING_PREMIUM - 1:.0%} above Compute Engine, "
                       f"{VERTEX_TRAINING_N1_STANDARD_4.cite()})")
        out += ["  note: " + n for n in self.notes]
        out += ["  prices: " + s for s in self.sources]
        return "\n".join(out)


def _pool_machine(pool: Mapping[str, Any], i: int) -> tuple[str, str, int]:
    """(machine type, accelerator type, accelerators) of one replica; a TPU VM's topology says
    how many chips it holds. A pairing Vertex does not offer is refused (ParameterError)."""
    machine = pool.get("machine_spec") or {}
    machine_type = machine.get("machine_type") or ""
    acc, count = machine.get("accelerator_type") or "", int(machine.get("accelerator_count") or 0)
    topology = machine.get("tpu_topology")
    if not machine_type:  # nothing to price (validate() names the missing field)
        return "", "", 0
    check_machine(machine_type, acc or None, count, f"worker_pool_specs[{i}].machine_spec.", tpu_topology=topology)
    chips = tpu_chips(machine_type, topology)
    if chips:
        acc, count = chips
    return machine_type, acc, count if acc else 0


def _label(machine_type: str, acc: str, count: int) -> str:
    return f"{acc} x {count} on {machine_type}" if acc else machine_type or "a machine without machine_type"


def _line(i: int, replicas: int, quote: MachineQuote) -> str:
    od, sp = quote.hourly(), quote.hourly(spot=True)
    with_acc = f" with {quote.accelerator_count} x {quote.accelerator_type}" if quote.accelerator_type else ""
    spot = "Spot unknown" if sp is None else f"${replicas * sp:,.2f}/h Spot"
    parts = ""
    if len(quote.parts) == 2:  # host and attached accelerators, each its own row
        host, accelerators = quote.parts
        parts = f": host ${host.on_demand_usd_hr:,.4f}/h + accelerators ${accelerators.on_demand_usd_hr:,.4f}/h"
    return (f"workerpool{i}: {replicas} x {quote.machine_type}{with_acc}: ${replicas * od:,.2f}/h on-demand, "  # type: ignore[operator]
            f"{spot} ({quote.price_basis}, {quote.region}{parts})")


def estimate_cost(spec: Mapping[str, Any]) -> CostEstimate:
    """Cost per hour of `spec` (a CustomJobSpec dict): every pool's replicas x its machine's
    price. A machine/accelerator pairing Vertex does not offer is refused (ParameterError naming
    both), never priced."""
    est = CostEstimate(0.0, 0.0, (spec.get("scheduling") or {}).get("strategy") == "SPOT")
    try:
        prices = load_machine_prices()
    except CatalogError as e:  # a broken price list must not break a dry run: nothing is priced
        prices = []
        est.notes.append(f"the machine price list could not be read: {e}")
    for i, pool in enumerate(spec.get("worker_pool_specs") or []):
        if not pool:
            continue
        replicas = int(pool.get("replica_count", 1))
        machine_type, acc, count = _pool_machine(pool, i)
        label = f"{_label(machine_type, acc, count)} (workerpool{i})"
        quote = machine_price(prices, machine_type, acc, count)
        if quote is None:
            est.unpriced.append(label)
            continue
        od, sp = quote.hourly(), quote.hourly(spot=True)
        est.on_demand_usd_hr += replicas * od  # type: ignore[operator]
        if sp is None:
            est.spot_unpriced.append(label)
        else:
            est.spot_usd_hr += replicas * sp
        est.lines.append(_line(i, replicas, quote))
        for part in quote.parts:
            if part.price_basis not in est.bases:
                est.bases.append(part.price_basis)
            if part.cite() not in est.sources:
                est.sources.append(part.cite())
    if est.spot_unpriced:
        est.spot_usd_hr = math.nan  # never a Spot figure that leaves a pool out
    if est.lines:
        est.notes.append(NOT_PRICED)
    return est
