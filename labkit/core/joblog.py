"""What a running job reports on stdout: one JSON object per line, as Cloud Logging reads them.

A Vertex AI replica's output reaches Cloud Logging line by line. A progress bar redraws its
line with carriage returns, which only a terminal replays; a line that is a JSON object becomes
a **structured** entry instead (`STRUCTURED_LOGGING`): ``severity`` sets the entry's
severity (one of `SEVERITIES`), ``message`` is the text Logs Explorer shows for it, and every
other field stays in ``jsonPayload``, where a query can filter on it
(``jsonPayload.event="step" AND jsonPayload.loss < 2``).

When (`json_lines`): ``LABKIT_LOG_FORMAT=json`` or ``text`` forces it on or off; otherwise it
is on inside a Vertex AI job, told by ``CLOUD_ML_JOB_ID``, which Vertex sets in every replica
of a custom job (`JOB_ID_SOURCE`) and labkit's emulator sets as well, and off in a Jupyter
kernel (a notebook run as a job keeps its output in the executed notebook, where a bar reads
better). Outside a job nothing changes: tqdm bars as before.

On Vertex the lines are the job's entries in Logs Explorer (`logs_query(job_id)`, the filter
gcloud itself uses), and ``gcloud ai custom-jobs stream-logs JOB_ID`` prints their messages.

What (each line has ``event``):

- `emit(message, severity, **fields)`: one line, anywhere;
- `StepLines`: a training run's steps (``event: "step"``), the step's figures as top-level
  fields (``step``, ``loss``, ``step_time_s``, ``samples_per_s``, ``lr``..., the machine's
  ``gpu_util`` / ``gpu_mem_gib`` when sampled, and ``steps_per_s`` since the previous line). By
  default every step has its line, like its metrics row and TensorBoard point;
  ``LABKIT_LOG_EVERY_S=S`` thins them to at most one per S seconds (the first and last step,
  and a non-finite loss, always have theirs). The message counts steps done as the bar did
  (``train cnn 12/100 [...]``), which is what the local emulator reads a replica's step from;
- `warnings_as_lines()`: Python warnings become WARNING lines while it is active;
- `say(text, severity)`: a command's output line (`labkit train`'s summary and errors), plain
  outside a job; `notice(message)`: a one-line notice: a WARNING line in a job, one plain line
  on stderr elsewhere.

JSON has no NaN or infinity: such values are written as the strings "nan", "inf", "-inf".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

STRUCTURED_LOGGING = ("https://cloud.google.com/logging/docs/structured-logging (a structured "
                      "entry stores its payload as a JSON object in jsonPayload, queried by JSON "
                      "path in Logs Explorer; the special fields severity and message set the "
                      "entry's severity and shown text; read 2026-11-29)")
# python-aiplatform's training_utils/environment_variables.py: "CLOUD_ML_JOB_ID: The name given
# to the training job", read from a training replica's environment.
JOB_ID_SOURCE = ("https://github.com/googleapis/python-aiplatform "
                 "(google/cloud/aiplatform/training_utils/environment_variables.py, read 2026-11-29)")
# gcloud's own filter for a custom job's logs (`gcloud ai custom-jobs stream-logs`), which shows
# an entry's jsonPayload.message as its text.
JOB_LOGS_FILTER = ("https://github.com/google-cloud-sdk-unofficial/google-cloud-sdk "
                   "(lib/googlecloudsdk/command_lib/ai/log_util.py, _LogFilters and _EntryToDict; "
                   "read 2026-11-29)")
# Cloud Logging's LogSeverity values, lowest first.
SEVERITIES = ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT",
              "EMERGENCY")
FORMAT_ENV = "LABKIT_LOG_FORMAT"
FORMATS = ("json", "text")
EVERY_ENV = "LABKIT_LOG_EVERY_S"
JOB_ID_ENV = "CLOUD_ML_JOB_ID"
# The step figures a step line carries, in this order (a metrics row's names).
STEP_FIELDS = ("step", "loss", "step_time_s", "data_time_s", "samples_per_s", "tokens_per_s",
               "mfu", "lr", "peak_memory_bytes", "skipped")


def json_lines(env: Mapping[str, str] | None = None, *, kernel: bool = False) -> bool:
    """Whether this process writes its reports as JSON lines: LABKIT_LOG_FORMAT decides when
    set, else whether it runs in a Vertex AI job (CLOUD_ML_JOB_ID) outside a Jupyter kernel."""
    env = os.environ if env is None else env
    forced = env.get(FORMAT_ENV, "").strip().lower()
    if forced and forced not in FORMATS:
        raise ValueError(f"{FORMAT_ENV} must be one of {', '.join(FORMATS)} (got {forced!r})")
    if forced:
        return forced == "json"
    return bool(env.get(JOB_ID_ENV)) and not kernel


def logs_query(job_id: str, event: str | None = "step") -> str:
    """The Logs Explorer query for a custom job's entries (`JOB_LOGS_FILTER`), narrowed to one
    kind of labkit line (``event``; None: every entry of the job)."""
    query = f'resource.type="ml_job" resource.labels.job_id="{job_id}"'
    return query + (f' jsonPayload.event="{event}"' if event else "")


def every_s(env: Mapping[str, str] | None = None) -> float:
    """The least time between two step lines (LABKIT_LOG_EVERY_S; default 0: every step)."""
    env = os.environ if env is None else env
    text = env.get(EVERY_ENV, "").strip()
    try:
        value = float(text) if text else 0.0
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{EVERY_ENV} must be a number of seconds >= 0 (got {text!r})")
    return value


def _plain(value: Any) -> Any:
    """`value` as JSON can hold it: non-finite floats as strings, other objects as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


