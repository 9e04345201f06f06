"""Notebook 12's script, step by step: each step a plain script (nothing from labkit), each
shown as the change from the one before, the first and the last proven to learn here; the
timing of two steps as medians, ranges and the verdict from `labkit.core.stats`."""

from __future__ import annotations

import ast
import math

import pytest

from labkit.core import stats
from labkit.course import own_job, your_job


def test_the_steps_are_plain_scripts_each_a_change_from_the_last():
    previous = None
    for name in your_job.STEPS:
        path = your_job.step_path(name)
        imported = {n.module or "" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import) for a in n.names}
        assert not any(m.split(".")[0] == "labkit" for m in imported), f"{name} imports labkit"
        shown = repr(your_job.show_step(name, previous))
        if previous is not None:
            assert 0 < sum(line.startswith("+ ") for line in shown.splitlines()[1:]) < len(shown.splitlines()) / 2
        previous = name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["step1_plain", "step5_ddp"])
def test_a_step_learns(name, tmp_path):
    pytest.importorskip("torch")
    from labkit.course.profiling import example_images

    images = example_images(tmp_path / "images", per_class=32, size=40)
    run = your_job.run_step(name, images, epochs=4, image_size=32, workdir=tmp_path / "run",
                            extra=() if name == "step1_plain" else ("--num-workers", "0"))
    assert [r["epoch"] for r in run.rows] == [1, 2, 3, 4]
    seen = run.learning
    assert (seen.first_loss, seen.last_loss, seen.last_epoch) == (run.rows[0]["test_loss"], run.rows[-1]["test_loss"], 4)
    assert run.classes == your_job.classes(images) and seen.chance == pytest.approx(math.log(run.classes))
    assert run.learned and seen.verdict == own_job.LEARNED, run.report()
    assert run.report().startswith(f"$ python {your_job.step_path(name)}")


def _timing(a: list[float], b: list[float]) -> your_job.TimingFindings:
    return your_job.StepTiming("step1_plain", "step2_loader", {"step1_plain": a, "step2_loader": b}).findings()


def test_timing_findings_are_the_medians_ranges_and_verdict_of_the_runs():
    found = _timing([100.0, 104.0, 102.0], [150.0, 149.0, 155.0])
    assert (found.a, found.b) == ("step1_plain", "step2_loader")
    assert (found.a_rate.median, found.a_rate.low, found.a_rate.high) == (102.0, 100.0, 104.0)
    assert found.b_rate.values == (150.0, 149.0, 155.0)
    assert found.ratio == pytest.approx(150.0 / 102.0)
    assert (found.verdict, found.decided, found.pays) == ("faster", True, True)


@pytest.mark.parametrize(("b", "verdict"), [([101.0, 99.0, 103.0], stats.NO_DIFFERENCE), ([60.0, 61.0, 59.0], "slower")])
def test_a_fix_that_does_not_pay_says_so_from_its_runs(b, verdict):
    found = _timing([100.0, 104.0, 102.0], b)
    assert (found.verdict, found.decided, found.pays) == (verdict, True, False)


def test_too_few_runs_give_numbers_but_no_verdict():
    found = _timing([100.0], [300.0])
    assert found.ratio == 3.0 and not found.decided and not found.pays
    assert str(stats.MIN_REPEATS) in found.verdict and found.verdict not in ("faster", "slower", stats.NO_DIFFERENCE)


def test_classes_counts_the_train_subfolders(tmp_path):
    for name in ("cat", "dog", "fox"):
        (tmp_path / "train" / name).mkdir(parents=True)
    (tmp_path / "train" / "labels.txt").write_text("not a class")
    assert your_job.classes(tmp_path) == 3
