"""Notebook 11's presentation of a hyperparameter study: the metric against each tuned value,
the study's cost on Spot against on-demand, and sentences computed from the trial records that
`labkit.vertex.run_local_tuning` returns."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
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


def conclusions(summary: StudySummary, records: Sequence[TrialRecord], spot: StudyCost,
                on_demand: StudyCost, parameters: Mapping[str, Any], *,
                chance: float | None = None, floor: float | None = None) -> list[str]:
    """Sentences from this study's records and costs (nothing typed in). With `chance` (the
    metric of guessing: a loss metric's ln classes), a study whose best trial did not get under
    `LEARNED_BELOW` × chance names no best configuration: its ranking is noise. With `floor` (the
    best loss the data allows, `synthetic.best_possible_loss`), the best trial is placed between
    the two."""
    out = []
    best = summary.best
    if best is None:
        out.append("No trial finished, so the study has no best configuration.")
    elif chance is not None and best.metric >= LEARNED_BELOW * chance:
        out.append(f"No trial learned: the best metric, {best.metric:.4g}, is not under {LEARNED_BELOW:g} × "
                   f"chance ({chance:.4f}), so the ranking of these trials is noise and names no best "
                   f"configuration. Give the trials more steps.")
    else:
        values = ", ".join(f"{k}={_fmt(v)}" for k, v in best.parameters.items())
        against = f" (chance {chance:.4f})" if chance is not None else ""
        out.append(f"Best of {len(records)} trials: trial {best.trial_id} ({values}), metric "
                   f"{best.metric:.4g}{against} at its last report.")
        finished = sorted(r.metric for r in records if r.state == "SUCCEEDED" and r.metric is not None)
        if len(finished) > 1:
            spread = (finished[-1] - finished[0]) / abs(finished[0]) if finished[0] else math.inf
            out.append(f"The finished trials ended between {finished[0]:.4f} and {finished[-1]:.4f} "
                       f"({spread:.1%} apart): that is how much {', '.join(parameters)} moved the "
                       f"metric in runs this short.")
        if floor is not None and chance is not None:
            out.append(f"No model can score below {floor:.3f} on this data (a share of the training "
                       f"labels are random): the best trial ended {best.metric - floor:.3f} above that "
                       f"floor and {chance - best.metric:.3f} below chance.")
    stopped = [r for r in records if r.early_stopped]
    if stopped:
        saved = sum(r.seconds for r in stopped)
        out.append(f"{len(stopped)} trial(s) were stopped early by the median rule after {saved:.0f} s "
                   f"in all, instead of running to the end.")
    if on_demand.total_usd > 0:
        out.append(f"On Spot the study's trial time costs ${spot.total_usd:,.4f} instead of "
                   f"${on_demand.total_usd:,.4f} on demand ({1 - spot.total_usd / on_demand.total_usd:.0%} "
                   f"less), at the trial machine's catalog prices, for the trial times measured here.")
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value and (abs(value) < 1e-2 or abs(value) >= 1e4):
        return f"{value:.2e}"
    return f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def submit_or_preview(spec: Mapping[str, Any], display_name: str) -> str:
    """Submit `spec` (a `vertex.tuning_job` dict) when this environment can (project, region,
    bucket, credentials); otherwise send the same request to a local stand-in of the Vertex
    JobService (`labkit.vertex.fake_service.FakeVertex`) and say what it received. Returns one
    line either way."""
    from labkit import vertex
    from labkit.core import frameworks
    from labkit.vertex.fake_service import FakeVertex

    if not frameworks.has_aiplatform():  # neither submitted nor sent: the client is what sends it
        return frameworks.missing_reason("google.cloud.aiplatform").replace("its column", "the submission")
    placeholder = vertex.submission_placeholder(spec)
    if vertex.preflight().ready and placeholder is None:
        return f"submitted: {vertex.submit(spec, display_name=display_name).name}"
    with FakeVertex() as fake:
        job = vertex.submit(vertex.with_bucket(spec, "labkit-local"), display_name=display_name,
                            project="labkit-local", region="us-central1", bucket="gs://labkit-local",
                            endpoint=fake.endpoint)
        arrived = fake.created("hyperparameterTuningJobs")[0]
        final = vertex.wait(job.name, poll_s=0, timeout_s=30, endpoint=fake.endpoint)
    metric = arrived["study_spec"]["metrics"][0]
    why = ("not configured to submit" if placeholder is None else
           f"{placeholder} still holds a placeholder (set output_uri to a bucket of yours to submit; the "
           f"stand-in got gs://labkit-local there)")
    return (f"{why}, so the request went to a local stand-in of the Vertex "
            f"JobService, which received {arrived['display_name']!r}: {int(arrived['max_trial_count'])} "
            f"trials, {int(arrived['parallel_trial_count'])} in parallel, metric {metric['metric_id']} "
            f"({metric['goal']}); state after polling: {final.state.name}")


def edge_notes(best: TrialRecord | None, ranges: Mapping[str, tuple]) -> list[str]:
    """A sentence for each tuned range (``("linear"|"log", low, high)``) whose best value lies in
    its outer tenth, on the range's own scale: the optimum may lie outside what was searched."""
    out = []
    for name, (kind, low, high) in ranges.items() if best is not None else ():
        value = best.parameters.get(name)
        if value is None:
            continue
        scale = math.log if kind == "log" else float
        where = (scale(value) - scale(low)) / (scale(high) - scale(low))
        if min(where, 1 - where) < EDGE_SHARE:
            side = "top" if where > 0.5 else "bottom"
            out.append(f"The best {name}, {_fmt(value)}, sits at the {side} edge of the range searched "
                       f"({_fmt(low)} to {_fmt(high)}): the optimum may lie beyond it, so widen the range "
                       f"past that edge before trusting this value.")
    return out


