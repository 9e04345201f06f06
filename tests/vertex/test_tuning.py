"""Contract 9: hyperparameter tuning. The HyperparameterTuningJob spec is accepted by
aiplatform_v1, trials get their values as `labkit train` flags, and the study runs here through
the emulator with Optuna, stopping trials early by the median rule."""

from __future__ import annotations

import json
import sys

import pytest

from labkit import vertex
from labkit.core.config import ParameterError
from labkit.core.train_config import TrainConfig, from_argv
from labkit.vertex import specs
from labkit.vertex.tuning import StudyCost, TrialRecord, trial_spec

OUT = "gs://bkt/study"
BASE = {"model": "cnn", "steps": 6, "checkpoint_every": 2, "batch_size": 16, "progress": False}
PARAMS = {"lr": ("log", 1e-4, 1e-1), "batch_size": [16, 32], "warmup_steps": ("linear", 0, 4),
          "precision": ["fp32", "bf16"]}


def job(**kw):
    options = dict(output_uri=OUT, metric="loss", goal="minimize", parameters=PARAMS,
                   max_trial_count=6, parallel_trial_count=2) | kw
    return vertex.tuning_job(BASE, **options)


def test_tuning_job_is_accepted_by_aiplatform():
    types = pytest.importorskip("google.cloud.aiplatform_v1.types")
    spec = job(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4", accelerator_count=1, spot=True)
    message = types.HyperparameterTuningJob(**spec)
    assert message.max_trial_count == 6 and message.parallel_trial_count == 2
    study = types.HyperparameterTuningJob.to_dict(message, use_integers_for_enums=False)["study_spec"]
    assert study["metrics"] == [{"metric_id": "loss", "goal": "MINIMIZE", "safety_config": None}] or \
        study["metrics"][0]["goal"] == "MINIMIZE"
    by_id = {p["parameter_id"]: p for p in study["parameters"]}
    assert by_id["lr"]["double_value_spec"]["min_value"] == 1e-4 and by_id["lr"]["scale_type"] == "UNIT_LOG_SCALE"
    assert by_id["batch-size"]["discrete_value_spec"]["values"] == [16.0, 32.0]
    assert by_id["warmup-steps"]["integer_value_spec"]["max_value"] == "4"  # int64 as a string
    assert by_id["precision"]["categorical_value_spec"]["values"] == ["fp32", "bf16"]
    assert "median_automated_stopping_spec" in study
    assert message.trial_job_spec.scheduling.strategy == types.Scheduling.Strategy.SPOT
    assert vertex.validate_tuning_job(spec) == message


def test_trials_get_their_values_as_labkit_train_flags():
    spec = job()
    args = spec["trial_job_spec"]["worker_pool_specs"][0]["container_spec"]["args"]
    assert args[:5] == ["python", "-m", "labkit.vertex.trial", "--tuning-metric", "loss"]
    assert "--checkpoint-dir" not in args  # each trial checkpoints in its own AIP_CHECKPOINT_DIR
    one = trial_spec(spec, "3", {"lr": 0.003, "batch-size": 32.0, "warmup-steps": 2, "precision": "bf16"})
    trial_args = one["worker_pool_specs"][0]["container_spec"]["args"]
    # As the service writes them: a DISCRETE value is a double, an INTEGER one an integer.
    assert trial_args[-4:] == ["--lr=0.003", "--batch-size=32.0", "--warmup-steps=2", "--precision=bf16"]
    assert one["base_output_directory"]["output_uri_prefix"] == f"{OUT}/3"
    cfg = from_argv(trial_args[5:])  # what `labkit train` makes of them
    assert (cfg.lr, cfg.batch_size, cfg.warmup_steps, cfg.precision, cfg.steps) == (0.003, 32, 2, "bf16", 6)


@pytest.mark.parametrize("parameters,name,words", [
    ({"learning_rate": ("log", 1e-4, 1e-1)}, "parameters['learning_rate']", "not a labkit train flag"),
    ({"compile": [True, False]}, "parameters['compile']", "on/off switch"),
    ({"batch_size": ("linear", 8.0, 64.0)}, "parameters['batch_size']", "takes integers"),
    ({"batch_size": [0, 16]}, "parameters['batch_size']", "batch_size"),
    ({"lr": ["high", "low"]}, "parameters['lr']", "not strings"),
    ({"lr": ("log", 0.0, 1.0)}, "parameters['lr']", "low > 0"),
    ({"lr": ("cubic", 1e-4, 1e-1)}, "parameters['lr']", "non-empty list of numbers"),
    ({"checkpoint_dir": ["/a", "/b"]}, "parameters['checkpoint_dir']", "output location"),
])
def test_bad_parameters_are_refused_naming_them(parameters, name, words):
    with pytest.raises(ParameterError, match=words) as err:
        job(parameters=parameters)
    assert err.value.name == name


@pytest.mark.parametrize("kw,name", [
    ({"metric": "accuracy"}, "metric"), ({"goal": "lowest"}, "goal"),
    ({"algorithm": "GRID_SEARCH"}, "algorithm"),  # lr is a DOUBLE range: no grid
    ({"parallel_trial_count": 7}, "parallel_trial_count"), ({"parameters": {}}, "parameters"),
])
def test_bad_study_settings_are_refused(kw, name):
    with pytest.raises(ParameterError) as err:
        job(**kw)
    assert err.value.name == name


def _records():
    return [TrialRecord("1", {"lr": 0.01}, 0.5, "SUCCEEDED", 30.0),
            TrialRecord("2", {"lr": 0.001}, 0.3, "SUCCEEDED", 30.0),
            TrialRecord("3", {"lr": 0.3}, 2.0, "STOPPED", 6.0),
            TrialRecord("4", {"lr": 0.1}, None, "FAILED", 4.0, error="boom")]


def test_study_summary_picks_the_best_finished_trial():
    summary = vertex.study_summary(_records(), "minimize")
    assert summary.best.trial_id == "2" and summary.best["metric"] == 0.3
    assert summary.states == {"SUCCEEDED": 2, "STOPPED": 1, "FAILED": 1}
    assert vertex.study_summary(_records(), "maximize").best.trial_id == "1"  # not the stopped one
    assert "best: trial 2" in summary.text() and "4 trials" in summary.text()


def _row(machine_type, accelerator_type="", count=0):
    from labkit.hardware.catalog import load_machine_prices, machine_price

    return machine_price(load_machine_prices(), machine_type, accelerator_type, count)


def test_study_cost_bills_every_trial_at_the_spot_rate():
    spec = job(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4", accelerator_count=1)
    rate = _row("g2-standard-8", "NVIDIA_L4", 1).hourly(spot=True)
    cost = vertex.study_cost(_records(), spec, spot=True)
    assert isinstance(cost, StudyCost) and cost.usd_per_hour == pytest.approx(rate)
    assert cost.trial_hours == pytest.approx(70 / 3600)
    assert cost.total_usd == pytest.approx(70 / 3600 * rate) and cost.per_trial_usd["3"] == pytest.approx(6 / 3600 * rate)
    assert vertex.study_cost(_records(), spec, seconds_scale=0.5).total_usd == pytest.approx(cost.total_usd / 2)
    cpu = vertex.study_cost(_records(), job(), spot=True)  # a CPU-only trial job: its machine's row
    assert cpu.usd_per_hour == pytest.approx(_row(specs.DEFAULT_MACHINE_TYPE).hourly(spot=True))
    with pytest.raises(ValueError, match="no price for NVIDIA_B200 x 8 on a4-highgpu-8g"):
        vertex.study_cost(_records(), job(machine_type="a4-highgpu-8g", accelerator_type="NVIDIA_B200",
                                          accelerator_count=8))
    with pytest.raises(ValueError, match="no Spot price for n1-standard-4"):  # Vertex AI's rate: no Spot
        vertex.study_cost(_records(), job(machine_type="n1-standard-4"), spot=True)


# A trial program that reports 10 x its trial id at steps 1..4: with one trial at a time, the
# third trial is worse than the median of the first two at its first report and is stopped.
REPORTER = (
    "import os, sys, time\n"
    "from labkit.core.hypertune import report_metric\n"
    "x = float(sys.argv[-1].split('=')[1])\n"
    "for step in range(1, 5):\n"
    "    report_metric('loss', 10 * int(os.environ['CLOUD_ML_TRIAL_ID']) + x, step)\n"
    "    print(f'step {step}', flush=True)\n"
    "    time.sleep(0.4)\n")


@pytest.mark.slow
def test_local_study_stops_a_trial_that_falls_behind(tmp_path):
    pytest.importorskip("optuna")
    trial_job = vertex.custom_job_spec(vertex.PoolConfig(image_uri="gcr.io/p/img",
                                                         args=["python", "-c", REPORTER]), output_uri=OUT)
    spec = {"study_spec": {"metrics": [{"metric_id": "loss", "goal": "MINIMIZE"}],
                           "parameters": [{"parameter_id": "x", "discrete_value_spec": {"values": [1.0, 2.0]}}],
                           "median_automated_stopping_spec": {"use_elapsed_duration": False}},
            "max_trial_count": 3, "parallel_trial_count": 1, "trial_job_spec": trial_job}
    records = vertex.run_local_tuning(spec, tmp_path, seed=1)
    assert [r.trial_id for r in records] == ["1", "2", "3"]
    assert [r.state for r in records] == ["SUCCEEDED", "SUCCEEDED", "STOPPED"]
    for r in records:
        assert r.parameters["x"] in (1.0, 2.0) and r["metric"] == pytest.approx(10 * int(r.trial_id) + r.parameters["x"])
    assert [s for s, _ in records[0].measurements] == [1, 2, 3, 4] and len(records[2].measurements) < 4
    # Each trial wrote under its own base output directory of the one stand-in bucket.
    assert (tmp_path / "trial-3" / "containers").is_dir() and (tmp_path / "gcs").is_dir()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_lr_and_batch_size_study_runs_labkit_train_trials(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("optuna")
    spec = vertex.tuning_job(dict(BASE, steps=4), output_uri="gs://bkt/lr-study", metric="loss",
                             goal="minimize", parameters={"lr": ("log", 1e-3, 3e-2), "batch_size": [8, 16]},
                             max_trial_count=3, parallel_trial_count=2, early_stopping=False)
    records = vertex.run_local_tuning(spec, tmp_path, seed=0, env={"LABKIT_NO_PROGRESS": "1"})
    assert len(records) == 3 and all(r.state == "SUCCEEDED" for r in records), \
        [(r.state, r.error) for r in records]
    for r in records:
        assert set(r.parameters) == {"lr", "batch_size"} and 1e-3 <= r.parameters["lr"] <= 3e-2
        metrics = json.loads((tmp_path / "gcs/bkt/lr-study" / r.trial_id / "model/metrics.json").read_text())
        assert r.metric == pytest.approx(metrics["steps"][-1]["loss"])  # the last step's loss
        assert metrics["run"].get("batch_size", r.parameters["batch_size"]) == r.parameters["batch_size"]
    assert vertex.study_summary(records).best is not None
    assert sys.executable  # trials ran this interpreter through the emulator


def test_a_trial_trains_in_its_own_aip_folders_through_the_mount():
    from labkit.core.hypertune import objective
    from labkit.vertex.trial import trial_config

    env = {"AIP_MODEL_DIR": "gs://bkt/study/3/model/", "AIP_CHECKPOINT_DIR": "gs://bkt/study/3/checkpoints/",
           "AIP_TENSORBOARD_LOG_DIR": "gs://bkt/study/3/logs/"}
    cfg = trial_config(["--steps", "4", "--lr=0.01"], env)
    assert (cfg.checkpoint_dir, cfg.tensorboard_dir, cfg.metrics_out) == (
        "/gcs/bkt/study/3/checkpoints/", "/gcs/bkt/study/3/logs/", "/gcs/bkt/study/3/model/metrics.json")
    assert trial_config(["--checkpoint-dir", "/mine"], env).checkpoint_dir == "/mine"
    metrics = {"steps": [{"step": 0, "loss": 2.0}, {"step": 1, "loss": 1.5}], "summary": {"final_loss": 1.5}}
    assert objective(metrics, "loss") == (2, 1.5) and objective(metrics, "final_loss") == (2, 1.5)
    assert objective({"steps": []}, "loss") is None


@pytest.mark.parametrize("framework,metric", [("torch", "heldout_loss"), ("tf", "heldout_loss"), ("torch", "loss")])
def test_both_engines_report_the_trial_metric_once_per_evaluation(framework, metric, tmp_path, monkeypatch):
    """Inside a trial each metrics write (every checkpoint and the end) reports the metric in
    cloudml-hypertune's format, one report per step; the held-out loss is measured there."""
    pytest.importorskip("torch" if framework == "torch" else "tensorflow")
    from labkit.core import hypertune
    from labkit.train import run_training

    monkeypatch.setenv(hypertune.TUNING_METRIC_ENV, metric)
    monkeypatch.setenv(hypertune.METRIC_FILE_ENV, str(tmp_path / "hypertune" / "output.metrics"))
    log = run_training(TrainConfig(framework=framework, steps=4, batch_size=8, checkpoint_every=2,
                                   num_samples=64, eval_samples=32,  # the default sizes cost seconds
                                   checkpoint_dir=str(tmp_path / "ck"), metrics_out=str(tmp_path / "m.json"),
                                   device="cpu", progress=False))
    reported = hypertune.reported_values(hypertune.read_reports(tmp_path / "hypertune" / "output.metrics"), metric)
    assert [step for step, _ in reported] == [2, 4]
    assert [value for _, value in reported] == [log.steps[1][metric], log.steps[3][metric]]


ECHO = ("import os, sys\n"
        "from labkit.core.hypertune import report_metric\n"
        "print('flags:', ' '.join(sys.argv[1:]), flush=True)\n"
        "value = sys.argv[-1].split('=')[1]\n"
        "if value == 'FAIL':\n"
        "    print('trial refuses its value FAIL', flush=True)\n"
        "    sys.exit(2)\n"
        "report_metric('loss', float(int(float(value))), 1)\n")


def _study(parameters, algorithm=None, trials=4):
    trial_job = vertex.custom_job_spec(vertex.PoolConfig(image_uri="gcr.io/p/img",
                                                         args=["python", "-c", ECHO]), output_uri=OUT)
    study = {"metrics": [{"metric_id": "loss", "goal": "MINIMIZE"}], "parameters": parameters}
    if algorithm:
        study["algorithm"] = algorithm
    return {"study_spec": study, "max_trial_count": trials, "parallel_trial_count": 1,
            "trial_job_spec": trial_job}


@pytest.mark.slow  # a process per trial; the battery's grid row stays in make check
def test_a_grid_search_runs_the_grid_once_and_keeps_every_record(tmp_path):
    pytest.importorskip("optuna")
    grid = [{"parameter_id": "x", "discrete_value_spec": {"values": [16.0, 32.0]}}]
    records = vertex.run_local_tuning(_study(grid, "GRID_SEARCH", trials=5), tmp_path)
    assert [r.state for r in records] == ["SUCCEEDED", "SUCCEEDED"]  # the grid has two points
    assert sorted(r.parameters["x"] for r in records) == [16.0, 32.0]
    # The values reach the trial exactly as the service writes a DISCRETE value: a double.
    logs = "".join(p.read_text() for p in tmp_path.glob("trial-*/logs/attempt0/*.log"))
    assert "--x=16.0" in logs and "--x=32.0" in logs


def test_a_trial_that_fails_by_itself_runs_once_and_says_why(tmp_path):  # the battery's row is slow
    pytest.importorskip("optuna")
    bad = [{"parameter_id": "x", "categorical_value_spec": {"values": ["FAIL"]}}]
    (record,) = vertex.run_local_tuning(_study(bad, trials=1), tmp_path)
    assert record.state == "FAILED" and record.metric is None
    assert "exited 2" in record.error and "trial refuses its value FAIL" in record.error
    assert len(list((tmp_path / "trial-1" / "logs").rglob("*.log"))) == 1  # not restarted


def test_every_integer_flag_of_labkit_train_reads_the_services_double():
    import argparse

    from labkit.cli import build_parser

    train = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "train")[1]
    ints = [a for a in train._actions if a.option_strings and a.type is not None
            and getattr(a.type, "__name__", "") == "int"]
    assert {"--batch-size", "--steps", "--warmup-steps", "--seed", "--nproc-per-node"} <= \
        {a.option_strings[0] for a in ints}
    for action in ints:
        flag = action.option_strings[0]
        ns = train.parse_args([f"{flag}=4.0"])
        assert getattr(ns, action.dest) == 4 and isinstance(getattr(ns, action.dest), int), flag
    with pytest.raises(SystemExit):
        argparse.ArgumentParser.parse_args(train, ["--batch-size=32.5"])


def test_the_median_rule_is_the_one_study_proto_states():
    """A running trial is stopped when its best report is worse than the median running average
    of the completed trials up to its last step, not when its latest report is worse than the
    others' reports at that step (Optuna's MedianPruner)."""
    optuna = pytest.importorskip("optuna")
    from labkit.vertex.tuning import median_stopping

    def study_with(pruner):
        study = optuna.create_study(direction="minimize", pruner=pruner)
        for _ in range(2):  # completed: 4 then 0, a running average of 2 at step 1
            t = study.ask()
            t.report(4.0, 0)
            t.report(0.0, 1)
            study.tell(t, 0.0)
        running = study.ask()
        running.report(3.0, 0)
        running.report(1.0, 1)  # best 1: better than the median performance 2, worse than the others' 0
        return running

    assert not study_with(median_stopping(2)).should_prune()
    assert study_with(optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)).should_prune()
    late = study_with(median_stopping(2))
    late.report(2.5, 2)  # its best stays 1: still not behind the median of 2
    assert not late.should_prune()
    worse = optuna.create_study(direction="minimize", pruner=median_stopping(1))
    done = worse.ask()
    done.report(1.0, 0)
    worse.tell(done, 1.0)
    behind = worse.ask()
    behind.report(5.0, 0)
    assert behind.should_prune()
