"""For every test path, notebooks included: an executed notebook cell (nbval) that writes to
stderr fails, unless the cell is tagged `allow-stderr` (labkit.notebooks.STDERR_TAG)
because that output is part of the lesson.

A notebook that the browser test (tests/browser, which runs first) has already executed in
JupyterLab with every check passed is not executed again by nbval: the same kernel ran the same
cells there, and the browser test checks all nbval checks (no error in any cell, every cell run,
no stderr) and more. Without Chromium, or for a notebook that failed in the browser, nbval runs
it as usual; `-m "not browser"` gives nbval every notebook."""

from __future__ import annotations

import pytest

from labkit.notebooks.stderr import STDERR_TAG, allows_stderr, stderr_text
from tests.executed import ran_in_lab

MAX_SHOWN_LINES = 8
# `make test` runs on pytest-xdist workers (--dist loadgroup): the browser tests and nbval's cells
# are one group, so they run in one worker in collection order (browser first) and nbval sees
# which notebooks the browser already ran; every other test goes to whichever worker is free.
NOTEBOOK_GROUP = "notebooks"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group into each test's id
def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("browser") or getattr(item, "cell", None) is not None:
            item.add_marker(pytest.mark.xdist_group(NOTEBOOK_GROUP))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before nbval's own setup, so no kernel is started for a notebook already run in the lab.
    if getattr(item, "cell", None) is not None and item.path.name in ran_in_lab(item.config):
        pytest.skip(f"{item.path.name} was executed in JupyterLab by tests/browser in this session, "
                    "every cell with no error or stderr")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    outputs, cell = getattr(item, "test_outputs", None), getattr(item, "cell", None)
    if outputs is None or cell is None or allows_stderr(cell):  # not an nbval cell, or allowed
        return result
    text = stderr_text(outputs).strip()
    if text:
        shown = "\n".join(text.splitlines()[-MAX_SHOWN_LINES:])
        item.raise_cell_error(f"the cell wrote to stderr; send library and child-process output "
                              f"to the notebook's log, or tag the cell {STDERR_TAG!r} if it is part "
                              f"of the lesson:\n{shown}")
    return result
