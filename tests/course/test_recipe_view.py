"""The course helper behind each notebook's "The code" section: the source shown from the file,
the recipe run as a learner runs it, its curve beside the engine's."""

from __future__ import annotations

import pytest

from labkit.core.metrics import MetricsLog, StepMetrics
from labkit.core.train_config import TrainConfig
from labkit.course import capstone, recipe_view

SMALL = ["--batch-size", "16", "--num-samples", "64", "--steps", "4"]


def test_every_recipe_is_shown_from_its_file():
    for name in recipe_view.RECIPES:
        text = recipe_view.source(name)
        assert text == (recipe_view.RECIPE_DIR / f"{name}.py").read_text()
        assert 20 < recipe_view.lines_of_code(name) < len(text.splitlines())
    code = recipe_view.show("ddp")
    assert "DistributedDataParallel" in code.data and "no_sync()" in code.data
    assert '<span class="k">def</span>' in code._repr_html_()  # highlighted in a notebook
    # what the recipe calls from common.py is on the page too, folded under one line
    helpers = recipe_view.common_helpers("ddp")
    assert {"torch_model", "torch_dataset", "adamw", "StepLog"} <= set(helpers)
    assert "model_config" in helpers  # called by torch_model, not by the recipe itself
    assert helpers["adamw"].startswith("def adamw(")
    html = code._repr_html_()
    assert "<details><summary>recipes/common.py" in html and html.count('class="highlight"') == 2
    assert recipe_view.common_helpers("vertex_job") == {}
    folded = recipe_view.show("pipeline").folded()._repr_html_()
    assert folded.startswith("<details><summary>recipes/pipeline.py (") and folded.count("<details>") == 2
    assert folded.count('class="highlight"') == 2 and folded.count("<summary>") == 2
    with pytest.raises(ValueError, match="'nope' is not one of"):
        recipe_view.source("nope")


def test_a_recipe_shown_as_the_change_from_another_marks_the_lines_that_one_lacks():
    """FSDP beside DDP: the shared training script is plain, what sharding adds is highlighted."""
    fsdp = recipe_view.source("fsdp").splitlines()
    ddp = set(recipe_view.source("ddp").splitlines())
    marked = recipe_view.new_lines("fsdp", "ddp")
    assert marked == sorted(marked) and 0 < len(marked) < len(fsdp)
    assert any("fully_shard(" in fsdp[i - 1] for i in marked)
    unmarked = [line for i, line in enumerate(fsdp, 1) if i not in marked and line.strip()]
    assert unmarked and all(line in ddp for line in unmarked)  # what is not marked, DDP has
    assert recipe_view.new_lines("ddp", "ddp") == []

    code = recipe_view.show("fsdp").changes_from("ddp")
    html = code._repr_html_()
    assert html.count('class="hll"') == len(marked) and 'class="labkit-changes"' in html
    assert f"the {len(marked)} of its {len(fsdp)} lines that recipes/ddp.py does not have" in html
    text = repr(code).splitlines()
    assert [i for i, line in enumerate(text, 1) if line.startswith("+ ")] == marked
    folded = recipe_view.show("pipeline").changes_from("zero").folded()._repr_html_()
    assert folded.startswith("<details><summary>recipes/pipeline.py (") and "recipes/zero.py does not have" in folded
    with pytest.raises(ValueError, match="'nope' is not one of"):
        recipe_view.show("fsdp").changes_from("nope")


def test_only_training_recipes_run_and_single_process_ones_refuse_several():
    with pytest.raises(ValueError, match="does not train"):
        recipe_view.run("vertex_job", [])
    with pytest.raises(ValueError, match="nproc"):
        recipe_view.run("mixed_precision", SMALL, nproc=2)


