"""Time and cost of a training run on each catalog option, on-demand and Spot, compared on equal
terms, and the Pareto front.

Every row of one comparison runs the same number of accelerators (`CostAssumptions.gpus`: GPUs,
or chips on a TPU row) and is priced per accelerator used, so a one-GPU machine never meets an
eight-GPU one. The arithmetic, per row, is simple enough to check by hand:

    compute step = FLOPs per GPU step / (one GPU's datasheet peak × MFU) / scaling efficiency
    input step   = samples per GPU step / input samples/s per GPU   (0 when no rate is known)
    step time    = max(compute step, input step)       a row whose input step is longer says so
    steps/epoch  = ceil(samples per epoch / (samples per GPU step × GPUs))
    hours/epoch  = steps per epoch × step time / 3600
    $/epoch      = hours/epoch × GPUs × one GPU's share of its machine's hourly price
    Spot         = same work, × (1 + expected preemption overhead), at the Spot price

- **Price per GPU used.** A catalog row is a whole machine; one GPU's share is its price over
  its accelerator count (`CatalogEntry.hourly_per_accelerator`, host included). Compute Engine
  prices the machines of a GPU family per GPU (a2-highgpu-8g costs eight a2-highgpu-1g in the
  machine price list), so N GPUs cost N shares; a GPU sold only in 8-GPU machines (the H200 in
  an a3-ultragpu-8g) is priced per GPU used too, and `EstimateTable.assumptions_text` says what
  renting the whole machine for fewer GPUs costs instead.
- **Scaling.** N data-parallel GPUs take one step each at once, each slower than alone by the
  scaling efficiency (weak scaling: t₁ / t_N). labkit has measured no multi-GPU scaling (its DDP
  runs are processes on a CPU, notebook 02), so above one GPU the efficiency is yours
  (`scaling_efficiency`) or `DEFAULT_SCALING_EFFICIENCY`, a published figure, always shown.
- **Utilisation per model kind.** MFU is always the fraction of the **datasheet** peak (the
  catalog's `peak_bf16_tflops`) a run reaches. `model_mfu` takes labkit's measured run of the
  same kind of model, restated against the H100's datasheet peak: GPT-2 small (bf16,
  torch.compile, batch 48) for "gpt", ResNet-50 for "cnn" and "resnet"
  (`labkit.hardware.results.kind_mfu`); any other model needs the user's own figure (measure
  it with `mfu_from_measurement`). Each row carries the MFU it used and where it comes from.
- **TPU rows.** Nothing labkit measured ran on a TPU (its torch engine targets GPUs), so a GPU's
  MFU is never applied to one: without `tpu_mfu` a TPU row has no time or cost, only the MFU at
  which it would match the cheapest GPU row (`Estimate.break_even_mfu`), and it takes no part in
  `fastest`, `cheapest` or the Pareto front.
- **Input.** The samples/s the input pipeline delivers per GPU (`input_samples_per_s`, measured)
  caps every row's throughput; a row whose GPU would wait for data is `input_bound`.

The preemption overhead is `labkit.hardware.spot.SpotModel`'s (lost work and restarts). Override
the step time of an option you actually timed with `measured_step_s`, and see how the answer moves
with the MFU with `mfu_sensitivity`. Options without a price are skipped and listed in
`EstimateTable.skipped` with the reason, never silently dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from labkit.core.config import ParameterError, check_choice, check_float, check_int
from labkit.hardware.catalog import CatalogEntry, find, load_catalog
from labkit.hardware.results import DEFAULT_MFU_ROW, MfuReference, ResultsUnavailable
from labkit.hardware.results import default_mfu as measured_default_mfu
from labkit.hardware.spot import SpotModel

REFERENCE_MACHINE = "H100 80GB"  # the catalog row whose datasheet peak the measured MFUs are restated against

# The kind of model labkit measured for each course model: matmul-bound (GPT-2 small) or
# convolutional (ResNet-50), the keys of `labkit.hardware.results.KIND_MFU_ROWS`.
MODEL_KINDS = {"gpt": "matmul", "cnn": "convolutional", "resnet": "convolutional"}

# Above one GPU, unless the user states theirs: Horovod's published data-parallel benchmark,
# https://github.com/horovod/horovod/blob/27743d08ca7a59290b52154c8cddc807006436d3/docs/benchmarks.rst
# (read 2026-11-29): "128 servers with 4 Pascal GPUs each connected by RoCE-capable 25 Gbit/s
# network. Horovod achieves 90% scaling efficiency for both Inception V3 and ResNet-101, and 68%
# scaling efficiency for VGG-16."
DEFAULT_SCALING_EFFICIENCY = 0.90
DEFAULT_SCALING_SOURCE = (
    "the default, not measured by labkit (its DDP runs, notebook 02, are processes on a CPU): Horovod's "
    "published 90% for Inception V3 and ResNet-101 on 512 Pascal GPUs over 25 Gbit/s RoCE (68% for VGG-16), "
    "https://github.com/horovod/horovod/blob/27743d08ca7a59290b52154c8cddc807006436d3/docs/benchmarks.rst "
    "(read 2026-11-29); pass scaling_efficiency for yours")
NO_TPU_MFU = "none: no TPU run measured (pass tpu_mfu)"


def default_mfu_reference(catalog_path: str | None = None) -> MfuReference:
    """The measured run behind the default utilisation, with its MFU against the datasheet peak
    of the catalog's H100 row and against the GEMM measured in the same run."""
    h100 = find(load_catalog(catalog_path), REFERENCE_MACHINE)
    return measured_default_mfu(h100.peak_bf16_tflops)


