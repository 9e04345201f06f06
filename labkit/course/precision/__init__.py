"""Notebook 04's mixed-precision ladder, for both frameworks: the rungs, repeated training runs
per rung, and what the rows show as numbers and verdicts (the notebook writes the sentences).

    rows = run_ladder(PrecisionLadderConfig(model="resnet"), "torch")
    find(rows, "bf16")["speedup"]           # rungs are found by key; labels are for display
    found = findings(rows)                  # each rung against the first: ratio, range, verdict
    found.best.rung, found.best.verdict     # "faster" only when no run overlaps the first rung's

Both frameworks climb fp32 → tf32 → bf16 → fp16 with loss scaling, then their own rungs: torch
adds channels_last and torch.compile; TensorFlow, channels last natively, adds XLA
(`jit_compile`). Each measurement is a full run of the engine `labkit train` uses
(`labkit.torch.engine`, `labkit.tf.engine`). After one short discarded run of every rung, the
rungs take turns `repeats` times (`labkit.course.ladder`), so a slow spell of the machine
hits all of them; a row holds the median throughput and the min–max range, and a speed verdict
against the first rung comes from `labkit.core.stats.compare` ("no measurable difference here"
when the ranges overlap). Both frameworks give rows with the same keys, so one table holds them.
The H100 reference ladder is read from the repository's results (`reference_ladder`).
Framework-free at import: a framework is imported only when its ladder runs. The rungs are rows
of `labkit.course.levers`.

The rest of notebook 04, beside the ladder in this package:

    loss_scaling   fp16 started from an absurd loss scale: skipped steps until the scale fits
    tensor_cores   matmuls at sizes on and off the tensor cores' tiles
    cuda_graphs    CUDA graphs and the whole step as one graph, from the H100 results files
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from labkit.core import precisions, stats
from labkit.core.config import (
    ParameterError,
    by_scale,
    check_bool,
    check_choice,
    check_int,
    resolve_scale,
)
from labkit.core.models import MODEL_NAMES
from labkit.core.train_config import TrainConfig
from labkit.course import ladder
from labkit.course.levers import RUNGS, Rung


@dataclass(frozen=True)
class PrecisionLadderConfig:
    """One ladder run, the same for both frameworks. Sizes default by scale. `include_compile`
    (torch.compile for torch, XLA `jit_compile` for TensorFlow) None means only at full scale:
    compiling takes minutes on a small CPU and would dominate a smoke run. `repeats` runs of
    each rung (at least 3 for a verdict) follow one discarded warm-up run of each."""

    model: str = "resnet"
    scale: str = "auto"
    steps: int | None = None
    batch_size: int | None = None
    include_compile: bool | None = None
    device: str = "auto"
    seed: int = 0
    repeats: int = stats.MIN_REPEATS
    # The number formats this GPU has tensor cores for (`labkit.course.sizing`'s plan): rungs in
    # other formats are left out. None: every rung.
    formats: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_choice("model", self.model, MODEL_NAMES)
        check_int("steps", self.steps, minimum=2, allow_none=True)
        check_int("batch_size", self.batch_size, minimum=1, allow_none=True)
        if self.include_compile is not None:
            check_bool("include_compile", self.include_compile)
        check_int("repeats", self.repeats, minimum=1)

    def resolved(self) -> tuple[str, int, int, bool]:
        """(scale, steps, batch size, include the compile rung) with the defaults filled in."""
        scale = resolve_scale(self.scale)
        steps = self.steps or by_scale(scale, smoke=5, full=30)
        batch = self.batch_size or default_batch(self.model, scale)
        return scale, steps, batch, compile_included(self.include_compile, scale)


def default_batch(model: str, scale: str) -> int:
    """Smoke: 16. Full: the peer batches of benchmarks/RESULTS.md (GPT-2 small 12, ResNet-50 256)."""
    return by_scale(scale, smoke=16, full=12 if model == "gpt" else 256)


def compile_included(include_compile: bool | None, scale: str) -> bool:
    """None means only at full scale: compiling takes minutes on a small CPU."""
    return include_compile if include_compile is not None else scale == "full"


# The columns each framework's table shows (TensorFlow has no activation count).
# `samples_per_s` is the median of the repeats, `range` their min–max, `vs_first` the verdict.
COLUMNS = {
    "torch": ("framework", "rung", "samples_per_s", "range", "speedup", "vs_first", "step_time_ms",
              "activation_mib", "peak_memory_mib", "final_loss", "device"),
    "tf": ("framework", "rung", "samples_per_s", "range", "speedup", "vs_first", "step_time_ms",
           "peak_memory_mib", "final_loss", "device"),
}


def rungs(framework: str, include_compile: bool, formats: tuple[str, ...] | None = None,
          model: str | None = None) -> list[Rung]:
    """The rungs a ladder climbs: all of `framework`'s, less the compile rung unless included,
    rungs in number formats outside `formats` (the plan's: a GPU without their tensor cores;
    None: every format that runs without dedicated tensor cores) and, given `model`, rungs in a
    precision that changes nothing in it (`labkit.core.precisions.why_not_trains`)."""
    check_choice("framework", framework, tuple(RUNGS))

    def climbs(r: Rung) -> bool:
        if formats is not None:
            return r.precision in formats
        return not precisions.get(r.precision).needs_tensor_cores

    return [r for r in RUNGS[framework] if (include_compile or not r.compile) and climbs(r)
            and (model is None or precisions.why_not_trains(r.precision, framework, model) is None)]


def run_ladder(config: PrecisionLadderConfig, framework: str = "torch") -> list[dict[str, Any]]:
    """Train every rung `config.repeats` times with `framework`'s engine, taking turns after one
    short discarded run of each; one row per rung with the median and range of samples/s, the
    speed-up of medians over the first rung and the verdict against it."""
    scale, steps, batch, include_compile = config.resolved()
    climb = rungs(framework, include_compile, config.formats, config.model)  # checks `framework` first
    train = _train_torch if framework == "torch" else _train_tf
    if framework == "tf":
        release_torch_gpu_memory()  # TensorFlow grows into what torch's allocator gives back
    runs = ladder.in_turns(
        {r.key: (lambda r=r: train(config, r, scale, steps, batch)) for r in climb},
        repeats=config.repeats, warm_up_with={r.key: (lambda r=r: train(config, r, scale, ladder.WARM_UP_STEPS, batch))
                                              for r in climb},
        desc=f"precision ladder ({framework})")
    if framework == "torch":
        release_torch_gpu_memory()
    rows = [ladder.summary(runs[r.key]) for r in climb]
    base = rows[0]
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base["samples_per_s"] if base["samples_per_s"] else None
        r["vs_first"] = ("reference" if r is base else ladder.verdict(ladder.comparison(base, r)))
    return rows


def release_torch_gpu_memory() -> None:
    """Hand the GPU memory torch's caching allocator keeps back to the driver (when torch has
    used CUDA in this process), so TensorFlow, which allocates through the driver, finds it."""
    import gc
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


def _row(framework: str, rung: Rung, log: Any, **extra: Any) -> dict[str, Any]:
    s = log.to_dict()["summary"]
    return {"framework": framework, "key": rung.key, "rung": rung.label, "precision": rung.precision,
            "channels_last": rung.channels_last, "compile": rung.compile,
            "samples_per_s": s.get("median_samples_per_s"), "step_time_ms": 1000 * s["median_step_time_s"],
            "final_loss": s["final_loss"], "device": log.run["device"], **extra}


def _train_torch(config: PrecisionLadderConfig, rung: Rung, scale: str, steps: int,
                 batch: int) -> dict[str, Any]:
    from labkit.torch.memory import activation_bytes
    from labkit.torch.trainer import fit

    # At full scale, loader workers keep the GPU fed (decode-free synthetic data still costs
    # host time per image); smoke runs keep everything in one process.
    cfg = TrainConfig(model=config.model, scale=scale, steps=steps, batch_size=batch,
                      num_workers=0 if scale == "smoke" else min(8, max(1, (os.cpu_count() or 2) // 2)),
                      pin_memory=scale == "full", precision=rung.precision, channels_last=rung.channels_last,
                      compile=rung.compile, seed=config.seed, device=config.device,
                      progress=False, grad_clip=None, eval_samples=0)  # a rate, not a lesson in learning
    log = fit(cfg)
    s = log.to_dict()["summary"]
    return _row("torch", rung, log, mfu=s.get("median_mfu"),
                peak_memory_mib=(s["peak_memory_bytes"] / 2**20 if log.run["device"].startswith("cuda") else None),
                activation_mib=activation_bytes(cfg) / 2**20)


def _train_tf(config: PrecisionLadderConfig, rung: Rung, scale: str, steps: int,
              batch: int) -> dict[str, Any]:
    from labkit.tf.engine import fit

    log = fit(TrainConfig(framework="tf", model=config.model, scale=scale, batch_size=batch, seed=config.seed,
                          device=config.device, progress=False, grad_clip=None, steps=steps,
                          precision=rung.precision, compile=rung.compile, eval_samples=0))
    s = log.to_dict()["summary"]
    row = _row("tf", rung, log, mfu=None, activation_mib=None,
               peak_memory_mib=s["peak_memory_bytes"] / 2**20 if log.run["device"] == "gpu" else None)
    return row | {"channels_last": True}  # TensorFlow's layout is channels last natively


def find(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The row of the rung with this key (a `Rung.key`, or a reference row's key)."""
    for r in rows:
        if r["key"] == key:
            return r
    raise KeyError(f"no rung with key {key!r} in these rows (keys: {', '.join(r['key'] for r in rows)})")


