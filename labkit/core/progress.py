"""Progress bars for long work (training runs, shard writing, the course's benchmarks).

One bar, drawn the way the place it runs in can show it:

- ``"widget"``: a live ipywidgets bar, in a notebook open in JupyterLab, Vertex AI Workbench or
  Notebook 7 (a kernel started by a Jupyter server, which sets ``JPY_SESSION_NAME``);
- ``"text"``: a plain text bar on stdout, in a notebook executed headless (papermill, nbval,
  ``labkit run``), so the saved notebook keeps the final state of the bar rather than a widget
  no viewer can draw, and nothing lands on the notebook's stderr;
- ``"terminal"``: tqdm's usual bar on stderr, in a terminal;
- ``"off"``: no bar, on every process but the main one of a distributed job (other ranks
  stay quiet), or when ``LABKIT_NO_PROGRESS`` is set.

``LABKIT_PROGRESS=widget|text|terminal|off`` overrides the choice (a widget only where one can be
drawn: in a kernel, with ipywidgets).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from labkit.core.cluster import from_env

STYLES = ("widget", "text", "terminal", "off")
STYLE_ENV = "LABKIT_PROGRESS"
OFF_ENV = "LABKIT_NO_PROGRESS"
# A headless notebook keeps every redraw in its saved output: redraw at most once a second.
TEXT_INTERVAL_S = 1.0

T = TypeVar("T")


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def style(env: Mapping[str, str] | None = None, *, is_main: bool | None = None,
          kernel: bool | None = None) -> str:
    """Which bar this process draws (one of `STYLES`). `is_main` defaults to the cluster
    variables' verdict (`ClusterInfo.is_chief`), `kernel` to `in_kernel()`."""
    env = os.environ if env is None else env
    forced = env.get(STYLE_ENV, "").strip().lower()
    if forced and forced not in STYLES:
        raise ValueError(f"{STYLE_ENV} must be one of {', '.join(STYLES)} (got {forced!r})")
    main = from_env(env).is_chief if is_main is None else is_main
    if not main or env.get(OFF_ENV):
        return "off"
    kernel = in_kernel() if kernel is None else kernel
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
    if chosen == "widget":
        from tqdm.notebook import tqdm as widget_bar

        return widget_bar(**settings)
    from tqdm import tqdm

    if chosen == "text":
        settings.setdefault("file", sys.stdout)
        settings.setdefault("mininterval", TEXT_INTERVAL_S)
        settings.setdefault("ncols", 100)
    return tqdm(disable=chosen == "off", **settings)


def track(items: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it",
          is_main: bool | None = None, **options: Any) -> Iterator[T]:
    """`items`, one bar step per item (e.g. `for rung in track(rungs, "precision ladder")`)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress(total, desc, unit=unit, is_main=is_main, **options) as bar:
        for item in items:
            yield item
            bar.update(1)
