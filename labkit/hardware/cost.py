"""Time and cost of a training run on each catalog option, on-demand and Spot, and the Pareto front.

The model is deliberately simple so you can check it by hand:

    step time   = FLOPs per step / (peak FLOP/s of the option × utilisation)
    hours/epoch = steps per epoch × step time / 3600
    $/epoch     = hours/epoch × price per hour
    Spot        = same work, × (1 + expected preemption overhead), at the Spot price

The preemption overhead is `labkit.hardware.spot.SpotModel`'s (lost work and restarts).

FLOPs per step come from the model (e.g. 6·N·tokens for a transformer, or measured with a FLOP
counter); utilisation (MFU) is the fraction of the datasheet peak a run reaches. Measure it on
your hardware (`mfu_from_measurement`) and reuse it, or override the step time of an option you
actually timed with `measured_step_s`. Options without a price are skipped and listed in
`EstimateTable.skipped` with the reason, never silently dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from labkit.core.config import check_choice, check_float, check_int
from labkit.hardware.catalog import CatalogEntry
from labkit.hardware.spot import SpotModel


@dataclass
class Workload:
    """What one run must do. `flops_per_step` counts forward + backward of one optimizer step."""

    flops_per_step: float
    samples_per_step: int
    samples_per_epoch: int
    epochs: float = 1.0

    def __post_init__(self) -> None:
        check_float("flops_per_step", self.flops_per_step, minimum=1.0)
        check_int("samples_per_step", self.samples_per_step, minimum=1)
        check_int("samples_per_epoch", self.samples_per_epoch, minimum=1)
        check_float("epochs", self.epochs, minimum=0.0)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.samples_per_epoch / self.samples_per_step)


@dataclass
class CostAssumptions:
    """How to turn datasheet peaks into time: `mfu` is the utilisation a tuned run reaches."""

    mfu: float = 0.4
    precision: str = "bf16"
    spot: SpotModel = field(default_factory=SpotModel)
    include_host: bool = True
    include_tpu: bool = True

    def __post_init__(self) -> None:
        check_float("mfu", self.mfu, minimum=1e-6, maximum=1.0)
        check_choice("precision", self.precision, ("bf16", "fp32"))


@dataclass(frozen=True)
class Estimate:
    """Time and cost of the workload on one option."""

    name: str
    step_s: float
    hours_per_epoch: float
    hours_per_run: float
    on_demand_per_epoch: float
    on_demand_per_run: float
    spot_hours_per_run: float | None
    spot_per_epoch: float | None
    spot_per_run: float | None
    measured: bool = False


@dataclass
class EstimateTable:
    estimates: list[Estimate]
    skipped: list[tuple[str, str]]

    def rows(self) -> list[dict[str, object]]:
        return [{
            "option": e.name, "step s": e.step_s, "h/epoch": e.hours_per_epoch,
            "h/run": e.hours_per_run, "$/epoch": e.on_demand_per_epoch, "$/run": e.on_demand_per_run,
            "Spot h/run": e.spot_hours_per_run, "Spot $/run": e.spot_per_run,
            "from": "measured" if e.measured else "datasheet × MFU",
        } for e in self.estimates]

    def pareto(self) -> list[tuple[str, str, float, float]]:
        """Options nobody beats on both time and cost: (name, 'on-demand'|'spot', hours, $),
        sorted fastest first."""
        points = []
        for e in self.estimates:
            points.append((e.name, "on-demand", e.hours_per_run, e.on_demand_per_run))
            if e.spot_per_run is not None and e.spot_hours_per_run is not None:
                points.append((e.name, "spot", e.spot_hours_per_run, e.spot_per_run))
        return pareto_front(points)

    def cheapest(self, spot: bool = False) -> Estimate:
        key = (lambda e: e.spot_per_run) if spot else (lambda e: e.on_demand_per_run)
        candidates = [e for e in self.estimates if key(e) is not None]
        return min(candidates, key=key)  # type: ignore[arg-type,return-value]

    def fastest(self) -> Estimate:
        return min(self.estimates, key=lambda e: e.hours_per_run)

    def skipped_text(self) -> str:
        return "\n".join(f"skipped {name}: {why}" for name, why in self.skipped)


def pareto_front(points: list[tuple[str, str, float, float]]) -> list[tuple[str, str, float, float]]:
    """Points (name, kind, time, cost) not dominated by another (no worse on both, better on one)."""
    front = []
    for p in points:
        dominated = any(q[2] <= p[2] and q[3] <= p[3] and (q[2] < p[2] or q[3] < p[3]) for q in points)
        if not dominated:
            front.append(p)
    return sorted(front, key=lambda p: (p[2], p[3]))


def mfu_from_measurement(flops_per_step: float, step_s: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation of a measured run: achieved FLOP/s over the peak (in TFLOP/s)."""
    check_float("step_s", step_s, minimum=1e-12)
    check_float("peak_tflops", peak_tflops, minimum=1e-12)
    return flops_per_step / step_s / (peak_tflops * 1e12)


