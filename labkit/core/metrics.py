"""The per-step metrics schema shared by the PyTorch and TensorFlow engines.

A metrics file is JSON: `{"run": {...}, "steps": [{"step": i, "loss": x, ...}, ...],
"summary": {...}}`. A resumed run that writes to the same file keeps the steps the earlier run
recorded before the resumed step (`MetricsLog.continue_from`), so the file holds every step of
the run, each once. Engines fill `StepMetrics`; notebooks and tests read the file
back with `load_metrics`, so both frameworks are compared through the same code.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class StepMetrics:
    """What happened in one optimizer step. Times are wall-clock seconds on this process."""

    step: int
    loss: float
    step_time_s: float | None = None
    data_time_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_memory_bytes: int | None = None
    lr: float | None = None
    skipped: bool = False  # fp16 overflow: the optimizer step was skipped
    # loss on held-out samples, measured after this step (the last one; checkpoints in a trial)
    heldout_loss: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set, then `extra` (one per step: kept cheap, no deep copy)."""
        d = {k: v for k in _STEP_FIELDS if (v := getattr(self, k)) is not None}
        d.update(self.extra)
        return d


_STEP_FIELDS = tuple(f.name for f in fields(StepMetrics) if f.name != "extra")


def summarize(steps: list[dict[str, Any]], *, warmup: int = 1) -> dict[str, Any]:
    """Medians over the steps after `warmup` (compilation and allocator warm-up excluded)."""
    timed = steps[warmup:] if len(steps) > warmup else steps
    out: dict[str, Any] = {"num_steps": len(steps)}
    if steps:
        out["first_loss"] = steps[0]["loss"]
        out["final_loss"] = steps[-1]["loss"]
    for key in ("step_time_s", "data_time_s", "samples_per_s", "tokens_per_s", "mfu"):
        values = [s[key] for s in timed if s.get(key) is not None]
        if values:
            out[f"median_{key}"] = statistics.median(values)
    evaluated = [s["heldout_loss"] for s in steps if s.get("heldout_loss") is not None]
    if evaluated:
        out["heldout_loss"] = evaluated[-1]
    peaks = [s["peak_memory_bytes"] for s in steps if s.get("peak_memory_bytes") is not None]
    if peaks:
        out["peak_memory_bytes"] = max(peaks)
    return out


# A run counts as having learned when its held-out loss is under this share of chance
# (ln classes, ln vocabulary): 0.8 × 2.30 = 1.84 for ten classes.
LEARNED_BELOW = 0.8


def learned(metrics: dict[str, Any]) -> bool | None:
    """Whether the run of a metrics file's content learned (held-out loss under
    `LEARNED_BELOW` × chance); None when it measured no held-out loss."""
    heldout = (metrics.get("run") or {}).get("heldout")
    return None if not heldout else heldout["loss"] < LEARNED_BELOW * heldout["chance"]


class MetricsLog:
    """Collects StepMetrics and writes the JSON file atomically (a reader never sees half a file)."""

    def __init__(self, run: dict[str, Any] | None = None):
        self.run: dict[str, Any] = dict(run or {})
        self.steps: list[dict[str, Any]] = []

    @classmethod
    def read(cls, path: str | os.PathLike) -> MetricsLog:
        """A log back from its file (e.g. rank 0's, after a multi-process run)."""
        data = load_metrics(path)
        log = cls(data.get("run"))
        log.steps = list(data["steps"])
        return log

    def append(self, metrics: StepMetrics) -> dict[str, Any]:
        """Add one step; returns its row as written to the file."""
        row = metrics.to_dict()
        self.steps.append(row)
        return row

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.steps]

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "steps": self.steps, "summary": summarize(self.steps)}

    def continue_from(self, path: str | os.PathLike | None, start: int) -> int:
        """Before a run resumed at step `start` appends its steps: take the steps below `start`
        from the metrics file at `path` that an earlier attempt wrote (steps from `start` on
        are trained again, so theirs are dropped). Returns how many were taken; none when there
        is no such file or it is not a metrics file (it is then replaced, as before)."""
        if not path or start <= 0 or not os.path.isfile(path):
            return 0
        try:
            earlier = load_metrics(path)["steps"]
        except (OSError, ValueError):
            return 0
        kept = [row for row in earlier if isinstance(row, dict) and isinstance(row.get("step"), int)
                and row["step"] < start]
        self.steps[:0] = kept
        return len(kept)

    def write(self, path: str | os.PathLike) -> Path:
        """Write the file atomically: a temporary file beside it, then a rename. A write that
        fails (a full disk) removes the temporary file and raises an OSError naming `path`.
        Through a symbolic link, the file the link points to is written and the link stays."""
        path = Path(path)
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f, indent=1)
            os.replace(tmp, target)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            error = OSError(f"cannot write metrics file {path}: {e.strerror or e}")
            error.errno = e.errno  # kept for code that tells a full disk from other failures
            raise error from e
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        return path


def load_metrics(path: str | os.PathLike) -> dict[str, Any]:
    """Read a metrics file; raises ValueError naming the file when it is not one."""
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a metrics JSON file ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
        raise ValueError(f"{path}: a metrics file needs a 'steps' list")
    return data
