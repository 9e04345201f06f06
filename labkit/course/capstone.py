"""Notebook 09's capstone: a baseline that is slow for a stated reason, the course's levers
applied one at a time (each kept only when it made *this* machine measurably faster), then the
baseline and the optimised run measured again side by side and priced per epoch.

    result = optimise(CapstoneConfig(model="resnet"))
    result.slow_input  # why the baseline is slow, fixed before it is measured
    result.trials   # one row per lever: throughput before and after (medians, ranges), verdict
    result.final    # baseline and optimised, re-measured in alternation
    result.bottleneck()  # the stated bottleneck against the baseline's measured wait
    findings(result, cost_rows(result, price_for_this_machine(), samples_per_epoch=1_281_167))

Why the baseline is slow: it trains in fp32 and, with torch, reads every batch from slow
storage (`TrainConfig.input_latency_ms`, an injected wait per batch in the training process; by
default as long as this machine's own compute step, measured first without it, so about half of
each baseline step is waiting). Each lever then has something to remove: loader workers the
wait, the 16-bit and layout levers the fp32 arithmetic. TensorFlow's engine has no loader lever
here, so its baseline gets no injected wait.

How a lever is judged: every configuration gets one short discarded run the first time it is
seen (first-use costs: thread pools, kernels chosen on first use, loader processes), then the
configuration so far and the candidate take turns `repeats` times (`labkit.core.stats`). The
lever is kept only when the candidate's runs are all faster than the current ones (no overlap)
and its median gains at least `min_gain`; otherwise the verdict reads "no measurable difference
here". Every run of every configuration is kept (`CapstoneResult.runs`), so the findings can
flag the same configuration measuring very differently during the run.

The notebook writes the sentences: `findings` gives it the numbers and the verdicts (the final
comparison's, each lever's, the stated bottleneck's against the measured wait), never prose.

Levers are found by key (`Lever.key`, the `key` of each trial row); labels are for display.
The levers themselves (key, label, settings, the code that shows them) are rows of
`labkit.course.levers`; the measuring is `labkit.course.ladder`'s. Which levers a job on another
GPU carries, and what its epoch costs there, is `labkit.course.capstone_target`'s.
Every lever is a change to `labkit.core.train_config.TrainConfig`, so the optimised
configuration is exactly what `labkit train` (or a Vertex AI job built by
`labkit.vertex.training_job`) runs. The price comes from `labkit.hardware.machines`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from labkit.core import stats
from labkit.core.config import (
    ParameterError,
    by_scale,
    check_bool,
    check_choice,
    check_float,
    check_int,
    resolve_scale,
)
from labkit.core.models import MODEL_NAMES
from labkit.core.placement import DEVICES, place_here
from labkit.core.progress import track
from labkit.core.train_config import TrainConfig
from labkit.course import ladder
from labkit.course.levers import LEVERS, Lever, loader_workers
from labkit.course.levers import lever as lever_row  # `levers` is this module's lever list
from labkit.course.precision import compile_included, default_batch
from labkit.hardware.machines import Price

CONV_MODELS = ("cnn", "resnet")
# Samples in one epoch of the public dataset each model family stands for, so that "$ per epoch"
# means something: CIFAR-10's training set (cnn), ImageNet-1k's (resnet) and OpenWebText's
# ~9.04B GPT-2 tokens in 1,024-token sequences (gpt).
EPOCH_SAMPLES = {"cnn": 50_000, "resnet": 1_281_167, "gpt": 9_035_582_198 // 1024}
EPOCH_SOURCES = {"cnn": "CIFAR-10 training set", "resnet": "ImageNet-1k training set",
                 "gpt": "OpenWebText, 9.04B GPT-2 tokens in 1,024-token sequences"}


@dataclass(frozen=True)
class CapstoneConfig:
    """One capstone run. `framework` "auto" takes torch when installed, else TensorFlow. Sizes
    default by scale as in notebook 04's ladder (smoke: seconds on a CPU; full: ResNet-50 or GPT-2
    small on a GPU at the peer batches). A lever is kept only when its `repeats` runs (at least 3)
    are all faster than the configuration so far and its median gains at least `min_gain`
    (0.03 = 3%); the final comparison alternates baseline and optimised runs `repeats` times.
    `include_compile` None compiles only at full scale (compiling takes minutes on a small CPU).
    `input_latency_ms`: the baseline's injected wait per batch (torch), None: as long as this
    machine's compute step, measured first (`slow_baseline`); 0: no wait (an fp32-only baseline).
    `cpu_threads`: torch compute threads while the climb runs on a CPU (0 keeps torch's
    default); one leaves a core for a loader worker and keeps runs steady on a small shared
    machine, where oversubscribed threads make the same configuration swing run to run."""

    framework: str = "auto"
    model: str = "resnet"
    scale: str = "auto"
    steps: int | None = None
    batch_size: int | None = None
    include_compile: bool | None = None
    device: str = "auto"
    min_gain: float = 0.03
    repeats: int | None = None
    input_latency_ms: float | None = None
    cpu_threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("framework", self.framework, ("auto", "torch", "tf"))
        check_choice("model", self.model, MODEL_NAMES)
        check_int("steps", self.steps, minimum=3, allow_none=True)
        check_int("batch_size", self.batch_size, minimum=1, allow_none=True)
        if self.include_compile is not None:
            check_bool("include_compile", self.include_compile)
        check_choice("device", self.device, DEVICES)
        check_float("min_gain", self.min_gain, minimum=0.0, maximum=1.0)
        check_int("repeats", self.repeats, minimum=stats.MIN_REPEATS, allow_none=True)
        check_float("input_latency_ms", self.input_latency_ms, minimum=0.0, allow_none=True)
        check_int("cpu_threads", self.cpu_threads, minimum=0)
        check_int("seed", self.seed, minimum=0)

    def resolved_framework(self) -> str:
        from labkit.core import frameworks

        if self.framework != "auto":
            frameworks.require("torch" if self.framework == "torch" else "tensorflow")
            return self.framework
        if frameworks.has_torch():
            return "torch"
        if frameworks.has_tf():
            return "tf"
        raise ParameterError("framework", self.framework, "needs torch or tensorflow installed; neither is")

    def baseline(self) -> TrainConfig:
        """The starting point: fp32, eager, batches built in the training process, with the
        injected storage wait when `input_latency_ms` is a number (None: `slow_baseline` sizes
        it from a measured step)."""
        scale = resolve_scale(self.scale)
        steps = self.steps or by_scale(scale, smoke=20, full=40)
        batch = self.batch_size or default_batch(self.model, scale)
        return TrainConfig(framework=self.resolved_framework(), model=self.model, scale=scale, steps=steps,
                           batch_size=batch, precision="fp32", seed=self.seed, device=self.device,
                           progress=False, eval_samples=0,  # levers are timed: no held-out pass
                           input_latency_ms=self.input_latency_ms or 0.0)

    def compile_included(self) -> bool:
        return compile_included(self.include_compile, resolve_scale(self.scale))

    def resolved_repeats(self) -> int:
        return self.repeats or stats.MIN_REPEATS


class SkippedLever(NamedTuple):
    """A lever not tried, or not finished, on this machine, and why."""

    key: str
    label: str
    why: str


@dataclass(frozen=True)
class Hardware:
    """What decides which levers apply: the device type, fp8 tensor cores, CPU cores."""

    device_type: str
    fp8: bool = False
    cpu_count: int = 2
    bf16: bool = True  # bf16 tensor cores (a T4 has none: its 16-bit lever is fp16 + GradScaler)

    @classmethod
    def detect(cls, device: str = "auto") -> Hardware:
        from labkit.core import devices
        from labkit.hardware.gpus import for_gpu

        info = devices.detect()
        # The placement rule for one torch process; "cuda" is held to it by the engine that runs
        # (TensorFlow may see a GPU torch does not), so here it asks only for what torch can use.
        on_gpu = place_here(device="auto" if device == "cuda" else device).on_gpu
        gpu = info.gpus[0] if on_gpu and info.gpus else None
        facts = for_gpu(gpu) if gpu else None
        return cls("cuda" if gpu else "cpu", bool(facts and facts.supports("fp8")), devices.usable_cpu_count(),
                   facts is None or facts.supports("bf16"))


# Why the compile levers are not tried unless asked for: at smoke scale compiling takes minutes on
# a small CPU; at full scale the plan leaves them out where recompiling for every run would be
# most of the notebook (`labkit.course.sizing`).
COMPILE_OFF = "include_compile is off (the plan above says why); include_compile=True tries it"


def levers(framework: str, model: str, hw: Hardware, include_compile: bool) -> tuple[list[Lever], list[SkippedLever]]:
    """(the levers to try, in order; the levers that do not apply here, with why), from the
    registry (`labkit.course.levers`). Input first, so later levers are not hidden behind a
    starved device; then precision, layout, compiler."""
    lv = LEVERS[framework]
    tried: list[Lever] = []
    skipped: list[SkippedLever] = []

    def skip(key: str, why: str) -> None:
        skipped.append(SkippedLever(key, lv[key].label, why))

    if framework == "tf":
        tried.append(lv["bf16"])
        if include_compile:
            tried.append(lv["compile"])
        else:
            skip("compile", COMPILE_OFF)
        return tried, skipped
    tried.append(loader_workers(max(1, min(8, hw.cpu_count // 2)), hw.device_type == "cuda"))
    if hw.bf16:
        tried.append(lv["bf16"])
    else:
        tried.append(lv["fp16"])
        skip("bf16", "this GPU has no bf16 tensor cores (compute capability below 8.0): fp16 with a GradScaler instead")
    if model in CONV_MODELS:
        tried.append(lv["channels_last"])
    else:
        skip("channels_last", "GPT has no convolutions")
    if not include_compile:
        skip("compile", COMPILE_OFF)
    else:
        tried.append(lv["compile"])
        if hw.device_type == "cuda":
            tried.append(lv["cuda_graphs"])
        else:
            skip("cuda_graphs", "needs a CUDA GPU")
    if hw.device_type == "cuda":
        # With or without torch.compile: it also removes an eager step's launch gaps.
        tried.append(lv["step_graph"])
    else:
        skip("step_graph", "needs a CUDA GPU")
    if model == "gpt":
        if hw.fp8:
            tried.append(lv["fp8_head"])
        else:
            skip("fp8_head", "needs fp8 tensor cores (compute capability 8.9+: L4, H100, H200)")
    return tried, skipped


def lever_rows(tried: list[Lever]) -> list[dict[str, Any]]:
    """The levers as table rows: what each sets and where the course teaches it."""
    return [{"lever": lv.label, "sets": dict(lv.changes), "taught in": lv.lesson} for lv in tried]


# ---------------------------------------------------------------- the slow baseline

INPUT_LEVERS = frozenset({"loader_workers"})  # levers that remove waiting for input, not arithmetic
INPUT_BOUND = 1 / 3  # a baseline waiting for its input this share of each step (or more) is input-bound
PROBE_STEPS = 5  # the run that sizes the injected wait (its first step is not counted in the median)


@dataclass(frozen=True)
class SlowInput:
    """Why the baseline is slow, fixed before it is measured: fp32 and, when `latency_ms` > 0, a
    wait per batch for (emulated) storage in the training process. `compute_ms`: this machine's
    step without the wait, when the wait was sized from it (None: the wait was given)."""

    latency_ms: float
    compute_ms: float | None = None

    @property
    def injected(self) -> bool:
        """Whether the baseline waits for (emulated) storage at all."""
        return bool(self.latency_ms)

    @property
    def expected_wait(self) -> float | None:
        """The share of a baseline step expected to be waiting for input (None: unknown)."""
        if not self.latency_ms:
            return 0.0
        return None if self.compute_ms is None else self.latency_ms / (self.latency_ms + self.compute_ms)


def slow_baseline(config: CapstoneConfig, hardware: Hardware | None = None,
                  measure_fn: Callable[[TrainConfig], dict[str, Any]] | None = None) -> tuple[TrainConfig, SlowInput]:
    """The baseline with its storage wait, and why it is slow. Without a lever that removes the
    wait (`INPUT_LEVERS`; TensorFlow has none here) there is none; else it is `input_latency_ms`
    when given, or one short run without it measures the compute step (with the climb's
    threads) and the wait is made as long."""
    base = config.baseline()
    hw = hardware or Hardware.detect(config.device)
    tried, _ = levers(base.framework, config.model, hw, config.compile_included())
    if not any(lv.key in INPUT_LEVERS for lv in tried):
        return replace(base, input_latency_ms=0.0), SlowInput(0.0)
    if config.input_latency_ms is not None:
        return base, SlowInput(base.input_latency_ms)
    with _torch_threads(_climb_threads(config, hw, base.framework)):
        probe = (measure_fn or measure)(replace(base, steps=min(base.steps, PROBE_STEPS), input_latency_ms=0.0))
    compute_ms = probe["step_time_ms"] * (1.0 - (probe.get("data_fraction") or 0.0))
    latency = float(max(1, round(compute_ms)))
    return replace(base, input_latency_ms=latency), SlowInput(latency, compute_ms)


def _climb_threads(config: CapstoneConfig, hw: Hardware, framework: str) -> int:
    """torch compute threads for runs on this machine (0: torch's default)."""
    return config.cpu_threads if hw.device_type == "cpu" and framework == "torch" else 0


def measure(config: TrainConfig) -> dict[str, Any]:
    """Train `config` once and summarise it (medians over the steps after the first)."""
    from labkit.train import run_training

    log = run_training(config)
    s = log.to_dict()["summary"]
    step = s["median_step_time_s"]
    peak = s.get("peak_memory_bytes")
    return {"samples_per_s": s.get("median_samples_per_s") or config.batch_size / step,
            "step_time_ms": 1000 * step,
            "data_fraction": s["median_data_time_s"] / step if s.get("median_data_time_s") is not None else None,
            "peak_memory_mib": peak / 2**20 if peak and log.run.get("device", "").startswith("cuda") else None,
            "final_loss": s["final_loss"], "device": log.run.get("device", "")}


@dataclass(frozen=True)
class Bottleneck:
    """The baseline's measured wait for input against what was stated before it ran. `wait`:
    the share of a step spent waiting (median of its `runs` in the final comparison; None when
    the engine did not measure it); `expected`: the share stated (None: unknown); `injected`: a
    storage wait was injected, so the baseline was stated input-bound; `input_bound`: the
    measured wait reached `INPUT_BOUND`."""

    wait: float | None
    expected: float | None
    injected: bool
    input_bound: bool
    runs: int

    @property
    def shown(self) -> bool:
        """Whether the measurement agrees with the statement: input-bound when a storage wait
        was injected, else not (its time is the fp32 step)."""
        return self.wait is not None and self.input_bound == self.injected


@dataclass
class CapstoneResult:
    """The climb and the final comparison. `trials`: one row per lever tried (medians, ranges,
    gain, verdict, kept); `final`: baseline and optimised rows (median of their runs in the final
    comparison); `runs`: every measured run (samples/s) of every configuration, by
    configuration, over the whole climb."""

    baseline: TrainConfig
    optimised: TrainConfig
    trials: list[dict[str, Any]]
    skipped: list[SkippedLever]
    final: list[dict[str, Any]]
    min_gain: float = 0.0
    runs: dict[str, list[float]] = field(default_factory=dict)  # keyed by repr(config)
    cpu_threads: int | None = None  # torch compute threads the climb ran with on a CPU (None: default)
    slow_input: SlowInput | None = None  # why the baseline is slow, fixed before it ran

    @property
    def baseline_wait(self) -> float | None:
        """The share of a baseline step spent waiting for input (median of its final runs), or
        None when the engine did not measure it."""
        return self.final[0].get("data_fraction")

    @property
    def input_bound(self) -> bool:
        """Whether the baseline's measured breakdown shows it input-bound (`INPUT_BOUND`)."""
        return self.baseline_wait is not None and self.baseline_wait >= INPUT_BOUND

    def bottleneck(self) -> Bottleneck:
        """The bottleneck stated before the baseline ran against its measured breakdown."""
        stated = self.slow_input or SlowInput(0.0)
        return Bottleneck(self.baseline_wait, stated.expected_wait, stated.injected, self.input_bound,
                          self.final[0].get("repeats", 1))

    @property
    def speedup(self) -> float:
        return self.final[1]["samples_per_s"] / self.final[0]["samples_per_s"]

    @property
    def final_comparison(self) -> stats.Comparison | None:
        """Baseline (a) against optimised (b) in the final alternation, when each has the
        repeats a verdict needs."""
        a, b = (r.get("runs_samples_per_s") or [] for r in self.final)
        if min(len(a), len(b)) < stats.MIN_REPEATS:
            return None
        return stats.compare(a, b, min_effect=self.min_gain)

    @property
    def kept(self) -> list[str]:
        """The keys of the levers kept, in order."""
        return [t["key"] for t in self.trials if t["kept"]]

    @property
    def kept_labels(self) -> list[str]:
        return [t["lever"] for t in self.trials if t["kept"]]

    def changes(self) -> dict[str, Any]:
        """The TrainConfig fields the optimised run sets differently from the baseline."""
        return {k: v for k, v in vars(self.optimised).items() if vars(self.baseline)[k] != v}

    def spread_of(self, config: TrainConfig) -> stats.Spread | None:
        """All runs of `config` during the whole climb (None if it never ran)."""
        values = self.runs.get(repr(config))
        return stats.Spread(tuple(values)) if values else None


class _Bench:
    """Runs configurations for `optimise`: a discarded short run the first time a configuration
    is seen, then measured runs in turns; keeps every measurement by configuration."""

    def __init__(self, measure_fn: Callable[[TrainConfig], dict[str, Any]], repeats: int):
        self.measure_fn, self.repeats = measure_fn, repeats
        self.warmed: set[str] = set()
        self.runs: dict[str, list[float]] = {}  # TrainConfig is not hashable: keyed by its repr

    def _run(self, config: TrainConfig) -> dict[str, Any]:
        row = self.measure_fn(config)
        self.runs.setdefault(repr(config), []).append(row["samples_per_s"])
        return row

    def _warm(self, config: TrainConfig) -> None:
        if repr(config) not in self.warmed:
            self.measure_fn(replace(config, steps=min(config.steps, ladder.WARM_UP_STEPS)))
            self.warmed.add(repr(config))

    def compare(self, a: TrainConfig, b: TrainConfig, min_effect: float) -> tuple[dict, dict, stats.Comparison]:
        """`a` and `b` in turns after their warm-ups: each one's summary row and the comparison
        of b against a."""
        runs = ladder.in_turns({"a": lambda: self._run(a), "b": lambda: self._run(b)}, repeats=self.repeats,
                               warm_up_with={"a": lambda: self._warm(a), "b": lambda: self._warm(b)})
        rows = [ladder.summary(runs[k]) for k in ("a", "b")]
        return rows[0], rows[1], stats.compare(rows[0]["runs_samples_per_s"], rows[1]["runs_samples_per_s"],
                                              min_effect=min_effect)


def optimise(config: CapstoneConfig, *, hardware: Hardware | None = None,
             measure_fn: Callable[[TrainConfig], dict[str, Any]] = measure,
             slow: tuple[TrainConfig, SlowInput] | None = None) -> CapstoneResult:
    """Climb the levers greedily from the baseline, then measure baseline and optimised again.
    `slow`: the baseline and its reason from `slow_baseline` (None: found here). Every
    comparison runs its two configurations in turns `repeats` times after a discarded first run
    of each (see the module docstring), so both see the same machine state and a
    configuration's first-use costs are not charged to it."""
    hw = hardware or Hardware.detect(config.device)
    base, why = slow or slow_baseline(config, hw, measure_fn)
    tried, skipped = levers(base.framework, config.model, hw, config.compile_included())
    threads = _climb_threads(config, hw, base.framework)
    with _torch_threads(threads):
        result = _climb(config, base, tried, skipped, measure_fn)
    return replace(result, cpu_threads=threads or None, slow_input=why)


@contextlib.contextmanager
def _torch_threads(threads: int):
    """torch's intra-op threads set to `threads` inside the block (0: left alone), restored after."""
    if not threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _climb(config: CapstoneConfig, base: TrainConfig, tried: list[Lever], skipped: list[SkippedLever],
           measure_fn: Callable[[TrainConfig], dict[str, Any]]) -> CapstoneResult:
    bench = _Bench(measure_fn, config.resolved_repeats())
    current = base
    trials = []
    for lever in track(tried, "capstone levers", unit="lever"):
        missing = {k: v for k, v in lever.needs.items() if getattr(current, k) != v}
        if missing:
            skipped.append(SkippedLever(lever.key, lever.label, "needs " + ", ".join(
                f"{k}={v!r}" for k, v in missing.items()) + ", which did not pay off here"))
            continue
        candidate = replace(current, **lever.changes)
        try:
            before, after, c = bench.compare(current, candidate, config.min_gain)
        except Exception as e:  # noqa: BLE001 - one lever failing on this machine must not lose the climb
            skipped.append(SkippedLever(lever.key, lever.label, f"failed here: {_first_line(e)}"))
            continue
        kept = c.b_is_better
        trials.append({"key": lever.key, "lever": lever.label, "lesson": lever.lesson, "comparison": c,
                       "figure": f"capstone lever here: {_generic_label(base.framework, lever)}, with / without",
                       "before_samples_per_s": before["samples_per_s"], "before_range": before["range"],
                       "samples_per_s": after["samples_per_s"], "range": after["range"],
                       "gain": c.speedup(), "verdict": ladder.verdict(c), "kept": kept,
                       "final_loss": after["final_loss"], "repeats": after["repeats"]})
        if kept:
            current = candidate
    baseline_run, optimised_run, _ = bench.compare(base, current, config.min_gain)
    final = [dict(baseline_run, run="baseline"), dict(optimised_run, run="optimised")]
    return CapstoneResult(base, current, trials, skipped, final, config.min_gain, bench.runs)


def _generic_label(framework: str, lever: Lever) -> str:
    """The registry's label of a lever (the loader lever's without this machine's worker count),
    so a key figure keeps its name from machine to machine."""
    row = lever_row(framework, lever.key)
    return row.label if row is not None else lever.label


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


# ---------------------------------------------------------------- cost


def cost_rows(result: CapstoneResult, price: Price | None, samples_per_epoch: int,
              spot_overhead: float = 0.0) -> list[dict[str, Any]]:
    """Machine-hours and dollars per epoch of baseline and optimised. Spot takes
    `spot_overhead` more time (lost work and restarts, `labkit.hardware.spot.SpotModel.overhead`)."""
    check_int("samples_per_epoch", samples_per_epoch, minimum=1)
    check_float("spot_overhead", spot_overhead, minimum=0.0)
    rows = []
    for r in result.final:
        hours = samples_per_epoch / r["samples_per_s"] / 3600.0
        row: dict[str, Any] = {"run": r["run"], "samples/s": r["samples_per_s"], "h/epoch": hours}
        if price is not None:
            row["$/epoch"] = hours * price.on_demand
            if price.spot is not None:
                row["Spot $/epoch"] = hours * (1.0 + spot_overhead) * price.spot
        rows.append(row)
    return rows


SWING_WARNING = 2.0  # a configuration whose runs span more than this factor: the machine changed
NEXT_LEVER_WAIT = 0.1  # an optimised run still waiting this share of each step has an input lever left


@dataclass(frozen=True)
class LeverFinding:
    """One lever of the climb: its gain (ratio of the medians), the ranges of the runs without
    and with it (samples/s), its verdict (`labkit.course.ladder.verdict`) and whether it was kept."""

    lever: str
    gain: float
    before_range: str
    after_range: str
    verdict: str
    kept: bool


@dataclass(frozen=True)
class CapstoneFindings:
    """What the climb and the final side-by-side runs measured, for the notebook's sentences.
    `baseline`/`optimised`: samples/s of each one's runs in the final comparison; `verdict`:
    optimised against baseline (`labkit.course.ladder.verdict`: "faster", "slower", no
    measurable difference, or no verdict with too few runs); `speedup`: ratio of the medians;
    `baseline_runs`: every run of the baseline configuration over the whole climb (`swung`: they
    span more than `SWING_WARNING`×); `input_left`: the optimised run still waits for its input
    `NEXT_LEVER_WAIT` of each step or more; `epoch_dollars`: on-demand $ per epoch of baseline
    and optimised, and `spot_dollars` the optimised run's on Spot (None: not priced)."""

    device: str
    nothing_kept: bool
    baseline: stats.Spread
    optimised: stats.Spread
    verdict: str
    speedup: float
    bottleneck: Bottleneck
    levers: tuple[LeverFinding, ...]
    baseline_runs: stats.Spread | None
    baseline_wait: float | None
    optimised_wait: float | None
    steps: int
    final_loss: tuple[float, float]  # baseline, optimised
    epoch_dollars: tuple[float, float] | None = None
    spot_dollars: float | None = None

    @property
    def kept(self) -> tuple[LeverFinding, ...]:
        return tuple(f for f in self.levers if f.kept)

    @property
    def dropped(self) -> tuple[LeverFinding, ...]:
        return tuple(f for f in self.levers if not f.kept)

    @property
    def cost_ratio(self) -> float:
        """An epoch of the optimised run over the baseline's, at any fixed hourly price."""
        return 1.0 / self.speedup

    @property
    def swung(self) -> bool:
        return self.baseline_runs is not None and self.baseline_runs.swing > SWING_WARNING

    @property
    def input_left(self) -> bool:
        measured = self.optimised_wait is not None and self.baseline_wait is not None
        return measured and self.optimised_wait >= NEXT_LEVER_WAIT

    @property
    def loss_gap(self) -> float:
        return abs(self.final_loss[1] - self.final_loss[0])


def _final_spread(row: dict[str, Any]) -> stats.Spread:
    return stats.Spread(tuple(row.get("runs_samples_per_s") or (row["samples_per_s"],)))


def findings(result: CapstoneResult, costs: list[dict[str, Any]]) -> CapstoneFindings:
    """This run's numbers and verdicts for the notebook's conclusions; `costs`: `cost_rows`
    (baseline, optimised), or [] where this machine's runs do not price the epoch."""
    base, best = result.final
    levers_ = tuple(LeverFinding(t["lever"], t["gain"], t["before_range"], t["range"], t["verdict"], t["kept"])
                    for t in result.trials)
    priced = len(costs) == 2 and "$/epoch" in costs[0]
    return CapstoneFindings(
        best["device"], result.optimised == result.baseline, _final_spread(base), _final_spread(best),
        ladder.verdict(result.final_comparison), result.speedup, result.bottleneck(), levers_,
        result.spread_of(result.baseline), base.get("data_fraction"), best.get("data_fraction"),
        result.baseline.steps, (base["final_loss"], best["final_loss"]),
        (costs[0]["$/epoch"], costs[1]["$/epoch"]) if priced else None,
        costs[1].get("Spot $/epoch") if priced else None)


def epoch_job(result: CapstoneResult, samples_per_epoch: int, *, checkpoint_every_min: float = 30.0,
              config: TrainConfig | None = None, step_time_ms: float | None = None,
              **job_options: Any) -> dict[str, Any]:
    """The Vertex AI CustomJob spec (`labkit.vertex.training_job`) for one epoch at full scale of
    `config` (default: the optimised configuration), without the injected storage wait (a
    stand-in for slow storage; the job reads the engine's own data). Checkpoints come every
    `checkpoint_every_min` minutes of `step_time_ms` (default: the measured step, when this run
    measured a GPU at full scale), else every 1,000 steps."""
    from labkit.vertex import training_job

    check_float("checkpoint_every_min", checkpoint_every_min, minimum=0.01)
    check_float("step_time_ms", step_time_ms, minimum=0.001, allow_none=True)
    chosen = config or result.optimised
    best = result.final[1]
    if step_time_ms is None and config is None and best["device"].startswith("cuda") and chosen.scale == "full":
        step_time_ms = best["step_time_ms"]
    batch = chosen.batch_size if chosen.scale == "full" else default_batch(chosen.model, "full")
    steps = -(-samples_per_epoch // batch)
    every = round(checkpoint_every_min * 60_000 / step_time_ms) if step_time_ms else 1000
    cfg = replace(chosen, scale="full", batch_size=batch, steps=steps, device="auto", input_latency_ms=0.0,
                  checkpoint_every=max(1, min(every, steps)), progress=False)
    return training_job(cfg, **job_options)