@dataclass(frozen=True)
class MfuAssumption:
    """The utilisation an estimate uses: `value` (fraction of the datasheet peak), where it comes
    from (`origin`, and `label` short enough for a table row), and the measured runs it can be
    compared with (`references` for GPT-2 small, `cases` for the others; empty with `note`
    saying why when the benchmark results are not here)."""

    value: float
    origin: str
    references: tuple[MfuReference, ...] = ()
    note: str = ""
    label: str = ""
    cases: tuple[tuple[str, float], ...] = ()

    def text(self) -> str:
        lines = [r.text() for r in self.references] or [self.note]
        return "\n".join([ln for ln in lines if ln] + [f"mfu = {self.value:.1%} of the datasheet peak ({self.origin})"])

    @property
    def source(self) -> str:
        """What a table row says the MFU comes from."""
        return self.label or self.origin

    def sensitivity_cases(self) -> list[tuple[str, float]]:
        """(label, MFU) for `mfu_sensitivity`: every measured run, and this value if it is none of them."""
        cases = [(r.label, r.of_datasheet) for r in self.references] + list(self.cases)
        if all(abs(m - self.value) > 1e-9 for _, m in cases):
            cases.append(("your mfu parameter" if self.origin == "your parameter" else self.source, self.value))
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
        return MfuAssumption(check_float("mfu", mfu, minimum=1e-6, maximum=1.0), "your parameter", refs, note,
                             label="your mfu parameter")
    if not refs:
        raise ParameterError("mfu", None, f"has no measured default here ({note}); pass a value")
    default = next(r for r in refs if r.key == " / ".join(DEFAULT_MFU_ROW))
    return MfuAssumption(default.of_datasheet, f"the default: {default.label}", refs, note,
                         label=f"measured: labkit GPT-2 small, one H100 ({default.source.name})")


