"""Each notebook's sizes for the machine it runs on, and the time it expects to take there.

`scale="smoke"` gives the sizes CI runs on two CPU cores (unchanged by the machine). At
`scale="full"` the sizes are chosen for what is there: the batch that fits the GPU's memory with
headroom (`labkit.hardware.gpus` holds each GPU's memory, number formats and peak rates), only
the precision rungs the GPU has tensor cores for, and, where a demo starts more processes than
there are GPUs, every process on the CPU with gloo at the CPU sizes (`labkit.core.placement`),
said in the plan's notes. A notebook prints its plan before its long cells:

    plan = sizing.plan("04_mixed_precision", scale, time_budget_s=time_budget_s)
    print(plan.text())                 # machine, sizes, skipped rungs with the reason, expected time
    batch = batch_size or plan["batch_size"]

The expected time comes from the datasheet peak of the format a run uses, the share of it
labkit's engine reached on one H100 for that kind of model (`EFFICIENCY`), a short matmul probe
of this GPU (so a throttled or unlisted GPU is planned at what it does), and per-notebook
overheads (kernel start, process starts, compiling). It is a forecast, good to tens of percent.

`time_budget_s` trims the sizes that only buy precision (steps, samples, trials; never below
what a verdict needs: 3 repeats stay 3) until the forecast fits, and drops optional rungs (the
compile rung) last; `Plan.trimmed` says what changed, so results are never read as full-size.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from labkit.core import precisions
from labkit.core.config import ParameterError, check_float, resolve_scale
from labkit.core.models import build_config, flops_per_sample
from labkit.core.placement import Placement, place
from labkit.core.precisions import PRECISIONS
from labkit.hardware import gpus as gpu_table

# Share of the datasheet peak of its number format that labkit's engine reached on one H100
# (benchmarks/results/2026-11-22-h100-bench-torch-resnet.json and -gpt.json: ResNet-50 at batch
# 256, GPT-2 small at batch 12), per (model, format, layout or compiler); the conv nets are
# bandwidth- and launch-bound, so their share of a tensor-core peak is small. A format measured
# nowhere yet is planned at the model's smallest share (`efficiency`).
EFFICIENCY = {
    ("resnet", "fp32"): 0.36, ("resnet", "tf32"): 0.092, ("resnet", "bf16"): 0.055,
    ("resnet", "fp16"): 0.055, ("resnet", "channels_last"): 0.097, ("resnet", "compile"): 0.136,
    ("gpt", "fp32"): 0.45, ("gpt", "tf32"): 0.15, ("gpt", "bf16"): 0.30, ("gpt", "fp16"): 0.30,
    ("gpt", "channels_last"): 0.30, ("gpt", "compile"): 0.376,
    ("cnn", "fp32"): 0.05, ("cnn", "tf32"): 0.01, ("cnn", "bf16"): 0.005, ("cnn", "fp16"): 0.005,
    ("cnn", "channels_last"): 0.005, ("cnn", "compile"): 0.008,
}
STEP_OVERHEAD_S = 0.004      # per GPU step: kernel launches, optimizer, loss read, data hand-off
RUN_START_S = 2.0            # per engine run: model build, loader workers, first-step set-up
PROCESS_START_S = 4.0        # a Python process that imports torch (a replica, a recipe, a trial)
KERNEL_START_S = 8.0         # a notebook's kernel and its imports
COMPILE_S = {"resnet": 70.0, "gpt": 50.0, "cnn": 15.0}  # the first torch.compile of a model
RECOMPILE_S = 20.0           # a later one of the same model (inductor's caches are warm)
H100_PROBE_TFLOPS = 698.0    # a bf16 GEMM measured on one H100
H100_PROBE_SHARE = H100_PROBE_TFLOPS / gpu_table.by_key("h100").peak_tflops["bf16"]  # of its datasheet peak
MEMORY_HEADROOM = 0.6        # share of GPU memory a plan fills: allocator, cuDNN workspaces, spikes
COMPILE_SHARE_CAP = 0.5      # optional compile levers left out by default past this share of a notebook

# Bytes one sample keeps for backward at full size (ResNet-50 224², GPT-2 small 1024 tokens with
# SDPA attention and fp32 logits), and bytes that do not grow with the batch (fp32 weights,
# gradients, AdamW's two moments, a workspace), for the batch a GPU fits.
ACTIVATION_BYTES = {("resnet", "fp32"): 104e6, ("resnet", "16bit"): 60e6,
                    ("gpt", "fp32"): 1.3e9, ("gpt", "16bit"): 1.0e9,
                    ("cnn", "fp32"): 2e6, ("cnn", "16bit"): 1e6}
FIXED_BYTES = {"resnet": 25.6e6 * 16 + 1.5e9, "gpt": 124e6 * 16 + 1.5e9, "cnn": 1.5e9}
BATCH_CHOICES = {"resnet": (256, 192, 128, 96, 64, 48, 32, 16, 8),
                 "gpt": (48, 32, 24, 16, 12, 8, 4, 2, 1), "cnn": (1024, 512, 256, 128, 64, 32)}


# ---------------------------------------------------------------- the machine


@dataclass(frozen=True)
class Machine:
    """What a plan is made for: the GPUs torch can use (their facts: table row or derived), the
    CPU cores, and what a short probe measured (`probe_tflops`: this GPU's matmul rate per
    format; empty when not probed). `Machine.planned("l4")` describes a machine that is not
    here, for tables of what each GPU would do."""

    gpus: int
    gpu: gpu_table.GPUFacts | None
    cpu_cores: int
    probe_tflops: dict[str, float] = field(default_factory=dict)
    unusable: str | None = None  # a GPU is present that torch cannot use (said in the plan)
    here: bool = False  # this machine (detected), not one described for a table

    @property
    def has_gpu(self) -> bool:
        return self.gpus > 0 and self.gpu is not None

    @property
    def name(self) -> str:
        if not self.has_gpu:
            return f"CPU ({self.cpu_cores} cores)"
        return f"{self.gpus} × {self.gpu.label}" if self.gpus > 1 else self.gpu.label

    @classmethod
    def detect(cls, *, probe: bool = True) -> Machine:
        from labkit.core import devices

        info = devices.detect()
        usable = list(info.gpus) if devices.cuda_available() else []
        facts = gpu_table.for_gpu(usable[0]) if usable else None
        probed = _probe_gpu(facts.fastest_format()) if (usable and probe) else {}
        return cls(len(usable), facts, info.cpu_count, probed, devices.unusable_gpus(), here=True)

    @classmethod
    def planned(cls, key: str | None, *, gpus: int = 1, cpu_cores: int = 8) -> Machine:
        """A machine with `gpus` of the table's GPU `key` (None: a CPU machine), not probed."""
        if key is None:
            return cls(0, None, cpu_cores)
        return cls(gpus, gpu_table.by_key(key), cpu_cores)

    def tflops(self, fmt: str) -> float:
        """The rate planned for matmuls in `fmt`: the datasheet peak, scaled by how this GPU's
        probe compares with an H100's probe against its own datasheet (a throttled or shared GPU
        is planned slower, in every format); for a GPU with no table row, the probe itself (or
        a cautious 10 TFLOP/s unprobed). fp32 stands in for formats the GPU lacks."""
        gpu = self.gpu
        if gpu is None:
            raise ValueError("a CPU machine has no GPU rate")
        fmt = fmt if gpu.supports(fmt) else "fp32"
        peak = gpu.peak(fmt)
        if peak is None:
            probed = self.probe_tflops.get(fmt)
            return (probed / H100_PROBE_SHARE) if probed else 10.0
        for probed_fmt, probed in self.probe_tflops.items():
            reference = gpu.peak(probed_fmt)
            if reference:
                return peak * min(1.5, max(0.25, probed / reference / H100_PROBE_SHARE))
        return peak

    def memory_bytes(self) -> float:
        return self.gpu.memory_gib * 2**30 if self.gpu else 0.0

    def facts_line(self) -> str:
        if not self.has_gpu:
            return self.name + ("" if not self.unusable else f"; WARNING: {self.unusable}")
        g = self.gpu
        tensor_core_formats = [f.name for f in precisions.FORMATS if f.tensor_cores_from]
        formats = ", ".join(f"{f} {'yes' if g.supports(f) else 'no'}" for f in tensor_core_formats)
        probe = (f"; probe: {', '.join(f'{f} {v:.0f} TFLOP/s' for f, v in self.probe_tflops.items())}"
                 if self.probe_tflops else "")
        source = "derived from the driver (not in the GPU table)" if g.derived else g.cite()
        return (f"{self.name}, {g.memory_gib:.1f} GiB, compute capability {g.compute_capability} "
                f"({formats}){probe}; facts: {source}")


