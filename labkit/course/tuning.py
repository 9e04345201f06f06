"""Notebook 11's reading of a hyperparameter study, as numbers and verdicts from which the
notebook writes its sentences, all from the trial records `labkit.vertex.run_local_tuning`
returns:

    found = findings(summary, records, spot, on_demand, chance=2.30)   # the best trial, whether it learned
    range_edges(summary.best, {"lr": ("log", 1e-4, 3e-2)})             # best values at a range's edge
    tpe_share(len(records)).guided                                     # trials TPE suggested
    rows = confirm_top(base, records, ...)                             # the top two, re-run with other seeds
    confirmation(rows, top_comparison(rows, "minimize")).verdict       # "better" only on every seed
    submit_or_preview(spec, "name")                                    # where the request went

and the plots and tables: the metric against each tuned value, the study's cost on Spot against
on-demand."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.core.metrics import LEARNED_BELOW
from labkit.course.plots import finish, new_figure
from labkit.vertex.tuning import (
    StudyCost,
    StudySummary,
    TrialRecord,
    run_local_tuning,
    tpe_startup_trials,
    tuning_job,
)

EDGE_SHARE = 0.1  # the outer tenth of a searched range (on its own scale) counts as its edge


def plot_study(records: Sequence[TrialRecord], parameter: str, *, metric: str = "loss",
               log_x: bool = True, path=None):
    """The last reported metric of every trial against one tuned parameter; trials stopped
    early are marked apart (their metric is from before they would have finished)."""
    fig, ax = new_figure((6.5, 3.8))
    for state, marker, label in (("SUCCEEDED", "o", "finished"), ("STOPPED", "x", "stopped early"),
                                 ("FAILED", "s", "failed")):
        chosen = [r for r in records if r.state == state and r.metric is not None]
        if chosen:
            ax.scatter([float(r.parameters[parameter]) for r in chosen], [r.metric for r in chosen],
                       marker=marker, label=f"{label} ({len(chosen)})")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(parameter)
    ax.set_ylabel(f"{metric} (last report)")
    ax.set_title(f"{len(records)} trials")
    ax.legend()
    return finish(fig, path)


def cost_rows(spot: StudyCost, on_demand: StudyCost) -> list[dict[str, Any]]:
    """The study's trial-hours priced both ways."""
    return [{"pricing": "Spot" if c.spot else "on-demand", "usd_per_hour": c.usd_per_hour,
             "trial_minutes": c.trial_hours * 60, "total_usd": c.total_usd} for c in (on_demand, spot)]


@dataclass(frozen=True)
class StudyFindings:
    """What a study's records and prices show (`findings`)."""

    trials: int
    best: TrialRecord | None  # the best finished trial (None: no trial finished)
    chance: float | None  # the metric of guessing (a loss metric's ln classes), when given
    # The best trial's metric is under `LEARNED_BELOW` × chance (True without `chance`); None
    # when no trial finished. A study in which no trial learned names no best configuration.
    learned: bool | None
    finished_low: float | None  # the lowest and highest metric of the trials that finished
    finished_high: float | None
    finished: int
    floor: float | None  # the best loss the data allows, when given
    stopped: int  # trials stopped early by the median rule
    stopped_seconds: float  # the time they ran, in all
    spot_usd: float
    on_demand_usd: float

    @property
    def learned_below(self) -> float | None:
        """The metric a trial must get under to count as having learned."""
        return None if self.chance is None else LEARNED_BELOW * self.chance

    @property
    def finished_spread(self) -> float | None:
        """How far apart the finished trials ended, relative to the lowest (None under two)."""
        if self.finished < 2:
            return None
        return (self.finished_high - self.finished_low) / abs(self.finished_low) if self.finished_low else math.inf

    @property
    def above_floor(self) -> float | None:
        """The best trial's metric minus the floor."""
        return None if self.best is None or self.floor is None else self.best.metric - self.floor

    @property
    def below_chance(self) -> float | None:
        """Chance minus the best trial's metric."""
        return None if self.best is None or self.chance is None else self.chance - self.best.metric

    @property
    def spot_saving(self) -> float | None:
        """The share of the on-demand price Spot saves (None when on-demand costs nothing)."""
        return 1 - self.spot_usd / self.on_demand_usd if self.on_demand_usd > 0 else None


