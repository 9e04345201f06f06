"""Key figures: how a notebook states a measured result so the course summary can collect it.

`key_figure("bf16 speed-up over fp32", 2.4, "×")` displays a line in the notebook and embeds the
value in the cell output under a labkit MIME type. `run_notebook` reads those outputs back from
the executed notebook (`figures_in_notebook`) and `labkit course` builds its report from them, so
the report can only show what a run measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from labkit.notebooks.markdown import literal

FIGURE_MIME = "application/vnd.labkit.figure+json"


@dataclass(frozen=True)
class KeyFigure:
    name: str
    value: float | int | str
    unit: str = ""
    note: str = ""

    def text(self) -> str:
        value = format_value(self.value)
        unit = self.unit if self.unit in ("", "×", "%") else f" {self.unit}"
        note = f" ({self.note})" if self.note else ""
        return f"{self.name}: {value}{unit}{note}"


def format_value(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if isinstance(value, int) or magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def key_figure(name: str, value: float | int | str, unit: str = "", note: str = "") -> None:
    """Show a measured figure in the notebook and record it for the course report. Returns None
    so a cell ending in `key_figure(...)` does not echo it twice."""
    fig = KeyFigure(name, value, unit, note)
    bundle = {"text/plain": fig.text(), "text/markdown": f"**{literal(fig.text())}**",
              FIGURE_MIME: {"name": name, "value": value, "unit": unit, "note": note}}
    shell = _ipython_shell()
    if shell is None:  # plain Python (a script, a test): just print it
        print(fig.text())
    else:
        from IPython.display import display

        display(bundle, raw=True)


def key_ratio(name: str, ratio: float, verdict: str, note: str = "") -> None:
    """A ratio of repeated measurements as a key figure that obeys its `verdict` (a
    `labkit.core.stats` verdict): the ratio, or "no measurable difference here" where that is
    the verdict (the ratio then goes in the note)."""
    from labkit.core.stats import NO_DIFFERENCE

    if verdict == NO_DIFFERENCE:  # said once, as the value
        note = note.replace(f"; {NO_DIFFERENCE}", "").replace(NO_DIFFERENCE, "").strip("; ")
        return key_figure(name, NO_DIFFERENCE, note="; ".join(x for x in (f"{ratio:.2f}×", note) if x))
    return key_figure(name, ratio, "×", note=note)


def key_comparison(name: str, comparison: Any, a_label: str, b_label: str, what: str = "samples/s") -> None:
    """A `labkit.core.stats.Comparison` of `b_label` against `a_label` as a key figure that says
    what its verdict says: the ratio when one side won in every run, and "no measurable
    difference here" when their runs overlap (the ratio, medians and ranges go in the note)."""
    from labkit.core.stats import NO_DIFFERENCE

    note = comparison.sentence(a_label, b_label, what)
    if comparison.winner is None:
        return key_figure(name, NO_DIFFERENCE, note=note.rsplit(": ", 1)[0])
    return key_figure(name, comparison.ratio, "×", note=note)


def _ipython_shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def figures_in_notebook(nb: Any) -> list[KeyFigure]:
    """Every key figure recorded in an executed notebook (an nbformat NotebookNode), in order."""
    found = []
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []) or []:
            data = output.get("data") or {}
            if FIGURE_MIME in data:
                d = data[FIGURE_MIME]
                found.append(KeyFigure(d["name"], d["value"], d.get("unit", ""), d.get("note", "")))
    return found


def against_verdict(figures: list[KeyFigure]) -> list[KeyFigure]:
    """The key figures that present a ratio as a result while their own note says the runs
    showed no measurable difference: what `key_ratio` and `key_comparison` never write, so a
    notebook that prints one has a headline its evidence does not support."""
    from labkit.core.stats import NO_DIFFERENCE

    return [f for f in figures if f.unit == "×" and NO_DIFFERENCE in f"{f.name} {f.note}"]

