"""Profile an unmodified training script: ``labkit profile -- python my_train.py ARGS``.

The command runs as it is, with `labkit/profiling/attach` first on its ``PYTHONPATH``: the
first process that steps a torch optimizer is profiled from its first step on (see that
folder's sitecustomize). Once `warmup` + `steps` training steps are traced, the command is
stopped (``then="stop"``: its whole process group, SIGTERM then SIGKILL) or left to finish.
The trace is then analysed like labkit's own runs (`labkit.profiling.analysis`): the step
breakdown, the top ops and the verdict with its fix, plus what only this script has:

- `hotspots`: the script's own functions (frames from files outside Python and its installed
  packages) by the share of the profiled steps they cover, and which of them ran while the
  step waited for its batch;
- `loaders`: the DataLoaders that fed it (dataset class and where it is defined, batch size,
  workers, pinned memory), so the fix can name the line to change.

A command that ends without a training step to profile is refused with `ParameterError`
naming what happened (it never stepped an optimizer, or stepped too few times).
"""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core.config import ParameterError, check_int
from labkit.profiling.analysis import Breakdown, OpStat, op_profile, step_breakdown, top_ops
from labkit.profiling.trace import read_chrome_trace, timeline_from_chrome_trace
from labkit.profiling.verdict import Verdict, diagnose

ATTACH_DIR = Path(__file__).with_name("attach")
_FRAME = re.compile(r"^(?P<file>.+\.py)\((?P<line>\d+)\): (?P<func>.+)$")


@dataclass
class Hotspot:
    """One of the script's own functions: its share of the profiled steps (inclusive time,
    overlapping calls counted once), and of the time spent waiting for batches."""

    where: str
    function: str
    share: float
    input_share: float

    def text(self) -> str:
        extra = f", {100 * self.input_share:.0f}% of the input time" if self.input_share >= 0.01 else ""
        return f"{100 * self.share:5.1f}%  {self.function} ({self.where}){extra}"


@dataclass
class CommandProfile:
    """What `profile_command` found."""

    command: list[str]
    out_dir: Path
    trace_path: Path
    tensorboard_dir: Path
    breakdown: Breakdown
    ops: dict[str, float]
    top: list[OpStat]
    verdict: Verdict
    hotspots: list[Hotspot] = field(default_factory=list)
    loaders: list[dict[str, Any]] = field(default_factory=list)
    warmup: int = 0
    exit_code: int | None = None

    @property
    def samples_per_s(self) -> float | None:
        batch = next((d["batch_size"] for d in self.loaders if d.get("batch_size")), None)
        return batch / self.breakdown.mean_step_s if batch else None

    def fix(self) -> str:
        """The verdict's fix, said about this script's own DataLoader where that is the cause."""
        if self.verdict.kind == "input-bound" and self.loaders:
            d = self.loaders[0]
            where = f" ({d['defined_at']})" if d.get("defined_at") else ""
            cores = os.cpu_count() or 1
            if not d.get("num_workers"):
                return (f"your DataLoader over {d['dataset']}{where} loads every batch in the training "
                        f"process (num_workers=0): give it num_workers (up to {cores} cores here) and "
                        f"pin_memory=True, so batches are made while the step computes")
            return (f"your DataLoader over {d['dataset']}{where} has {d['num_workers']} workers and still "
                    f"makes the step wait: more workers (up to {cores} cores here), a larger prefetch_factor "
                    f"(now {d.get('prefetch_factor')}), or cheaper samples (decode once, shard to TFRecords)")
        return self.verdict.fix

    def text(self) -> str:
        rate = f" ({self.samples_per_s:,.0f} samples/s)" if self.samples_per_s else ""
        lines = [f"{self.breakdown.text()}{rate}", "top ops:"]
        lines += [f"  {o.share:5.1%}  {o.name} (x{o.count})" for o in self.top[:5]]
        if self.hotspots:
            lines.append("in your code:")
            lines += [f"  {h.text()}" for h in self.hotspots[:5]]
        seen = {(d["dataset"], d["batch_size"], d["num_workers"], d["pin_memory"]) for d in self.loaders}
        lines += [f"DataLoader over {name}: batch {batch}, num_workers {workers}, pin_memory {pin}"
                  for name, batch, workers, pin in sorted(seen, key=str)]
        lines += [f"{self.verdict.kind}: {self.verdict.evidence}", f"fix: {self.fix()}",
                  f"see notebook {self.verdict.notebook}",
                  f"trace (open in https://ui.perfetto.dev): {self.trace_path}",
                  f"TensorBoard: tensorboard --logdir {self.tensorboard_dir}"]
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        return {"command": self.command, "step_ms": 1e3 * self.breakdown.mean_step_s,
                "fractions": self.breakdown.fractions, "verdict": self.verdict.kind,
                "evidence": self.verdict.evidence, "fix": self.fix(), "notebook": self.verdict.notebook,
                "hotspots": [h.__dict__ for h in self.hotspots], "loaders": self.loaders,
                "trace": str(self.trace_path), "tensorboard": str(self.tensorboard_dir)}


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} | {sys.prefix, sys.base_prefix}
    return tuple(os.path.realpath(r) for r in roots if r)


