"""labkit's reading of a torch.profiler trace beside Holistic Trace Analysis's (HTA, PyPI
``HolisticTraceAnalysis``) on the same file, where the two compute the same thing:

- **step times**: HTA's parsed ``ProfilerStep#N`` ranges against labkit's (`trace.Timeline`);
- **GPU busy**: HTA's temporal breakdown (from each rank's first GPU kernel to its last: idle,
  compute and non-compute time) against the same ratio computed by labkit from the same
  kernels (their union over that span). labkit's own report is busy time *inside the profiled
  steps*, shown beside it.

What labkit adds and HTA does not compute: the CPU side of each step (waiting for the
DataLoader, forward, backward, optimizer), the verdict and fix, and the user's own functions.
HTA's temporal and idle-time breakdowns need GPU kernels: on a CPU-only trace only the step
times compare, and the report says so.

    rows = side_by_side("prof/tensorboard")   # the folder `labkit profile` writes
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from labkit.profiling.analysis import Timeline, step_breakdown, union_length
from labkit.profiling.trace import timeline_from_chrome_trace

PACKAGE = "HolisticTraceAnalysis"


@dataclass
class SideBySide:
    """Rows of (what, labkit's value, HTA's value) and notes on what could not be compared."""

    trace: str
    rows: list[tuple[str, float | None, float | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def agrees(self, tolerance: float = 0.01) -> bool:
        """Every row HTA also computed is within `tolerance` (relative) of labkit's."""
        pairs = [(a, b) for _, a, b in self.rows if a is not None and b is not None]
        return bool(pairs) and all(abs(a - b) <= tolerance * max(abs(a), abs(b), 1e-9) for a, b in pairs)

    def text(self) -> str:
        def cell(v: float | None) -> str:
            return "-" if v is None else f"{v:,.2f}"

        lines = [f"{'':<40}{'labkit':>12}{'HTA':>12}"]
        lines += [f"{what:<40}{cell(a):>12}{cell(b):>12}" for what, a, b in self.rows]
        return "\n".join(lines + self.notes)


def trace_file(folder: str | os.PathLike) -> Path:
    """The one ``*.pt.trace.json`` in `folder` (HTA reads a folder of them, one per rank)."""
    found = sorted(Path(folder).glob("*.pt.trace.json*"))
    if len(found) != 1:
        raise FileNotFoundError(f"{folder}: expected one *.pt.trace.json (found {len(found)}); "
                                f"pass the tensorboard folder labkit profile writes")
    return found[0]


def side_by_side(folder: str | os.PathLike) -> SideBySide:
    """Compare labkit and HTA on the trace in `folder`; ImportError naming the package when HTA
    is not installed."""
    path = trace_file(folder)
    timeline = timeline_from_chrome_trace(path)
    analysis = _hta(folder)
    trace = next(iter(analysis.t.traces.values()))
    names = trace["name"].map(analysis.t.symbol_table.get_sym_table().__getitem__)
    hta_steps = dict(zip(names[names.str.startswith("ProfilerStep#")], trace["dur"][names.str.startswith("ProfilerStep#")],
                         strict=True))
    out = SideBySide(str(path))
    for step in timeline.steps:
        theirs = hta_steps.get(step.name)
        out.rows.append((f"{step.name} (ms)", (step.end - step.start) / 1e3, None if theirs is None else theirs / 1e3))
    missing = [s.name for s in timeline.steps if s.name not in hta_steps]
    if missing:
        out.notes.append(f"HTA leaves out {', '.join(missing)} (it keeps the steps it considers complete)")
    if not timeline.has_gpu:
        out.notes.append("no GPU kernels in this trace: HTA's temporal and idle-time breakdowns need them, "
                         "so only step times compare; labkit's CPU breakdown and verdict have no HTA counterpart")
        return out
    with _quiet():
        breakdown = analysis.get_temporal_breakdown(visualize=False)
    theirs = 100.0 - float(breakdown["idle_time_pctg"].iloc[0])
    kept = [s for s in timeline.steps if s.name in hta_steps]
    out.rows.append(("GPU busy, first to last kernel (%)", 100 * kernel_span_busy(timeline, kept), theirs))
    inside = step_breakdown(timeline).gpu_busy
    out.rows.append(("GPU busy inside the steps (%), labkit's report", None if inside is None else 100 * inside, None))
    return out


def kernel_span_busy(timeline: Timeline, steps: list | None = None) -> float:
    """The union of GPU activity over the span from its first to its last kernel (HTA's
    definition), counting the kernels that start inside `steps` (default: all of them)."""
    steps = timeline.steps if steps is None else steps
    lo, hi = min(s.start for s in steps), max(s.end for s in steps)
    gpu = [(e.start, e.end) for e in timeline.events if e.kind == "gpu" and lo <= e.start < hi]
    if not gpu:
        return 0.0
    span = max(e for _, e in gpu) - min(s for s, _ in gpu)
    return union_length(gpu) / span if span > 0 else 0.0


def _hta(folder: str | os.PathLike):
    with _quiet():
        try:
            from hta.trace_analysis import TraceAnalysis
        except ImportError:
            raise ImportError(f"Holistic Trace Analysis is not installed: pip install {PACKAGE}") from None
        return TraceAnalysis(trace_dir=str(folder))


@contextlib.contextmanager
def _quiet():
    """HTA logs each file it parses and prints advice; keep that out of the caller's output."""
    logger = logging.getLogger("hta")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
