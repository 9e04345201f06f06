"""Every course notebook follows the conventions: a parameters cell first, no committed outputs,
thin cells (logic lives in labkit), and a py:percent twin that says the same thing."""

from __future__ import annotations

import ast
import re

import jupytext
import nbformat
import pytest

from labkit.notebooks import KERNEL_NAME
from tests.conftest import NOTEBOOK_DIR

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
MAX_LOGIC_LINES = 12
# Training loops and gradient code belong in labkit, never in a cell.
FORBIDDEN = re.compile(r"\.backward\(|GradientTape|optimizer\.step\(|\.zero_grad\(")


def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _logic_lines(source: str) -> list[str]:
    return [ln for ln in source.splitlines() if ln.strip() and not ln.strip().startswith(("#", "%", "!"))]


def test_the_course_has_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_tour.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_first_code_cell_is_parameters_with_scale(path):
    nb = nbformat.read(path, as_version=4)
    first = _code_cells(nb)[0]
    assert "parameters" in first.metadata.get("tags", []), "first code cell must be tagged parameters"
    names = {t.id for node in ast.parse(first.source).body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    assert "scale" in names
    assert re.search(r'^scale = "auto"$', first.source, re.M), 'scale must default to "auto"'
    assert all(isinstance(n, ast.Assign) for n in ast.parse(first.source).body), \
        "the parameters cell holds plain assignments only"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_imports_cell_routes_kernel_stderr_first(path):
    """Nothing routes a kernel's stderr on import, so each notebook asks, before any import that
    could print (TensorFlow's start-up messages)."""
    body = ast.parse(_code_cells(nbformat.read(path, as_version=4))[1].source).body
    calls = [i for i, node in enumerate(body) if isinstance(node, ast.Expr)
             and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "route_kernel_stderr"]
    assert calls, "the cell after the parameters must call route_kernel_stderr()"
    assert all(isinstance(node, ast.ImportFrom) and node.module == "labkit.notebooks"
               for node in body[:calls[0]]), "route_kernel_stderr() must come before the other imports"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_committed_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(_code_cells(nb)):
        assert not cell.outputs, f"code cell {i} has outputs (strip them: nbstripout)"
        assert cell.execution_count is None, f"code cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_cells_are_thin(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(_code_cells(nb)):
        lines = [] if "parameters" in cell.metadata.get("tags", []) else _logic_lines(cell.source)  # plain values
        assert len(lines) <= MAX_LOGIC_LINES, f"code cell {i} has {len(lines)} lines of logic; move it to labkit"
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            assert not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.While)), \
                f"code cell {i} defines a function/class or loops with while; that belongs in labkit"
        assert not FORBIDDEN.search(cell.source), f"code cell {i} contains training-loop code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_script_matches(path):
    script = path.with_suffix(".py")
    assert script.exists(), f"{path.name} has no py:percent twin (run `make sync`)"
    nb = jupytext.read(path)
    twin = jupytext.read(script)
    assert [(c.cell_type, c.source) for c in nb.cells] == [(c.cell_type, c.source) for c in twin.cells], \
        f"{path.name} and {script.name} differ (run `make sync`)"
    assert nb.metadata.get("kernelspec", {}).get("name") == KERNEL_NAME


def _shown_recipes(path) -> set[str]:
    """The recipes a notebook's code cells display with `recipe_view.show("NAME")`."""
    nb = nbformat.read(path, as_version=4)
    return {m.group(1) for cell in _code_cells(nb)
            for m in re.finditer(r"""recipe_view\.show\(["'](\w+)["']\)""", cell.source)}


def test_every_recipe_is_shown_in_the_notebook_that_teaches_it():
    from labkit.course import recipe_view

    assert set(recipe_view.NOTEBOOKS) == set(recipe_view.RECIPES)
    names = {p.stem for p in NOTEBOOKS}
    assert set(recipe_view.NOTEBOOKS.values()) <= names, "a recipe names a notebook that does not exist"
    for path in NOTEBOOKS:
        wanted = {r for r, nb in recipe_view.NOTEBOOKS.items() if nb == path.stem}
        missing = wanted - _shown_recipes(path)
        assert not missing, f"{path.name} no longer shows {sorted(missing)} with recipe_view.show"
    for number in range(2, 9):  # every technique notebook has code on the page
        path = next(p for p in NOTEBOOKS if p.stem.startswith(f"{number:02d}_"))
        assert _shown_recipes(path), f"{path.name} shows no recipe"
        headings = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown"]
        assert any(re.search(r"^## (\d+\. )?The code", h, re.M) for h in headings), \
            f"{path.name} has no '## The code' section"