@pytest.mark.slow
def test_compare_runs_the_recipe_and_the_engine_and_plots_both(tmp_path):
    pytest.importorskip("torch")
    import matplotlib

    matplotlib.use("Agg")
    cmp = recipe_view.compare("mixed_precision", ["--model", "cnn", *SMALL])
    assert len(cmp.recipe_losses) == len(cmp.engine_losses) == 4
    assert cmp.equal and cmp.max_abs_diff <= 1e-5 and cmp.tolerance == 1e-5
    fig = recipe_view.plot(cmp)
    assert "largest difference" in fig.axes[0].get_title()


@pytest.mark.slow
def test_a_preempted_recipe_is_restarted_until_it_finishes(tmp_path):
    pytest.importorskip("torch")
    cmp = recipe_view.compare("preemptible", ["--model", "cnn", *SMALL, "--checkpoint-dir",
                                              str(tmp_path / "ckpt"), "--preempt-at", "1"])
    assert cmp.recipe.returncodes == [143, 0]
    assert [s["step"] for s in cmp.recipe.steps] == [0, 1, 2, 3]
    assert cmp.equal


@pytest.mark.slow
def test_submit_locally_shows_the_request_and_the_states():
    pytest.importorskip("google.cloud.aiplatform")
    r = recipe_view.submit_locally(["--project", "p", "--bucket", "gs://bkt", "--image-uri", "img:1",
                                    "--replicas", "2", "--spot", "--", "--model", "gpt"])
    assert r["states"][-1] == "JOB_STATE_SUCCEEDED"
    assert r["request"]["job_spec"]["scheduling"]["strategy"] == "SPOT"
    assert len(r["request"]["job_spec"]["worker_pool_specs"]) == 2


def test_flags_spell_a_config_and_extra_values_as_recipe_flags():
    config = TrainConfig(model="gpt", scale="smoke", steps=7, batch_size=8, grad_clip=None)
    argv = recipe_view.flags(config, precision="bf16", trace_dir=None, spot=True, wait=False)
    assert argv[:6] == ["--model", "gpt", "--scale", "smoke", "--steps", "7"]
    assert argv[argv.index("--grad-clip") + 1] == "0.0"  # None: the recipes' "no clipping"
    assert argv[-3:] == ["--precision", "bf16", "--spot"] and "--trace-dir" not in argv and "--wait" not in argv
    assert recipe_view.flags(batch_size=4) == ["--batch-size", "4"]


def test_command_is_what_a_learner_types():
    argv = ["--model", "gpt"]
    assert recipe_view.command("ddp", argv, nproc=2) == \
        "torchrun --standalone --nproc-per-node 2 -m labkit.recipes.ddp --model gpt"
    assert recipe_view.command("ddp", argv) == "python -m labkit.recipes.ddp --model gpt"
    assert recipe_view.command("elastic_ddp", argv, nproc=2, max_restarts=3) == \
        "torchrun --standalone --nproc-per-node 2 --max-restarts 3 -m labkit.recipes.elastic_ddp --model gpt"
    assert "in each of 2 workers" in recipe_view.command("tf_multiworker", argv, nproc=2)
    # MirroredStrategy's replicas live in one process: --devices, not a launcher, makes them
    assert recipe_view.command("keras_mirrored_fit", recipe_view.flags(model="cnn", devices=2)) == \
        "python -m labkit.recipes.keras_mirrored_fit --model cnn --devices 2"
    with pytest.raises(ValueError, match="not one of"):
        recipe_view.command("nope", argv)


def test_the_catalogue_is_read_from_the_recipe_files():
    rows = {r["recipe"]: r for r in recipe_view.catalogue()}
    assert set(rows) == set(recipe_view.RECIPES)
    for name, row in rows.items():
        assert f"labkit.recipes.{name}" in row["run"] and row["lines"] == recipe_view.lines_of_code(name)
        assert row["technique"] and "\n" not in row["technique"]
    assert rows["ddp"]["run"].startswith("torchrun") and rows["ddp"]["notebook"] == "02_distribution_tf_vs_ddp"


