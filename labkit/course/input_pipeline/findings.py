"""Notebook 03's findings, as numbers and verdicts over this run's measurements, from which the
notebook writes its sentences: each input ladder's steps (`ladder_findings`) and the torch reading
mechanisms (`mechanism_findings`). Rungs and readers are found by key, so relabelling one for
display changes no finding."""

from __future__ import annotations

import os
from dataclasses import dataclass

from labkit.core import stats
from labkit.core.config import ParameterError
from labkit.course import ladder as verdicts
from labkit.course.input_pipeline.ladder import InputLadder, InputLadderConfig, InputRung
from labkit.course.input_pipeline.read_rates import best_torch_mechanism

# Why a step up the ladder was not measurably faster, from what the rung adds and the waits
# the run measured (`RungStep.reason`).
HELPERS_SHARE_CORES = "its helpers share this machine's cores with the training step"
WITHIN_NOISE = "it cut the wait, but the epochs' times vary more than that gain"
LITTLE_TO_WIN = "there was little waiting to win"
WAIT_NOT_CUT = "it did not cut the wait"
# A wait cut by more than this share of the epoch counts as cut; under `LITTLE_WAIT` there was
# little to cut.
WAIT_CUT = 0.05
LITTLE_WAIT = 0.2


@dataclass(frozen=True)
class RungStep:
    """One step up a ladder: rung `after` against rung `before` (samples/s of their epochs)."""

    before: InputRung
    after: InputRung
    verdict: str  # "faster", "slower", stats.NO_DIFFERENCE, or no verdict (too few epochs)
    measured: bool  # whether both rungs had the epochs a verdict needs

    @property
    def ratio(self) -> float:
        return self.after.samples_per_s / self.before.samples_per_s

    @property
    def reason(self) -> str | None:
        """For a measured step that was not faster, the likely reason (one of `HELPERS_SHARE_CORES`,
        `WITHIN_NOISE`, `LITTLE_TO_WIN`, `WAIT_NOT_CUT`); None otherwise."""
        if not self.measured or self.verdict == "faster":
            return None
        waited, waits = self.before.data_fraction, self.after.data_fraction
        if self.after.key in ("parallel_reads", "prefetch"):
            return HELPERS_SHARE_CORES
        if waits < waited - WAIT_CUT:
            return WITHIN_NOISE
        return LITTLE_TO_WIN if waited < LITTLE_WAIT else WAIT_NOT_CUT


@dataclass(frozen=True)
class LadderFindings:
    """One engine's ladder: its rungs' steps in climbing order, the best rung, and whether the
    torch parallel-reads rung paid for starting its workers afresh each epoch."""

    engine: str
    rungs: tuple[InputRung, ...]
    steps: tuple[RungStep, ...]
    best: InputRung
    speedup: float  # best rung over the naive one (ratio of median epochs)
    steps_per_epoch: int
    cores: int

    @property
    def naive(self) -> InputRung:
        return self.rungs[0]

    @property
    def epochs(self) -> int:
        """Measured epochs per rung."""
        return len(self.naive.epochs_s) or 1

    def step(self, after: str) -> RungStep:
        """The step up to rung `after` (a key of `INPUT_RUNGS`)."""
        for s in self.steps:
            if s.after.key == after:
                return s
        raise KeyError(f"{self.engine} ladder has no step up to {after!r}")

    @property
    def not_faster(self) -> tuple[RungStep, ...]:
        """The measured steps that were not measurably faster, each with its `reason`."""
        return tuple(s for s in self.steps if s.reason is not None)

    @property
    def workers_cost_more(self) -> bool:
        """torch: the parallel-reads rung, whose loader workers start afresh every epoch
        (persistent_workers=False), measurably slower than the shards rung without them."""
        s = self.step("parallel_reads")
        return self.engine == "torch" and s.measured and s.verdict == "slower"


def ladder_findings(lad: InputLadder, config: InputLadderConfig) -> LadderFindings:
    keys = [r.key for r in lad.rungs]
    steps = tuple(RungStep(lad.rung(a), lad.rung(b), lad.verdict(a, b), lad.comparison(a, b) is not None)
                  for a, b in zip(keys, keys[1:], strict=False))
    return LadderFindings(lad.engine, tuple(lad.rungs), steps, lad.best, lad.speedup(),
                          -(-config.num_samples // config.batch_size), os.cpu_count() or 1)


@dataclass(frozen=True)
class MechanismFindings:
    """The torch reading mechanisms from the page cache: samples/s of each one's passes, the
    best (highest median) against the runner-up, and the worst."""

    passes: dict[str, stats.Spread]
    best: str
    runner_up: str
    worst: str

    @property
    def best_over_worst(self) -> float:
        return self.passes[self.best].median / self.passes[self.worst].median

    @property
    def comparison(self) -> stats.Comparison | None:
        """The best's passes (b) against the runner-up's (a); None with too few passes."""
        a, b = self.passes[self.runner_up], self.passes[self.best]
        if min(len(a.values), len(b.values)) < stats.MIN_REPEATS:
            return None
        return stats.compare(a.values, b.values)

    @property
    def verdict(self) -> str:
        """The best against the runner-up: "faster" (in every pass), `stats.NO_DIFFERENCE`, or
        no verdict."""
        return verdicts.verdict(self.comparison)


def mechanism_findings(mechanisms: dict[str, stats.Spread]) -> MechanismFindings:
    if len(mechanisms) < 2:
        raise ParameterError("mechanisms", list(mechanisms), "a best and a runner-up need at least two")
    ranked = sorted(mechanisms, key=lambda k: mechanisms[k].median, reverse=True)
    return MechanismFindings(dict(mechanisms), best_torch_mechanism(mechanisms), ranked[1], ranked[-1])
