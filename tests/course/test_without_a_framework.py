"""Every notebook runs on an image that has only one of the two frameworks (Vertex's prebuilt
PyTorch or TensorFlow containers), skipping the other's columns and saying why."""

from __future__ import annotations

import re
import subprocess
import sys

import nbformat
import pytest

from tests.conftest import NOTEBOOK_DIR

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
SAYS_MISSING = {"torch": "PyTorch is not installed", "tensorflow": "TensorFlow is not installed"}
# A notebook that calls into a framework's side of labkit must say when it skips that part.
USES = {
    "torch": re.compile(r'labkit\.torch\b|has_torch\(|missing_reason\("torch"\)|from labkit import [^\n]*\btorch\b'),
    "tensorflow": re.compile(r'labkit\.tf\b|has_tf\(|missing_reason\("tensorflow"\)|from labkit import [^\n]*\btf\b'
                             # the course module that runs both frameworks' jobs side by side
                             r'|from labkit\.course import [^\n]*\bdistribution\b'),
}


def _outputs_text(path) -> str:
    nb = nbformat.read(path, as_version=4)
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") or out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


# What a run without a framework checks is what it skips and says, not the measurements: these
# parameters leave out repeats of the same measurement (one run each: the notebooks then say
# "no verdict") and runs that only repeat a layout the notebook has already shown.
ONE_REPEAT = ["-p", "repeats", "1"]
LIGHTER = {"03_input_pipelines": ONE_REPEAT, "04_mixed_precision": ONE_REPEAT,
           "06_multi_node": ["-p", "own_epochs", "2", "-p", "allreduce_max_mb", "4"],
           "09_capstone": ["-p", "steps", "4"],  # TensorFlow's bf16 on a CPU is slow per step
           "10_model_parallelism": ["-p", "four_processes", "False", "-p", "use_deepspeed", "False"],
           "11_hyperparameter_tuning": ["-p", "trials", "3"], "12_your_own_job": ONE_REPEAT}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_without(path, hide_frameworks, tmp_path):
    """The notebook without TensorFlow and without PyTorch, both runs at once (each is mostly
    the other framework's work, or waiting on processes it started). A notebook that never
    calls one framework's side of labkit is not run again without it: that run would repeat
    the JupyterLab run cell for cell, and that nothing in the course layer imports a framework
    it does not need is `test_course_modules_import_without_either_framework`'s check."""
    source = path.with_suffix(".py").read_text()
    uses = {name for name, pattern in USES.items() if pattern.search(source)}
    runs = {}
    for hidden in SAYS_MISSING:
        if uses and hidden not in uses:
            continue
        env = hide_frameworks(hidden)
        env["LABKIT_ARTIFACTS"] = str(tmp_path / hidden / "artifacts")
        out = tmp_path / hidden / path.name
        out.parent.mkdir()
        cmd = [sys.executable, "-m", "labkit", "run", str(path), "-o", str(out), *LIGHTER.get(path.stem, [])]
        with open(out.parent / "log.txt", "w") as log:  # a file: neither run blocks on a full pipe
            runs[hidden] = (out, subprocess.Popen(cmd, env=env, cwd=out.parent, stdout=log,
                                                  stderr=subprocess.STDOUT))
    try:
        for _, proc in runs.values():
            proc.wait(timeout=840)
    finally:
        for _, proc in runs.values():
            proc.kill()  # only one still running (a timeout) is affected
    for hidden, (out, proc) in runs.items():
        assert proc.returncode == 0, f"without {hidden}: " + (out.parent / "log.txt").read_text()[-3000:]
        if USES[hidden].search(path.with_suffix(".py").read_text()):
            assert SAYS_MISSING[hidden] in _outputs_text(out), f"{path.name} skipped {hidden} without saying why"


# Course modules that are about one framework only and import it at once.
TORCH_ONLY = {"memory"}


def test_course_modules_import_without_either_framework(hide_frameworks):
    """Framework-specific work in the course layer is imported when it runs, so a notebook can
    import its modules on an image with one framework, or none, and say what it skips."""
    code = ("import importlib, pkgutil, labkit.course as c\n"
            f"for m in sorted(set(n.name for n in pkgutil.iter_modules(c.__path__)) - {TORCH_ONLY!r}):\n"
            "    importlib.import_module('labkit.course.' + m)\n"
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], env=hide_frameworks("torch", "tensorflow"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