def model_mfu(model: str, mfu: float | None = None, precision: str = "bf16",
              catalog_path: str | None = None) -> MfuAssumption:
    """The utilisation for `model`: `mfu` when given; else what labkit measured for a model of
    its kind (`MODEL_KINDS`: GPT-2 small for "gpt", ResNet-50 for "cnn" and "resnet"), restated
    against the datasheet peak of the catalog's H100 row and assumed to carry over to every GPU.
    A model labkit measured nothing like (or a precision it has no run at) needs `mfu`: a
    ParameterError naming it says so."""
    from labkit.hardware.results import kind_mfu, resnet_ladder

    check_choice("precision", precision, ("bf16", "fp16", "fp32"))
    kind = MODEL_KINDS.get(model)
    if kind == "matmul" and precision != "fp32":
        return mfu_assumption(mfu, catalog_path)
    if mfu is not None:
        return MfuAssumption(check_float("mfu", mfu, minimum=1e-6, maximum=1.0), "your parameter",
                             label="your mfu parameter")
    if kind is None:
        raise ParameterError("mfu", None, f"has no measured value for model {model!r}: labkit measured "
                             f"{', '.join(sorted(MODEL_KINDS))} only; pass your own run's MFU (mfu_from_measurement)")
    try:
        ref = kind_mfu(kind, precision)
    except ResultsUnavailable as e:
        raise ParameterError("mfu", None, f"has no measured default here ({e}); pass a value") from None
    if ref is None:
        raise ParameterError("mfu", None, f"has no measured value: labkit ran no {precision} {kind} model; "
                             "pass your own run's MFU")
    h100 = find(load_catalog(catalog_path), REFERENCE_MACHINE)
    peak = h100.peak_fp32_tflops if precision == "fp32" else h100.peak_bf16_tflops
    value = ref.of_datasheet(peak)
    cases = tuple((f"ResNet-50 {r.label}", value * r.value / ref.rate) for r in resnet_ladder()
                  if kind == "convolutional" and precision != "fp32")
    return MfuAssumption(value, f"labkit's {kind} run above, assumed to carry over to {model!r} and every GPU",
                         note=ref.text(peak), cases=cases,
                         label=f"measured: labkit {ref.label.split(' ')[1]}, one H100 ({ref.source.name})")


def default_mfu() -> float:
    """`default_mfu_reference().of_datasheet`; a ParameterError naming `mfu` when the benchmark
    results are not installed (then pass `mfu` yourself)."""
    try:
        return default_mfu_reference().of_datasheet
    except ResultsUnavailable as e:
        raise ParameterError("mfu", None, f"has no measured default here ({e}); pass a value") from None


@dataclass
class Workload:
    """What one run must do. `flops_per_step` counts forward + backward of one GPU's step of
    `samples_per_step` samples (with N GPUs each takes such a step at once)."""

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
        return self.steps_per_epoch_on(1)

    def steps_per_epoch_on(self, gpus: int) -> int:
        """Steps of an epoch when `gpus` GPUs each take `samples_per_step` at once."""
        return math.ceil(self.samples_per_epoch / (self.samples_per_step * gpus))


@dataclass
class CostAssumptions:
    """What turns datasheet peaks into time, and what every row of a comparison shares:

    - `mfu`: the fraction of each GPU's datasheet peak a run reaches; None takes labkit's
      measured figure for `model`'s kind (`model_mfu`); `mfu_source` says where it comes from
      (filled in when empty);
    - `gpus`: GPUs (chips on a TPU row) of every row, and `scaling_efficiency` of N of them
      (None: 1 at one GPU, `DEFAULT_SCALING_EFFICIENCY` above);
    - `tpu_mfu`: a TPU's fraction of its datasheet peak, yours; None leaves TPU rows without time
      or cost, with the MFU they would need instead;
    - `input_samples_per_s`: what the input pipeline delivers per GPU (None: not known, rows are
      compute only), and `input_source` where that figure comes from.
    """

    mfu: float | None = None
    precision: str = "bf16"
    spot: SpotModel = field(default_factory=SpotModel)
    include_tpu: bool = True
    model: str = "gpt"
    mfu_source: str = ""
    gpus: int = 1
    scaling_efficiency: float | None = None
    tpu_mfu: float | None = None
    input_samples_per_s: float | None = None
    input_source: str = ""

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, ("bf16", "fp32"))
        if self.mfu is None:
            assumed = model_mfu(self.model, None, self.precision)
            self.mfu, self.mfu_source = assumed.value, self.mfu_source or assumed.source
        check_float("mfu", self.mfu, minimum=1e-6, maximum=1.0)
        self.mfu_source = self.mfu_source or "your mfu parameter"
        check_int("gpus", self.gpus, minimum=1)
        check_float("scaling_efficiency", self.scaling_efficiency, minimum=1e-3, maximum=1.0, allow_none=True)
        check_float("tpu_mfu", self.tpu_mfu, minimum=1e-6, maximum=1.0, allow_none=True)
        check_float("input_samples_per_s", self.input_samples_per_s, minimum=1e-9, allow_none=True)
        if self.input_samples_per_s is not None and not self.input_source:
            self.input_source = "your input_samples_per_s parameter"

    def scaling(self) -> tuple[float, str]:
        """(efficiency of `gpus` GPUs against perfect scaling, where it comes from)."""
        if self.scaling_efficiency is not None:
            return self.scaling_efficiency, "your scaling_efficiency parameter"
        if self.gpus == 1:
            return 1.0, "one GPU: no scaling"
        return DEFAULT_SCALING_EFFICIENCY, DEFAULT_SCALING_SOURCE


