"""Report a hyperparameter-tuning objective the way Vertex AI's tuning service reads it.

Vertex reads each trial's reports from a file in the trial's container, the convention of
Google's cloudml-hypertune package (hypertune/hypertune.py of cloudml-hypertune 0.1.0.dev6 on
PyPI, https://github.com/GoogleCloudPlatform/cloudml-hypertune, read 2026-11-23): the file named
by ``CLOUD_ML_HP_METRIC_FILE`` (default ``/tmp/hypertune/output.metrics``), rewritten on every
report with the last 100 reports, one JSON object per line, keys sorted::

    {"checkpoint_path": "", "global_step": "40", "loss": "0.231", "timestamp": 1763900000.1, "trial": "3"}

The metric's value is under its tag (the StudySpec's ``metric_id``), as a string, like the step;
``trial`` is ``CLOUD_ML_TRIAL_ID`` (0 when unset). `report_metric` writes exactly that, without
depending on the package; `read_reports` reads the file back (the local tuner does). Only the
chief should report (the engines call it on rank 0, once per evaluation).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labkit.core.metrics import StepMetrics

METRIC_FILE_ENV = "CLOUD_ML_HP_METRIC_FILE"
TRIAL_ID_ENV = "CLOUD_ML_TRIAL_ID"
DEFAULT_METRIC_FILE = "/tmp/hypertune/output.metrics"
DEFAULT_METRIC_TAG = "training/hptuning/metric"
TUNING_METRIC_ENV = "LABKIT_TUNING_METRIC"
MAX_REPORTS = 100  # cloudml-hypertune keeps this many


def tuning_metric(env: Mapping[str, str] | None = None) -> str | None:
    """The metric this process's tuning trial optimises, or None outside a trial."""
    env = os.environ if env is None else env
    return env.get(TUNING_METRIC_ENV) or None


def metric_file(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(METRIC_FILE_ENV) or DEFAULT_METRIC_FILE)


def read_reports(path: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The reports in a metric file (oldest first); [] when there is none yet."""
    path = metric_file() if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def report_metric(tag: str, value: float, step: int | None = None, *, checkpoint_path: str = "",
                  env: Mapping[str, str] | None = None) -> Path:
    """Append one report of metric `tag` (the tuning job's `metric`) at `step` and return the
    file. The file keeps the last `MAX_REPORTS` reports, including those of earlier processes
    of the same container (a restarted replica adds to its predecessor's). A NaN or infinite
    value is refused: the service cannot rank it."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"metric {tag!r}: value {value} is not finite")
    env = os.environ if env is None else env
    path = metric_file(env)
    body = {"timestamp": time.time(), "trial": str(env.get(TRIAL_ID_ENV, 0)),
            tag or DEFAULT_METRIC_TAG: str(value),
            "global_step": str(int(step) if step else 0), "checkpoint_path": checkpoint_path}
    reports = (read_reports(path) + [body])[-MAX_REPORTS:]
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole and renamed into place: the service (or the local tuner) never reads half.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".output.metrics.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in reports)
    os.replace(tmp, path)
    return path


def reported_values(reports: list[dict[str, Any]], tag: str) -> list[tuple[int, float]]:
    """(step, value) of every report of `tag`, in the order written."""
    return [(int(r.get("global_step") or 0), float(r[tag])) for r in reports if tag in r]


# Metrics a trial can report: a per-step value (the latest step's) or a run summary value.
STEP_METRICS = tuple(n for n, f in StepMetrics.__dataclass_fields__.items()
                     if f.type in ("float", "float | None", "int | None") and n != "step")
SUMMARY_METRICS = ("first_loss", "final_loss", "median_step_time_s", "median_data_time_s",
                   "median_samples_per_s", "median_tokens_per_s", "median_mfu", "peak_memory_bytes")
METRICS = (*STEP_METRICS, *[m for m in SUMMARY_METRICS if m not in STEP_METRICS])


def objective(metrics: dict[str, Any], metric: str) -> tuple[int, float] | None:
    """(step, value) of `metric` in a metrics file's content: the latest step's value for a
    per-step metric, the summary's for a summary metric; None when not there yet. `step` counts
    finished steps (the service's global_step)."""
    steps = metrics.get("steps") or []
    if metric in STEP_METRICS:
        for entry in reversed(steps):
            if entry.get(metric) is not None:
                return int(entry["step"]) + 1, float(entry[metric])
        return None
    value = (metrics.get("summary") or {}).get(metric)
    if value is None:
        return None
    return (int(steps[-1]["step"]) + 1 if steps else 0), float(value)


def report_latest(metrics: dict[str, Any], metric: str, env: Mapping[str, str] | None = None) -> int | None:
    """Report `metric`'s newest value in `metrics` (a metrics file's content) unless its step
    was reported already; returns the step reported, or None. Both engines call it (through
    `labkit.core.loop`) each time they write their metrics inside a tuning trial, and the
    trial wrapper after them, so the service sees one measurement per evaluation."""
    found = objective(metrics, metric)
    if found is None:
        return None
    step, value = found
    if not math.isfinite(value) or step in {s for s, _ in reported_values(read_reports(metric_file(env)), metric)}:
        return None
    report_metric(metric, value, step, env=env)
    return step
