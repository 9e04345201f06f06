"""Trace analysis in code: where each step's time went, and which ops took it.

Every instant of a step is given to exactly one category, so the fractions sum to one:

- input: inside a data-loading range (`labkit/input`, torch's `enumerate(DataLoader)...`,
  TF's `IteratorGetNext`): producing or waiting for the batch;
- h2d: inside `labkit/h2d` (host-to-device copy);
- communication: inside `labkit/communication` or a collective (all_reduce, nccl, gloo, c10d);
- optimizer: inside `labkit/optimizer` or torch's `Optimizer.step#...`;
- compute: covered by a CPU op (forward, backward, loss) outside the ranges above;
- idle: covered by nothing: Python between ops, launch overhead, waiting.

When several ranges overlap, the first in that list wins (a copy inside the input range is
input). On a GPU the device timeline is summarised separately (`gpu_busy`): the host runs ahead
of the device, so host-side compute says little about whether the GPU was busy.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from labkit.profiling.phases import CATEGORIES, PREFIX, Event, Timeline

_PRIORITY = ("input", "h2d", "communication", "optimizer", "compute")
_COMM = re.compile(r"all_?reduce|all_?gather|reduce_?scatter|broadcast|nccl|gloo|c10d::|record_param_comms", re.I)
# Ops whose time is set by memory traffic rather than arithmetic (elementwise, norms, copies).
MEMORY_BOUND_OPS = re.compile(
    r"add|mul|div|sub|relu|gelu|silu|sigmoid|tanh|dropout|norm|softmax|copy|cat|fill|zero|clone|"
    r"contiguous|transpose|permute|index|gather|scatter|where|masked|sum|mean|elementwise|vectorized",
    re.I)
MATMUL_OPS = re.compile(r"mm|matmul|linear|conv|gemm|cutlass|sm\d+_xmma|ampere_|hopper_|wgmma", re.I)


def classify(event: Event) -> str | None:
    """The category a range or op claims, or None for containers that claim nothing themselves."""
    name = event.name
    if event.kind == "gpu":
        return None
    if name.startswith(PREFIX):
        label = name[len(PREFIX):]
        if label in ("forward", "backward"):
            # A profiler range around the forward pass only contains ops; the gaps between
            # them are host overhead (idle). Host-timed phases (PhaseTimer) claim their span.
            return "compute" if event.kind == "cpu_op" else None
        return label
    if name.startswith("enumerate(DataLoader)") or "IteratorGetNext" in name:
        return "input"
    if name.startswith("Optimizer.step") or name.startswith("Optimizer.zero_grad"):
        return "optimizer"
    if _COMM.search(name):
        return "communication"
    if event.kind == "cpu_op":
        return "compute"
    return None


@dataclass
class StepBreakdown:
    step: str
    duration_us: float
    seconds: dict[str, float]
    gpu_busy: float | None = None

    @property
    def fractions(self) -> dict[str, float]:
        total = sum(self.seconds.values())
        return {k: (v / total if total else 0.0) for k, v in self.seconds.items()}


@dataclass
class Breakdown:
    """Per-step breakdowns and their total over the profiled steps."""

    steps: list[StepBreakdown]
    gpu_busy: float | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def total_seconds(self) -> dict[str, float]:
        out = dict.fromkeys(CATEGORIES, 0.0)
        for s in self.steps:
            for k, v in s.seconds.items():
                out[k] += v
        return out

    @property
    def fractions(self) -> dict[str, float]:
        tot = self.total_seconds
        total = sum(tot.values())
        return {k: (v / total if total else 0.0) for k, v in tot.items()}

    @property
    def mean_step_s(self) -> float:
        return statistics.fmean(s.duration_us for s in self.steps) / 1e6

    def rows(self) -> list[dict[str, object]]:
        return [{"category": k, "seconds": self.total_seconds[k], "fraction": f}
                for k, f in self.fractions.items()]

    def text(self) -> str:
        parts = [f"{k} {100 * f:.0f}%" for k, f in self.fractions.items() if f >= 0.005]
        gpu = f", GPU busy {100 * self.gpu_busy:.0f}%" if self.gpu_busy is not None else ""
        return f"{len(self.steps)} steps, {1e3 * self.mean_step_s:.1f} ms/step: " + ", ".join(parts) + gpu


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The length covered by `intervals` (start, end), overlaps counted once."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _step_breakdown(step: Event, events: list[Event]) -> StepBreakdown:
    lo, hi = step.start, step.end
    claimed: list[tuple[float, float, int]] = []  # (start, end, priority)
    gpu: list[tuple[float, float]] = []
    for ev in events:
        if ev.end <= lo or ev.start >= hi:
            continue
        s, e = max(ev.start, lo), min(ev.end, hi)
        if ev.kind == "gpu":
            gpu.append((s, e))
            continue
        cat = classify(ev)
        if cat in _PRIORITY:
            claimed.append((s, e, _PRIORITY.index(cat)))
    # Sweep over the boundaries; each elementary segment goes to its best-priority claimant.
    bounds = sorted({lo, hi, *(c[0] for c in claimed), *(c[1] for c in claimed)})
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    starts = sorted(claimed)
    active: list[tuple[float, float, int]] = []
    j = 0
    for a, b in zip(bounds, bounds[1:], strict=False):
        while j < len(starts) and starts[j][0] <= a:
            active.append(starts[j])
            j += 1
        active = [c for c in active if c[1] > a]
        best = min((c[2] for c in active), default=None)
        seconds["idle" if best is None else _PRIORITY[best]] += (b - a) / 1e6
    gpu_busy = union_length(gpu) / (hi - lo) if gpu and hi > lo else None
    return StepBreakdown(step.name, hi - lo, seconds, gpu_busy)


def step_breakdown(timeline: Timeline, skip_first: int = 0) -> Breakdown:
    """Break every profiled step down into CATEGORIES (fractions sum to one per step)."""
    steps = timeline.steps[skip_first:]
    if not steps:
        raise ValueError(f"{timeline.source or 'timeline'}: no steps to analyse")
    per_step = [_step_breakdown(s, timeline.events) for s in steps]
    busy = [s.gpu_busy for s in per_step if s.gpu_busy is not None]
    gpu_busy = None
    if timeline.has_gpu:
        total = sum(s.duration_us for s in per_step)
        gpu_busy = sum((s.gpu_busy or 0.0) * s.duration_us for s in per_step) / total if total else None
    out = Breakdown(per_step, gpu_busy, timeline.source)
    if timeline.has_gpu and not busy:
        out.notes.append("the trace has GPU activity but none inside the profiled steps")
    return out


@dataclass(frozen=True)
class OpStat:
    name: str
    kind: str
    count: int
    self_us: float
    share: float


def _self_times(events: list[Event]) -> dict[int, float]:
    """Self time of each event (its span minus its direct children on the same thread)."""
    by_tid: dict[object, list[int]] = defaultdict(list)
    for i, ev in enumerate(events):
        by_tid[ev.tid].append(i)
    self_us = {i: events[i].dur for i in range(len(events))}
    for idx in by_tid.values():
        idx.sort(key=lambda i: (events[i].start, -events[i].dur))
        stack: list[int] = []
        for i in idx:
            while stack and events[stack[-1]].end <= events[i].start:
                stack.pop()
            if stack:
                self_us[stack[-1]] -= events[i].dur
            stack.append(i)
    return self_us


def top_ops(timeline: Timeline, n: int = 10, device: str | None = None) -> list[OpStat]:
    """The ops that took the most self time inside the profiled steps: GPU kernels when the
    trace has them (device='gpu'), else CPU ops."""
    device = device or ("gpu" if timeline.has_gpu else "cpu")
    kind = "gpu" if device == "gpu" else "cpu_op"
    if not timeline.steps:
        return []
    lo, hi = timeline.steps[0].start, timeline.steps[-1].end
    evs = [e for e in timeline.events if e.kind == kind and e.start >= lo and e.end <= hi]
    self_us = _self_times(evs) if kind == "cpu_op" else {i: e.dur for i, e in enumerate(evs)}
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for i, ev in enumerate(evs):
        agg[ev.name][0] += 1
        agg[ev.name][1] += max(self_us[i], 0.0)
    total = sum(v[1] for v in agg.values()) or 1.0
    ranked = sorted(agg.items(), key=lambda kv: -kv[1][1])[:n]
    return [OpStat(name, kind, int(c), t, t / total) for name, (c, t) in ranked]


def op_profile(timeline: Timeline, small_op_us: float | None = None) -> dict[str, float]:
    """Shape of the compute, for the verdict: share of op self time in matmul-like and in
    memory-bound ops, the share spent in *small* ops (each shorter than `small_op_us`: 50 µs on
    CPU, 20 µs for GPU kernels), where per-op overhead rather than arithmetic sets the pace,
    and ops per step."""
    kind = "gpu" if timeline.has_gpu else "cpu_op"
    threshold = small_op_us if small_op_us is not None else (20.0 if kind == "gpu" else 50.0)
    if not timeline.steps:
        return {"matmul_share": 0.0, "memory_share": 0.0, "small_op_share": 0.0, "ops_per_step": 0.0}
    lo, hi = timeline.steps[0].start, timeline.steps[-1].end
    evs = [e for e in timeline.events if e.kind == kind and e.start >= lo and e.end <= hi]
    self_us = _self_times(evs) if kind == "cpu_op" else {i: e.dur for i, e in enumerate(evs)}
    total = sum(max(v, 0.0) for v in self_us.values()) or 1.0
    matmul = memory = small = 0.0
    for i, ev in enumerate(evs):
        t = max(self_us[i], 0.0)
        if MATMUL_OPS.search(ev.name):
            matmul += t
        elif MEMORY_BOUND_OPS.search(ev.name):
            memory += t
        if ev.dur < threshold:
            small += t
    return {
        "matmul_share": matmul / total,
        "memory_share": memory / total,
        "small_op_share": small / total,
        "ops_per_step": len(evs) / len(timeline.steps),
    }