@dataclass(frozen=True)
class Estimate:
    """Time and cost of the workload on one option at `gpus` accelerators. A TPU row without a
    TPU MFU has no time or cost (None), only `break_even_mfu`."""

    name: str
    step_s: float | None
    hours_per_epoch: float | None
    hours_per_run: float | None
    on_demand_per_epoch: float | None
    on_demand_per_run: float | None
    spot_hours_per_run: float | None
    spot_per_epoch: float | None
    spot_per_run: float | None
    measured: bool = False
    gpus: int = 1
    mfu: float | None = None
    mfu_source: str = ""
    samples_per_s: float | None = None
    input_bound: bool | None = None  # the GPU waits for data (None: no input rate known, or no time)
    priced_as: str = ""
    is_tpu: bool = False
    break_even_mfu: float | None = None  # TPU rows: the MFU at which it costs what the cheapest GPU row does
    break_even_note: str = ""
    note: str = ""  # what the row's price leaves out (a machine sold with more GPUs than the row uses)

    @property
    def comparable(self) -> bool:
        """Whether the row has a time and a cost to rank (a TPU row without a TPU MFU has not)."""
        return self.hours_per_run is not None and self.on_demand_per_run is not None

    @property
    def bound_by(self) -> str:
        if not self.comparable:
            return "–"
        if self.input_bound is None:
            return "compute (input not measured)"
        return "INPUT: waits for data" if self.input_bound else "compute"