def _log(config: TrainConfig, losses: list[float], world_size: int = 1) -> MetricsLog:
    from dataclasses import asdict

    log = MetricsLog(run={"config": asdict(config), "world_size": world_size})
    for i, loss in enumerate(losses):
        log.append(StepMetrics(step=i, loss=loss))
    return log


def test_an_engine_run_is_reused_only_when_it_trained_the_recipes_settings():
    argv = ["--model", "cnn", *SMALL, "--lr", "0.01"]
    same = TrainConfig(model="cnn", batch_size=16, num_samples=64, steps=4, lr=0.01)
    recipe_view.check_engine_run("ddp", argv, _log(same, [1.0] * 4, world_size=2), nproc=2)
    other = TrainConfig(model="cnn", batch_size=16, num_samples=64, steps=4, lr=0.001, seed=3)
    with pytest.raises(ValueError, match=r"lr 0.001 \(recipe: 0.01\); seed 3 \(recipe: 0\); world_size 1"):
        recipe_view.check_engine_run("ddp", argv, _log(other, [1.0] * 4), nproc=2)
    with pytest.raises(ValueError, match="framework 'torch' \\(recipe: 'tf'\\)"):
        recipe_view.check_engine_run("tf_multiworker", argv, _log(same, [1.0] * 4))
    with pytest.raises(ValueError, match="records no config"):
        recipe_view.check_engine_run("ddp", argv, MetricsLog())


def _comparison(recipe_losses, engine_losses, codes=(0,), resumed=(), precision="fp32"):
    steps = [{"step": i, "loss": x} for i, x in enumerate(recipe_losses)]
    run = recipe_view.RecipeRun("preemptible", [], list(codes), "", steps, {}, list(resumed))
    return recipe_view.Comparison(run, list(engine_losses), precision)


def test_a_comparison_counts_restarts_and_refuses_unequal_lengths():
    resumed = _comparison([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], codes=(143, 0), resumed=(2,))
    assert resumed.recipe.restarts == 1 and resumed.recipe.resumed_at == [2]
    assert [s["step"] for s in resumed.recipe.steps] == [0, 1, 2]  # each step exactly once
    with pytest.raises(ValueError, match="logged 2 steps, the engine 3"):
        _ = _comparison([1.0, 2.0], [1.0, 2.0, 3.0]).max_abs_diff


def test_a_gap_on_a_gpu_is_judged_against_the_engine_run_twice():
    """On a GPU the engine does not repeat itself exactly: a recipe as far from it as it is from
    itself computes the same thing; one far beyond that does not."""
    drift = _comparison([2.3, 2.0, 1.7], [2.3, 2.001, 1.703])
    drift.engine_repeat_losses = [2.3, 2.002, 1.701]
    assert not drift.equal and drift.engine_spread == pytest.approx(0.002) and drift.within_spread
    real = _comparison([2.3, 2.0, 1.7], [2.3, 2.05, 1.75])
    real.engine_repeat_losses = [2.3, 2.051, 1.75]
    assert not real.within_spread
    assert real.agreement == recipe_view.DIFFERENT
    exact = _comparison([2.3, 2.0], [2.3, 2.1])
    exact.engine_repeat_losses = [2.3, 2.1]  # an engine that repeats itself leaves no excuse
    assert exact.engine_spread == 0 and not exact.within_spread
    assert recipe_view.ran_on_a_gpu({"device": "cuda:0"}) and recipe_view.ran_on_a_gpu({"devices": ["/GPU:0"]})
    assert not recipe_view.ran_on_a_gpu({"device": "cpu"}) and not recipe_view.ran_on_a_gpu({})