RUNG_FIGURE = "ladder rung {rung} (torch)"  # the key figure notebook 04 records for each rung


def reference_ladder() -> tuple[list[dict[str, Any]], str]:
    """A ResNet-50 ladder measured on a GPU, for a run that had none: this notebook's own ladder
    from the newest full-size course run on a GPU in the repository's results when there is one
    (`benchmarks/course_gpu.py`), else labkit's benchmark ladder on one H100 (batch 256, AdamW,
    synthetic 224² images, one run per rung; its last row adds CUDA graphs). Returns (rows with
    `rung`, `samples_per_s`, `range` (of the repeated runs the file records, or "one run") and
    `speedup`, the source's provenance)."""
    from labkit.hardware import results

    course = results.course_run("04")
    labels = {RUNG_FIGURE.format(rung=r.label): r for r in RUNGS["torch"]}
    measured = [f for f in (course.figures("04") if course else []) if f.label in labels]
    if measured:
        base = measured[0].value
        rows = [{"key": labels[f.label].key, "rung": labels[f.label].label, "samples_per_s": f.value,
                 "range": f.range or "-", "speedup": f.value / base} for f in measured]
        return rows, course.provenance()
    ladder = results.resnet_ladder()
    base = ladder[0].value
    by_key = {r.key: r.label for r in RUNGS["torch"]}  # the ladder's labels, where it has the rung
    rows = [{"key": r.key, "rung": by_key.get(r.key, r.label), "samples_per_s": r.value,
             "range": "one run", "speedup": r.value / base} for r in ladder]
    return rows, ladder[0].source.provenance()