def findings(summary: StudySummary, records: Sequence[TrialRecord], spot: StudyCost, on_demand: StudyCost, *,
             chance: float | None = None, floor: float | None = None) -> StudyFindings:
    """The numbers a notebook's sentences about a study need, from its records and costs. With
    `chance` (the metric of guessing), whether its best trial got under `LEARNED_BELOW` ×
    chance; `floor`: the best loss the data allows (`synthetic.best_possible_loss`)."""
    best = summary.best
    learned = None if best is None else chance is None or best.metric < LEARNED_BELOW * chance
    finished = sorted(r.metric for r in records if r.state == "SUCCEEDED" and r.metric is not None)
    stopped = [r for r in records if r.early_stopped]
    return StudyFindings(len(records), best, chance, learned, finished[0] if finished else None,
                         finished[-1] if finished else None, len(finished), floor, len(stopped),
                         sum(r.seconds for r in stopped), spot.total_usd, on_demand.total_usd)


def values_text(parameters: Mapping[str, Any]) -> str:
    """A trial's values as ``lr=1.00e-03, batch_size=32``."""
    return ", ".join(f"{k}={_fmt(v)}" for k, v in parameters.items())


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value and (abs(value) < 1e-2 or abs(value) >= 1e4):
        return f"{value:.2e}"
    return f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


@dataclass(frozen=True)
class Submission:
    """Where `submit_or_preview` sent a study's request, and what was received."""

    job: str | None = None  # the job's resource name on Vertex, when it was submitted
    not_sent: str = ""  # why nothing was sent anywhere (the client library is not installed)
    placeholder: str | None = None  # the spec field still holding a placeholder, when one does
    # What the local stand-in of the Vertex JobService received, and the job's state after polling:
    display_name: str = ""
    trials: int = 0
    parallel: int = 0
    metric: str = ""
    goal: str = ""
    state: str = ""

    @property
    def to_stand_in(self) -> bool:
        return self.job is None and not self.not_sent


def submit_or_preview(spec: Mapping[str, Any], display_name: str) -> Submission:
    """Submit `spec` (a `vertex.tuning_job` dict) when this environment can (project, region,
    bucket, credentials) and no field holds a placeholder; otherwise send the same request to a
    local stand-in of the Vertex JobService (`labkit.vertex.fake_service.FakeVertex`, with a
    stand-in bucket) and return what it received."""
    from labkit import vertex
    from labkit.core import frameworks
    from labkit.vertex.fake_service import FakeVertex

    if not frameworks.has_aiplatform():  # neither submitted nor sent: the client is what sends it
        return Submission(not_sent=frameworks.missing_reason("google.cloud.aiplatform")
                          .replace("its column", "the submission"))
    placeholder = vertex.submission_placeholder(spec)
    if vertex.preflight().ready and placeholder is None:
        return Submission(job=vertex.submit(spec, display_name=display_name).name)
    with FakeVertex() as fake:
        job = vertex.submit(vertex.with_bucket(spec, "labkit-local"), display_name=display_name,
                            project="labkit-local", region="us-central1", bucket="gs://labkit-local",
                            endpoint=fake.endpoint)
        arrived = fake.created("hyperparameterTuningJobs")[0]
        final = vertex.wait(job.name, poll_s=0, timeout_s=30, endpoint=fake.endpoint)
    metric = arrived["study_spec"]["metrics"][0]
    return Submission(placeholder=placeholder, display_name=arrived["display_name"],
                      trials=int(arrived["max_trial_count"]), parallel=int(arrived["parallel_trial_count"]),
                      metric=metric["metric_id"], goal=str(metric["goal"]), state=final.state.name)


@dataclass(frozen=True)
class RangeEdge:
    """A tuned value of the best trial in the outer `EDGE_SHARE` of its searched range, on the
    range's own scale: the optimum may lie beyond it."""

    name: str
    value: float
    low: float
    high: float
    position: float  # where the value lies in the range on its own scale: 0 at `low`, 1 at `high`

    @property
    def side(self) -> str:
        return "top" if self.position > 0.5 else "bottom"


