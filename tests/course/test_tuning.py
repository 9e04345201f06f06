"""Notebook 11's reading of a study: the numbers and verdicts its sentences are written from, and
the cost rows, all computed from trial records."""

from __future__ import annotations

import math

import pytest

from labkit.course import tuning
from labkit.vertex.tuning import StudyCost, TrialRecord, study_summary


def _records():
    return [TrialRecord("1", {"lr": 1e-3, "batch_size": 32.0}, 2.10, "SUCCEEDED", 10.0),
            TrialRecord("2", {"lr": 3e-2, "batch_size": 16.0}, 2.60, "STOPPED", 4.0),
            TrialRecord("3", {"lr": 3e-4, "batch_size": 64.0}, 2.31, "SUCCEEDED", 12.0)]


def _cost(spot: bool, rate: float) -> StudyCost:
    hours = 26.0 / 3600
    return StudyCost(spot, rate, hours, hours * rate, {}, [], [])


def _findings(records, **kw):
    return tuning.findings(study_summary(records), records, _cost(True, 0.2), _cost(False, 0.5), **kw)


def test_findings_come_from_the_records_and_prices():
    found = _findings(_records())
    assert found.trials == 3 and found.best.trial_id == "1" and found.learned is True  # no chance: not judged
    assert tuning.values_text(found.best.parameters) == "lr=1.00e-03, batch_size=32"
    assert (found.finished, found.finished_low, found.finished_high) == (2, 2.10, 2.31)
    assert found.finished_spread == pytest.approx(0.1)
    assert (found.stopped, found.stopped_seconds) == (1, 4.0)
    assert found.spot_saving == pytest.approx(0.6)
    assert found.above_floor is None and found.below_chance is None and found.learned_below is None


def test_a_study_in_which_no_trial_learned_names_no_best_configuration():
    flat = _findings(_records(), chance=2.302585)
    assert flat.learned is False and flat.learned_below == pytest.approx(0.8 * 2.302585)
    learned = _findings(_records(), chance=6.0, floor=0.5)
    assert learned.learned is True and learned.best.trial_id == "1"
    assert learned.above_floor == pytest.approx(1.6) and learned.below_chance == pytest.approx(3.9)


def test_a_study_with_no_finished_trial_has_no_best():
    found = _findings([TrialRecord("1", {"lr": 1e-3}, None, "FAILED", 1.0)], chance=2.3)
    assert found.best is None and found.learned is None and found.finished == 0
    assert found.finished_spread is None and found.stopped == 0


def test_spot_saving_needs_an_on_demand_price():
    records = _records()
    free = tuning.findings(study_summary(records), records, _cost(True, 0.0), _cost(False, 0.0))
    assert free.spot_saving is None


def test_cost_rows_and_plot(tmp_path):
    rows = tuning.cost_rows(_cost(True, 0.2), _cost(False, 0.5))
    assert [r["pricing"] for r in rows] == ["on-demand", "Spot"]
    fig = tuning.plot_study(_records(), "lr", path=tmp_path / "study.png")
    assert (tmp_path / "study.png").stat().st_size > 0 and len(fig.axes[0].collections) == 2


