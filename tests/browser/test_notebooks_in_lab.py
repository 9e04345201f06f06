"""Every course notebook opened in JupyterLab in a real (headless) browser and run as a learner
runs it: Run All, then what the page shows is checked, not only what the kernel returned.

Per notebook: it opens with the course kernel and no kernel dialog; every code cell executes with
no error output and nothing unexpected on stderr; every image, table, syntax-highlighted code
block and progress widget in its outputs is rendered in the page; a notebook that trains shows at
least one progress widget. A screenshot of each is kept (see `browser_outputs`).
"""

from __future__ import annotations

import time

import nbformat
import pytest

from labkit.notebooks.figures import against_verdict, figures_in_notebook
from labkit.notebooks.kernel import KERNEL_NAME
from labkit.notebooks.stderr import unexpected_stderr
from tests.conftest import NOTEBOOK_DIR
from tests.executed import ran_in_lab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOKS = sorted(p.name for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
# Every notebook that trains, writes shards or runs a benchmark ladder must show a progress
# widget, except: 00 and 01 (seconds of environment checks and micro-benchmarks) and 05, whose
# runs are profiled (a bar's redraws would show up in the traces it analyses).
NO_PROGRESS_BAR = {"00_tour.ipynb", "01_hardware_choice.ipynb", "05_profiling.ipynb"}
OPEN_TIMEOUT_MS = 120_000
RUN_TIMEOUT_MS = 600_000
MAX_SCREENSHOT_PX = 16_000

_CURRENT = "window.jupyterapp.shell.currentWidget"

KERNEL_READY = """() => {
  const app = window.jupyterapp; const w = app && app.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!(k && k.status === 'idle' && w.context.isReady);
}"""

# Done: the kernel is idle and no cell is queued or running ([*]).
RUN_FINISHED = f"""() => {{
  const w = {_CURRENT}; const k = w.sessionContext.session.kernel;
  return k.status === 'idle' &&
    w.content.widgets.every(c => c.model.type !== 'code' || c.model.executionState !== 'running');
}}"""

# What the page shows in each code cell's output area, beside what the cell's outputs hold.
INSPECT = f"""() => {{
  const w = {_CURRENT};
  const count = (outs, test) => outs.filter(test).length;
  return w.content.widgets.map((cell, index) => {{
    if (cell.model.type !== 'code') return null;
    const outs = cell.model.toJSON().outputs || [];
    const data = o => o.data || {{}};
    const area = cell.node.querySelector('.jp-OutputArea') || cell.node;
    const imgs = [...area.querySelectorAll('.jp-RenderedImage img')];
    const colours = [...area.querySelectorAll('.highlight')].map(block => new Set(
      [...block.querySelectorAll('span[class]')].map(s => getComputedStyle(s).color)).size);
    return {{
      index,
      images: count(outs, o => ['image/png', 'image/jpeg', 'image/svg+xml'].some(m => m in data(o))),
      images_shown: imgs.filter(i => i.complete && i.naturalWidth > 0).length
        + area.querySelectorAll('.jp-RenderedSVG svg').length,
      tables: count(outs, o => /<table/i.test(data(o)['text/html'] || '')
                               || /^\\s*\\|?\\s*:?-{{3,}}/m.test(data(o)['text/markdown'] || '')),
      tables_shown: area.querySelectorAll('.jp-OutputArea-output table').length,
      highlighted: count(outs, o => /class="highlight"/.test(data(o)['text/html'] || '')),
      highlight_colours: colours,
      widgets: count(outs, o => 'application/vnd.jupyter.widget-view+json' in data(o)),
      progress_shown: area.querySelectorAll('.jupyter-widgets .progress-bar').length,
      widget_errors: [...area.querySelectorAll('.jp-OutputArea-output')]
        .map(n => n.textContent).filter(t => /Error displaying widget|Loading widget/.test(t)),
    }};
  }}).filter(c => c !== null);
}}"""


@pytest.mark.parametrize("name", NOTEBOOKS, ids=[n.removesuffix(".ipynb") for n in NOTEBOOKS])
def test_notebook_runs_clean_in_jupyterlab(name, lab, browser, browser_outputs, record_timing, request):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    start, cpu_before = time.monotonic(), lab.children_cpu_seconds()
    try:
        page.goto(lab.page_url(name))
        page.wait_for_function(KERNEL_READY, timeout=OPEN_TIMEOUT_MS, polling=500)
        assert page.locator(".jp-Dialog").count() == 0, \
            f"JupyterLab asked something on opening {name}: {page.locator('.jp-Dialog').inner_text()}"
        kernel = page.evaluate(f"() => {_CURRENT}.sessionContext.session.kernel.name")
        assert kernel == KERNEL_NAME, f"{name} started kernel {kernel!r}, not {KERNEL_NAME!r}"

        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_timeout(1000)
        page.wait_for_function(RUN_FINISHED, timeout=RUN_TIMEOUT_MS, polling=1000)
        page.wait_for_timeout(1000)  # let the last outputs and widgets render
        seconds = time.monotonic() - start
        nb = nbformat.from_dict(page.evaluate(f"() => {_CURRENT}.content.model.toJSON()"))
        cells = page.evaluate(INSPECT)
    finally:
        _screenshot(page, browser_outputs / name.replace(".ipynb", ".png"))
        page.evaluate(f"() => {_CURRENT} && {_CURRENT}.sessionContext.shutdown()")
        page.close()
    cpu_after = lab.children_cpu_seconds()
    record_timing(name, seconds, cpu_after - cpu_before if cpu_before is not None else None)

    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    errors = [f"cell {i}: {o.ename}: {o.evalue}" for i, c in code for o in c.outputs
              if o.output_type == "error"]
    assert not errors, f"{name} raised in the browser: " + "; ".join(errors)
    unrun = [i for i, c in code if c.execution_count is None]
    assert not unrun, f"{name}: cells {unrun} were not executed"
    stderr = unexpected_stderr(nb)
    assert not stderr, f"{name}: stderr in the lesson: " + "; ".join(
        f"cell {i}: {text.strip().splitlines()[-1][:200]}" for i, text in stderr)
    assert not page_errors, f"{name}: JavaScript errors in the page: {page_errors}"
    wrong = against_verdict(figures_in_notebook(nb))
    assert not wrong, f"{name}: a ratio headline against its own verdict: {[f.text() for f in wrong]}"

    for c in cells:
        where = f"{name} cell {c['index']}"
        assert c["images_shown"] >= c["images"], f"{where}: {c['images']} plot(s), {c['images_shown']} shown"
        assert c["tables_shown"] >= c["tables"], f"{where}: {c['tables']} table(s), {c['tables_shown']} shown"
        assert len(c["highlight_colours"]) >= c["highlighted"], f"{where}: highlighted code not shown"
        assert all(n >= 3 for n in c["highlight_colours"]), \
            f"{where}: code shown without syntax colours ({c['highlight_colours']} distinct colours)"
        assert not c["widget_errors"], f"{where}: {c['widget_errors']}"
        assert c["progress_shown"] >= min(c["widgets"], 1), f"{where}: progress widget not rendered"
    if name not in NO_PROGRESS_BAR:
        assert any(c["widgets"] and c["progress_shown"] for c in cells), \
            f"{name} trains or benchmarks but showed no progress widget"
    ran_in_lab(request.config).add(name)  # every check passed: nbval need not run it again


def _screenshot(page, path) -> None:
    """The whole notebook, not only the visible part: the page is made as tall as the notebook
    (the notebook scrolls inside the page, so a full-page screenshot would cut it)."""
    try:
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        height = page.evaluate(
            "() => { const n = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');"
            " return n ? n.scrollHeight : 0; }")
        page.set_viewport_size({"width": 1400, "height": min(MAX_SCREENSHOT_PX, max(1000, height + 200))})
        page.evaluate("() => { const n = document.querySelector('.jp-NotebookPanel .jp-WindowedPanel-outer');"
                      " if (n) n.scrollTop = 0; }")
        page.wait_for_timeout(500)
        page.screenshot(path=str(path))
    except Exception as e:  # noqa: BLE001 - a failed screenshot must not hide the test's verdict
        path.with_suffix(".txt").write_text(f"no screenshot: {e}\n")
