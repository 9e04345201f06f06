import json

import pytest

from labkit.core.metrics import MetricsLog, StepMetrics, load_metrics, summarize


def test_metrics_file_schema_and_summary(tmp_path):
    log = MetricsLog({"framework": "torch", "model": "cnn"})
    for i, loss in enumerate([2.0, 1.5, 1.0]):
        log.append(StepMetrics(step=i, loss=loss, step_time_s=0.1 * (i + 1), samples_per_s=100.0,
                               extra={"grad_norm": 1.0}))
    path = log.write(tmp_path / "m" / "metrics.json")
    data = load_metrics(path)
    assert [s["step"] for s in data["steps"]] == [0, 1, 2]
    assert data["steps"][0] == {"step": 0, "loss": 2.0, "step_time_s": 0.1, "samples_per_s": 100.0,
                                "skipped": False, "grad_norm": 1.0}
    assert data["summary"]["final_loss"] == 1.0
    assert data["summary"]["median_step_time_s"] == pytest.approx(0.25)  # steps 1, 2 after warm-up
    assert not list(path.parent.glob(".*.tmp"))


def test_summarize_empty_and_single():
    assert summarize([]) == {"num_steps": 0}
    assert summarize([{"step": 0, "loss": 1.0, "step_time_s": 2.0}])["median_step_time_s"] == 2.0


def test_load_metrics_names_the_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not a metrics JSON"):
        load_metrics(bad)
    bad.write_text(json.dumps({"loss": 1}))
    with pytest.raises(ValueError, match="'steps' list"):
        load_metrics(bad)


def test_append_returns_the_row_it_wrote_with_unset_fields_left_out():
    log = MetricsLog()
    row = log.append(StepMetrics(step=0, loss=1.0, lr=0.1, extra={"grad_norm": 2.0}))
    assert row is log.steps[0]
    assert row == {"step": 0, "loss": 1.0, "lr": 0.1, "skipped": False, "grad_norm": 2.0}


def test_a_resumed_log_continues_the_earlier_file_without_repeating_steps(tmp_path):
    earlier = MetricsLog()
    for step in range(8):  # the attempt ran 8 steps; its checkpoint holds 6
        earlier.append(StepMetrics(step, float(step)))
    earlier.write(tmp_path / "m.json")
    resumed = MetricsLog()
    assert resumed.continue_from(tmp_path / "m.json", 6) == 6
    resumed.append(StepMetrics(6, 60.0))
    assert [s["step"] for s in resumed.steps] == [0, 1, 2, 3, 4, 5, 6] and resumed.steps[-1]["loss"] == 60.0
    assert MetricsLog().continue_from(tmp_path / "none.json", 6) == 0
    (tmp_path / "notes.json").write_text("not metrics")
    assert MetricsLog().continue_from(tmp_path / "notes.json", 6) == 0


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path):
    log = MetricsLog(run={"bad": object()})  # not JSON: the write fails half way
    with pytest.raises(TypeError):
        log.write(tmp_path / "m.json")
    assert list(tmp_path.iterdir()) == []


def test_learned_compares_the_held_out_loss_with_chance():
    from labkit.core.metrics import learned

    run = {"heldout": {"loss": 1.0, "samples": 256, "chance": 2.302585}}
    assert learned({"run": run}) is True
    flat = {"run": {"heldout": {"loss": 2.29, "samples": 256, "chance": 2.302585}}, "steps": []}
    assert learned(flat) is False
    assert learned({"run": {}}) is None


def test_the_summary_holds_the_latest_held_out_loss():
    from labkit.core.metrics import summarize

    rows = [{"step": 0, "loss": 2.3}, {"step": 1, "loss": 2.0, "heldout_loss": 2.1},
            {"step": 2, "loss": 1.5, "heldout_loss": 1.4}]
    assert summarize(rows)["heldout_loss"] == 1.4
    assert "heldout_loss" not in summarize(rows[:1])


def test_a_metrics_path_through_a_symlink_writes_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "runs").mkdir()
    link = tmp_path / "latest.json"
    link.symlink_to(tmp_path / "runs" / "metrics.json")  # dangling until the first write
    log = MetricsLog({"framework": "torch"})
    log.append(StepMetrics(step=0, loss=1.0, step_time_s=0.1, samples_per_s=10.0))
    assert log.write(link) == link
    assert link.is_symlink() and load_metrics(tmp_path / "runs" / "metrics.json")["steps"][0]["loss"] == 1.0
    log.append(StepMetrics(step=1, loss=0.5, step_time_s=0.1, samples_per_s=10.0))
    log.write(link)
    assert link.is_symlink() and len(load_metrics(link)["steps"]) == 2


def test_a_metrics_file_at_a_cloud_storage_address_is_refused_before_training(tmp_path, monkeypatch):
    """`Path("gs://b/m.json")` is the local folder `gs:`: the file is named through the mount."""
    from labkit.core.config import ParameterError
    from labkit.core.outputs import check_run_outputs
    from labkit.core.train_config import TrainConfig

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParameterError, match=r"'metrics_out' is a Cloud Storage address.*/gcs/my-bucket/m\.json"):
        check_run_outputs(TrainConfig(metrics_out="gs://my-bucket/m.json"))
    assert not (tmp_path / "gs:").exists()
