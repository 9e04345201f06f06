"""Notebook 05's reading of `labkit.profiling` results: two runs side by side, one stacked bar
of the step breakdown per run, and the labkit phase ranges a trace holds."""

from __future__ import annotations

import json
import os

from labkit.course.plots import finish, new_figure
from labkit.profiling.phases import CATEGORIES
from labkit.profiling.run import ProfileResult


def compare(before: ProfileResult, after: ProfileResult) -> str:
    """Two runs side by side: verdicts, step time, throughput and the speed-up."""
    return (f"before [{before.label}]: {before.verdict.kind}, {1e3 * before.step_s:.1f} ms/step, "
            f"{before.samples_per_s:,.0f} samples/s\n"
            f"after  [{after.label}]: {after.verdict.kind}, {1e3 * after.step_s:.1f} ms/step, "
            f"{after.samples_per_s:,.0f} samples/s\n"
            f"speed-up: {after.speedup_over(before):.2f}× samples/s")


def plot_breakdowns(results: list[ProfileResult], title: str = "where each step's time goes",
                    path: str | os.PathLike | None = None):
    """One stacked bar per run: the fraction of the step in each category."""
    fig, ax = new_figure((7, 0.8 + 0.7 * len(results)))
    labels = [f"{r.label}\n({r.verdict.kind})" for r in results]
    left = [0.0] * len(results)
    for cat in CATEGORIES:
        widths = [r.breakdown.fractions[cat] for r in results]
        ax.barh(labels, widths, left=left, label=cat)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of step time")
    ax.set_title(title)
    ax.legend(ncol=len(CATEGORIES), fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.08))
    return finish(fig, path)


def nvtx_ranges(result: ProfileResult) -> dict[str, int]:
    """How many labkit phase ranges the trace holds (the same names go to NVTX on CUDA)."""
    if result.trace_path is None:
        return {}
    counts: dict[str, int] = {}
    for ev in json.loads(result.trace_path.read_text())["traceEvents"]:
        name = str(ev.get("name", ""))
        if name.startswith("labkit/") and ev.get("ph") == "X":
            counts[name] = counts.get(name, 0) + 1
    return counts
