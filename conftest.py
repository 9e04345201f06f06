"""For every test path, notebooks included: an executed notebook cell (nbval) that writes to
stderr fails, unless the cell is tagged `allow-stderr` (labkit.course.notebook.STDERR_TAG)
because that output is part of the lesson."""

from __future__ import annotations

import pytest

from labkit.course.notebook import STDERR_TAG, allows_stderr, stderr_text

MAX_SHOWN_LINES = 8


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