def estimate_costs(
    workload: Workload,
    entries: list[CatalogEntry],
    assumptions: CostAssumptions | None = None,
    measured_step_s: dict[str, float] | None = None,
) -> EstimateTable:
    """Estimate every catalog option; see the module docstring for the arithmetic."""
    a = assumptions or CostAssumptions()
    measured_step_s = measured_step_s or {}
    estimates, skipped = [], []
    for e in entries:
        if e.is_tpu and not a.include_tpu:
            skipped.append((e.name, "TPU options excluded (include_tpu=False)"))
            continue
        on_demand = e.hourly(spot=False, include_host=a.include_host)
        if on_demand is None:
            skipped.append((e.name, "no on-demand price in the catalog" + (f" ({e.note})" if e.note else "")))
            continue
        if e.name in measured_step_s:
            step_s, measured = check_float(f"measured_step_s[{e.name!r}]", measured_step_s[e.name], minimum=1e-12), True
        else:
            peak = e.peak_tflops(a.precision)
            if peak is None:
                skipped.append((e.name, f"no {a.precision} peak rate in the catalog"))
                continue
            step_s, measured = workload.flops_per_step / (peak * 1e12 * a.mfu), False
        hours_epoch = workload.steps_per_epoch * step_s / 3600.0
        hours_run = hours_epoch * workload.epochs
        spot_rate = e.hourly(spot=True, include_host=a.include_host)
        factor = 1.0 + a.spot.overhead
        estimates.append(Estimate(
            name=e.name, step_s=step_s, hours_per_epoch=hours_epoch, hours_per_run=hours_run,
            on_demand_per_epoch=hours_epoch * on_demand, on_demand_per_run=hours_run * on_demand,
            spot_hours_per_run=None if spot_rate is None else hours_run * factor,
            spot_per_epoch=None if spot_rate is None else hours_epoch * factor * spot_rate,
            spot_per_run=None if spot_rate is None else hours_run * factor * spot_rate,
            measured=measured,
        ))
    return EstimateTable(estimates, skipped)


def tpu_break_even(table: EstimateTable, entries: list[CatalogEntry], mfu: float,
                   spot: bool = False) -> list[dict[str, object]]:
    """For each TPU option: the utilisation it must reach to cost no more per run than the
    cheapest GPU option at `mfu` (cost scales as 1/MFU at a fixed price per hour)."""
    tpus = {e.name for e in entries if e.is_tpu}
    key = (lambda e: e.spot_per_run) if spot else (lambda e: e.on_demand_per_run)
    gpus = [e for e in table.estimates if e.name not in tpus and key(e) is not None]
    if not gpus:
        return []
    best = min(gpus, key=key)  # type: ignore[arg-type]
    out = []
    for e in table.estimates:
        if e.name in tpus and key(e) is not None and not e.measured:
            needed = mfu * key(e) / key(best)  # type: ignore[operator]
            out.append({"tpu": e.name, "cheapest GPU": best.name, "GPU $/run": key(best),
                        "TPU $/run at same MFU": key(e), "break-even TPU MFU": needed,
                        "cheaper at the same MFU": needed <= mfu, "reachable": needed <= 1.0})
    return out