def range_edges(best: TrialRecord | None, ranges: Mapping[str, tuple]) -> list[RangeEdge]:
    """Each tuned range (``("linear"|"log", low, high)``) whose best value lies in its outer
    `EDGE_SHARE`, on the range's own scale; [] without a best trial."""
    out = []
    for name, (kind, low, high) in ranges.items() if best is not None else ():
        value = best.parameters.get(name)
        if value is None:
            continue
        scale = math.log if kind == "log" else float
        where = (scale(value) - scale(low)) / (scale(high) - scale(low))
        if min(where, 1 - where) < EDGE_SHARE:
            out.append(RangeEdge(name, float(value), float(low), float(high), where))
    return out


@dataclass(frozen=True)
class TpeShare:
    """How much of a study Optuna's TPE guided: its first `startup` trials are random."""

    trials: int
    startup: int  # `tpe_startup_trials()`

    @property
    def guided(self) -> int:
        """The trials TPE suggested from its model (0: the study was a random search)."""
        return max(0, self.trials - self.startup)


def tpe_share(trials: int) -> TpeShare:
    """`trials` split into TPE's random start-up and the trials it guided."""
    return TpeShare(trials, tpe_startup_trials())


def confirm_top(base: Any, records: Sequence[TrialRecord], *, metric: str, goal: str, output_uri: str,
                workdir: str | Path, seeds: Sequence[int] = (1, 2), top: int = 2,
                env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Re-run the `top` finished trials with other `seeds`, each as a small grid study over
    ``seed`` with the trial's values fixed (what you would submit to Vertex to check a winner),
    and return one row per trial: its values, the metric of every seed (the study's own run
    first), their median and range."""
    ranked = sorted((r for r in records if r.state == "SUCCEEDED" and r.metric is not None),
                    key=lambda r: r.metric, reverse=goal == "maximize")[:top]
    rows = []
    for r in ranked:
        fixed = replace(base, **r.parameters)
        spec = tuning_job(fixed, output_uri=f"{output_uri.rstrip('/')}/confirm-{r.trial_id}", metric=metric,
                          goal=goal, parameters={"seed": list(seeds)}, max_trial_count=len(seeds),
                          parallel_trial_count=min(2, len(seeds)), algorithm="GRID_SEARCH", early_stopping=False)
        again = run_local_tuning(spec, Path(workdir) / f"confirm-{r.trial_id}", env=env)
        values = [r.metric] + [a.metric for a in again if a.metric is not None]
        spread = stats.Spread(values)
        rows.append({"trial": r.trial_id, "values": values_text(r.parameters),
                     "seeds": ", ".join(str(x) for x in (base.seed, *seeds)), "metrics": values,
                     "median": spread.median, "range": spread.range_text(4)})
    return rows


def top_comparison(rows: Sequence[Mapping[str, Any]], goal: str) -> stats.Comparison | None:
    """The study's best trial (a) against its runner-up (b) over their seeds."""
    if len(rows) < 2:
        return None
    return stats.compare(rows[0]["metrics"], rows[1]["metrics"], higher_is_better=goal == "maximize")


@dataclass(frozen=True)
class Confirmation:
    """The study's best trial re-run with other seeds against its runner-up (`confirm_top`'s
    first two rows)."""

    best: Mapping[str, Any]
    runner_up: Mapping[str, Any]
    seeds: int  # runs of each, the study's own included
    # The best trial against the runner-up over the seeds (`stats.compare`): "better" or
    # "worse" only when it was so on every seed (their ranges do not overlap), else
    # `stats.NO_DIFFERENCE`.
    verdict: str


def confirmation(rows: Sequence[Mapping[str, Any]], comparison: stats.Comparison | None) -> Confirmation | None:
    """What the re-runs say about the study's winner (`top_comparison`'s `comparison` of
    `rows[0]` against `rows[1]`); None when fewer than two trials finished."""
    if comparison is None:
        return None
    verdict = {"a": "better", "b": "worse", None: stats.NO_DIFFERENCE}[comparison.winner]
    return Confirmation(rows[0], rows[1], len(rows[0]["metrics"]), verdict)