@dataclass
class EstimateTable:
    """The rows of one comparison, all at `gpus` accelerators, with what they assume."""

    estimates: list[Estimate]
    skipped: list[tuple[str, str]]
    gpus: int = 1
    scaling_efficiency: float = 1.0
    scaling_source: str = "one GPU: no scaling"
    mfu: float | None = None
    mfu_source: str = ""
    tpu_mfu: float | None = None
    input_samples_per_s: float | None = None
    input_source: str = ""
    whole_machines: list[str] = field(default_factory=list)  # rows whose machine `gpus` does not fill, and what that costs

    @property
    def comparable(self) -> list[Estimate]:
        """The rows on equal terms: same GPU count (all rows), each with a time and a cost."""
        return [e for e in self.estimates if e.comparable]

    def rows(self) -> list[dict[str, object]]:
        return [{
            "option": e.name, "GPUs": e.gpus, "priced as": e.priced_as,
            "MFU": None if e.mfu is None else f"{e.mfu:.1%}", "MFU from": e.mfu_source,
            "bound by": e.bound_by, "samples/s": e.samples_per_s, "step s": e.step_s,
            "h/run": e.hours_per_run, "$/run": e.on_demand_per_run,
            "Spot h/run": e.spot_hours_per_run, "Spot $/run": e.spot_per_run,
            "break-even MFU": None if e.break_even_mfu is None else f"{e.break_even_mfu:.1%}",
            "from": "measured" if e.measured else "datasheet × MFU" if e.comparable else "–",
        } for e in self.estimates]

    def pareto(self) -> list[tuple[str, str, float, float]]:
        """Options nobody beats on both time and cost: (name, 'on-demand'|'spot', hours, $),
        sorted fastest first, among the comparable rows."""
        points = []
        for e in self.comparable:
            points.append((e.name, "on-demand", e.hours_per_run, e.on_demand_per_run))
            if e.spot_per_run is not None and e.spot_hours_per_run is not None:
                points.append((e.name, "spot", e.spot_hours_per_run, e.spot_per_run))
        return pareto_front(points)  # type: ignore[arg-type]

    def cheapest(self, spot: bool = False) -> Estimate:
        """The comparable row with the lowest cost per run (on Spot: among rows with a Spot price)."""
        key = (lambda e: e.spot_per_run) if spot else (lambda e: e.on_demand_per_run)
        return _least([e for e in self.comparable if key(e) is not None], key, "cheapest")

    def fastest(self) -> Estimate:
        """The comparable row with the fewest hours per run (of rows that tie, the cheapest)."""
        return _least(self.comparable, lambda e: (e.hours_per_run, e.on_demand_per_run), "fastest")

    def ties(self, e: Estimate) -> list[str]:
        """The other comparable rows as fast as `e` (an input cap gives several rows one pace)."""
        return [o.name for o in self.comparable if o is not e and math.isclose(o.hours_per_run, e.hours_per_run)]

    def cheapest_gpu(self, spot: bool = False) -> Estimate | None:
        """The comparable GPU row with the lowest cost per run: what a TPU row is weighed against."""
        key = (lambda e: e.spot_per_run) if spot else (lambda e: e.on_demand_per_run)
        gpus = [e for e in self.comparable if not e.is_tpu and key(e) is not None]
        return min(gpus, key=key) if gpus else None  # type: ignore[arg-type,return-value]

    def skipped_text(self) -> str:
        return "\n".join(f"skipped {name}: {why}" for name, why in self.skipped)

    def assumptions_text(self) -> str:
        """What every row of this comparison assumes, one line each."""
        n, unit = self.gpus, "GPU" if self.gpus == 1 else "GPUs"
        lines = [f"every row: {n} {unit} (TPU rows: {n} chip{'s' if n > 1 else ''}), priced per GPU used "
                 "(one GPU's share of its machine, host included)"]
        lines += [f"  {w}" for w in self.whole_machines]
        lines.append(f"scaling: {self.scaling_efficiency:.0%} of perfect ({self.scaling_source})" if n > 1
                     else "scaling: none (one GPU)")
        if self.mfu is not None:
            lines.append(f"GPU rows: MFU {self.mfu:.1%} of each GPU's datasheet peak ({self.mfu_source})")
        lines.append(f"TPU rows: MFU {self.tpu_mfu:.1%} (your tpu_mfu parameter)" if self.tpu_mfu is not None else
                     "TPU rows: no TPU MFU, so no time or cost: each shows the MFU it would need to cost what the "
                     "cheapest GPU row does, and takes no part in fastest / cheapest")
        lines.append(f"input: {self.input_samples_per_s:,.0f} samples/s per GPU ({self.input_source}) caps every row"
                     if self.input_samples_per_s is not None else
                     f"input: no rate ({self.input_source or 'not measured'}); rows are compute only")
        return "\n".join(lines)

    def basis(self, e: Estimate) -> str:
        """What a headline about `e` assumes: the rows it was chosen among, and its own terms."""
        n = len(self.comparable)
        left = len(self.estimates) - n
        among = (f"among {n} rows at {self.gpus} GPU{'s' if self.gpus > 1 else ''} each"
                 + (f" ({left} TPU row{'s' if left > 1 else ''} without a TPU MFU left out)" if left else ""))
        mfu = "measured step" if e.measured else f"MFU {e.mfu:.1%} ({e.mfu_source})"
        scaling = f", {self.scaling_efficiency:.0%} scaling" if self.gpus > 1 else ""
        tied = self.ties(e)
        return (f"{among}; {e.name}: {mfu}{scaling}, {e.bound_by}, priced {e.priced_as}"
                + (f" ({e.note})" if e.note else "") + (f"; as fast: {', '.join(tied)}" if tied else ""))


def _least(rows: list[Estimate], key, what: str) -> Estimate:
    if not rows:
        raise LookupError(f"no row to pick the {what} from: no option has a time and a price")
    return min(rows, key=key)


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


def _priced_as(e: CatalogEntry, gpus: int) -> str:
    if e.accelerator_count == 1:
        return f"{gpus} × {e.machine_type}"
    return f"{gpus} × 1/{e.accelerator_count} of {e.machine_type}"


def _whole_machines(e: CatalogEntry, gpus: int) -> str:
    """What renting whole machines would cost instead, where `gpus` does not fill them ("" if it does)."""
    if e.accelerator_count == 1 or gpus % e.accelerator_count == 0:
        return ""
    machines = math.ceil(gpus / e.accelerator_count)
    return (f"comes {e.accelerator_count} per {e.machine_type}: its row prices the {gpus} GPU(s) used; renting "
            f"{machines} whole machine(s) for them costs {machines * e.accelerator_count / gpus:g}× that")


