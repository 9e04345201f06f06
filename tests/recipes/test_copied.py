"""A PyTorch recipe copied out of labkit runs on its own. The recipe and the three files it needs
(common.py, plain.py, samples.py) go into an empty folder; a Python that has PyTorch and NumPy but
cannot import labkit runs it there, as a learner runs a script; the copy trains (its loss falls,
its metrics file is written) and gives `labkit train`'s losses, because plain.py and samples.py
are the files labkit's engine builds its networks and data from.

How labkit is kept out: labkit may be installed in this environment in editable mode, which
setuptools implements with "a special .pth file in the target directory (usually site-packages)
that extends the PYTHONPATH or install[s] a custom import hook", with "no guarantee of which
technique will be used" (https://setuptools.pypa.io/en/latest/userguide/development_mode.html,
read 2026-11-29). Leaving the repository off PYTHONPATH is then not enough, and `python -S` (no
`site` at all) would drop the site-packages that hold torch too. Instead PYTHONPATH holds only a
folder with a `sitecustomize.py`, which `site` imports at start-up "after these path
manipulations", the .pth files included (https://docs.python.org/3/library/site.html, read
2026-11-29); it puts a finder first on `sys.meta_path` that refuses `labkit` and its submodules
and notes each attempt in a file. Every process of the run gets it, torchrun's workers too (they
inherit the environment), whichever way labkit is installed; the test checks that `import labkit`
fails there, and that the copy never tried it.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.core.train_config import PREEMPTED_EXIT_CODE
from tests.conftest import launch_output
from tests.recipes.test_torch import SMALL, _assert_equal, _engine


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("torch")


REPO = Path(__file__).resolve().parents[2]
# What a copy of a PyTorch recipe takes with it, from where labkit keeps it.
SHARED_FILES = ("labkit/recipes/common.py", "labkit/torch/plain.py", "labkit/data/samples.py")
BLOCKER = '''
import importlib.abc
import os
import sys


class NoLabkit(importlib.abc.MetaPathFinder):
    """Refuse labkit: a copied recipe must run without it."""

    def find_spec(self, name, path=None, target=None):
        if name == "labkit" or name.startswith("labkit."):
            with open(os.environ["LABKIT_IMPORT_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r} (kept out of a copied recipe)", name=name)
        return None


sys.meta_path.insert(0, NoLabkit())
'''


def copy_recipe(name: str, folder: Path) -> Path:
    """The recipe and the files it needs, side by side in `folder`, as a learner copies them
    (the list the notebook shows under the recipe)."""
    from labkit.course import recipe_view

    files = recipe_view.copy_files(name)
    assert sorted(files) == sorted([f"labkit/recipes/{name}.py", *SHARED_FILES])
    folder.mkdir()
    for path in files:
        shutil.copy(REPO / path, folder)
    script = folder / recipe_view.copy_name(name)
    (folder / f"{name}.py").rename(script)
    return script


def without_labkit(tmp_path: Path) -> dict[str, str]:
    """An environment whose Pythons import torch and numpy but not labkit (module docstring)."""
    blocker = tmp_path / "no_labkit"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k not in (
        "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(blocker), LABKIT_IMPORT_LOG=str(tmp_path / "labkit_imports.log"),
               OMP_NUM_THREADS="1")
    return env


def run_copy(script: Path, argv: list[str], env: dict[str, str], *, nproc: int = 1,
             expect: int = 0) -> subprocess.CompletedProcess:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] \
        if nproc > 1 else []
    r = subprocess.run([sys.executable, *launcher, script.name, *argv], cwd=script.parent, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == expect, launch_output(r)
    return r


def losses(path: Path) -> list[float]:
    return [s["loss"] for s in json.loads(path.read_text())["steps"]]


def assert_labkit_was_kept_out(tmp_path: Path, env: dict[str, str]) -> None:
    """labkit cannot be imported in `env`, and nothing the copy ran asked for it."""
    r = subprocess.run([sys.executable, "-c", "import labkit"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "kept out of a copied recipe" in r.stderr, r.stderr
    log = tmp_path / "labkit_imports.log"
    assert log.read_text().splitlines() == ["labkit"]  # the check just made, nothing else


def labkit_imports(tree: ast.AST) -> list[ast.stmt]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and any(
        name.startswith("labkit") for name in ([n.module or ""] if isinstance(n, ast.ImportFrom)
                                               else [a.name for a in n.names]))]


def test_the_page_lists_the_files_a_copy_needs():
    from labkit.course import recipe_view

    assert "Outside labkit: copy recipes/ddp.py, recipes/common.py" in recipe_view.show("ddp")._repr_html_()
    assert recipe_view.copy_files("keras_mixed_precision") == []  # TensorFlow's recipes need labkit
    assert "Outside labkit" not in recipe_view.show("tfrecord_pipeline")._repr_html_()
    assert recipe_view.copy_name("ddp") == "ddp.py"
    assert "the recipe as <code>profile_recipe.py</code>" in recipe_view.show("profile")._repr_html_()


def test_what_a_copy_runs_imports_nothing_of_labkit():
    """plain.py and samples.py import nothing of labkit at all. A recipe and common.py import it
    at module level only under `if __package__:` (labkit's own path: a copy run as a script has
    no package); common.py's helpers for labkit's side import it inside, when called."""
    for path in SHARED_FILES[1:]:
        assert not labkit_imports(ast.parse((REPO / path).read_text())), path
    for path in ("labkit/recipes/common.py", "labkit/recipes/ddp.py",
                 "labkit/recipes/mixed_precision.py", "labkit/recipes/preemptible.py"):
        tree = ast.parse((REPO / path).read_text())
        guarded = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__package__"]
        top = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
        outside = [n for stmt in top if stmt not in guarded for n in labkit_imports(stmt)]
        inside = [n for stmt in guarded for branch in stmt.orelse for n in labkit_imports(branch)]
        assert guarded and not outside and not inside, path


@pytest.mark.parametrize("name,argv", [
    ("mixed_precision", ["--model", "cnn"]),
    # fp8's Linear layers are in the recipe itself (a copy of labkit.torch.fp8's algorithm)
    pytest.param("mixed_precision", ["--model", "gpt", "--precision", "fp8"], marks=pytest.mark.slow),
    pytest.param("ddp", ["--model", "gpt", "--grad-accum", "2"], marks=pytest.mark.slow),
    pytest.param("attention", ["--model", "gpt", "--attention", "manual"], marks=pytest.mark.slow),
    # copied as profile_recipe.py: a profile.py beside it would hide the standard library's
    pytest.param("profile", ["--model", "gpt", "--trace-dir", "tb"], marks=pytest.mark.slow),
])
def test_a_copied_recipe_trains_without_labkit_and_gives_the_engine_s_losses(tmp_path, name, argv):
    script, env = copy_recipe(name, tmp_path / "copy"), without_labkit(tmp_path)
    argv = [*argv, "--steps", "6", *SMALL]
    run_copy(script, [*argv, "--metrics-out", "m.json"], env)
    data = json.loads((script.parent / "m.json").read_text())
    assert [s["step"] for s in data["steps"]] == list(range(6))
    assert data["run"]["recipe"] == name and data["summary"]["num_steps"] == 6
    assert data["summary"]["final_loss"] < data["summary"]["first_loss"]  # it learns
    precision = argv[argv.index("--precision") + 1] if "--precision" in argv else "fp32"
    _assert_equal(losses(script.parent / "m.json"), _engine(argv), precision)
    assert_labkit_was_kept_out(tmp_path, env)


@pytest.mark.slow
def test_a_copied_preemptible_recipe_survives_its_drill_without_labkit(tmp_path):
    """SIGTERM to itself in step 3, exit 143, and the rerun resumes at step 4 from the committed
    checkpoint (written through fsspec, which the recipe needs besides torch and numpy): the two
    halves are the engine's uninterrupted run."""
    script, env = copy_recipe("preemptible", tmp_path / "copy"), without_labkit(tmp_path)
    argv = ["--model", "cnn", "--steps", "7", *SMALL, "--checkpoint-dir", "ckpt",
            "--checkpoint-every", "2", "--preempt-at", "3"]
    run_copy(script, [*argv, "--metrics-out", "a.json"], env, expect=PREEMPTED_EXIT_CODE)
    assert "continuing with step 4" in run_copy(script, [*argv, "--metrics-out", "b.json"], env).stdout
    resumed = losses(script.parent / "a.json") + losses(script.parent / "b.json")
    assert len(resumed) == 7 and resumed[-1] < resumed[0]
    assert (script.parent / "ckpt" / "step-00000006" / "COMMITTED").exists()
    _assert_equal(resumed, _engine(argv))
    assert_labkit_was_kept_out(tmp_path, env)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_copied_ddp_recipe_under_torchrun_trains_without_labkit(tmp_path):
    """Two processes started by torchrun from the copy's folder: each imports the copy's own
    common.py, and rank 0 writes the engine's two-replica losses."""
    script, env = copy_recipe("ddp", tmp_path / "copy"), without_labkit(tmp_path)
    argv = ["--model", "gpt", "--steps", "5", *SMALL]
    r = run_copy(script, [*argv, "--metrics-out", "m.json"], env, nproc=2)
    assert r.stdout.count("step 0 loss") == 1
    data = json.loads((script.parent / "m.json").read_text())
    assert data["run"]["world_size"] == 2 and data["summary"]["final_loss"] < data["summary"]["first_loss"]
    _assert_equal(losses(script.parent / "m.json"), _engine(argv, nproc=2))
    assert_labkit_was_kept_out(tmp_path, env)