@dataclass(frozen=True)
class RungFinding:
    """One rung of a ladder against the first rung: the numbers a sentence about it needs."""

    key: str
    rung: str  # its label
    samples_per_s: float  # the median of its runs
    low: float  # its slowest run
    high: float  # its fastest run
    runs: int
    speedup: float | None  # its median over the first rung's
    # Against the first rung, from the spread of the runs (`labkit.course.ladder.verdict`):
    # "faster", "slower", "no measurable difference here", or no verdict under 3 runs;
    # "reference" for the first rung itself.
    verdict: str
    final_loss: float
    activation_mib: float | None


@dataclass(frozen=True)
class LadderFindings:
    """What a ladder's rows show (`findings`): each rung against the first, the rung with the
    highest median, and why a CPU run looks the way it does."""

    device: str
    first: RungFinding
    best: RungFinding  # the highest median (its verdict says whether that is measurable)
    others: tuple[RungFinding, ...]  # every rung after the first, in ladder order
    slow_on_cpu: tuple[SlowFormat, ...]  # 16-bit formats at under half fp32's speed on a CPU
    tf32_on_cpu: bool  # a tf32 rung ran on a CPU: no tensor cores, fp32's kernels

    def rung(self, key: str) -> RungFinding:
        """The finding of the rung with this key."""
        for f in (self.first, *self.others):
            if f.key == key:
                return f
        raise KeyError(f"no rung with key {key!r} in these findings")


