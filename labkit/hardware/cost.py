"""Time and cost of a training run on each catalog option, on-demand and Spot, and the Pareto front.

The model is deliberately simple so you can check it by hand:

    step time   = FLOPs per step / (peak FLOP/s of the option × utilisation)
    hours/epoch = steps per epoch × step time / 3600
    $/epoch     = hours/epoch × price per hour
    Spot        = same work, × (1 + expected preemption overhead), at the Spot price

The preemption overhead is `labkit.hardware.spot.SpotModel`'s (lost work and restarts).

FLOPs per step come from the model (e.g. 6·N·tokens for a transformer, or measured with a FLOP
counter). Utilisation (MFU) is always the fraction of the **datasheet** peak (the catalog's
`peak_bf16_tflops`) a run reaches. Its default is measured, not assumed: labkit's GPT-2 small
with bf16 and torch.compile at batch 48 on one H100, from the repository's benchmark results,
restated against the H100's datasheet peak (`default_mfu`; `labkit.hardware.results` says which
file). A model of yours reaches its own figure: measure it (`mfu_from_measurement`, against the
same datasheet peak) and pass it, see how the answer moves with it (`mfu_sensitivity`), or
override the step time of an option you actually timed with `measured_step_s`. Every price is
the whole machine's (accelerators and host VM). Options without a price are skipped and listed
in `EstimateTable.skipped` with the reason, never silently dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from labkit.core.config import ParameterError, check_choice, check_float, check_int
from labkit.hardware.catalog import CatalogEntry, find, load_catalog
from labkit.hardware.results import DEFAULT_MFU_ROW, MfuReference, ResultsUnavailable
from labkit.hardware.results import default_mfu as measured_default_mfu
from labkit.hardware.spot import SpotModel

REFERENCE_MACHINE = "H100 80GB"  # the catalog row whose datasheet peak the default MFU is restated against


def default_mfu_reference(catalog_path: str | None = None) -> MfuReference:
    """The measured run behind the default utilisation, with its MFU against the datasheet peak
    of the catalog's H100 row and against the GEMM measured in the same run."""
    h100 = find(load_catalog(catalog_path), REFERENCE_MACHINE)
    return measured_default_mfu(h100.peak_bf16_tflops)


@dataclass(frozen=True)
class MfuAssumption:
    """The utilisation an estimate uses: `value` (fraction of the datasheet peak), where it comes
    from, and the measured runs it can be compared with (`references`, empty with `note` saying
    why when the benchmark results are not here)."""

    value: float
    origin: str
    references: tuple[MfuReference, ...] = ()
    note: str = ""

    def text(self) -> str:
        lines = [r.text() for r in self.references] or [self.note]
        return "\n".join(lines + [f"mfu = {self.value:.1%} of the datasheet peak ({self.origin})"])

    def sensitivity_cases(self) -> list[tuple[str, float]]:
        """(label, MFU) for `mfu_sensitivity`: every measured run, and this value if it is none of them."""
        cases = [(r.label, r.of_datasheet) for r in self.references]
        if all(abs(m - self.value) > 1e-9 for _, m in cases):
            cases.append(("your mfu parameter", self.value))
        return cases


def mfu_assumption(mfu: float | None, catalog_path: str | None = None) -> MfuAssumption:
    """`mfu` when given (checked), else the measured default (`default_mfu_reference`); with the
    measured GPT-2 small runs on one H100 against the datasheet peak of the catalog's H100 row."""
    from labkit.hardware.results import GPT_MFU_ROWS, gpt_mfu

    h100 = find(load_catalog(catalog_path), REFERENCE_MACHINE)
    try:
        refs, note = tuple(gpt_mfu(h100.peak_bf16_tflops, tuple(GPT_MFU_ROWS))), ""
    except ResultsUnavailable as e:
        refs, note = (), str(e)
    if mfu is not None:
        return MfuAssumption(check_float("mfu", mfu, minimum=1e-6, maximum=1.0), "your parameter", refs, note)
    if not refs:
        raise ParameterError("mfu", None, f"has no measured default here ({note}); pass a value")
    default = next(r for r in refs if r.key == " / ".join(DEFAULT_MFU_ROW))
    return MfuAssumption(default.of_datasheet, f"the default: {default.label}", refs, note)


def default_mfu() -> float:
    """`default_mfu_reference().of_datasheet`; a ParameterError naming `mfu` when the benchmark
    results are not installed (then pass `mfu` yourself)."""
    try:
        return default_mfu_reference().of_datasheet
    except ResultsUnavailable as e:
        raise ParameterError("mfu", None, f"has no measured default here ({e}); pass a value") from None


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
    """How to turn datasheet peaks into time: `mfu` is the fraction of the datasheet peak a run
    reaches (default: measured, see `default_mfu`)."""

    mfu: float = field(default_factory=default_mfu)
    precision: str = "bf16"
    spot: SpotModel = field(default_factory=SpotModel)
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
        on_demand = e.hourly(spot=False)
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
        spot_rate = e.hourly(spot=True)
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


def mfu_sensitivity(workload: Workload, entries: list[CatalogEntry], assumptions: CostAssumptions,
                    mfus: list[tuple[str, float]]) -> list[dict[str, object]]:
    """The answer under each utilisation in `mfus` ((label, MFU of the datasheet peak) pairs):
    the fastest option and its hours, the cheapest option on-demand and on Spot and their cost.
    Time and cost scale as 1/MFU, so the ranking between options does not change when one MFU
    applies to all of them; what changes is the budget."""
    rows = []
    for label, mfu in mfus:
        t = estimate_costs(workload, entries, replace(assumptions, mfu=mfu))
        fast, cheap = t.fastest(), t.cheapest()
        row: dict[str, object] = {"assumption": label, "MFU of datasheet": f"{mfu:.1%}",
                                  "fastest": fast.name, "fastest h/run": fast.hours_per_run,
                                  "cheapest on-demand": cheap.name, "$/run": cheap.on_demand_per_run}
        if any(e.spot_per_run is not None for e in t.estimates):
            spot = t.cheapest(spot=True)
            row.update({"cheapest on Spot": spot.name, "Spot $/run": spot.spot_per_run})
        rows.append(row)
    return rows


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
