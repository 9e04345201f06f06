"""The one way the course compares settings by training them: every setting gets one short
discarded run first (first-use costs: thread pools, kernels chosen on first use, loader
processes), then the settings take turns `repeats` times (`labkit.core.stats.round_robin`), so a
slow spell of the machine hits all of them. A setting's runs become one row (`summary`: medians,
the min–max range, the runs themselves), and a verdict against another row comes from
`labkit.core.stats.compare`: "no measurable difference here" when the ranges overlap.

Notebook 03's input ladder, notebook 04's precision ladder and notebook 09's capstone climb
measure this way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from labkit.core import stats

K = TypeVar("K")
T = TypeVar("T")

WARM_UP_STEPS = 2  # the discarded first run of each setting is this many steps long


def in_turns(measures: Mapping[K, Callable[[], T]], *, repeats: int,
             warm_up_with: Mapping[K, Callable[[], object]], desc: str | None = None) -> dict[K, list[T]]:
    """One discarded warm-up of each setting (`warm_up_with[key]`, e.g. a `WARM_UP_STEPS` run),
    then `repeats` rounds of every setting in turn; each setting's runs in order."""
    return stats.round_robin(measures, repeats=repeats, warmup=1, warm_up_with=warm_up_with, desc=desc)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One setting's runs as one row: the last run's fields, with the median samples/s and step
    time, the range of samples/s, the runs themselves (`runs_samples_per_s`), their count, the
    largest peak memory, and the median data-wait fraction when the runs measured one."""
    rates = stats.Spread(tuple(r["samples_per_s"] for r in runs))
    peaks = [r["peak_memory_mib"] for r in runs if r.get("peak_memory_mib") is not None]
    row = {**runs[-1], "samples_per_s": rates.median, "range": rates.range_text(),
           "runs_samples_per_s": list(rates.values), "repeats": len(runs),
           "step_time_ms": stats.Spread(tuple(r["step_time_ms"] for r in runs)).median,
           "peak_memory_mib": max(peaks) if peaks else None}
    if any("data_fraction" in r for r in runs):
        fractions = [r["data_fraction"] for r in runs if r.get("data_fraction") is not None]
        row["data_fraction"] = stats.Spread(tuple(fractions)).median if fractions else None
    return row


def comparison(base: dict[str, Any], row: dict[str, Any], min_effect: float = 0.02) -> stats.Comparison | None:
    """`row`'s runs against `base`'s (samples/s, higher is better), or None when either has
    fewer than the repeats a verdict needs."""
    a, b = base.get("runs_samples_per_s") or [], row.get("runs_samples_per_s") or []
    if min(len(a), len(b)) < stats.MIN_REPEATS:
        return None
    return stats.compare(a, b, min_effect=min_effect)


def verdict(c: stats.Comparison | None) -> str:
    """One word for a comparison: faster, slower, or no measurable difference (or no verdict)."""
    if c is None:
        return f"fewer than {stats.MIN_REPEATS} runs: no verdict"
    if c.winner is None:
        return stats.NO_DIFFERENCE
    return "faster" if c.b_is_better else "slower"
