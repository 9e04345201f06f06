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
# `make test` runs on pytest-xdist workers. The browser tests and nbval's cells are one unit of
# work: one worker runs them all, in collection order (browser first), so nbval sees which
# notebooks the browser already ran and a notebook's cells share one kernel; every other test
# goes to whichever worker is free. (A scheduler rather than xdist_group marks: --dist loadgroup
# renames node ids through a private attribute that pytest 9.2 no longer reads.)
NOTEBOOK_GROUP = "notebooks"


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which may be absent
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None  # another --dist mode asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class NotebooksTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return NOTEBOOK_GROUP if path.startswith("tests/browser/") or path.endswith(".ipynb") else nodeid

    return NotebooksTogether(config, log)


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
