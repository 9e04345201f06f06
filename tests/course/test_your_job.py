"""Notebook 12's script, step by step: each step a plain script (nothing from labkit), each
shown as the change from the one before, the first and the last proven to learn here."""

from __future__ import annotations

import ast

import pytest

from labkit.course import your_job


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
    assert run.learned, run.text()
