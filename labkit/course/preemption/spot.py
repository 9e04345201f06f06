"""Notebook 07's Spot trade-off: checkpoint interval against expected lost work against cost.

`tradeoff` prices a job at each checkpoint interval with `labkit.hardware.spot.SpotModel` (the
one model of preemption overhead: lost work and restarts stretch the wall time, checkpoint
writes add their own), so the cheapest interval and the Spot saving are numbers, not advice.
`sensitivity` shows how that saving moves with the assumed preemption rate and the interval.
`time_checkpoint_write` measures what writing a checkpoint costs here (at a size that measures
bandwidth, not latency). `capacity_options`
compares on-demand, Spot and DWS flex-start for one job, each price and rule with its source.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from labkit.core import stats
from labkit.core.config import check_float
from labkit.course.plots import finish, new_figure
from labkit.hardware import facts
from labkit.hardware.spot import SpotModel


@dataclass
class SpotScenario:
    """A job needing `work_hours` of uninterrupted compute, its prices per hour, and how Spot
    treats it (`spot`; the checkpoint interval is what `tradeoff` varies)."""

    work_hours: float
    on_demand_usd_hr: float
    spot_usd_hr: float
    spot: SpotModel

    def __post_init__(self) -> None:
        check_float("work_hours", self.work_hours, minimum=0.0)
        check_float("on_demand_usd_hr", self.on_demand_usd_hr, minimum=0.0)
        check_float("spot_usd_hr", self.spot_usd_hr, minimum=0.0)


@dataclass
class TradeoffRow:
    interval_s: float
    checkpoint_overhead: float  # fraction of time spent writing checkpoints
    lost_per_preemption_s: float
    expected_preemptions: float
    wall_hours: float
    spot_cost: float
    on_demand_cost: float  # same checkpoints, no preemptions, on-demand price

    @property
    def saving(self) -> float:
        return 1.0 - self.spot_cost / self.on_demand_cost if self.on_demand_cost else float("nan")


def row(s: SpotScenario, interval_s: float) -> TradeoffRow:
    """The job with a checkpoint every `interval_s` seconds, on Spot and on-demand."""
    model = replace(s.spot, checkpoint_every_min=interval_s / 60)
    busy = s.work_hours * (1 + model.checkpoint_overhead)
    wall = model.wall_hours(s.work_hours)
    return TradeoffRow(interval_s, model.checkpoint_overhead, model.lost_per_preemption_s,
                       model.preemptions_per_hour * wall, wall, wall * s.spot_usd_hr,
                       busy * s.on_demand_usd_hr)


def tradeoff(s: SpotScenario, intervals_s: list[float]) -> list[TradeoffRow]:
    return [row(s, i) for i in intervals_s]


def table_rows(rows: list[TradeoffRow]) -> list[dict[str, Any]]:
    """The trade-off as rows for `labkit.course.tables.table`, in the units a reader compares."""
    return [{"interval (min)": r.interval_s / 60, "checkpoint overhead (%)": 100 * r.checkpoint_overhead,
             "lost per preemption (min)": r.lost_per_preemption_s / 60, "preemptions": r.expected_preemptions,
             "wall h": r.wall_hours, "Spot $": r.spot_cost, "on-demand $": r.on_demand_cost,
             "saving (%)": 100 * r.saving} for r in rows]


def sensitivity(s: SpotScenario, rates_per_hour: Sequence[float],
                intervals_s: Sequence[float]) -> list[dict[str, Any]]:
    """How the Spot saving depends on what the notebook assumes: per preemption rate (one row
    each), the saving (%) with hard kills at every checkpoint interval (None: the job never
    finishes, restarts eat every hour), the cheapest of those intervals, and what a SIGTERM
    checkpoint then saves in dollars and brings the saving to."""
    rows = []
    for rate in rates_per_hour:
        at = replace(s, spot=replace(s.spot, preemptions_per_hour=rate))
        hard = tradeoff(at, list(intervals_s))
        best = min(hard, key=lambda r: r.spot_cost)
        soft = row(replace(at, spot=replace(at.spot, checkpoint_on_sigterm=True)), best.interval_s)
        out: dict[str, Any] = {"preemptions/h": rate}
        for r in hard:
            out[f"saving at {r.interval_s / 60:g} min (%)"] = 100 * r.saving if math.isfinite(r.spot_cost) else None
        finite = math.isfinite(best.spot_cost)
        out |= {"cheapest interval (min)": best.interval_s / 60 if finite else None,
                "SIGTERM checkpoint saves $": (best.spot_cost - soft.spot_cost) if finite else None,
                "saving with it (%)": 100 * soft.saving if math.isfinite(soft.spot_cost) else None}
        rows.append(out)
    return rows


def sensitivity_text(rows: list[dict[str, Any]], on_demand_usd: float) -> str:
    """What a `sensitivity` grid says, computed from it: from which rate the SIGTERM checkpoint
    saves at least 1% of the on-demand bill, from which a job with hard kills never finishes,
    and whether Spot with the SIGTERM checkpoint stops saving."""
    gains = [(r["preemptions/h"], r["SIGTERM checkpoint saves $"] or 0.0) for r in rows]
    worth = [rate for rate, usd in gains if usd >= 0.01 * on_demand_usd]
    best = max(usd for _, usd in gains)
    first = (f"The SIGTERM checkpoint saves at least 1% of the ${on_demand_usd:,.0f} on-demand bill from "
             f"{min(worth):g} preemptions/h" if worth else
             f"The SIGTERM checkpoint saves under 1% of the ${on_demand_usd:,.0f} on-demand bill at every rate "
             f"here (at most ${best:,.2f})")
    never = [r["preemptions/h"] for r in rows
             if all(v is None for k, v in r.items() if k.startswith("saving at"))]
    lost = [r["preemptions/h"] for r in rows if not (r["saving with it (%)"] or 0) > 0]
    second = (f"With hard kills the job never finishes from {min(never):g} preemptions/h at these intervals "
              "(restarts and lost work outpace it); " if never else "")
    second += (f"Spot stops saving from {min(lost):g} preemptions/h even with the SIGTERM checkpoint."
               if lost else "with the SIGTERM checkpoint Spot saves at every rate here.")
    second = second[0].upper() + second[1:]
    return f"{first}. {second}"


@dataclass(frozen=True)
class CheckpointWrite:
    """Timed writes of `nbytes` through labkit's checkpoint commit (the files, then the marker)."""

    seconds: stats.Spread
    nbytes: int

    @property
    def bandwidth(self) -> float:
        """Bytes per second, from the median write."""
        return self.nbytes / self.seconds.median


