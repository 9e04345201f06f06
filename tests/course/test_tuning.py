"""Notebook 11's presentation of a study: sentences and cost rows computed from trial records."""

from __future__ import annotations

from labkit.course import tuning
from labkit.vertex.tuning import StudyCost, TrialRecord, study_summary


def _records():
    return [TrialRecord("1", {"lr": 1e-3, "batch_size": 32.0}, 2.10, "SUCCEEDED", 10.0),
            TrialRecord("2", {"lr": 3e-2, "batch_size": 16.0}, 2.60, "STOPPED", 4.0),
            TrialRecord("3", {"lr": 3e-4, "batch_size": 64.0}, 2.31, "SUCCEEDED", 12.0)]


def _cost(spot: bool, rate: float) -> StudyCost:
    hours = 26.0 / 3600
    return StudyCost(spot, rate, hours, hours * rate, {}, [], [])


def test_conclusions_come_from_the_records_and_prices():
    records = _records()
    text = "\n".join(tuning.conclusions(study_summary(records), records, _cost(True, 0.2), _cost(False, 0.5),
                                        ["lr", "batch_size"]))
    assert "trial 1 (lr=1.00e-03, batch_size=32)" in text and "2.1000" in text
    assert "between 2.1000 and 2.3100 (10.0% apart)" in text
    assert "1 trial(s) were stopped early" in text and "after 4 s" in text
    assert "(60% less)" in text


def test_a_study_in_which_no_trial_learned_names_no_best_configuration():
    records = _records()
    flat = tuning.conclusions(study_summary(records), records, _cost(True, 0.2), _cost(False, 0.5),
                              ["lr", "batch_size"], chance=2.302585)
    assert "No trial learned" in flat[0] and "lr=1.00e-03" not in " ".join(flat)
    learned = tuning.conclusions(study_summary(records), records, _cost(True, 0.2), _cost(False, 0.5),
                                 ["lr", "batch_size"], chance=6.0)
    assert "trial 1 (lr=1.00e-03" in learned[0] and "chance 6.0000" in learned[0]
    placed = tuning.conclusions(study_summary(records), records, _cost(True, 0.2), _cost(False, 0.5),
                                ["lr", "batch_size"], chance=6.0, floor=0.5)
    assert "ended 1.600 above that floor and 3.900 below chance" in " ".join(placed)
    assert not any("floor" in line for line in flat + learned)


def test_a_study_with_no_finished_trial_says_so():
    records = [TrialRecord("1", {"lr": 1e-3}, None, "FAILED", 1.0)]
    text = tuning.conclusions(study_summary(records), records, _cost(True, 0.2), _cost(False, 0.5), ["lr"])
    assert "finished" in text[0] and "1.00e-03" not in " ".join(text)  # no best configuration named


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
    line = tuning.submit_or_preview(spec, "t")
    assert "local stand-in" in line and "3 trials, 1 in parallel" in line and "JOB_STATE_SUCCEEDED" in line


def test_a_placeholder_bucket_is_never_submitted_even_with_a_cloud(monkeypatch, tmp_path):
    """Notebook 11's default output_uri is gs://YOUR_BUCKET/...: with a project, region and
    credentials configured it would otherwise be submitted, and fail on the service."""
    from labkit import vertex
    from labkit.core.train_config import TrainConfig

    monkeypatch.setattr(vertex, "preflight", lambda *a, **k: type("Ready", (), {"ready": True})())
    monkeypatch.setattr(vertex, "submit", _refuse_real_submissions(vertex.submit))
    spec = vertex.tuning_job(TrainConfig(steps=3), output_uri="gs://YOUR_BUCKET/s", metric="loss", goal="minimize",
                             parameters={"lr": ("log", 1e-4, 1e-2)}, max_trial_count=2, parallel_trial_count=1)
    line = tuning.submit_or_preview(spec, "t")
    assert line.startswith("output_uri still holds a placeholder") and "local stand-in" in line


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
    assert "top edge" in tuning.edge_notes(best(2.9e-2), ranges)[0]
    assert "bottom edge" in tuning.edge_notes(best(1.2e-4), ranges)[0]
    assert tuning.edge_notes(best(2e-3), ranges) == []  # mid-range on a log scale
    assert tuning.edge_notes(best(0.05), {"lr": ("linear", 0.0, 0.1)}) == []
    assert tuning.edge_notes(None, ranges) == []


def test_the_search_note_counts_tpes_random_start_up():
    from labkit.vertex.tuning import tpe_startup_trials

    startup = tpe_startup_trials()
    assert "random search" in tuning.search_note(startup)
    assert tuning.search_note(startup + 5).startswith(f"TPE suggested 5 of the {startup + 5} trials")


def _confirmed(a, b):
    return [{"trial": "3", "metrics": a, "range": "x"}, {"trial": "7", "metrics": b, "range": "y"}]


def test_a_winner_is_named_only_when_it_holds_on_every_seed():
    from labkit.core import stats

    holds = _confirmed([1.0, 1.01, 1.02], [1.2, 1.21, 1.19])
    cmp = tuning.top_comparison(holds, "minimize")
    assert cmp.winner == "a" and "stays best on every one of 3 seeds" in tuning.confirmation_sentence(holds, cmp)
    luck = _confirmed([1.0, 1.3, 1.31], [1.1, 1.12, 1.11])
    assert stats.NO_DIFFERENCE in tuning.confirmation_sentence(luck, tuning.top_comparison(luck, "minimize"))
    flipped = _confirmed([1.3, 1.31, 1.32], [1.1, 1.12, 1.11])
    assert "one seed's luck" in tuning.confirmation_sentence(flipped, tuning.top_comparison(flipped, "minimize"))
    assert tuning.top_comparison(holds[:1], "minimize") is None


def test_the_planned_full_study_leaves_tpes_start_up():
    from labkit.course import sizing
    from labkit.vertex.tuning import tpe_startup_trials

    assert sizing.plan("11_hyperparameter_tuning", "full")["trials"] > tpe_startup_trials()