def test_agreement_is_one_verdict_with_the_numbers_beside_it():
    """What a notebook writes its own sentence from: the verdict, the largest difference, its step,
    the tolerance and (on a GPU) the engine's difference from itself."""
    assert _comparison([1.0, 2.0], [1.0, 2.0]).agreement == recipe_view.BIT_FOR_BIT
    close = _comparison([1.0, 2.0, 3.0], [1.0, 2.000002, 3.0])
    assert close.agreement == recipe_view.WITHIN_TOLERANCE and close.worst_step == 1
    assert close.max_abs_diff == pytest.approx(2e-6) and close.tolerance == 1e-5
    far = _comparison([1.0, 2.0], [1.0, 2.1], precision="bf16")
    assert far.agreement == recipe_view.DIFFERENT and far.tolerance == 1e-3
    drift = _comparison([2.3, 2.0, 1.7], [2.3, 2.001, 1.703], precision="bf16")
    drift.engine_repeat_losses = [2.3, 2.002, 1.701]
    assert drift.agreement == recipe_view.WITHIN_SPREAD and drift.engine_spread == pytest.approx(0.002)
    assert "2× labkit train's own run-to-run spread" in recipe_view.WITHIN_SPREAD  # says SPREAD_MARGIN


def test_a_curve_trend_is_the_mean_of_its_first_and_last_quarters():
    trend = recipe_view.curve_trend([2.30, 2.25, 2.0, 1.8, 1.5, 1.4, 1.2, 1.0])
    assert (trend.first, trend.last) == pytest.approx((2.275, 1.1)) and trend.falls
    assert trend.verdict == "falls by more than 10%"
    flat = recipe_view.curve_trend([2.30, 2.31, 2.29, 2.30, 2.28, 2.30, 2.27, 2.29])
    assert flat.first == pytest.approx(2.305) and not flat.falls and flat.verdict == "does not fall by 10%"
    assert recipe_view.curve_trend([2.3, 1.0]).first == 2.3  # under 4 steps: one step each
    with pytest.raises(ValueError, match="losses"):
        recipe_view.curve_trend([])


def test_a_recipes_mistake_is_shown_as_the_change_from_its_own_file():
    change = recipe_view.mistake_lines("mixed_precision", "softmax")
    assert change.function == "cross_entropy"
    source = recipe_view.source("mixed_precision")
    assert all(line in source for line in (*change.removed, *change.added))  # the file's lines, verbatim
    code = recipe_view.show_mistake("mixed_precision", "softmax")
    assert repr(code).splitlines() == [
        "recipes/mixed_precision.py, cross_entropy(): with --mistake softmax (-) and without (+):",
        "- return F.cross_entropy(F.softmax(logits, -1), y)", "+ return F.cross_entropy(logits, y)"]
    assert 'class="highlight"' in code._repr_html_()
    with pytest.raises(ValueError, match="no `if mistake == 'bf16':` block"):
        recipe_view.mistake_lines("mixed_precision", "bf16")


def test_a_torchrun_restart_is_read_from_the_metrics_and_the_printed_steps():
    """elastic_ddp exits 0 after torchrun restarted it: the restart and the resumed step come from
    its metrics run section, the steps trained twice from its printed lines."""
    out = "step 0 loss 2.3\nstep 1 loss 2.2\nrank 1: exiting\nattempt 1: resumed\nstep 1 loss 2.2\nstep 2 loss 2.1"
    steps = [{"step": i, "loss": x} for i, x in enumerate([2.3, 2.2, 2.1])]
    run = recipe_view.RecipeRun("elastic_ddp", [], [0], out, steps,
                                {"restart_count": 1, "resumed_at_step": 1}, [1])
    assert run.restarts == 1 and run.repeated_steps() == [1]
    assert run.resumed_at == [1] and run.returncodes == [0]  # torchrun's restart, not a preemption
    assert [s["step"] for s in run.steps] == [0, 1, 2]  # the metrics log each step exactly once
    assert recipe_view.Comparison(run, [2.3, 2.2, 2.1], "fp32", nproc=2).agreement == recipe_view.BIT_FOR_BIT


