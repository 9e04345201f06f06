"""Spot VMs: the expected extra wall time of a job that preemptions cause. labkit's one model of
it: the cost estimator's Spot column, notebook 07's checkpoint-interval trade-off and the
capstone's Spot price all come from `SpotModel`.

A preemption loses the work done since the last checkpoint, on average half an interval
(nothing when the SIGTERM handler writes a checkpoint within the notice), plus the restart (new
VM, image pull, start-up, restore). Preemptions strike during the whole wall time, which they
lengthen, so with `busy` the hours of work and checkpoint writes:

    wall = busy + rate × wall × (lost + restart)   =>   wall = busy / (1 − rate × (lost + restart))

The preemption rate is an input: Google publishes no rate for Spot VMs, so state yours.

How long a job has to act on SIGTERM: Compute Engine gives a Spot VM 30 s between the soft-off
signal and the hard stop (`labkit.hardware.facts.SPOT_SHUTDOWN_S`), but Vertex AI does not
document how much of that reaches a training container, so labkit assumes half
(`SIGTERM_NOTICE_S`, `facts.CONTAINER_SIGTERM_GRACE_S`): a SIGTERM checkpoint that takes longer is
treated as lost work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labkit.core.config import check_bool, check_float
from labkit.hardware.facts import CONTAINER_SIGTERM_GRACE_S

# What to assume for acting on SIGTERM before the VM stops: undocumented for Vertex AI, so less
# than Compute Engine's documented 30 s (see the module docstring).
SIGTERM_NOTICE_S = float(CONTAINER_SIGTERM_GRACE_S.value)


@dataclass
class SpotModel:
    """How Spot treats a job: `preemptions_per_hour` (an assumption), a checkpoint every
    `checkpoint_every_min` minutes taking `checkpoint_write_s` seconds to write, `restart_min`
    minutes per restart, and whether a checkpoint is written on SIGTERM."""

    preemptions_per_hour: float = 0.05
    checkpoint_every_min: float = 30.0
    restart_min: float = 5.0
    checkpoint_write_s: float = 0.0
    checkpoint_on_sigterm: bool = False

    def __post_init__(self) -> None:
        check_float("preemptions_per_hour", self.preemptions_per_hour, minimum=0.0)
        check_float("checkpoint_every_min", self.checkpoint_every_min, minimum=0.0)
        check_float("restart_min", self.restart_min, minimum=0.0)
        check_float("checkpoint_write_s", self.checkpoint_write_s, minimum=0.0)
        check_bool("checkpoint_on_sigterm", self.checkpoint_on_sigterm)

    @property
    def lost_per_preemption_s(self) -> float:
        """Work lost per preemption: half an interval, or none when the SIGTERM checkpoint fits
        in the notice."""
        if self.checkpoint_on_sigterm and self.checkpoint_write_s <= SIGTERM_NOTICE_S:
            return 0.0
        return self.checkpoint_every_min * 60 / 2

    @property
    def checkpoint_overhead(self) -> float:
        """Fraction of extra time spent writing the periodic checkpoints (with or without Spot)."""
        interval_s = self.checkpoint_every_min * 60
        return self.checkpoint_write_s / interval_s if interval_s > 0 else 0.0

    @property
    def overhead(self) -> float:
        """Fraction of extra wall time preemptions cause (0.1 = 10% longer than the same job,
        with the same checkpoints, never preempted); infinite when restarts never catch up."""
        lost_per_hour = self.preemptions_per_hour * (self.lost_per_preemption_s + self.restart_min * 60) / 3600
        return lost_per_hour / (1 - lost_per_hour) if lost_per_hour < 1 else math.inf

    def wall_hours(self, work_hours: float) -> float:
        """Expected wall time on Spot of a job needing `work_hours` of uninterrupted compute."""
        return work_hours * (1 + self.checkpoint_overhead) * (1 + self.overhead)


def young_daly_interval(checkpoint_write_s: float, preemptions_per_hour: float) -> float:
    """The checkpoint interval (seconds) that minimises expected waste without SIGTERM
    checkpoints: sqrt(2 C M), C the write time and M the mean time between preemptions."""
    if preemptions_per_hour <= 0:
        return math.inf
    return math.sqrt(2 * checkpoint_write_s * 3600 / preemptions_per_hour)
