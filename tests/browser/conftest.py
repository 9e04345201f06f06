"""One JupyterLab server and one headless Chromium shared by the browser tests of a module.
Without Chromium (or Playwright) the tests are skipped with a one-line reason saying how to get
it; `make setup` installs Chromium where it can."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.browser.lab import CHROMIUM_ARGS, find_chromium, start_lab
from tests.conftest import NOTEBOOK_DIR, REPO


@pytest.fixture(scope="module")
def chromium() -> str:
    path, why = find_chromium()
    if path is None:
        pytest.skip(why)
    return path


@pytest.fixture(scope="module")
def browser(chromium):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright is not installed: `pip install playwright` (the dev extra has it)")
    with sync_playwright() as p:
        # Playwright gives the browser a fresh, temporary profile (user data dir).
        instance = p.chromium.launch(executable_path=chromium, args=list(CHROMIUM_ARGS))
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory, browser):
    """JupyterLab serving a copy of the course notebooks (running them in the page must not
    touch the repository's files), its state and the kernels' artifacts under a temporary folder."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "notebooks"
    root.mkdir()
    for nb in sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")):
        shutil.copy2(nb, root / nb.name)
    server = start_lab(root, base / "state", repo=REPO, artifacts=base / "artifacts")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser_outputs(tmp_path_factory) -> Path:
    """Screenshots and timings of the browser run: `<basetemp>/browser-screenshots/`."""
    out = tmp_path_factory.getbasetemp() / "browser-screenshots"
    out.mkdir(exist_ok=True)
    return out


@pytest.fixture(scope="session")
def record_timing(browser_outputs):
    """`record_timing(name, seconds, cpu_seconds)`: kept in `timings.json` beside the
    screenshots, with the totals and the machine's load average when the notebook finished."""
    path = browser_outputs / "timings.json"

    def record(name: str, seconds: float, cpu_seconds: float | None) -> None:
        data = json.loads(path.read_text()) if path.exists() else {"notebooks": {}}
        data["notebooks"][name] = {"wall_s": round(seconds, 1), "cpu_s": cpu_seconds and round(cpu_seconds, 1),
                                   "load_average_1min": round(os.getloadavg()[0], 2)}
        runs = data["notebooks"].values()
        data["total_wall_s"] = round(sum(r["wall_s"] for r in runs), 1)
        data["total_cpu_s"] = round(sum(r["cpu_s"] or 0 for r in runs), 1)
        path.write_text(json.dumps(data, indent=1))

    return record
