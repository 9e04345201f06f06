"""Notebook 07's Spot trade-off: checkpoint interval against expected lost work against cost.

`tradeoff` prices a job at each checkpoint interval with `labkit.hardware.spot.SpotModel` (the
one model of preemption overhead: lost work and restarts stretch the wall time, checkpoint
writes add their own), so the cheapest interval and the Spot saving are numbers, not advice.
`time_checkpoint_write` measures what one checkpoint costs to write here. `capacity_options`
compares on-demand, Spot and DWS flex-start for one job, each price and rule with its source.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

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


def time_checkpoint_write(checkpoint_dir: str) -> tuple[float, int]:
    """Seconds and bytes to write the newest committed checkpoint of `checkpoint_dir` again
    (to a temporary folder, with its commit marker): the measured cost of one checkpoint."""
    from labkit.core import checkpoint

    ckpt = checkpoint.load(checkpoint_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{checkpoint_dir}: no committed checkpoint to time")
    with tempfile.TemporaryDirectory(prefix="labkit-ckpt-") as tmp:
        start = time.perf_counter()
        checkpoint.save(tmp, ckpt.step, ckpt.files, ckpt.meta)
        seconds = time.perf_counter() - start
    return seconds, sum(len(b) for b in ckpt.files.values())


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
