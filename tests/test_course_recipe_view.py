"""The course helper behind each notebook's "The code" section: the source shown from the file,
the recipe run as a learner runs it, its curve beside the engine's."""

from __future__ import annotations

import pytest

from labkit.course import recipe_view

SMALL = ["--batch-size", "16", "--num-samples", "64", "--steps", "4"]


def test_every_recipe_is_shown_from_its_file():
    for name in recipe_view.RECIPES:
        text = recipe_view.source(name)
        assert text == (recipe_view.RECIPE_DIR / f"{name}.py").read_text()
        assert 20 < recipe_view.lines_of_code(name) < len(text.splitlines())
    code = recipe_view.show("ddp")
    assert "DistributedDataParallel" in code.data and "no_sync()" in code.data
    assert '<span class="k">def</span>' in code._repr_html_()  # highlighted in a notebook
    with pytest.raises(ValueError, match="'nope' is not one of"):
        recipe_view.source("nope")


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
    r = recipe_view.submit_locally(["--project", "p", "--bucket", "gs://b", "--image-uri", "img:1",
                                    "--replicas", "2", "--spot", "--", "--model", "gpt"])
    assert r["states"][-1] == "JOB_STATE_SUCCEEDED"
    assert r["request"]["job_spec"]["scheduling"]["strategy"] == "SPOT"
    assert len(r["request"]["job_spec"]["worker_pool_specs"]) == 2