def search_note(trials: int) -> str:
    """How much of the study TPE guided: its first `tpe_startup_trials()` are random."""
    startup = tpe_startup_trials()
    if trials <= startup:
        return (f"All {trials} trials were TPE's random start-up trials (it guides the search from trial "
                f"{startup + 1} on): at this size the study is a random search.")
    return f"TPE suggested {trials - startup} of the {trials} trials; the first {startup} were random."


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
        rows.append({"trial": r.trial_id, "values": ", ".join(f"{k}={_fmt(v)}" for k, v in r.parameters.items()),
                     "seeds": ", ".join(str(x) for x in (base.seed, *seeds)), "metrics": values,
                     "median": spread.median, "range": spread.range_text(4)})
    return rows


def top_comparison(rows: Sequence[Mapping[str, Any]], goal: str) -> stats.Comparison | None:
    """The study's best trial (a) against its runner-up (b) over their seeds."""
    if len(rows) < 2:
        return None
    return stats.compare(rows[0]["metrics"], rows[1]["metrics"], higher_is_better=goal == "maximize")


def confirmation_sentence(rows: Sequence[Mapping[str, Any]], comparison: stats.Comparison | None) -> str:
    """What the re-runs say about the study's winner."""
    if comparison is None:
        return "Fewer than two trials finished: there is no runner-up to check the winner against."
    best, second = rows[0], rows[1]
    seeds = len(best["metrics"])
    if comparison.winner == "a":
        return (f"Trial {best['trial']} stays best on every one of {seeds} seeds ({best['range']} against "
                f"{second['range']}): the study's winner holds.")
    if comparison.winner == "b":
        return (f"Re-run with other seeds, trial {second['trial']} beats trial {best['trial']} on every seed "
                f"({second['range']} against {best['range']}): the study's ranking was one seed's luck.")
    return (f"Across {seeds} seeds trials {best['trial']} ({best['range']}) and {second['trial']} "
            f"({second['range']}) overlap: {stats.NO_DIFFERENCE}, so the study names no single winner "
            f"between them.")

