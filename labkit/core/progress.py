"""Progress bars for long work (training runs, shard writing, the course's benchmarks).

One bar, drawn the way the place it runs in can show it:

- ``"widget"``: a live ipywidgets bar, in a notebook open in JupyterLab, Vertex AI Workbench or
  Notebook 7 (a kernel started by a Jupyter server, which sets ``JPY_SESSION_NAME``);
- ``"text"``: a plain text bar on stdout, in a notebook executed headless (papermill, nbval,
  ``labkit run``), so the saved notebook keeps the final state of the bar rather than a widget
  no viewer can draw, and nothing lands on the notebook's stderr;
- ``"terminal"``: tqdm's usual bar on stderr, in a terminal;
- ``"json"``: in a Vertex AI job (`labkit.core.joblog.json_lines`: ``CLOUD_ML_JOB_ID`` set,
  or ``LABKIT_LOG_FORMAT=json``), no bar: each redraw is one JSON log line on stdout
  (``event: "progress"``, the bar's text as ``message``, ``n`` and ``total`` as fields), at most
  one a second, and none with a carriage return;
- ``"off"``: no bar, on every process but the main one of a distributed job (other ranks
  stay quiet), or when ``LABKIT_NO_PROGRESS`` is set.

``LABKIT_PROGRESS=widget|text|terminal|off`` overrides the choice (a widget only where one can be
drawn: in a kernel, with ipywidgets), except that in JSON-line mode only ``off`` does: the log
format is decided first (``LABKIT_LOG_FORMAT=text`` brings the bars back in a job).
"""

from __future__ import annotations

import functools
import importlib.util
import io
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from labkit.core import joblog
from labkit.core.cluster import from_env

STYLES = ("widget", "text", "terminal", "off")  # what LABKIT_PROGRESS may force
JSON_STYLE = "json"  # chosen, never forced: the log format decides it (joblog.json_lines)
STYLE_ENV = "LABKIT_PROGRESS"
OFF_ENV = "LABKIT_NO_PROGRESS"
# A headless notebook keeps every redraw in its saved output: redraw at most once a second.
TEXT_INTERVAL_S = 1.0
# A job's log keeps every line too: the same pace, and the bar's text without its bar.
JSON_INTERVAL_S = 1.0
JSON_BAR_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"

T = TypeVar("T")


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def style(env: Mapping[str, str] | None = None, *, is_main: bool | None = None,
          kernel: bool | None = None) -> str:
    """Which bar this process draws (one of `STYLES`, or `JSON_STYLE` in a job). `is_main`
    defaults to the cluster variables' verdict (`ClusterInfo.is_chief`), `kernel` to
    `in_kernel()`."""
    env = os.environ if env is None else env
    forced = env.get(STYLE_ENV, "").strip().lower()
    if forced and forced not in STYLES:
        raise ValueError(f"{STYLE_ENV} must be one of {', '.join(STYLES)} (got {forced!r})")
    main = from_env(env).is_chief if is_main is None else is_main
    if not main or env.get(OFF_ENV) or forced == "off":
        return "off"
    kernel = in_kernel() if kernel is None else kernel
    if joblog.json_lines(env, kernel=kernel):
        return JSON_STYLE
    # A widget needs a kernel and ipywidgets (a forced "widget" reaches child processes too).
    can_draw_widget = kernel and importlib.util.find_spec("ipywidgets") is not None
    if forced:
        return forced if forced != "widget" or can_draw_widget else ("text" if kernel else "terminal")
    if not kernel:
        return "terminal"
    return "widget" if can_draw_widget and env.get("JPY_SESSION_NAME") else "text"


def progress(total: int | None = None, desc: str = "", *, unit: str = "it", initial: int = 0,
             is_main: bool | None = None, **options: Any):
    """A tqdm bar (`update(n)`, `set_postfix`, `close`, a context manager) drawn as `style()`
    says; with style "off" a disabled bar whose methods do nothing. `options` go to tqdm."""
    chosen = style(is_main=is_main)
    settings = dict(total=total, desc=desc, unit=unit, initial=initial, **options)
    if chosen == JSON_STYLE:
        settings.update(file=io.StringIO(), mininterval=JSON_INTERVAL_S, bar_format=JSON_BAR_FORMAT)
        return _json_bar_class()(**settings)
    if chosen == "widget":
        from tqdm.notebook import tqdm as widget_bar

        return widget_bar(**settings)
    from tqdm import tqdm

    if chosen == "text":
        settings.setdefault("file", sys.stdout)
        settings.setdefault("mininterval", TEXT_INTERVAL_S)
        settings.setdefault("ncols", 100)
    return tqdm(disable=chosen == "off", **settings)


@functools.cache
def _json_bar_class():
    """tqdm with each redraw written as one JSON log line (tqdm's own output, the carriage
    returns included, goes to a string buffer nobody reads)."""
    from tqdm import tqdm

    class JsonLineBar(tqdm):
        def display(self, msg=None, pos=None):
            if msg == "":  # tqdm clearing its line: nothing to log
                return True
            meter = self.format_dict
            joblog.emit(self.format_meter(**meter), event="progress", desc=self.desc.rstrip(": "),
                        n=meter["n"], total=meter["total"])
            return True

    return JsonLineBar


def track(items: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it",
          is_main: bool | None = None, **options: Any) -> Iterator[T]:
    """`items`, one bar step per item (e.g. `for rung in track(rungs, "precision ladder")`)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(total, desc, unit=unit, is_main=is_main, **options) as bar:
        for item in items:
            yield item
            bar.update(1)
