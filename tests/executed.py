"""Which notebooks this pytest session has already executed in full, in JupyterLab in a real
browser (tests/browser): nbval does not run them a second time (see the root conftest)."""

from __future__ import annotations

import pytest

RAN_IN_LAB = pytest.StashKey[set[str]]()


def ran_in_lab(config: pytest.Config) -> set[str]:
    """The set of notebook file names (e.g. "04_mixed_precision.ipynb"), created on first use."""
    return config.stash.setdefault(RAN_IN_LAB, set())
