"""Faults injected into an emulated job: a preemption (SIGTERM, then SIGKILL after a grace
period, as a Spot VM's shutdown) or a machine failure (SIGKILL), sent to one replica when a
trigger fires. Three triggers reach any code, whatever it prints:

- ``at_step``: the job reports that step. Steps are read from every replica's output lines with
  `step_pattern` (a regular expression whose first group is the step, e.g. ``r"Epoch:? (\\d+)"``);
  by default labkit's progress (``step 12`` or a tqdm ``12/100 [`` counter).
- ``after_s``: the target replica has run that many seconds (each run counted from its start).
- ``when_file``: a file appears, or is rewritten, after the target replica's run started (a
  ``gs://`` or ``/gcs/`` path in the emulated bucket, e.g. the first checkpoint, or a local path).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkit.hardware import facts

DEFAULT_STEP_PATTERNS = (re.compile(r"\bstep[\s=:#]*(\d+)", re.I), re.compile(r"(\d+)/\d+\s*\["))


def parse_replica(name: str) -> tuple[int, int]:
    m = re.fullmatch(r"workerpool([0-3])(?:\[(\d+)\])?", name)
    if not m:
        raise ValueError(f"Fault.replica must look like 'workerpool1[0]' (got {name!r})")
    return int(m.group(1)), int(m.group(2) or 0)


def compile_step_pattern(pattern: str | None, name: str = "Fault.step_pattern") -> re.Pattern | None:
    if pattern is None:
        return None
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{name} is not a regular expression ({e}): {pattern!r}") from None
    if compiled.groups < 1:
        raise ValueError(f"{name} needs a group that captures the step number, e.g. 'Epoch (\\d+)' "
                         f"(got {pattern!r})")
    return compiled


@dataclass(frozen=True)
class Fault:
    """Send `signal` ("SIGTERM" or "SIGKILL") to `replica` ("workerpool1[0]", "workerpool0")
    when a trigger fires: at step `at_step` (read with `step_pattern`), `after_s` seconds
    into the replica's run, or when `when_file` appears; from job attempt `job_attempt` (0 =
    the first run) on, `times` times in all (each time to a fresh run of the replica: a restart
    or a later attempt). After SIGTERM the replica has `grace_s` seconds before SIGKILL, like a
    Spot VM's shutdown (Vertex does not document the grace inside a container: labkit assumes
    the value in `labkit.hardware.facts.CONTAINER_SIGTERM_GRACE_S`)."""

    replica: str = "workerpool0"
    at_step: int | None = 1
    signal: str = "SIGTERM"
    job_attempt: int = 0
    grace_s: float = facts.CONTAINER_SIGTERM_GRACE_S.value
    times: int = 1
    after_s: float | None = None
    when_file: str | None = None
    step_pattern: str | None = None

    def __post_init__(self) -> None:
        if self.signal not in ("SIGTERM", "SIGKILL"):
            raise ValueError(f"Fault.signal must be 'SIGTERM' or 'SIGKILL' (got {self.signal!r})")
        if isinstance(self.times, bool) or not isinstance(self.times, int) or self.times < 1:
            raise ValueError(f"Fault.times must be an integer >= 1 (got {self.times!r})")
        if self.after_s is not None and self.when_file is not None:
            raise ValueError("Fault: give one trigger, after_s or when_file, not both")
        if self.after_s is not None and not self.after_s > 0:
            raise ValueError(f"Fault.after_s must be > 0 seconds (got {self.after_s!r})")
        if self.trigger == "step" and (isinstance(self.at_step, bool) or not isinstance(self.at_step, int)
                                       or self.at_step < 0):
            raise ValueError(f"Fault.at_step must be an integer >= 0 (got {self.at_step!r})")
        compile_step_pattern(self.step_pattern)
        parse_replica(self.replica)

    @property
    def target(self) -> tuple[int, int]:
        return parse_replica(self.replica)

    @property
    def trigger(self) -> str:
        """"file", "time" or "step"."""
        return "file" if self.when_file is not None else "time" if self.after_s is not None else "step"

    def describe(self) -> str:
        when = {"file": f"when {self.when_file} appears", "time": f"{self.after_s:g} s into its run",
                "step": f"at step {self.at_step}"}[self.trigger]
        return f"{self.signal} to {self.replica} {when}"


class StepReader:
    """The step a line of output reports, by `pattern` (group 1) or labkit's own patterns."""

    def __init__(self, pattern: str | None = None):
        compiled = compile_step_pattern(pattern)
        self.patterns = (compiled,) if compiled is not None else DEFAULT_STEP_PATTERNS

    def __call__(self, line: str) -> int | None:
        for pattern in self.patterns:
            m = pattern.search(line)
            if m:
                try:
                    return int(m.group(1))
                except (TypeError, ValueError):
                    return None
        return None


