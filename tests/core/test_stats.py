"""labkit.core.stats: verdicts from repeated measurements, with their spread."""

from __future__ import annotations

import itertools

import pytest

from labkit.core import stats


def test_a_configuration_compared_with_itself_shows_no_difference():
    """The same configuration measured in alternation: whatever the noise, the ranges overlap."""
    noisy = itertools.cycle([101.0, 97.0, 104.0, 99.0, 95.0, 103.0])  # one machine's jitter
    a, b = stats.interleave(lambda: next(noisy), lambda: next(noisy), repeats=3, warmup=0)
    c = stats.compare(a, b)
    assert c.winner is None
    assert stats.NO_DIFFERENCE in c.sentence("fp32", "fp32 again")


def test_separated_ranges_name_the_winner_and_the_direction():
    c = stats.compare([100, 102, 98], [150, 149, 155])
    assert c.winner == "b" and c.b_is_better and c.speedup() == pytest.approx(1.5)
    assert c.sentence("fp32", "bf16").endswith(": faster")
    times = stats.compare([1.0, 1.1, 1.05], [2.0, 2.1, 1.9], higher_is_better=False)
    assert times.winner == "a" and times.sentence("x", "y", "s").endswith(": slower")
    assert times.speedup() == pytest.approx(1.05 / 2.0)


def test_overlapping_ranges_or_a_tiny_effect_are_no_difference():
    assert stats.compare([100, 110, 90], [105, 115, 95]).winner is None  # overlap
    assert stats.compare([100, 100, 100], [101, 101, 101]).winner is None  # 1% < min_effect
    assert stats.compare([100, 100, 100], [101, 101, 101], min_effect=0.005).winner == "b"


def test_a_verdict_needs_three_repeats_and_says_so():
    with pytest.raises(ValueError, match="b: 2 measurement"):
        stats.compare([1, 2, 3], [1, 2])


def test_interleave_discards_the_warm_up_and_alternates():
    calls = []

    def run(name):
        def measure():
            calls.append(name)
            return float(len(calls))
        return measure

    a, b = stats.interleave(run("a"), run("b"), repeats=2, warmup=1)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert a == [3.0, 5.0] and b == [4.0, 6.0]


def test_spread_text_shows_median_range_and_count():
    assert stats.Spread((1200.0, 1260.0, 1230.0)).text() == "1,230 (1,200–1,260, n=3)"


def test_round_robin_warms_each_configuration_up_then_takes_turns():
    calls = []

    def run(name):
        def measure():
            calls.append(name)
            return len(calls)
        return measure

    runs = stats.round_robin({"x": run("x"), "y": run("y"), "z": run("z")}, repeats=2, warmup=1,
                             warm_up_with={"y": run("y-short")})
    assert calls == ["x", "y-short", "z", "x", "y", "z", "x", "y", "z"]
    assert runs == {"x": [4, 7], "y": [5, 8], "z": [6, 9]}


def test_spread_range_and_swing():
    s = stats.Spread((100.0, 150.0, 120.0))
    assert s.range_text() == "100–150" and s.swing == pytest.approx(1.5)
