"""Named phases of a training step, marked so the trace analysis can attribute time.

`phase("input")` opens a torch.profiler `record_function` range named `labkit/input` (and an
NVTX range of the same name when CUDA is in use, so Nsight Systems shows it too). Any training
loop can mark its phases this way; the analysis also recognises what torch marks by itself
(`enumerate(DataLoader)...`, `Optimizer.step#...`, collective ops).

`PhaseTimer` records the same phases with wall-clock time for code that no torch profiler sees
(a TensorFlow loop, a custom one): it produces the same `Timeline` the analysis reads.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

PREFIX = "labkit/"
# Categories of the step breakdown, in the order they are shown. "idle" is time covered by
# nothing: the host running Python between ops, waiting, or the device starved.
CATEGORIES = ("input", "h2d", "compute", "communication", "optimizer", "idle")
PHASES = ("input", "h2d", "forward", "backward", "communication", "optimizer")


@contextlib.contextmanager
def phase(name: str, nvtx: bool | None = None):
    """Mark a phase of the step for torch.profiler (and NVTX on CUDA). Cheap when no profiler runs."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r}; use one of {', '.join(PHASES)}")
    import torch

    use_nvtx = torch.cuda.is_available() if nvtx is None else nvtx
    if use_nvtx:
        torch.cuda.nvtx.range_push(PREFIX + name)
    try:
        with torch.profiler.record_function(PREFIX + name):
            yield
    finally:
        if use_nvtx:
            torch.cuda.nvtx.range_pop()


@dataclass
class Event:
    """One interval of a timeline, in microseconds."""

    name: str
    start: float
    end: float
    kind: str = "annotation"  # annotation | cpu_op | gpu | step
    tid: int | str = 0

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """What the analysis reads: step windows and events, from a trace file or a PhaseTimer."""

    steps: list[Event] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    source: str = ""

    @property
    def has_gpu(self) -> bool:
        return any(e.kind == "gpu" for e in self.events)


class PhaseTimer:
    """Wall-clock phase marks for loops no torch profiler sees:

        timer = PhaseTimer()
        for batch in ...:
            with timer.step():
                with timer.phase("input"): ...
                with timer.phase("forward"): ...
    """

    def __init__(self) -> None:
        self.timeline = Timeline(source="PhaseTimer")
        self._t0 = time.perf_counter()

    def _now(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    @contextlib.contextmanager
    def step(self):
        start = self._now()
        try:
            yield
        finally:
            self.timeline.steps.append(Event(f"step#{len(self.timeline.steps)}", start, self._now(), "step"))

    @contextlib.contextmanager
    def phase(self, name: str):
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; use one of {', '.join(PHASES)}")
        start = self._now()
        try:
            yield
        finally:
            # Host-timed compute phases count as compute for their whole span.
            kind = "cpu_op" if name in ("forward", "backward") else "annotation"
            self.timeline.events.append(Event(PREFIX + name, start, self._now(), kind))