@functools.lru_cache(maxsize=4)
def _probe_gpu(fmt: str) -> dict[str, float]:
    """Matmul TFLOP/s of GPU 0 in `fmt` (4096³, a few repeats after a warm-up): a fraction of a
    second, run once per process."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
    n, repeats = 4096, 10
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / repeats
    del a, b
    torch.cuda.empty_cache()
    return {fmt: 2 * n**3 / seconds / 1e12}


# ---------------------------------------------------------------- what runs cost


def gpu_train_seconds(machine: Machine, model: str, fmt: str, batch: int, steps: int, *,
                      channels_last: bool = False, compiled: bool = False, runs: int = 1) -> float:
    """Forecast of `runs` engine runs of `steps` steps of the full-size `model` at `batch` in
    `fmt` on `machine`'s GPU (compile time not included: see `compile_seconds`)."""
    per_sample = flops_per_sample(build_config(model, "full"))
    kind = "compile" if compiled else "channels_last" if channels_last else fmt
    share = efficiency(model, kind)
    rate = machine.tflops(fmt) * 1e12 * share
    step = per_sample * batch / rate + STEP_OVERHEAD_S
    return runs * (RUN_START_S + steps * step)


def efficiency(model: str, kind: str) -> float:
    """`EFFICIENCY` of (model, kind); for a kind not measured (a precision new to the registry),
    the model's smallest measured share, so its forecast errs long."""
    measured = EFFICIENCY.get((model, kind))
    return measured if measured is not None else min(v for (m, _), v in EFFICIENCY.items() if m == model)