def rung_finding(base: dict[str, Any], row: dict[str, Any]) -> RungFinding:
    """`row` against the first rung's row `base`."""
    runs = row.get("runs_samples_per_s") or [row["samples_per_s"]]
    verdict = "reference" if row is base else ladder.verdict(ladder.comparison(base, row))
    return RungFinding(row["key"], row["rung"], row["samples_per_s"], min(runs), max(runs), len(runs),
                       row.get("speedup"), verdict, row["final_loss"], row.get("activation_mib"))


def findings(rows: list[dict[str, Any]], flags: frozenset[str] | None = None) -> LadderFindings:
    """The numbers and verdicts a notebook's sentences about a ladder need, from its rows
    (`run_ladder`'s): a rung is faster or slower than the first only when their runs' ranges do
    not overlap. `flags`: the CPU's flags (this CPU's when None), for `slow_on_cpu`."""
    if not rows:
        raise ParameterError("rows", rows, "an empty ladder has no findings")
    base = rows[0]
    best = max(rows, key=lambda r: r["samples_per_s"] or 0)
    return LadderFindings(base["device"], rung_finding(base, base), rung_finding(base, best),
                          tuple(rung_finding(base, r) for r in rows[1:]),
                          tuple(slow_16_bit_on_cpu(rows, flags)),
                          base["device"] == "cpu" and any(r["key"] == "tf32" for r in rows))


# The CPU flags with which oneDNN (the CPU kernel library of torch and TensorFlow) multiplies
# in a 16-bit format natively; without them it converts around every operation.
NATIVE_HALF_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}


@dataclass(frozen=True)
class SlowFormat:
    """A 16-bit format whose rungs ran at under half of the first rung's speed on a CPU, with the
    CPU flags that would let oneDNN multiply in it natively (`native_flags`) and those of them
    this CPU reports (`cpu_has`, empty: every operation converts to fp32 and back)."""

    precision: str
    rungs: tuple[RungFinding, ...]
    native_flags: tuple[str, ...]
    cpu_has: tuple[str, ...]


def slow_16_bit_on_cpu(rows: list[dict[str, Any]], flags: frozenset[str] | None = None) -> list[SlowFormat]:
    """The 16-bit formats that ran at under half of the first rung's speed on a CPU, with this
    CPU's flags for them (`flags`: this CPU's, read when None); [] off a CPU."""
    from labkit.core.devices import cpu_flags

    base = rows[0]
    slow = [r for r in rows[1:] if r.get("precision") in NATIVE_HALF_FLAGS and (r.get("speedup") or 1.0) < 0.5]
    if base["device"] != "cpu" or not slow:
        return []
    flags = cpu_flags() if flags is None else flags
    return [SlowFormat(fmt, tuple(rung_finding(base, r) for r in slow if r["precision"] == fmt),
                       NATIVE_HALF_FLAGS[fmt], tuple(f for f in NATIVE_HALF_FLAGS[fmt] if f in flags))
            for fmt in sorted({r["precision"] for r in slow})]