def _per_accelerator_peak(e: CatalogEntry, precision: str) -> float | None:
    return e.peak_bf16_tflops if precision == "bf16" else e.peak_fp32_tflops


def estimate_costs(
    workload: Workload,
    entries: list[CatalogEntry],
    assumptions: CostAssumptions | None = None,
    measured_step_s: dict[str, float] | None = None,
) -> EstimateTable:
    """Estimate every catalog option at `assumptions.gpus` accelerators each; see the module
    docstring for the arithmetic. `measured_step_s` maps an option to one GPU's step time you
    measured on it (slowed by the scaling efficiency above one GPU, capped by the input as the
    other rows are)."""
    a = assumptions or CostAssumptions()
    measured_step_s = measured_step_s or {}
    efficiency, scaling_source = a.scaling()
    estimates, skipped, tpus, whole = [], [], [], []
    for e in entries:
        if e.is_tpu and not a.include_tpu:
            skipped.append((e.name, "TPU options excluded (include_tpu=False)"))
            continue
        if e.hourly_per_accelerator(spot=False) is None:
            skipped.append((e.name, "no on-demand price in the catalog" + (f" ({e.note})" if e.note else "")))
            continue
        peak = _per_accelerator_peak(e, a.precision)
        mfu = a.tpu_mfu if e.is_tpu else a.mfu
        source = (NO_TPU_MFU if mfu is None else "your tpu_mfu parameter") if e.is_tpu else a.mfu_source
        if e.name in measured_step_s:
            one = check_float(f"measured_step_s[{e.name!r}]", measured_step_s[e.name], minimum=1e-12)
            mfu = None if peak is None else mfu_from_measurement(workload.flops_per_step, one, peak)
            source = "implied by your measured step"
        elif peak is None:
            skipped.append((e.name, f"no {a.precision} peak rate in the catalog"))
            continue
        else:
            one = None if mfu is None else workload.flops_per_step / (peak * 1e12 * mfu)
        note = _whole_machines(e, a.gpus)
        whole += [f"{e.name} {note}"] if note else []
        estimates.append(Estimate(e.name, **_timing(workload, a, e, one, efficiency), measured=e.name in measured_step_s,
                                  gpus=a.gpus, mfu=mfu, mfu_source=source, priced_as=_priced_as(e, a.gpus),
                                  is_tpu=e.is_tpu, note=note))
        if e.is_tpu and peak is not None:
            tpus.append((len(estimates) - 1, e, peak))
    table = EstimateTable(estimates, skipped, a.gpus, efficiency, scaling_source, a.mfu, a.mfu_source, a.tpu_mfu,
                          a.input_samples_per_s, a.input_source, whole)
    best = table.cheapest_gpu()
    for i, e, peak in tpus:
        table.estimates[i] = replace(table.estimates[i], **_break_even(workload, a, e, peak, efficiency, best))
    return table


def _input_step_s(w: Workload, a: CostAssumptions) -> float:
    """Seconds the input pipeline needs for one GPU's batch (0 when no rate is known)."""
    return 0.0 if a.input_samples_per_s is None else w.samples_per_step / a.input_samples_per_s


def _timing(w: Workload, a: CostAssumptions, e: CatalogEntry, one_step_s: float | None,
            efficiency: float) -> dict[str, object]:
    """An Estimate's time and cost fields from one GPU's compute step (None: no time, no cost)."""
    none = dict.fromkeys(("step_s", "hours_per_epoch", "hours_per_run", "on_demand_per_epoch", "on_demand_per_run",
                          "spot_hours_per_run", "spot_per_epoch", "spot_per_run", "samples_per_s", "input_bound"))
    if one_step_s is None:
        return none
    compute_s, input_s = one_step_s / efficiency, _input_step_s(w, a)
    step_s = max(compute_s, input_s)
    hours_epoch = w.steps_per_epoch_on(a.gpus) * step_s / 3600.0
    hours_run = hours_epoch * w.epochs
    on_demand = a.gpus * e.hourly_per_accelerator(spot=False)  # type: ignore[operator]
    spot = e.hourly_per_accelerator(spot=True)
    factor = 1.0 + a.spot.overhead
    out = dict(none, step_s=step_s, hours_per_epoch=hours_epoch, hours_per_run=hours_run,
               on_demand_per_epoch=hours_epoch * on_demand, on_demand_per_run=hours_run * on_demand,
               samples_per_s=w.samples_per_step * a.gpus / step_s,
               input_bound=None if a.input_samples_per_s is None else input_s > compute_s)
    if spot is not None:
        out.update(spot_hours_per_run=hours_run * factor, spot_per_epoch=hours_epoch * factor * a.gpus * spot,
                   spot_per_run=hours_run * factor * a.gpus * spot)
    return out


