"""`labkit estimate`: memory, FLOPs, the GPUs a model fits and what an epoch costs, for any
PyTorch model given as a factory.

    report = estimate("mypkg.models:build", (3, 224, 224), batch_size=64, gpus=8, mode="fsdp")
    print(report.text()); report.to_dict()

The counting is `labkit.torch.footprint`'s (fake tensors: no memory, a 70B model in seconds);
fits and costs are `labkit.hardware.fit`'s over the machine catalog. The utilisation behind
the time is yours (`mfu`) or, by default, the one labkit measured for a model of the same kind
(convolutional: its ResNet-50; matmul-bound: its GPT-2 small; `labkit.hardware.results.kind_mfu`),
always printed with its source. `batch_size` is per GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.core.config import check_choice, check_float, check_int
from labkit.hardware.catalog import CatalogEntry, find, load_catalog
from labkit.hardware.cost import REFERENCE_MACHINE
from labkit.hardware.fit import HEADROOM, Fit, MachineRun, MfuChoice, gpu_fits, machine_runs
from labkit.hardware.results import ResultsUnavailable, kind_mfu
from labkit.torch.footprint import MODES, PRECISIONS, Footprint, load_factory, measure

DEFAULT_SAMPLES_PER_EPOCH = 1_000_000
SHORT_STEP_S = 0.02  # below this a step's time is launches and input, not FLOPs


@dataclass
class EstimateReport:
    footprint: Footprint
    others: list[Footprint]  # the same model at the other precisions
    mode: str
    gpus: int
    fits: list[Fit]
    runs: list[MachineRun]
    mfu: MfuChoice | None
    mfu_note: str
    samples_per_epoch: int
    input_samples_per_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def per_gpu(self) -> dict[str, int]:
        return self.footprint.per_gpu(self.mode, self.gpus)

    def memory_rows(self, unit: str = "GB") -> list[dict[str, Any]]:
        """Bytes per GPU (in `unit`: "GB" or "MB") for each precision counted and each
        data-parallel mode over `gpus`."""
        scale = {"GB": 1e9, "MB": 1e6}[unit]
        rows = []
        for fp in [self.footprint, *self.others]:
            for mode in ("ddp", "zero1", "zero2", "fsdp"):
                b = fp.per_gpu(mode, self.gpus)
                rows.append({"precision": fp.precision, "mode": "zero3 / fsdp" if mode == "fsdp" else mode,
                             **{f"{k} {unit}": b[k] / scale for k in ("params", "grads", "optimizer", "activations",
                                                                      "total")}})
        return rows

    def text(self) -> str:
        fp = self.footprint
        share = (f"{fp.conv_flop_share:.0%} of its FLOPs in convolutions" if fp.kind == "convolutional"
                 else f"{1 - fp.conv_flop_share:.0%} of its FLOPs outside convolutions")
        lines = [f"{fp.model}: {fp.parameters:,} parameters ({fp.trainable:,} trainable), a {fp.kind} model ({share})",
                 f"one step of {fp.batch_size} per GPU, input {fp.input_shape}, {_precision(fp.precision)}: "
                 f"{fp.flops_per_step / 1e9:,.3g} GFLOP forward + backward ({fp.flops_per_sample / 1e9:,.3g} per sample)",
                 "", f"memory per GPU over {self.gpus} GPU{'s' if self.gpus > 1 else ''}, counted from the tensors "
                     "(AdamW's state; activations saved for backward):"]
        unit = "GB" if self.per_gpu["total"] >= 1e9 else "MB"
        rows = self.memory_rows(unit)
        head = ["precision", "mode", *(f"{k} {unit}" for k in ("params", "grads", "optimizer", "activations", "total"))]
        lines.append("  " + "  ".join(f"{h:>14s}" for h in head))
        for r in rows:
            lines.append("  " + "  ".join(f"{r[h]:>14.3f}" if isinstance(r[h], float) else f"{r[h]:>14s}" for h in head))
        need = self.per_gpu["total"] / 1e9
        lines += ["", f"fits ({need:,.3f} GB per GPU at {fp.precision}, {self.mode}; {HEADROOM:.0%} of each GPU's "
                      "memory kept free for the CUDA context, the allocator's cache and temporaries):"]
        lines += [f"  {f.gpu:12s} {f.memory_gb:6.0f} GB  {f.verdict}{'' if f.verdict == 'does not fit' else f' ({f.used:.0%} used)'}"
                  for f in self.fits]
        lines.append("")
        if self.mfu is None:
            lines.append(f"time and cost: {self.mfu_note}")
        elif not self.runs:
            lines.append(f"time and cost: the step fits no catalog GPU at {self.mode} over {self.gpus} GPU(s); "
                         "shard it (--mode fsdp), spread it (--gpus), or lower --batch-size (activations grow "
                         "with it)")
        else:
            lines.append(f"one epoch of {self.samples_per_epoch:,} samples on {self.gpus} GPU(s), utilisation "
                         f"{self.mfu.source}:")
            feed = self.input_samples_per_s is not None
            lines.append(f"  {'option':12s} {'machines':>22s} {'MFU':>6s} {'step ms':>9s} {'samples/s':>11s} "
                         f"{'h/epoch':>9s} {'$/epoch':>9s} {'Spot $':>9s}" + ("  bound by" if feed else ""))
            for r in self.runs:
                cost, spot = _money(r.usd_per_epoch), _money(r.spot_usd_per_epoch)
                paid = f"{r.machines} × {r.machine_type}" + (f" ({r.gpus_paid} GPUs)" if r.gpus_paid != self.gpus else "")
                lines.append(f"  {r.option:12s} {paid:>22s} {r.mfu:6.1%} {r.step_s * 1e3:9.3g} {r.samples_per_s:11,.0f} "
                             f"{r.hours_per_epoch:9.3g} {cost:>9s} {spot:>9s}"
                             + (("  INPUT: the GPU waits for data" if r.input_bound else "  compute") if feed else ""))
            if feed:
                lines.append(f"  (your input pipeline: {self.input_samples_per_s:,.0f} samples/s per GPU, as you measured "
                             "it; an input-bound row's time and cost are the input's: shard the data, add loader "
                             "workers, or pick a smaller GPU)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.footprint.to_dict(), "mode": self.mode, "gpus": self.gpus, "per_gpu_bytes": self.per_gpu,
                "memory": self.memory_rows(), "headroom": HEADROOM,
                "fits": [{"gpu": f.gpu, "memory_gb": f.memory_gb, "needed_gb": f.needed_gb, "verdict": f.verdict}
                         for f in self.fits],
                "mfu_source": self.mfu.source if self.mfu else None, "mfu_note": self.mfu_note,
                "samples_per_epoch": self.samples_per_epoch, "input_samples_per_s": self.input_samples_per_s,
                "machines": [r.__dict__ for r in self.runs], "notes": self.notes}


def choose_mfu(kind: str, precision: str, mfu: float | None,
               entries: list[CatalogEntry] | None = None) -> tuple[MfuChoice | None, str]:
    """Your utilisation, else the fraction of its GPU's datasheet peak that labkit's measured run
    of a `kind` model at `precision` reached; (None, why) when there is neither."""
    if mfu is not None:
        check_float("mfu", mfu, minimum=1e-6, maximum=1.0)
        return MfuChoice(mfu, f"{mfu:.1%} of each GPU's datasheet peak (your --mfu)"), ""
    try:
        ref = kind_mfu(kind, precision)
    except ResultsUnavailable as e:
        return None, f"no measured utilisation here ({e}); pass --mfu"
    if ref is None:
        return None, (f"labkit measured no {precision} run of a {kind} model; pass --mfu (your own run's "
                      f"achieved FLOP/s over the GPU's datasheet peak)")
    h100 = find(entries if entries is not None else load_catalog(), REFERENCE_MACHINE)
    peak = h100.peak_fp32_tflops if precision == "fp32" else h100.peak_bf16_tflops
    fraction = ref.of_datasheet(peak)
    return (MfuChoice(fraction, f"{fraction:.1%} of each GPU's datasheet peak, what {ref.label} reached "
                                f"({ref.rate:,.0f} {ref.unit}, {ref.achieved_tflops:,.0f} of {peak:,.0f} TFLOP/s) and "
                                f"assumed to carry over to this model and every GPU; {ref.source.provenance()}"), "")


def estimate(model: str | Callable, input_shape: Sequence[int], *, batch_size: int = 1, precision: str = "bf16",
             gpus: int = 1, mode: str = "ddp", mfu: float | None = None,
             samples_per_epoch: int = DEFAULT_SAMPLES_PER_EPOCH, input_samples_per_s: float | None = None,
             catalog_path: str | None = None, search_path: str | None = None) -> EstimateReport:
    """Count `model` (a `package.module:function` factory, importable from `search_path` or the
    current folder, or the callable itself) at `precision` and the other precisions, and plan it
    on the catalog; see the module docstring."""
    check_choice("precision", precision, PRECISIONS)
    check_choice("mode", mode, MODES)
    check_int("gpus", gpus, minimum=1)
    check_int("samples_per_epoch", samples_per_epoch, minimum=1)
    if input_samples_per_s is not None:
        check_float("input_samples_per_s", input_samples_per_s, minimum=1e-9)
    factory = load_factory(model, search_path) if isinstance(model, str) else model
    name = model if isinstance(model, str) else getattr(model, "__name__", "model")
    fp = measure(factory, input_shape, batch_size, precision, name=name)
    others = [measure(factory, input_shape, batch_size, p, name=name) for p in ("fp32", "bf16") if p != precision
              and not (precision == "fp16" and p == "bf16")]
    entries = load_catalog(catalog_path)
    fits = gpu_fits(fp.per_gpu(mode, gpus)["total"], entries)
    choice, note = choose_mfu(fp.kind, precision, mfu, entries)
    runs = [] if choice is None else machine_runs(
        fp.flops_per_step, batch_size, gpus=gpus, samples_per_epoch=samples_per_epoch, mfu=choice, entries=entries,
        precision=precision, input_samples_per_s=input_samples_per_s, fits={f.gpu: f.verdict for f in fits})
    notes = []
    if gpus > 1:
        notes.append(f"{gpus} GPUs are assumed to scale perfectly (each takes a step of {batch_size} samples at "
                     f"once); gradient communication comes on top, notebooks 02 and 06 measure it")
    if runs and min(r.step_s for r in runs) < SHORT_STEP_S:
        notes.append(f"a step this small ({min(r.step_s for r in runs) * 1e3:.2g} ms at that utilisation) is bound by "
                     "kernel launches and the input pipeline, not FLOPs, and reaches far less than the measured "
                     "run: the times are lower bounds; time your own step (labkit profile -- python your_script.py) "
                     "and pass --mfu")
    if mode in ("zero3", "fsdp"):
        notes.append("ZeRO-3 / FSDP also gathers one layer's full parameters at a time, on top of the shard")
    if any(e.is_tpu for e in entries):
        notes.append("TPU rows left out: a PyTorch model needs torch_xla changes to run there")
    return EstimateReport(fp, others, mode, gpus, fits, runs, choice, note, samples_per_epoch, input_samples_per_s, notes)


def _money(usd: float | None) -> str:
    if usd is None:
        return "—"
    return f"{usd:,.2f}" if usd >= 0.1 else f"{usd:.2g}"


def _precision(p: str) -> str:
    return "float32" if p == "fp32" else f"{p} autocast (weights and optimizer state float32)"