class FaultTrigger:
    """Fires a `Fault` up to `Fault.times` times, each time at a run of the target that was
    not signalled yet. A step trigger is called with each step any replica reports (often only
    the chief prints progress); time and file triggers are polled by the job's watch loop.
    `resolve` maps a ``gs://`` or ``/gcs/`` path to the local file."""

    def __init__(self, fault: Fault | None, events: list[str], resolve: Callable[[str], str] = str):
        self.fault, self.events = fault, events
        self.remaining = fault.times if fault is not None else 0
        self.live: dict = {}
        self.attempt = 0
        self.fired_in: set[int] = set()  # attempts in which it fired
        self.signalled: set[int] = set()  # id() of the ReplicaRuns it signalled
        self.lock = threading.Lock()
        self.file = Path(resolve(fault.when_file)) if fault is not None and fault.when_file else None

    def start_attempt(self, attempt: int, live: dict) -> None:
        self.attempt, self.live = attempt, live

    @property
    def fired(self) -> bool:
        """Whether it fired in the current attempt."""
        return self.attempt in self.fired_in

    def _armed(self) -> bool:
        fault = self.fault
        return fault is not None and self.remaining > 0 and self.attempt >= fault.job_attempt

    def __call__(self, step: int) -> None:
        if self._armed() and self.fault.trigger == "step" and step >= self.fault.at_step:
            self._fire(f"at step {step}")

    def poll(self) -> None:
        """Check the time and file triggers (called often by the job's watch loop)."""
        if not self._armed() or self.fault.trigger == "step":
            return
        target = self.live.get(self.fault.target)
        if target is None or id(target.run) in self.signalled:
            return
        if self.fault.trigger == "time":
            if time.monotonic() - target.run.started >= self.fault.after_s:
                self._fire(f"{self.fault.after_s:g} s into its run")
            return
        try:
            mtime = self.file.stat().st_mtime
        except OSError:
            return
        if mtime >= target.run.started_wall - 1.0:  # file system times are coarse
            self._fire(f"when {self.fault.when_file} appeared")

    def _fire(self, when: str) -> None:
        with self.lock:
            target = self.live.get(self.fault.target)
            if self.remaining <= 0 or target is None or id(target.run) in self.signalled:
                return
            self.remaining -= 1
            self.signalled.add(id(target.run))
            self.fired_in.add(self.attempt)
            target.send(self.fault.signal, self.fault.grace_s)
            self.events.append(f"attempt {target.run.job_attempt}: sent {self.fault.signal} to "
                               f"{target.run.name} {when}")


def parse_duration(text: str, name: str = "--preempt-after") -> float:
    """``30s``, ``2m``, ``1h``, ``1.5`` (seconds) -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*", str(text))
    if not m:
        raise ValueError(f"{name} must be a duration like 30s, 2m or 1h (got {text!r})")
    value = float(m.group(1)) * {"ms": 1e-3, "s": 1, None: 1, "m": 60, "h": 3600}[m.group(2)]
    if value <= 0:
        raise ValueError(f"{name} must be longer than 0 seconds (got {text!r})")
    return value