def _break_even(w: Workload, a: CostAssumptions, e: CatalogEntry, peak: float, efficiency: float,
                best: Estimate | None) -> dict[str, object]:
    """The MFU at which TPU row `e` costs per run what the cheapest GPU row `best` does: cost
    falls as 1/MFU until the input pipeline sets the step time, so below that floor no MFU
    is enough."""
    if best is None or not best.on_demand_per_run:
        return {"break_even_note": "no GPU row with a cost to match"}
    hourly = a.gpus * e.hourly_per_accelerator(spot=False)  # type: ignore[operator]
    runs = w.steps_per_epoch_on(a.gpus) * w.epochs
    if not runs:
        return {"break_even_note": "no steps to run"}
    step_s = best.on_demand_per_run * 3600.0 / (hourly * runs)  # the step time at which both cost the same
    if step_s < _input_step_s(w, a):
        return {"break_even_note": f"none: at {a.input_samples_per_s:,.0f} samples/s per GPU the input alone "
                                   f"makes it dearer than {best.name}"}
    mfu = w.flops_per_step / (peak * 1e12 * efficiency * step_s)
    reach = "" if mfu <= 1.0 else " (above 100%: out of reach)"
    return {"break_even_mfu": mfu, "break_even_note": f"matches {best.name}'s ${best.on_demand_per_run:,.2f} per run "
                                                     f"at {mfu:.1%} of its datasheet peak{reach}"}


def mfu_sensitivity(workload: Workload, entries: list[CatalogEntry], assumptions: CostAssumptions,
                    mfus: list[tuple[str, float]]) -> list[dict[str, object]]:
    """The answer under each utilisation in `mfus` ((label, MFU of the datasheet peak) pairs):
    the fastest option and its hours, the cheapest option on-demand and on Spot and their cost,
    among the comparable rows. With one MFU for every GPU and no input cap, time and cost scale
    as 1/MFU and the ranking does not change; what changes is the budget."""
    rows = []
    for label, mfu in mfus:
        t = estimate_costs(workload, entries, replace(assumptions, mfu=mfu, mfu_source=label))
        fast, cheap = t.fastest(), t.cheapest()
        row: dict[str, object] = {"assumption": label, "MFU of datasheet": f"{mfu:.1%}",
                                  "fastest": fast.name, "fastest h/run": fast.hours_per_run,
                                  "cheapest on-demand": cheap.name, "$/run": cheap.on_demand_per_run}
        if any(e.spot_per_run is not None for e in t.comparable):
            spot = t.cheapest(spot=True)
            row.update({"cheapest on Spot": spot.name, "Spot $/run": spot.spot_per_run})
        rows.append(row)
    return rows


def tpu_break_even(table: EstimateTable) -> list[dict[str, object]]:
    """One row per TPU option of `table`: the cheapest GPU row it is weighed against, the MFU at
    which the TPU would cost the same per run (None with the reason when no MFU would do), and,
    with a TPU MFU of yours, its own cost per run."""
    best = table.cheapest_gpu()
    return [{"tpu": e.name, "chips": e.gpus, "cheapest GPU row": None if best is None else best.name,
             "GPU $/run": None if best is None else best.on_demand_per_run,
             "break-even TPU MFU": e.break_even_mfu, "reachable": e.break_even_mfu is not None and e.break_even_mfu <= 1.0,
             "your TPU MFU": e.mfu, "TPU $/run": e.on_demand_per_run, "why": e.break_even_note}
            for e in table.estimates if e.is_tpu]
