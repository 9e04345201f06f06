"""The course layer's index (its package docstring) names every module it has and every notebook."""

from __future__ import annotations

import re
from pathlib import Path

import labkit.course
from tests.conftest import NOTEBOOK_DIR

COURSE = Path(labkit.course.__file__).parent


def test_the_index_names_every_module_and_notebook():
    doc = labkit.course.__doc__
    words = set(re.findall(r"[a-z_]+", doc))
    modules = {p.stem for p in COURSE.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in COURSE.glob("*/__init__.py")}
    submodules = {p.stem for p in COURSE.glob("*/*.py") if p.stem != "__init__"}
    assert not (modules | packages | submodules) - words, "modules missing from labkit.course's index"
    numbers = {p.name[:2] for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.py")}
    listed = set(re.findall(r"^    (\d\d)  ", doc, flags=re.M))
    assert numbers and listed == numbers