def _is_user_file(path: str, roots: tuple[str, ...]) -> bool:
    """Whether a frame's file is the script's own: torch's tracer names library files by their
    path inside the environment (``torch/nn/modules/module.py``) and the script's by its own."""
    if path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    if os.path.isabs(path):
        real = os.path.realpath(path)
        return not any(real == r or real.startswith(r + os.sep) for r in roots)
    return not any(os.path.exists(os.path.join(r, path)) for r in roots)


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def hotspots(trace_path: str | os.PathLike, limit: int = 10) -> list[Hotspot]:
    """The script's own functions in a trace recorded with Python stacks (see `Hotspot`)."""
    events = read_chrome_trace(trace_path)["traceEvents"]
    steps = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    total = sum(b - a for a, b in steps)
    if not total:
        return []
    waits = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
             if e.get("ph") == "X" and str(e.get("name", "")).startswith("enumerate(DataLoader)")]
    wait_total = _union(waits)
    roots = _library_roots()
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "python_function":
            continue
        m = _FRAME.match(str(e.get("name", "")))
        if not m or not _is_user_file(m.group("file"), roots):
            continue
        start = float(e["ts"])
        spans[(f"{os.path.basename(m.group('file'))}:{m.group('line')}", m.group("func"))].append(
            (start, start + float(e.get("dur", 0))))
    out = []
    for (where, func), intervals in spans.items():
        inside = [(max(a, s), min(b, t)) for a, b in intervals for s, t in steps if min(b, t) > max(a, s)]
        waiting = [(max(a, s), min(b, t)) for a, b in intervals for s, t in waits if min(b, t) > max(a, s)]
        share = _union(inside) / total
        if share > 0:
            out.append(Hotspot(where, func, share, _union(waiting) / wait_total if wait_total else 0.0))
    # The script's entry point and the function holding its loop cover every step: keep the
    # functions that say where the time goes (and none of the profiler's own hook).
    out = [h for h in out if h.function != "<module>" and h.share < 0.99 and not h.where.startswith("sitecustomize.py:")]
    return sorted(out, key=lambda h: -h.share)[:limit]


def analyse(trace_path: Path, out_dir: Path, command: Sequence[str], info: dict[str, Any],
            exit_code: int | None) -> CommandProfile:
    timeline = timeline_from_chrome_trace(trace_path)
    breakdown = step_breakdown(timeline)
    ops = op_profile(timeline)
    return CommandProfile(list(command), out_dir, trace_path, Path(info.get("tensorboard", out_dir / "tensorboard")),
                          breakdown, ops, top_ops(timeline, 10), diagnose(breakdown, ops), hotspots(trace_path),
                          list(info.get("loaders") or []), int(info.get("warmup") or 0), exit_code)


def profile_command(command: Sequence[str], out_dir: str | os.PathLike, *, steps: int = 5, warmup: int = 2,
                    then: str = "stop", on_line: Callable[[str], None] | None = None,
                    timeout_s: float | None = None) -> CommandProfile:
    """Run `command` (a list of words) with the profiler attached; see the module docstring.
    `on_line` gets every line the command prints. `timeout_s`: stop waiting for the trace
    after that long (None: as long as the command runs)."""
    from labkit.core.launcher import Process, ProcessSpec, child_env

    words = [str(w) for w in command]
    if not words:
        raise ParameterError("COMMAND", words, "is empty: give the command after --, e.g. -- python train.py")
    check_int("steps", steps, minimum=1)
    check_int("warmup", warmup, minimum=0)
    if then not in ("stop", "continue"):
        raise ParameterError("then", then, "must be 'stop' or 'continue'")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("owner.pid", "profiled.json", "trace.json"):
        (out / stale).unlink(missing_ok=True)
    env = child_env({"LABKIT_PROFILE_OUT": str(out), "LABKIT_PROFILE_STEPS": str(steps),
                     "LABKIT_PROFILE_WARMUP": str(warmup)})
    env["PYTHONPATH"] = os.pathsep.join([str(ATTACH_DIR), env.get("PYTHONPATH", "")])
    # This environment's programs first (torchrun, python), in a shell command too.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    if words[0] in ("python", "python3"):
        words[0] = sys.executable
    try:
        process = Process(ProcessSpec("profiled command", words, env, log_path=out / "command.log", on_line=on_line))
    except OSError as e:
        raise ParameterError("COMMAND", words[0], f"cannot be started ({e.strerror or e})") from None
    ready, started = out / "profiled.json", time.monotonic()
    try:
        while process.poll() is None and not ready.exists():
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                break
            time.sleep(0.1)
        code = process.stop(grace_s=10.0) if ready.exists() and then == "stop" else \
            process.wait() if ready.exists() else process.stop(grace_s=10.0) if process.poll() is None else process.wait()
    finally:
        process.close()
    if not ready.exists():
        raise ParameterError("COMMAND", " ".join(command), _why_no_trace(out, code, steps + warmup + 1))
    info = json.loads(ready.read_text())
    if not info.get("complete", True):
        raise ParameterError("COMMAND", " ".join(command),
                             _why_no_trace(out, code, steps + warmup + 1, seen=info.get("steps_seen")))
    return analyse(Path(info["trace"]), out, command, info, code)


def _why_no_trace(out: Path, code: int | None, needed: int, seen: int | None = None) -> str:
    if not (out / "owner.pid").exists():
        return (f"ended (exit {code}) without calling a torch optimizer's step(): no training step to "
                "profile (is it a PyTorch training script? labkit profile --trace FILE reads a trace you "
                "recorded yourself)")
    saw = f" after {seen}" if seen else ""
    return (f"ended (exit {code}){saw} before {needed} training steps (optimizer.step() calls): give it "
            "more steps, or record fewer with --steps and --warmup")
