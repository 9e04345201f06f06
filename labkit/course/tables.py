"""The course's one table formatter: rows as aligned plain text for `print`, or as Markdown for
`display(Markdown(...))`, every number rounded the same way.

    print(table(rows))                                          # the first row's columns
    display(Markdown(table(rows, ["rung", "speedup"], markdown=True)))
    print(table(report.results, title="all-reduce"))            # dataclass instances work too
    print(table({"raw read": 2.1, "crc32c": 3.4}, ["reader", "GB/s"]))  # a mapping: two columns
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.notebooks.markdown import literal

MISSING = "–"


def cell(value: Any) -> str:
    """One value as a table shows it: whole numbers with thousands separators, other numbers to
    three significant figures (no decimals from 100 up), None as "–", NaN and infinity as "n/a"."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _as_dicts(rows: Iterable[Any] | Mapping[str, Any], columns: Sequence[str] | None) -> list[Mapping[str, Any]]:
    if isinstance(rows, Mapping):
        if columns is None or len(columns) != 2:
            raise ValueError("columns: a mapping is shown as two columns, so name both (key, value)")
        return [{columns[0]: k, columns[1]: v} for k, v in rows.items()]
    return [dataclasses.asdict(r) if dataclasses.is_dataclass(r) and not isinstance(r, type) else r
            for r in rows]


def _markdown_cell(text: str) -> str:
    """A cell that cannot break the table: pipes and dollar signs (math) escaped, line breaks
    as spaces."""
    return literal(" ".join(text.replace("|", "\\|").split("\n")))


def _numeric(values: list[Any]) -> bool:
    present = [v for v in values if v is not None]
    return bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)


def table(rows: Iterable[Any] | Mapping[str, Any], columns: Sequence[str] | None = None, *,
          markdown: bool = False, title: str | None = None) -> str:
    """`rows` (dicts, dataclass instances, or one mapping shown as two `columns`) as a table of
    `columns` (default: the first row's keys). Plain text right-aligns numeric columns; Markdown
    is for `IPython.display.Markdown`. `title`, when given, is the first line."""
    dicts = _as_dicts(rows, columns)
    if not dicts:
        return "(no rows)"
    columns = list(columns or dicts[0])
    cells = [[cell(r.get(c)) for c in columns] for r in dicts]
    head = [title] if title else []
    if markdown:
        lines = ["| " + " | ".join(_markdown_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_markdown_cell(v) for v in row) + " |" for row in cells]
        return "\n".join(head + ([""] if head else []) + lines)
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    right = [_numeric([r.get(c) for r in dicts]) for c in columns]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)).rstrip()

    return "\n".join(head + [line(columns), "  ".join("-" * w for w in widths)] + [line(row) for row in cells])


def write_csv(rows: Iterable[Any], path: str | Path, columns: Sequence[str] | None = None) -> Path:
    """The whole of a long table as a CSV file (a click away from the summary a page shows)."""
    import csv

    dicts = _as_dicts(rows, columns)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns or (dicts[0] if dicts else [])), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(dicts)
    return path
