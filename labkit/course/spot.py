"""Spot VMs: checkpoint interval vs expected lost work vs cost.

Spot capacity can be reclaimed at any time (Vertex then restarts the job). With checkpoints
every `interval` seconds, a preemption loses on average half an interval of work (nothing
when the SIGTERM handler checkpoints within the ~15 s notice), plus the restart itself; each
checkpoint costs its write time. `tradeoff` computes, for each interval, the expected wall
time and cost of a job, so the cheapest interval and the Spot saving are numbers, not advice.
The preemption rate is an input: Google publishes no rate for Spot VMs, so state yours.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass

from labkit.core.config import check_bool, check_float

SIGTERM_NOTICE_S = 15.0  # what to assume for acting on SIGTERM before the VM stops


@dataclass
class SpotScenario:
    """A job needing `work_hours` of uninterrupted compute; prices are per hour of the job."""

    work_hours: float
    checkpoint_write_s: float
    preemptions_per_hour: float
    on_demand_usd_hr: float
    spot_usd_hr: float
    restart_overhead_s: float = 300.0  # new VM, image pull, start-up, restore
    checkpoint_on_sigterm: bool = True

    def __post_init__(self) -> None:
        check_float("work_hours", self.work_hours, minimum=0.0)
        check_float("checkpoint_write_s", self.checkpoint_write_s, minimum=0.0)
        check_float("preemptions_per_hour", self.preemptions_per_hour, minimum=0.0)
        check_float("restart_overhead_s", self.restart_overhead_s, minimum=0.0)
        check_bool("checkpoint_on_sigterm", self.checkpoint_on_sigterm)


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


def lost_work_s(s: SpotScenario, interval_s: float) -> float:
    """Expected work lost per preemption: half an interval, or none when the SIGTERM handler
    can write a checkpoint within the notice."""
    if s.checkpoint_on_sigterm and s.checkpoint_write_s <= SIGTERM_NOTICE_S:
        return 0.0
    return interval_s / 2


def row(s: SpotScenario, interval_s: float) -> TradeoffRow:
    overhead = s.checkpoint_write_s / interval_s if interval_s > 0 else 0.0
    lost = lost_work_s(s, interval_s)
    busy = s.work_hours * (1 + overhead)
    # Preemptions strike during the whole wall time, which they lengthen: H = busy + rate*H*(lost+restart).
    per_hour_lost = s.preemptions_per_hour * (lost + s.restart_overhead_s) / 3600
    wall = busy / (1 - per_hour_lost) if per_hour_lost < 1 else math.inf
    return TradeoffRow(interval_s, overhead, lost, s.preemptions_per_hour * wall, wall,
                       wall * s.spot_usd_hr, busy * s.on_demand_usd_hr)


def tradeoff(s: SpotScenario, intervals_s: list[float]) -> list[TradeoffRow]:
    return [row(s, i) for i in intervals_s]


def young_daly_interval(checkpoint_write_s: float, preemptions_per_hour: float) -> float:
    """The interval that minimises expected waste without SIGTERM checkpoints: sqrt(2 C M)."""
    if preemptions_per_hour <= 0:
        return math.inf
    return math.sqrt(2 * checkpoint_write_s * 3600 / preemptions_per_hour)


def table(rows: list[TradeoffRow]) -> str:
    out = [f"{'interval':>9} {'ckpt ovh':>8} {'lost/preempt':>12} {'preempts':>8} {'wall h':>8} "
           f"{'Spot $':>9} {'on-dem $':>9} {'saving':>7}"]
    for r in rows:
        out.append(f"{r.interval_s:>8.0f}s {r.checkpoint_overhead:>8.2%} {r.lost_per_preemption_s:>11.0f}s "
                   f"{r.expected_preemptions:>8.2f} {r.wall_hours:>8.2f} {r.spot_cost:>9.2f} "
                   f"{r.on_demand_cost:>9.2f} {r.saving:>7.1%}")
    return "\n".join(out)


def rows_as_dicts(rows: list[TradeoffRow]) -> list[dict]:
    return [asdict(r) | {"saving": r.saving} for r in rows]


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


def plot_tradeoff(rows: list[TradeoffRow], path=None):
    import matplotlib

    if path is not None:
        import sys

        if "ipykernel" not in sys.modules:
            matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r.interval_s / 60 for r in rows]
    ax.plot(xs, [r.spot_cost for r in rows], "o-", label="Spot, expected cost")
    ax.plot(xs, [r.on_demand_cost for r in rows], "s--", label="on-demand")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes)")
    ax.set_ylabel("USD per job")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig
