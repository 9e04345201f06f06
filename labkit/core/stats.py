"""Repeated measurements and the verdicts drawn from them.

A speed claim ("bf16 is faster than fp32 here") is only as good as its spread. `interleave` runs
two configurations alternately (a, b, a, b, ...) after one discarded warm-up run of each, so a
slow spell of the machine hits both; `round_robin` does the same for any number of
configurations (a ladder's rungs). `compare` turns two lists into a `Comparison`: medians,
min–max ranges, the ratio, and a verdict that names a winner only when the ranges do not overlap
and the medians differ by more than `min_effect`. Otherwise the sentence says "no measurable
difference here", which is what two runs of the same configuration must give.

Why min–max ranges and not a t-test: a handful of runs of a training step are not normal (first
runs, page cache, thermal and scheduler effects skew them), and a reader can check a range by
eye in the table beside the sentence.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from labkit.core.config import check_float, check_int
from labkit.core.progress import progress

MIN_REPEATS = 3
NO_DIFFERENCE = "no measurable difference here"
# Units whose comparison reads "faster"/"slower" (rates and times); anything else "better"/"worse".
SPEEDS = ("samples/s", "tokens/s", "images/s", "steps/s", "GB/s", "TFLOP/s", "s", "ms")
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: median and min–max."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a Spread needs at least one measurement")

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def overlaps(self, other: Spread) -> bool:
        return self.low <= other.high and other.low <= self.high

    def text(self, digits: int = 3) -> str:
        """`1,230 (1,200–1,260, n=3)` style: median, then the range and the count."""
        return f"{_fmt(self.median, digits)} ({self.range_text(digits)}, n={len(self.values)})"

    def range_text(self, digits: int = 3) -> str:
        """`1,200–1,260`: the lowest and the highest measurement."""
        return f"{_fmt(self.low, digits)}–{_fmt(self.high, digits)}"

    @property
    def swing(self) -> float:
        """Highest over lowest measurement (1.0: all equal; inf when the lowest is 0)."""
        return self.high / self.low if self.low > 0 else float("inf")


def _fmt(value: float, digits: int) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}g}"


@dataclass(frozen=True)
class Comparison:
    """`b` against `a` (e.g. a candidate against the baseline). `ratio` is median(b)/median(a);
    `winner` is "a", "b" or None (no measurable difference)."""

    a: Spread
    b: Spread
    higher_is_better: bool = True
    min_effect: float = 0.02

    @property
    def ratio(self) -> float:
        return self.b.median / self.a.median if self.a.median else float("inf")

    @property
    def winner(self) -> str | None:
        if self.a.overlaps(self.b) or abs(self.ratio - 1.0) <= self.min_effect:
            return None
        b_higher = self.b.median > self.a.median
        return "b" if b_higher == self.higher_is_better else "a"

    @property
    def b_is_better(self) -> bool:
        return self.winner == "b"

    def speedup(self) -> float:
        """How many times better b is than a (ratio of medians, inverted for times)."""
        return self.ratio if self.higher_is_better else 1.0 / self.ratio

    def sentence(self, a_label: str, b_label: str, what: str = "samples/s") -> str:
        """One sentence with the medians, ranges and verdict, e.g. "bf16: 2.41× fp32
        (1,230 vs 510 samples/s, ranges 1,200–1,260 vs 500–520, n=3 each): faster"."""
        if self.winner is None:
            verdict = NO_DIFFERENCE
        elif what in SPEEDS:
            verdict = "faster" if self.winner == "b" else "slower"
        else:
            verdict = "better" if self.winner == "b" else "worse"
        return (f"{b_label}: {self.speedup():.2f}× {a_label} ({_fmt(self.b.median, 3)} vs "
                f"{_fmt(self.a.median, 3)} {what}, ranges {_fmt(self.b.low, 3)}–{_fmt(self.b.high, 3)} "
                f"vs {_fmt(self.a.low, 3)}–{_fmt(self.a.high, 3)}, n={len(self.b.values)} and "
                f"{len(self.a.values)}): {verdict}")


def compare(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True,
            min_effect: float = 0.02, min_repeats: int = MIN_REPEATS) -> Comparison:
    """The `Comparison` of two lists of repeated measurements; each needs `min_repeats`."""
    check_float("min_effect", min_effect, minimum=0.0)
    for name, values in (("a", a), ("b", b)):
        if len(values) < min_repeats:
            raise ValueError(f"{name}: {len(values)} measurement(s); a verdict needs at least "
                             f"{min_repeats} repeats")
    return Comparison(Spread(tuple(float(v) for v in a)), Spread(tuple(float(v) for v in b)),
                      higher_is_better, min_effect)


def interleave(measure_a: Callable[[], T], measure_b: Callable[[], T], *,
               repeats: int = MIN_REPEATS, warmup: int = 1) -> tuple[list[T], list[T]]:
    """Run `warmup` discarded runs of each, then a, b, a, b, ... `repeats` times; returns the
    two lists of measurements (whatever the callables return: samples/s, seconds, ...)."""
    runs = round_robin({"a": measure_a, "b": measure_b}, repeats=repeats, warmup=warmup)
    return runs["a"], runs["b"]


def round_robin(measures: Mapping[K, Callable[[], T]], *, repeats: int = MIN_REPEATS, warmup: int = 1,
                warm_up_with: Mapping[K, Callable[[], object]] | None = None,
                desc: str | None = None) -> dict[K, list[T]]:
    """`warmup` discarded rounds (each configuration once per round, with `warm_up_with[key]`
    when given, e.g. a shorter run of the same configuration), then `repeats` rounds a, b, c,
    a, b, c, ...; returns each configuration's measurements in order. With `desc`, a progress
    bar counts the runs (`labkit.core.progress`)."""
    check_int("repeats", repeats, minimum=1)
    check_int("warmup", warmup, minimum=0)
    out: dict[K, list[T]] = {key: [] for key in measures}
    # No description, no bar (e.g. the comparisons inside a capstone lever, which has its own).
    with progress(len(measures) * (warmup + repeats), desc or "", unit="run",
                  is_main=False if desc is None else None) as bar:
        for _ in range(warmup):
            for key, measure in measures.items():
                (warm_up_with or {}).get(key, measure)()
                bar.update(1)
        for _ in range(repeats):
            for key, measure in measures.items():
                out[key].append(measure())
                bar.update(1)
    return out