def compile_seconds(model: str, compiles: int) -> float:
    return 0.0 if compiles <= 0 else COMPILE_S[model] + (compiles - 1) * RECOMPILE_S


def fitting_batch(machine: Machine, model: str, fmt: str = "fp32", choices: tuple[int, ...] | None = None,
                  *, largest: int | None = None) -> int:
    """The largest batch of the full-size `model` (from `choices`, at most `largest`) whose
    activations in `fmt` and fixed state fill at most `MEMORY_HEADROOM` of the GPU's memory."""
    per = ACTIVATION_BYTES[(model, "fp32" if precisions.get(fmt).bytes == 4 else "16bit")]
    room = MEMORY_HEADROOM * machine.memory_bytes() - FIXED_BYTES[model]
    options = [b for b in (choices or BATCH_CHOICES[model]) if largest is None or b <= largest]
    for b in options:
        if b * per <= room:
            return b
    return options[-1]


# ---------------------------------------------------------------- a notebook's plan


BUSY_SHARE = 0.5  # a load average of half the cores or more: the machine is busy


@dataclass
class Plan:
    """One notebook's sizes on one machine: `sizes` (read with `plan["name"]`), rungs or sections
    `skipped` with the reason, `notes` (placement and framework decisions), the forecast
    `expected_s`, and what a time budget `trimmed` (name → (full size, trimmed size))."""

    notebook: str
    scale: str
    machine: Machine
    sizes: dict[str, Any]
    expected_s: float
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    budget_s: float | None = None
    trimmed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    load: float | None = None  # this machine's 1-minute load average when the plan was made

    @property
    def busy(self) -> bool:
        """Other work was running: the load average is at least `BUSY_SHARE` of the cores."""
        return self.load is not None and self.load >= BUSY_SHARE * self.machine.cpu_cores

    @property
    def stretch(self) -> float:
        """How much longer CPU-bound work may take while that load lasts: with `load` runnable
        processes besides this one on `cpu_cores` cores, each gets cores / (load + 1) of one."""
        if self.load is None:
            return 1.0
        return max(1.0, (self.load + 1) / max(1, self.machine.cpu_cores))

    def __getitem__(self, name: str) -> Any:
        return self.sizes[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.sizes.get(name, default)

    def text(self) -> str:
        """What a notebook prints before its long cells."""
        lines = [f"{self.notebook} at scale {self.scale!r} on {self.machine.facts_line()}"]
        if self.sizes:
            lines.append("sizes: " + ", ".join(f"{k}={_show(v)}" for k, v in self.sizes.items()))
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"skipped: {k}: {why}" for k, why in self.skipped.items()]
        if self.trimmed:
            lines.append(f"trimmed to fit time_budget_s={self.budget_s:g}: "
                         + ", ".join(f"{k} {_show(a)} → {_show(b)}" for k, (a, b) in self.trimmed.items()))
        basis = ("the GPU table, " + ("a probe of this GPU, " if self.machine.probe_tflops else "")
                 + "labkit's H100 rates and CPU step times" if self.machine.has_gpu
                 else "the CPU step times of the course's smoke models")
        lines.append(f"expected: about {_duration(self.expected_s)} here (forecast from {basis}; "
                     f"good to tens of percent on a quiet machine)")
        if self.busy:
            lines.append(f"busy: this machine's load average is {self.load:.1f} on {self.machine.cpu_cores} "
                         f"cores (other processes): the forecast and the timings measured here may stretch "
                         f"by about {self.stretch:.1f}×, and repeated runs will spread more; for figures to "
                         f"keep, rerun when it is quiet")
        return "\n".join(lines)

    def record(self) -> dict[str, Any]:
        """The plan as plain data (the course harness stores it with the run)."""
        return {"notebook": self.notebook, "scale": self.scale, "machine": self.machine.name,
                "sizes": self.sizes, "skipped": self.skipped, "notes": self.notes,
                "expected_s": self.expected_s, "budget_s": self.budget_s, "load": self.load,
                "trimmed": {k: list(v) for k, v in self.trimmed.items()}}


