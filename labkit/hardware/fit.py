"""Whether a training step's bytes fit each catalog GPU, and what an epoch costs on each
machine, for a model counted per GPU (`labkit.torch.footprint`).

    fits = gpu_fits(per_gpu_bytes, load_catalog())
    runs = machine_runs(flops_per_gpu_step, samples_per_gpu_step, gpus=8, samples_per_epoch=1_281_167,
                        mfu=MfuChoice(0.127, "..."), entries=load_catalog(), precision="bf16")

Fitting leaves `HEADROOM` of the GPU's memory free for what a count of tensors leaves out (the
CUDA context, the allocator's cache and fragmentation, temporaries freed within the step).

Time: a step on one GPU takes its FLOPs over (the GPU's datasheet peak × the utilisation);
`gpus` data-parallel GPUs take one such step each at once (perfect scaling: notebooks 02 and 06
measure what communication costs on top). An epoch is ceil(samples / (samples per GPU step ×
gpus)) steps. Machines come whole: `gpus` GPUs on a type sold only as 8-GPU machines rent
ceil(gpus / 8) of them, and the row says how many GPUs are paid for. TPU rows are left out: a
PyTorch model does not run there as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.core.config import check_float, check_int
from labkit.hardware.catalog import CatalogEntry

HEADROOM = 0.10  # of the GPU's memory, kept free for what the count leaves out
GIB = 2**30


@dataclass(frozen=True)
class Fit:
    gpu: str
    memory_gb: float
    needed_gb: float
    verdict: str  # "fits", "tight" (inside the headroom) or "does not fit"

    @property
    def used(self) -> float:
        return self.needed_gb / self.memory_gb


def gpu_fits(per_gpu_bytes: int, entries: list[CatalogEntry]) -> list[Fit]:
    """Each GPU type of the catalog (largest memory first): fits with `HEADROOM` to spare,
    tight, or does not fit."""
    out, seen = [], set()
    for e in sorted(entries, key=lambda e: -e.memory_gb):
        if e.is_tpu or e.accelerator_type in seen:
            continue
        seen.add(e.accelerator_type)
        need = per_gpu_bytes / 1e9
        verdict = ("fits" if need <= (1 - HEADROOM) * e.memory_gb else
                   "tight" if need <= e.memory_gb else "does not fit")
        out.append(Fit(e.name, e.memory_gb, need, verdict))
    return out


@dataclass(frozen=True)
class MfuChoice:
    """The utilisation a time estimate uses: one fraction of each GPU's datasheet peak (a
    measured run's fraction on its own GPU is assumed to carry over), and where it comes from."""

    fraction: float
    source: str


@dataclass(frozen=True)
class MachineRun:
    option: str
    machine_type: str
    machines: int
    gpus_paid: int
    step_s: float
    samples_per_s: float
    hours_per_epoch: float
    usd_per_epoch: float | None
    spot_usd_per_epoch: float | None
    mfu: float
    input_bound: bool | None  # the step waits for data (None: no input rate given)


def machine_runs(flops_per_gpu_step: float, samples_per_gpu_step: int, *, gpus: int, samples_per_epoch: int,
                 mfu: MfuChoice, entries: list[CatalogEntry], precision: str = "bf16",
                 input_samples_per_s: float | None = None, fits: dict[str, str] | None = None) -> list[MachineRun]:
    """Time and cost of one epoch on every GPU machine of the catalog whose GPU the step fits
    (`fits`: option name -> verdict; "does not fit" rows are left out), cheapest first. With
    `input_samples_per_s` (what your input pipeline delivers per GPU, measured), a step takes
    at least the time to read its batch: a row whose GPU would wait is `input_bound`, and its
    time and cost are the input's."""
    check_float("flops_per_gpu_step", flops_per_gpu_step, minimum=1.0)
    check_int("samples_per_gpu_step", samples_per_gpu_step, minimum=1)
    check_int("gpus", gpus, minimum=1)
    check_int("samples_per_epoch", samples_per_epoch, minimum=1)
    if input_samples_per_s is not None:
        check_float("input_samples_per_s", input_samples_per_s, minimum=1e-9)
    runs = []
    for e in entries:
        peak = e.peak_bf16_tflops if precision != "fp32" else e.peak_fp32_tflops
        if e.is_tpu or peak is None or (fits or {}).get(e.name) == "does not fit":
            continue
        m = mfu.fraction
        compute_s = flops_per_gpu_step / (peak * 1e12 * m)
        input_s = 0.0 if input_samples_per_s is None else samples_per_gpu_step / input_samples_per_s
        step_s = max(compute_s, input_s)
        steps = math.ceil(samples_per_epoch / (samples_per_gpu_step * gpus))
        hours = steps * step_s / 3600.0
        machines = math.ceil(gpus / e.accelerator_count)
        price, spot = e.hourly(False), e.hourly(True)
        rate = samples_per_gpu_step / step_s
        runs.append(MachineRun(e.name, e.machine_type, machines, machines * e.accelerator_count, step_s, rate * gpus,
                               hours, None if price is None else hours * machines * price,
                               None if spot is None else hours * machines * spot, m,
                               None if input_samples_per_s is None else input_s > compute_s))
    return sorted(runs, key=lambda r: (r.usd_per_epoch is None, r.usd_per_epoch or 0.0))