def line(message: str, severity: str = "INFO", **fields: Any) -> str:
    """One log line (no newline): ``{"severity": ..., "message": ..., **fields}``."""
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)} (got {severity!r})")
    record = {"severity": severity, "message": str(message)}
    record.update((k, _plain(v)) for k, v in fields.items() if k not in record)
    return json.dumps(record, allow_nan=False, separators=(",", ":"))


def emit(message: str, severity: str = "INFO", *, stream: TextIO | None = None, **fields: Any) -> None:
    """Write one JSON line to `stream` (stdout) and flush it: a job's log shows it at once."""
    out = stream or sys.stdout
    out.write(line(message, severity, **fields) + "\n")
    out.flush()


def parse(text: str) -> list[dict[str, Any]]:
    """The JSON log lines in `text` (a replica's log): every line that is a JSON object with a
    ``severity``; other lines are left out."""
    records = []
    for raw in text.splitlines():
        raw = raw.strip()
        if not raw.startswith("{"):
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and "severity" in record:
            records.append(record)
    return records


def say(text: str, severity: str = "INFO", *, env: Mapping[str, str] | None = None) -> None:
    """A command's line of output: printed as it is, or in a job one JSON line with `severity`
    (``event: "output"``), so that a job's log holds nothing but JSON lines from labkit."""
    if json_lines(env):
        emit(text, severity, event="output")
    else:
        print(text, flush=True)


def notice(message: str, *, env: Mapping[str, str] | None = None) -> None:
    """A one-line notice for the person running this: a WARNING line in a job, else one plain
    line on stderr."""
    if json_lines(env):
        emit(message, "WARNING", event="notice")
    else:
        print(f"labkit: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def warnings_as_lines(stream: TextIO | None = None) -> Iterator[None]:
    """While active, each warning Python shows becomes one WARNING line (its category and text,
    and where it was raised) instead of two lines of text on stderr."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        emit(f"{category.__name__}: {message}", "WARNING", stream=stream, event="warning",
             source=f"{filename}:{lineno}")

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


class StepLines:
    """The step lines of one run: `write(row, system)` after each step, with the step's metrics
    row and the machine's latest sample; it writes the line when one is due (see the module
    docstring) and returns whether it did."""

    def __init__(self, total: int, desc: str, *, every: float | None = None,
                 stream: TextIO | None = None):
        self.total, self.desc = total, desc
        self.every = every_s() if every is None else every
        self.stream = stream
        self._last: tuple[float, int] | None = None  # (time, steps done) at the last line

    def due(self, step: int, loss: float, now: float) -> bool:
        if self._last is None or step + 1 >= self.total or not math.isfinite(loss):
            return True
        return now - self._last[0] >= self.every

    def write(self, row: Mapping[str, Any], system: Mapping[str, float] | None = None) -> bool:
        now = time.monotonic()
        step, loss = int(row["step"]), float(row["loss"])
        if not self.due(step, loss, now):
            return False
        fields = {k: row[k] for k in STEP_FIELDS if row.get(k) is not None}
        fields["steps"] = self.total
        if self._last is not None and now > self._last[0]:
            fields["steps_per_s"] = (step + 1 - self._last[1]) / (now - self._last[0])
        fields.update(system or {})
        severity = "INFO" if math.isfinite(loss) else "ERROR"
        emit(self.message(row, system), severity, stream=self.stream, event="step", **fields)
        self._last = (now, step + 1)
        return True

    def message(self, row: Mapping[str, Any], system: Mapping[str, float] | None) -> str:
        """``train cnn 12/100 [loss 2.3012, 812.3 samples/s, 39.4 ms/step, GPU 97%]``: steps
        done over the total, as the bar counted them."""
        parts = [f"loss {row['loss']:.4f}", f"{row['samples_per_s']:.1f} samples/s",
                 f"{row['step_time_s'] * 1e3:.1f} ms/step"]
        if system and "gpu_util" in system:
            parts.append(f"GPU {system['gpu_util']:.0f}%")
        return f"{self.desc} {int(row['step']) + 1}/{self.total} [{', '.join(parts)}]"