def _show(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


@dataclass(frozen=True)
class Elastic:
    """A size a time budget may shrink, never below `floor` (what the lesson still needs)."""

    name: str
    floor: int


@dataclass
class _Draft:
    sizes: dict[str, Any]
    estimate: Callable[[dict[str, Any]], float]
    elastic: tuple[Elastic, ...] = ()
    optional: tuple[tuple[str, str], ...] = ()  # (size set to False to drop, label) in drop order
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


_PLANNERS: dict[str, Callable[..., _Draft]] = {}


def _planner(prefix: str):
    def register(fn):
        _PLANNERS[prefix] = fn
        return fn
    return register


def notebooks() -> tuple[str, ...]:
    """The notebook prefixes ("00" … "12") that have a plan."""
    return tuple(sorted(_PLANNERS))


def plan(notebook: str, scale: str = "auto", *, time_budget_s: float | None = None,
         machine: Machine | None = None, **params: Any) -> Plan:
    """The sizes of `notebook` ("04_mixed_precision" or "04") at `scale` on `machine` (default:
    this one, probed once). `params` are the notebook's own parameters that sizes depend on
    (processes, device, repeats, ...). `time_budget_s` (None or 0: none) trims elastic sizes."""
    key = notebook[:2]
    if key not in _PLANNERS:
        raise ParameterError("notebook", notebook, f"has no sizing plan (known: {', '.join(notebooks())})")
    budget = check_float("time_budget_s", time_budget_s, minimum=0.0, allow_none=True) or None
    resolved = resolve_scale(scale)
    if machine is None:
        machine = Machine.detect(probe=resolved == "full")
    if resolved == "smoke":
        machine = replace(machine, probe_tflops={})
    draft = _PLANNERS[key](resolved, machine, **params)
    sizes = dict(draft.sizes)
    trimmed: dict[str, tuple[Any, Any]] = {}
    skipped = dict(draft.skipped)
    if budget is not None and resolved == "full":
        sizes, trimmed, dropped = _fit(draft, sizes, budget)
        skipped.update(dropped)
    return Plan(notebook, resolved, machine, sizes, KERNEL_START_S + draft.estimate(sizes), skipped,
                list(draft.notes), budget, trimmed, _load() if machine.here else None)


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def _fit(draft: _Draft, sizes: dict[str, Any], budget: float) -> tuple[dict, dict, dict]:
    """Shrink the elastic sizes in proportion until the forecast fits `budget`, then drop the
    optional parts in order; never below a floor."""
    original = dict(sizes)
    dropped: dict[str, str] = {}
    target = max(1.0, budget - KERNEL_START_S)
    for _ in range(6):
        over = draft.estimate(sizes) / target
        if over <= 1.0:
            break
        for e in draft.elastic:
            sizes[e.name] = max(e.floor, int(sizes[e.name] / over))
    for name, label in draft.optional:
        if draft.estimate(sizes) <= target:
            break
        if sizes.get(name):
            sizes[name] = False
            dropped[label] = f"left out to fit time_budget_s={budget:g}"
    trimmed = {k: (original[k], v) for k, v in sizes.items() if original[k] != v}
    return sizes, trimmed, dropped


@functools.lru_cache(maxsize=1)
def tf_sees_gpu() -> bool | None:
    """Whether TensorFlow can use a GPU here (None: TensorFlow is not installed). A plain
    `pip install tensorflow` on a GPU machine trains on the CPU: its CUDA libraries come with
    `tensorflow[and-cuda]`."""
    from labkit.core import frameworks

    if not frameworks.has_tf():
        return None
    from labkit.tf import runtime

    return runtime.sees_gpu()


# ---------------------------------------------------------------- placement of multi-process demos


def processes_on(machine: Machine, processes: int, device: str = "auto") -> Placement:
    """Where a demo's `processes` processes run here (`labkit.core.placement.place`)."""
    return place(processes, machine.gpus if machine.has_gpu else 0, device=device)


def _process_demo(scale: str, machine: Machine, processes: int, device: str) -> tuple[Placement, str]:
    """(placement, model scale) of a multi-process demo: the GPU sizes only when every process
    has its own GPU; on the CPU the sizes CPU processes train in seconds."""
    where = processes_on(machine, processes, device)
    return where, ("full" if scale == "full" and where.on_gpu else "smoke")


def _cpu_run_seconds(steps: int, per_step_s: float, processes: int = 1) -> float:
    return PROCESS_START_S * processes + steps * per_step_s


# CPU step times of the smoke models at the course's smoke batches, one thread per process
# (the 2-core machine CI runs on: the smoke course's notebook times in benchmarks/RESULTS.md).
CPU_STEP_S = {"cnn": 0.03, "gpt": 0.05, "resnet": 0.06}
# AdamW's peak learning rate for the notebooks that show a model learning (a plan's "lr", for
# the engine and the recipes alike; `labkit train`'s default stays 10^-3): the smoke models
# take 10^-2 and fall well below chance in their 8-24 smoke steps (at 10^-3 the CNN barely
# moves in 10); the full-size ones the usual 10^-3.
LEARNING_RATE = {"smoke": 1e-2, "full": 1e-3}


# ---------------------------------------------------------------- the notebooks


@_planner("00")
def _plan_00(scale: str, machine: Machine, **_: Any) -> _Draft:
    return _Draft({}, lambda s: 8.0)


@_planner("01")
def _plan_01(scale: str, machine: Machine, **_: Any) -> _Draft:
    full = scale == "full"
    sizes = {"matmul_size": 8192 if full else 512, "copy_mb": 1024 if full else 64,
             "mlp_width": 4096 if full else 256, "mlp_batch": 1024 if full else 64,
             "mlp_steps": 50 if full else 5}
    if full and not machine.has_gpu:
        sizes |= {"matmul_size": 1024, "copy_mb": 256, "mlp_width": 512, "mlp_batch": 128, "mlp_steps": 10}
    return _Draft(sizes, lambda s: 8.0 + (4.0 if full else 0.0))  # 15 s in all on an H200, 2026-11-26


@_planner("02")
def _plan_02(scale: str, machine: Machine, *, processes: int = 2, device: str = "auto",
             model: str = "cnn", **_: Any) -> _Draft:
    where, model_scale = _process_demo(scale, machine, max(1, processes), device)
    full_gpu = model_scale == "full"
    steps = 300 if full_gpu else (100 if scale == "full" else 10)
    sizes = {"device": where.device, "model_scale": model_scale, "steps": steps,
             "lr": LEARNING_RATE[model_scale]}

    def estimate(s):
        runs = 9  # 1 and N processes × 2 frameworks, accumulation, the recipes, the mistake
        if full_gpu:
            return runs * (PROCESS_START_S + gpu_train_seconds(machine, model, "fp32", 64, s["steps"]))
        return runs * _cpu_run_seconds(s["steps"], CPU_STEP_S[model], 1) + 10.0
    notes = [f"placement: {where.reason}"]
    return _Draft(sizes, estimate, (Elastic("steps", 20),), notes=notes)


@_planner("03")
def _plan_03(scale: str, machine: Machine, *, open_latency_ms: float = 20.0, repeats: int = 3,
             **_: Any) -> _Draft:
    full = scale == "full"
    # The latency rungs do not go faster on a GPU: the naive rung opens one file per sample.
    sizes = {"num_samples": 512 if full else 256, "bench_mb": 512 if full else 64,
             "recipe_steps": 100 if full else 8, "lr": LEARNING_RATE[scale],
             # section 8: your own JPEG folder (4 classes), its file side and the side it is read at
             "own_images_per_class": 512 if full else 32, "own_jpeg_size": 256 if full else 96,
             "own_image_size": 224 if full else 64,
             # section 9: single-stream reads of objects of these sizes (MB) from Cloud Storage
             "probe_mb": (0.125, 1.0, 8.0, 64.0) if full else (0.125, 1.0, 8.0)}

    def estimate(s):
        naive = s["num_samples"] * open_latency_ms / 1000.0 * (repeats + 1)
        # three readers, an epoch each per round, at a few hundred images/s per core; section 9
        # reads them four ways more (the file-per-image way at a fifth of the rate)
        own = 4 * s["own_images_per_class"] * 3 * (repeats + 1) / 300.0 * (s["own_image_size"] / 224) ** 2 + 8.0
        own += own * 8 / 3 + 12.0 + sum(s["probe_mb"]) * (repeats + 1) / 200.0
        return naive * 1.3 + s["bench_mb"] / 100.0 + 15.0 + PROCESS_START_S + s["recipe_steps"] * 0.01 + own
    return _Draft(sizes, estimate, (Elastic("num_samples", 256), Elastic("bench_mb", 64)))


def ladder_formats(machine: Machine, model: str, *, timed_on_tensor_cores: bool) -> tuple[list[str], dict[str, str]]:
    """The training precisions notebook 04's ladder climbs for `model` on `machine`, and why each
    other one is left out ("fp8 rungs": the reason): one that changes nothing in `model`; one
    that needs tensor cores (`needs_tensor_cores`) where there are none (a CPU only emulates it);
    and, when the ladder times tensor cores (`timed_on_tensor_cores`: full scale), any the GPU
    has none for. All from the registry, `labkit.core.precisions`."""
    formats, skipped = [], {}
    for name in PRECISIONS:
        f = precisions.get(name)
        not_here = [precisions.why_not_trains(name, framework, model) for framework in f.rungs]
        if all(not_here):
            skipped[f"{name} rungs"] = f"{name} {not_here[0]}"
        elif machine.has_gpu and (f.needs_tensor_cores or timed_on_tensor_cores) and not machine.gpu.supports(name):
            skipped[f"{name} rungs"] = machine.gpu.why_not(name)
        elif not machine.has_gpu and f.needs_tensor_cores:
            skipped[f"{name} rungs"] = (f"no GPU here: {name} needs tensor cores of compute capability "
                                        f"{f.tensor_cores_from:.1f} ({f.architecture}) or newer, and a "
                                        f"CPU only emulates it")
        else:
            formats.append(name)
    return formats, skipped


@_planner("04")
def _plan_04(scale: str, machine: Machine, *, model: str = "resnet", repeats: int = 3,
             include_compile: bool | None = None, **_: Any) -> _Draft:
    full = scale == "full"
    notes: list[str] = []
    formats, skipped = ladder_formats(machine, model, timed_on_tensor_cores=full)
    if not full:
        sizes = {"batch_size": 16, "steps": 5, "include_compile": bool(include_compile),
                 "recipe_batch": 16, "recipe_steps": 8, "recipe_precision": "bf16",
                 "formats": formats, "tf_scale": "smoke", "lr": LEARNING_RATE[scale]}
        return _Draft(sizes, lambda s: 50.0, skipped=skipped)
    if not machine.has_gpu:  # full sizes asked for on a CPU: the GPU models, briefly
        sizes = {"batch_size": 8, "steps": 3, "include_compile": bool(include_compile),
                 "recipe_batch": 8, "recipe_steps": 3, "recipe_precision": "bf16",
                 "formats": formats, "tf_scale": "full", "lr": LEARNING_RATE[scale]}
        return _Draft(sizes, lambda s: 600.0, skipped=skipped,
                      notes=["no GPU: the full-size models on the CPU take many minutes"])
    gpu = machine.gpu
    tf_on_cpu = machine.here and tf_sees_gpu() is False
    if tf_on_cpu:
        notes.append("TensorFlow is installed without its CUDA libraries and sees no GPU, so its ladder "
                     "runs on the CPU at the smoke sizes (pip install 'labkit[tf-gpu]' for its GPU build)")
    batch = fitting_batch(machine, model, "fp32")
    fast = gpu.fastest_format()
    sizes = {"batch_size": batch, "steps": 20, "include_compile": True if include_compile is None else include_compile,
             "recipe_batch": fitting_batch(machine, model, fast, largest=128), "recipe_steps": 50,
             "recipe_precision": fast, "formats": formats,
             "tf_scale": "smoke" if tf_on_cpu else "full", "lr": LEARNING_RATE[scale]}
    if batch < BATCH_CHOICES[model][0]:
        notes.append(f"batch {batch}: the largest that fits {gpu.memory_gib:.0f} GiB in fp32 with headroom "
                     f"(the reference ladder used {BATCH_CHOICES[model][0]})")

    def estimate(s):
        rungs = [(f, False, False) for f in s["formats"]]
        if fast in s["formats"]:
            rungs.append((fast, True, False))
            if s["include_compile"]:
                rungs.append((fast, True, True))
        # one discarded 2-step run of each rung, then `repeats` runs of each in turns
        ladder = sum(gpu_train_seconds(machine, model, f, s["batch_size"], s["steps"], channels_last=cl,
                                       compiled=c, runs=repeats)
                     + gpu_train_seconds(machine, model, f, s["batch_size"], 2, channels_last=cl, compiled=c)
                     for f, cl, c in rungs)
        compiles = compile_seconds(model, (repeats + 1) if s["include_compile"] else 0)
        recipe = 2 * (PROCESS_START_S + gpu_train_seconds(machine, model, fast, s["recipe_batch"], s["recipe_steps"]))
        return ladder + compiles + recipe + 25.0  # + overflow demo, alignment, mistakes
    return _Draft(sizes, estimate, (Elastic("steps", 6), Elastic("recipe_steps", 6)),
                  optional=(("include_compile", "the torch.compile rung"),), skipped=skipped, notes=notes)


@_planner("05")
def _plan_05(scale: str, machine: Machine, *, batch_size: int = 16, input_latency_ms: float = 100.0,
             repeats: int = 3, **_: Any) -> _Draft:
    full = scale == "full"
    sizes = {"train_batch": 16 * batch_size if full else batch_size,
             "decode_steps": 64 if full else 16,
             "own_images_per_class": 256 if full else 48}  # section 7: the example's JPEG folder

    def estimate(s):
        latency = 6 * input_latency_ms / 1000.0 * (2 + repeats + 1)
        own_script = 12.0 + 0.004 * s["own_images_per_class"]  # write the images, profile twice
        return latency + 4 * s["decode_steps"] * 0.02 * (repeats + 1) + 30.0 + own_script
    return _Draft(sizes, estimate, (Elastic("decode_steps", 16),))


@_planner("06")
def _plan_06(scale: str, machine: Machine, *, replicas: int = 2, **_: Any) -> _Draft:
    where, model_scale = _process_demo(scale, machine, max(1, replicas), "auto")
    full = scale == "full"
    sizes = {"steps": (200 if model_scale == "full" else 60) if full else 12,
             "allreduce_max_mb": 512 if full else 16,
             "compression_steps": 100 if model_scale == "full" else (30 if full else 12),
             "model_scale": model_scale, "nodes_device": where.device, "lr": LEARNING_RATE[model_scale]}
    notes = [f"emulated nodes: {where.reason}"]

    def estimate(s):
        ddp = 2 * _cpu_run_seconds(s["steps"], CPU_STEP_S["cnn"], replicas)
        comp = 4 * _cpu_run_seconds(s["compression_steps"], CPU_STEP_S["gpt"], replicas)
        return ddp + comp + s["allreduce_max_mb"] / 20.0 + 20.0
    return _Draft(sizes, estimate, (Elastic("steps", 20), Elastic("compression_steps", 12),
                                    Elastic("allreduce_max_mb", 16)), notes=notes)


@_planner("07")
def _plan_07(scale: str, machine: Machine, *, replicas: int = 2, **_: Any) -> _Draft:
    where, _ = _process_demo(scale, machine, max(1, replicas), "cpu")
    full = scale == "full"
    # The drill proves an exact resume; its replicas run on the CPU (one thread each) at the
    # smoke model, so its length is about the signal landing mid-run, not about the GPU.
    sizes = {"steps": 60 if full else 12, "input_latency_ms": 20.0 if full else 100.0,
             "lr": LEARNING_RATE[scale]}  # the recipes' (the drill's lesson is the resume, not the curve)
    notes = ["the drill's replicas run on the CPU with gloo (its lesson is the exact resume, "
             "which does not depend on the device)"] if machine.has_gpu else []

    def estimate(s):
        per = CPU_STEP_S["cnn"] + s["input_latency_ms"] / 1000.0
        # + the fault-tolerant DDP section: two torchrun attempts of 2 processes and the engine's run
        elastic = 3 * _cpu_run_seconds(s["steps"], CPU_STEP_S["cnn"], 2)
        return 3 * _cpu_run_seconds(s["steps"], per, replicas) + 2 * _cpu_run_seconds(s["steps"], CPU_STEP_S["cnn"]) \
            + elastic + 25.0
    return _Draft(sizes, estimate, (Elastic("steps", 12),), notes=notes)


@_planner("08")
def _plan_08(scale: str, machine: Machine, *, model: str = "gpt", sharding_processes: int = 2,
             tradeoff_steps: int = 6, tradeoff_batch: int = 16, micro_steps: int = 4, **_: Any) -> _Draft:
    where, shard_scale = _process_demo(scale, machine, max(1, sharding_processes), "auto")
    full_gpu = scale == "full" and machine.has_gpu
    batch = tradeoff_batch
    notes = [f"FSDP section: {where.reason}"]
    if full_gpu:  # the accumulation and checkpointing runs take the whole batch at once
        fits = fitting_batch(machine, model, "fp32", tuple(range(tradeoff_batch, 0, -1)))
        batch = max(micro_steps, fits // micro_steps * micro_steps)
        if batch < tradeoff_batch:
            notes.append(f"tradeoff batch {batch} (of {tradeoff_batch}): what fits {machine.gpu.memory_gib:.0f} GiB "
                         f"in fp32 with headroom, a multiple of micro_steps={micro_steps}")
    sizes = {"batch_limit": fitting_batch(machine, model, "fp32", largest=4096) * 4 if full_gpu else 4096,
             "tradeoff_batch": batch, "sharding_scale": shard_scale, "sharding_device": where.device,
             "lr": LEARNING_RATE[scale],
             # Attention, manual vs SDPA: the smoke GPT's heads (2 of 32) on a CPU; GPT-2 small's
             # (12 of 64) on a GPU, in its 16-bit format (FlashAttention needs fp16 or bf16), at
             # a batch whose written-out T×T matrices stay a fraction of the GPU's memory.
             "attention_block_sizes": [1024, 2048, 4096] if full_gpu else [256, 512, 1024],
             "attention_batch": (8 if machine.gpu.memory_gib >= 40 else 2) if full_gpu else 1,
             "attention_heads": 12 if full_gpu else 2, "attention_head_dim": 64 if full_gpu else 32,
             "attention_dtype": machine.gpu.fastest_format() if full_gpu else "fp32"}

    def estimate(s):
        if not full_gpu:
            return 30.0
        search = 10 * gpu_train_seconds(machine, model, "fp32", max(1, s["batch_limit"] // 4), 1)
        rest = 3 * gpu_train_seconds(machine, model, "fp32", s["tradeoff_batch"], tradeoff_steps)
        return search + rest + 3 * _cpu_run_seconds(3, CPU_STEP_S["gpt"], sharding_processes) + 20.0
    return _Draft(sizes, estimate, notes=notes)


@_planner("09")
def _plan_09(scale: str, machine: Machine, *, model: str = "resnet", include_compile: bool | None = None,
             repeats: int = 3, **_: Any) -> _Draft:
    full = scale == "full"
    if not full or not machine.has_gpu:
        return _Draft({"batch_size": 16 if not full else 8, "steps": 20 if not full else 3,
                       "include_compile": bool(include_compile)}, lambda s: 30.0 if not full else 600.0)
    gpu = machine.gpu
    fast = gpu.fastest_format()
    sizes = {"batch_size": fitting_batch(machine, model, "fp32"), "steps": 30,
             "include_compile": True if include_compile is None else include_compile}

    def estimate(s):
        # Each lever: its warm-up, then it and the configuration so far in turns (2 × repeats
        # runs); the final comparison again. The compiled configurations recompile every run.
        levers = [("fp32", False, False), (fast, False, False), (fast, True, False)]
        compiled_levers = [(fast, True, True)] * 3 if s["include_compile"] else []  # compile, CUDA graphs, step graph
        runs = 2 * repeats + 1
        total = sum(gpu_train_seconds(machine, model, f, s["batch_size"], s["steps"], channels_last=cl,
                                      compiled=c, runs=runs) for f, cl, c in levers + compiled_levers)
        total += gpu_train_seconds(machine, model, fast, s["batch_size"], s["steps"], channels_last=True,
                                   compiled=bool(s["include_compile"]), runs=2 * repeats)
        compiles = (len(compiled_levers) * runs + repeats) if s["include_compile"] else 0
        return total + compile_seconds(model, compiles) + 10.0
    skipped: dict[str, str] = {}
    if include_compile is None:  # not asked for either way: only when compiling is not most of the run
        with_compile = estimate(sizes)
        without = estimate(dict(sizes, include_compile=False))
        if with_compile - without > COMPILE_SHARE_CAP * with_compile:
            sizes["include_compile"] = False
            skipped["the torch.compile levers"] = (
                f"each compiled run compiles the model again, about {_duration(with_compile - without)} of "
                f"{_duration(with_compile)} here; include_compile=True runs them")
    return _Draft(sizes, estimate, (Elastic("steps", 6),),
                  optional=(("include_compile", "the torch.compile levers"),), skipped=skipped)


@_planner("10")
def _plan_10(scale: str, machine: Machine, *, processes: int = 2, four_processes: bool = True,
             steps: int = 6, **_: Any) -> _Draft:
    most = 4 if four_processes else processes
    where, model_scale = _process_demo(scale, machine, max(processes, most), "auto")
    sizes = {"device": where.device, "model_scale": model_scale}
    notes = [f"parallel modes: {where.reason}"]

    def estimate(s):
        runs = 14
        if model_scale == "full":
            return runs * (PROCESS_START_S * 2 + gpu_train_seconds(machine, "gpt", "fp32", 32, steps))
        return runs * _cpu_run_seconds(steps, CPU_STEP_S["gpt"] * 2, 2) + 20.0
    return _Draft(sizes, estimate, notes=notes)


def _tpe_startup() -> int:
    try:
        from labkit.vertex.tuning import tpe_startup_trials

        return tpe_startup_trials()
    except ImportError:  # no Optuna: the notebook says so; size as if for its default
        return 10


@_planner("11")
def _plan_11(scale: str, machine: Machine, *, model: str = "cnn", parallel_trials: int = 2,
             **_: Any) -> _Draft:
    full = scale == "full"
    # At full size TPE gets 12 trials of its own after its random start-up trials.
    sizes = {"steps": (600 if machine.has_gpu else 200) if full else 24,
             "trials": _tpe_startup() + 12 if full else 6}

    def estimate(s):
        per_step = (gpu_train_seconds(machine, model, "fp32", 64, 1) - RUN_START_S
                    if machine.has_gpu and full else CPU_STEP_S[model])
        trial = PROCESS_START_S + RUN_START_S + s["steps"] * per_step
        return math.ceil(s["trials"] / max(1, parallel_trials)) * trial + 10.0
    return _Draft(sizes, estimate, (Elastic("steps", 100), Elastic("trials", 6)))


@_planner("12")
def _plan_12(scale: str, machine: Machine, *, repeats: int = 3, **_: Any) -> _Draft:
    full = scale == "full"
    # the example's JPEG folder (4 classes), its file side, the side it trains at, and epochs
    sizes = {"images_per_class": 256 if full else 32, "jpeg_size": 160 if full else 48,
             "image_size": 96 if full else 32, "epochs": 8 if full else 4}

    def estimate(s):
        images = 4 * s["images_per_class"] * (s["image_size"] / 32) ** 2
        run = PROCESS_START_S * 2 + s["epochs"] * images / (4000.0 if machine.has_gpu else 1500.0)
        # five steps once, two timed (repeats + warm-up each), two profiles, two 2-node jobs
        return 5 * run + 2 * (repeats + 1) * run + 2 * (run + 4.0) + 2 * 2.5 * run + 10.0
    return _Draft(sizes, estimate, (Elastic("images_per_class", 32),))


# ---------------------------------------------------------------- the course on one machine


def course_table(machine: Machine, scale: str = "full", *,
                 time_budget_s: float | None = None) -> list[dict[str, Any]]:
    """One row per notebook: its sizes and forecast at `scale` on `machine` (this one, or e.g.
    `Machine.planned("l4")` for what the course does on an L4)."""
    rows = []
    for key in notebooks():
        p = plan(key, scale, machine=machine, time_budget_s=time_budget_s)
        rows.append({"notebook": key, "expected_min": round(p.expected_s / 60, 1),
                     "sizes": ", ".join(f"{k}={_show(v)}" for k, v in p.sizes.items()) or "—",
                     "skipped": "; ".join(p.skipped) or "—"})
    return rows