def test_without_a_cloud_the_request_goes_to_the_local_stand_in(monkeypatch, tmp_path):
    from labkit import vertex
    from labkit.core.train_config import TrainConfig

    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud configuration
    for name in ("GOOGLE_CLOUD_PROJECT", "GOOGLE_CLOUD_REGION", "LABKIT_BUCKET", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    spec = vertex.tuning_job(TrainConfig(steps=3), output_uri="gs://bkt/s", metric="loss", goal="minimize",
                             parameters={"lr": ("log", 1e-4, 1e-2)}, max_trial_count=3, parallel_trial_count=1)
    sent = tuning.submit_or_preview(spec, "t")
    assert sent.to_stand_in and sent.job is None and sent.placeholder is None
    assert (sent.display_name, sent.trials, sent.parallel, sent.metric) == ("t", 3, 1, "loss")
    assert sent.goal == "MINIMIZE" and sent.state == "JOB_STATE_SUCCEEDED"


def test_a_placeholder_bucket_is_never_submitted_even_with_a_cloud(monkeypatch, tmp_path):
    """Notebook 11's default output_uri is gs://YOUR_BUCKET/...: with a project, region and
    credentials configured it would otherwise be submitted, and fail on the service."""
    from labkit import vertex
    from labkit.core.train_config import TrainConfig

    monkeypatch.setattr(vertex, "preflight", lambda *a, **k: type("Ready", (), {"ready": True})())
    monkeypatch.setattr(vertex, "submit", _refuse_real_submissions(vertex.submit))
    spec = vertex.tuning_job(TrainConfig(steps=3), output_uri="gs://YOUR_BUCKET/s", metric="loss", goal="minimize",
                             parameters={"lr": ("log", 1e-4, 1e-2)}, max_trial_count=2, parallel_trial_count=1)
    sent = tuning.submit_or_preview(spec, "t")
    assert sent.to_stand_in and sent.placeholder == "output_uri" and sent.trials == 2


def _refuse_real_submissions(submit):
    def only_local(spec, **kw):
        assert kw.get("endpoint", "").startswith("http://127.0.0.1"), "a real submission was attempted"
        assert vertex_placeholder_free(spec)
        return submit(spec, **kw)
    return only_local


def vertex_placeholder_free(spec) -> bool:
    from labkit import vertex

    return vertex.submission_placeholder(spec) is None


def test_a_best_value_at_the_edge_of_its_range_is_flagged_on_the_ranges_own_scale():
    def best(lr):
        return TrialRecord("1", {"lr": lr, "batch_size": 32.0}, 2.0, "SUCCEEDED", 1.0)

    ranges = {"lr": ("log", 1e-4, 3e-2)}
    [top] = tuning.range_edges(best(2.9e-2), ranges)
    assert (top.name, top.value, top.low, top.high, top.side) == ("lr", 2.9e-2, 1e-4, 3e-2, "top")
    assert top.position == pytest.approx(math.log(2.9e-2 / 1e-4) / math.log(3e-2 / 1e-4))
    assert tuning.range_edges(best(1.2e-4), ranges)[0].side == "bottom"
    assert tuning.range_edges(best(2e-3), ranges) == []  # mid-range on a log scale
    assert tuning.range_edges(best(0.05), {"lr": ("linear", 0.0, 0.1)}) == []
    assert tuning.range_edges(best(0.095), {"lr": ("linear", 0.0, 0.1)})[0].side == "top"
    assert tuning.range_edges(None, ranges) == []


def test_the_tpe_share_counts_its_random_start_up():
    from labkit.vertex.tuning import tpe_startup_trials

    startup = tpe_startup_trials()
    assert tuning.tpe_share(startup).guided == 0  # a random search
    share = tuning.tpe_share(startup + 5)
    assert (share.trials, share.startup, share.guided) == (startup + 5, startup, 5)


def _confirmed(a, b):
    return [{"trial": "3", "metrics": a, "range": "x"}, {"trial": "7", "metrics": b, "range": "y"}]


def test_a_winner_is_named_only_when_it_holds_on_every_seed():
    from labkit.core import stats

    holds = _confirmed([1.0, 1.01, 1.02], [1.2, 1.21, 1.19])
    held = tuning.confirmation(holds, tuning.top_comparison(holds, "minimize"))
    assert held.verdict == "better" and held.seeds == 3
    assert (held.best["trial"], held.runner_up["trial"]) == ("3", "7")
    luck = _confirmed([1.0, 1.3, 1.31], [1.1, 1.12, 1.11])
    assert tuning.confirmation(luck, tuning.top_comparison(luck, "minimize")).verdict == stats.NO_DIFFERENCE
    flipped = _confirmed([1.3, 1.31, 1.32], [1.1, 1.12, 1.11])
    assert tuning.confirmation(flipped, tuning.top_comparison(flipped, "minimize")).verdict == "worse"
    assert tuning.top_comparison(holds[:1], "minimize") is None
    assert tuning.confirmation(holds[:1], None) is None


def test_the_planned_full_study_leaves_tpes_start_up():
    from labkit.course import sizing
    from labkit.vertex.tuning import tpe_startup_trials

    assert sizing.plan("11_hyperparameter_tuning", "full")["trials"] > tpe_startup_trials()