def time_checkpoint_write(checkpoint_dir: str, *, min_bytes: int = 64 * 2**20,
                          repeats: int = 3) -> CheckpointWrite:
    """Write the newest committed checkpoint of `checkpoint_dir` again, `repeats` times, to a
    temporary folder with its commit marker. A small checkpoint is written with its bytes
    repeated into one more file up to `min_bytes`: a write of a few hundred KB times the
    file system's latency, not the bandwidth a GB-sized checkpoint gets."""
    from labkit.core import checkpoint

    ckpt = checkpoint.load(checkpoint_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{checkpoint_dir}: no committed checkpoint to time")
    files = dict(ckpt.files)
    size = sum(len(b) for b in files.values())
    if 0 < size < min_bytes:
        own = b"".join(files.values())
        files["ballast.bin"] = (own * -(-(min_bytes - size) // len(own)))[:min_bytes - size]
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="labkit-ckpt-") as tmp:
            start = time.perf_counter()
            checkpoint.save(tmp, ckpt.step, files, ckpt.meta)
            times.append(time.perf_counter() - start)
    return CheckpointWrite(stats.Spread(tuple(times)), sum(len(b) for b in files.values()))


def plot_tradeoff(rows: list[TradeoffRow], path: str | os.PathLike | None = None):
    """Expected Spot cost and on-demand cost against the checkpoint interval."""
    fig, ax = new_figure((7, 4))
    xs = [r.interval_s / 60 for r in rows]
    ax.plot(xs, [r.spot_cost for r in rows], "o-", label="Spot, expected cost")
    ax.plot(xs, [r.on_demand_cost for r in rows], "s--", label="on-demand")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("USD per job")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return finish(fig, path)


@dataclass
class CapacityOption:
    """One way to buy the job's machine time: what an hour costs, what the job costs, and the
    rules that come with it (each with its source)."""

    name: str
    usd_per_hour: tuple[float, float]  # (low, high): one figure when both are equal
    job_usd: tuple[float, float]
    wall_hours: float
    rules: list[str]
    sources: list[str]


def capacity_options(s: SpotScenario, interval_s: float, price_source: str) -> list[CapacityOption]:
    """On-demand, Spot (at the checkpoint interval `interval_s`, preemptions as `s.spot` models
    them) and DWS flex-start for the job of `s`. Flex-start has no sourced rate in labkit's
    catalog: its price is given as the range Google documents, from about half of on-demand
    (`facts.DWS_MAX_DISCOUNT`) to on-demand, for the same wall time as on-demand (it is not
    preempted) after a wait for capacity."""
    spot_row = row(s, interval_s)
    on_demand = s.on_demand_usd_hr
    busy = spot_row.on_demand_cost / on_demand if on_demand else s.work_hours  # work + checkpoint writes
    dws_low = on_demand * (1 - facts.DWS_MAX_DISCOUNT.value)
    return [
        CapacityOption("on-demand", (on_demand, on_demand), (spot_row.on_demand_cost,) * 2, busy,
                       ["starts when capacity is there (a stockout fails the job, retried up to 3 times)",
                        "never preempted"],
                       [price_source, facts.STOCKOUT_RESTARTS.cite()]),
        CapacityOption("Spot", (s.spot_usd_hr, s.spot_usd_hr), (spot_row.spot_cost,) * 2, spot_row.wall_hours,
                       [f"preempted at any time ({s.spot.preemptions_per_hour}/h assumed): the job restarts, "
                        "up to 6 times, from its last checkpoint",
                        f"up to {facts.SPOT_MAX_DISCOUNT.value:.0%} off on-demand"],
                       [price_source, facts.SPOT_JOB_RESTARTS.cite(), facts.SPOT_MAX_DISCOUNT.cite()]),
        CapacityOption("DWS flex-start", (dws_low, on_demand), (dws_low * busy, on_demand * busy), busy,
                       [f"waits for all its GPUs at once, at most maxWaitDuration (default "
                        f"{facts.DWS_MAX_WAIT_DEFAULT_H.value:.0f} h)",
                        "not preempted once running; L4, A100, H100, H200 or B200 only; timeout <= 7 days",
                        "price: up to about half of on-demand (no rate in labkit's catalog)"],
                       list(dict.fromkeys([facts.DWS_MAX_WAIT_DEFAULT_H.cite(), facts.DWS_NOT_PREEMPTIBLE.cite(),
                                           facts.DWS_MAX_DISCOUNT.cite()]))),
    ]


def capacity_rows(options: list[CapacityOption]) -> list[dict[str, Any]]:
    """Table rows of `capacity_options` (a range where the price is one)."""
    def money(pair: tuple[float, float]) -> str:
        return f"${pair[0]:,.2f}" if pair[0] == pair[1] else f"${pair[0]:,.2f}-{pair[1]:,.2f}"

    return [{"capacity": o.name, "USD/h": money(o.usd_per_hour), "job USD": money(o.job_usd),
             "wall h": round(o.wall_hours, 1), "rules": "; ".join(o.rules)} for o in options]


def capacity_text(options: list[CapacityOption], title: str) -> str:
    """The comparison as a table, then each option's sources."""
    from labkit.course.tables import table

    return "\n".join([table(capacity_rows(options), title=title),
                      *(f"{o.name}: " + "; ".join(o.sources) for o in options)])