def test_what_a_recipe_printed_is_found_by_words_and_blocks():
    run = recipe_view.RecipeRun("profile", [], [0], "warn\n---\nName x\naten::mm 1\nSelf CPU time total: 1s\nbye")
    assert run.lines("aten::", "bye") == "aten::mm 1\nbye"
    assert run.block("---", "Self CPU time total") == "---\nName x\naten::mm 1\nSelf CPU time total: 1s"
    assert run.block("===", "x") == ""


REQUEST = {"job_spec": {
    "worker_pool_specs": [
        {"machine_spec": {"machine_type": "a3-highgpu-8g", "accelerator_type": "NVIDIA_H100_80GB",
                          "accelerator_count": 8}, "replica_count": "1",
         "container_spec": {"image_uri": "img", "command": ["bash", "-c", "torchrun -m labkit.recipes.ddp"]}},
        {"machine_spec": {"machine_type": "a3-highgpu-8g", "accelerator_type": "NVIDIA_H100_80GB",
                          "accelerator_count": 8}, "replica_count": "3", "container_spec": {"image_uri": "img"}},
        {"machine_spec": {"machine_type": "n1-highcpu-16", "accelerator_count": 0}, "replica_count": "4",
         "container_spec": {"image_uri": "reductionserver:latest"}}],
    "scheduling": {"strategy": "SPOT", "restart_job_on_worker_restart": True},
    "base_output_directory": {"output_uri_prefix": "gs://bkt/run"}}}


def test_the_request_the_service_received_is_described_from_its_fields():
    rows = recipe_view.request_rows(REQUEST)
    assert [r["replicas"] for r in rows] == [1, 3, 4] and rows[2]["accelerators"] == "none"
    assert rows[0]["accelerators"] == "8 x NVIDIA_H100_80GB"
    got = recipe_view.received({"request": REQUEST, "states": ["JOB_STATE_SUCCEEDED"]})
    assert (got.pools, got.training_nodes, got.pool2_replicas) == (3, 4, 4)
    assert (got.pool2_image, got.pool2_machine) == ("reductionserver:latest", "n1-highcpu-16")
    assert got.strategy == "SPOT" and got.restart_job_on_worker_restart is True
    assert got.output_dirs == {"AIP_MODEL_DIR": "gs://bkt/run/model/", "AIP_CHECKPOINT_DIR": "gs://bkt/run/checkpoints/",
                               "AIP_TENSORBOARD_LOG_DIR": "gs://bkt/run/logs/"}
    assert got.primary_command == "torchrun -m labkit.recipes.ddp" and got.states == ("JOB_STATE_SUCCEEDED",)
    plain = {"job_spec": {"worker_pool_specs": [REQUEST["job_spec"]["worker_pool_specs"][1]]}}
    bare = recipe_view.received({"request": plain, "states": []})
    assert (bare.pools, bare.training_nodes, bare.pool2_replicas, bare.pool2_image) == (1, 3, 0, None)
    assert bare.strategy == "STANDARD" and bare.restart_job_on_worker_restart is False
    assert bare.output_dirs == {} and bare.primary_command is None


def test_every_capstone_lever_has_code_or_a_recipe():
    hw = capstone.Hardware("cuda", fp8=True, cpu_count=8)
    tried, skipped = capstone.levers("torch", "gpt", hw, True)
    rows = recipe_view.lever_code_rows("torch", [*tried, *skipped])
    assert len(rows) == len(tried) + len(skipped) and all(r["plain code"] for r in rows)
    assert "labkit train flag only" not in {r["plain code"] for r in rows}
    bf16 = next(r for r in rows if "bf16" in r["lever"])
    assert bf16["recipe"] == "mixed_precision" and bf16["recipe lines"] == recipe_view.lines_of_code("mixed_precision")
    tf_rows = recipe_view.lever_code_rows("tf", capstone.levers("tf", "cnn", hw, True)[0])
    assert tf_rows[0]["recipe"] == "keras_mixed_precision"
