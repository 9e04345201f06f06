"""Estimated cost per hour of a CustomJob spec, from dated and sourced accelerator prices.

Prices come from the accelerator catalog (`labkit.hardware.catalog`) when this installation has
it, else from the small table below (the same source, read on the same date). Only the
accelerators are priced: the host VMs and CPU-only pools (e.g. Reduction Server replicas) are
listed as unpriced in `CostEstimate.notes`, so the figure is a lower bound, and Vertex AI's own
rate card can differ from Compute Engine's by region: check https://cloud.google.com/vertex-ai/pricing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_SOURCE = ("Compute Engine per-GPU rates, us-central1 (H100: us-east4), from skypilot-catalog "
           "catalogs/v7/gcp/vms.csv @017e2502 (generated from the Google Cloud Billing Catalog)")
_READ_ON = "2026-11-22"
# accelerator_type -> (on-demand, Spot) USD per accelerator per hour.
_FALLBACK = {
    "NVIDIA_TESLA_T4": (0.35, 0.14),
    "NVIDIA_L4": (0.56004, 0.2231),
    "NVIDIA_TESLA_A100": (2.93391, 1.1472),
    "NVIDIA_A100_80GB": (1.8462, 1.5712),
    "NVIDIA_H100_80GB": (9.79655, 1.7632),
    "NVIDIA_H200_141GB": (74.49392 / 8, 29.7976 / 8),
}


@dataclass(frozen=True)
class AcceleratorPrice:
    on_demand: float
    spot: float
    source: str
    read_on: str


def accelerator_prices() -> dict[str, AcceleratorPrice]:
    """Per-accelerator hourly prices, keyed by Vertex accelerator type."""
    out = {k: AcceleratorPrice(od, sp, _SOURCE, _READ_ON) for k, (od, sp) in _FALLBACK.items()}
    try:  # the catalog, when present, is the maintained source
        from labkit.hardware.catalog import load_catalog
    except ImportError:
        return out
    try:
        entries = load_catalog()
    except Exception:  # a broken catalog must not break a dry run; the table above stays
        return out
    for e in entries:
        if e.on_demand_usd_hr is None or e.spot_usd_hr is None or e.is_tpu:
            continue
        n = e.accelerator_count
        out[e.accelerator_type] = AcceleratorPrice(e.on_demand_usd_hr / n, e.spot_usd_hr / n,
                                                   e.price_source, str(e.price_read_on))
    return out


@dataclass
class CostEstimate:
    """USD per hour of a job's accelerators, on-demand and Spot; `usd_per_hour` is the one the
    spec's scheduling strategy pays."""

    on_demand_usd_hr: float
    spot_usd_hr: float
    spot: bool
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    @property
    def usd_per_hour(self) -> float:
        return self.spot_usd_hr if self.spot else self.on_demand_usd_hr

    def text(self) -> str:
        kind = "Spot" if self.spot else "on-demand"
        out = [f"estimated cost: ${self.usd_per_hour:,.2f}/h ({kind}; on-demand "
               f"${self.on_demand_usd_hr:,.2f}/h, Spot ${self.spot_usd_hr:,.2f}/h)"]
        out += ["  " + line for line in self.lines]
        out += ["  note: " + n for n in self.notes]
        out += ["  prices: " + s for s in self.sources]
        return "\n".join(out)


def estimate_cost(spec: Mapping[str, Any]) -> CostEstimate:
    """Accelerator cost per hour of `spec` (a CustomJobSpec dict)."""
    prices = accelerator_prices()
    est = CostEstimate(0.0, 0.0, (spec.get("scheduling") or {}).get("strategy") == "SPOT")
    for i, pool in enumerate(spec.get("worker_pool_specs") or []):
        if not pool:
            continue
        machine = pool.get("machine_spec") or {}
        replicas = int(pool.get("replica_count", 1))
        acc, count = machine.get("accelerator_type"), int(machine.get("accelerator_count") or 0)
        where = f"workerpool{i}: {replicas} x {machine.get('machine_type')}"
        if not acc or not count:
            est.notes.append(f"{where} (no accelerator) host VM not priced")
            continue
        price = prices.get(acc)
        if price is None:
            est.notes.append(f"{where} {acc}: no price known")
            continue
        od, sp = replicas * count * price.on_demand, replicas * count * price.spot
        est.on_demand_usd_hr += od
        est.spot_usd_hr += sp
        est.lines.append(f"{where} with {count} x {acc}: ${od:,.2f}/h on-demand, ${sp:,.2f}/h Spot")
        src = f"{price.source} (read {price.read_on})"
        if src not in est.sources:
            est.sources.append(src)
    if est.lines:
        est.notes.append("host VMs are not included: the figure is a lower bound")
    return est
