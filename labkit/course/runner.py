"""`labkit course`: every notebook in order, then one report of what this machine measured.

Writes `runs/<timestamp>/<notebook>.ipynb` (executed), `artifacts/` (what notebooks made),
`summary.md` and `summary.json`. A failing notebook does not stop the others; the command exits
non-zero if any failed.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit.course.notebook import (
    ARTIFACTS_ENV,
    NotebookRun,
    course_notebooks,
    notebook_parameters,
    run_notebook,
    timestamp,
)
from labkit.course.tables import table


def run_course(
    out_dir: str | os.PathLike | None = None,
    parameters: dict[str, Any] | None = None,
    *,
    notebook_dir: str | os.PathLike | None = None,
    only: list[str] | None = None,
    echo=print,
) -> tuple[list[NotebookRun], Path]:
    """Run the course; `parameters` go to each notebook that declares them. Returns the runs and
    the path of the markdown report."""
    out = Path(out_dir) if out_dir else Path("runs") / timestamp()
    out.mkdir(parents=True, exist_ok=True)
    notebooks = course_notebooks(notebook_dir)
    if only:
        notebooks = [nb for nb in notebooks if any(key in nb.stem for key in only)]
        if not notebooks:
            raise FileNotFoundError(f"no course notebook matches {only}")
    previous = os.environ.get(ARTIFACTS_ENV)
    os.environ[ARTIFACTS_ENV] = str((out / "artifacts").resolve())
    runs = []
    try:
        for nb in notebooks:
            declared = notebook_parameters(nb)
            params = {k: v for k, v in (parameters or {}).items() if k in declared}
            echo(f"running {nb.name} ...", flush=True)
            run = run_notebook(nb, out / nb.name, params, kernel_log=True)
            status = "ok" if run.ok else f"FAILED: {run.error} (kernel log: {run.log})"
            echo(f"  {status} ({run.seconds:.0f}s)", flush=True)
            runs.append(run)
    finally:
        if previous is None:
            os.environ.pop(ARTIFACTS_ENV, None)
        else:
            os.environ[ARTIFACTS_ENV] = previous
    return runs, write_report(runs, out)


def _machine_line() -> str:
    from labkit.core import devices

    info = devices.detect()
    gpus = ", ".join(f"{g.name} ({g.memory_gib:.0f} GiB)" for g in info.gpus) or "no GPU"
    return f"{info.cpu_count} CPU cores ({info.cpu_model}), {gpus}, Python {platform.python_version()}"


def write_report(runs: list[NotebookRun], out: Path) -> Path:
    """summary.md (for people) and summary.json (for code) beside the executed notebooks."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = _machine_line()
    rows = [{"notebook": f"[{r.notebook.stem}]({r.output.name})",
             "status": "ok" if r.ok else f"failed: {r.error[:120]}", "time": f"{r.seconds:.0f}s",
             "key figures measured in this run": "<br>".join(f.text() for f in r.figures) or "—"} for r in runs]
    lines = [
        "# Course run summary", "",
        f"- when: {when}", f"- machine: {machine}",
        f"- notebooks: {sum(r.ok for r in runs)} of {len(runs)} succeeded, "
        f"{sum(r.seconds for r in runs) / 60:.1f} minutes in all", "",
        table(rows, markdown=True),
    ]
    md = out / "summary.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = {
        "when": when, "machine": machine,
        "runs": [{
            "notebook": r.notebook.name, "output": str(r.output), "ok": r.ok, "error": r.error,
            "seconds": r.seconds, "parameters": r.parameters,
            "figures": [asdict(f) for f in r.figures],
        } for r in runs],
    }
    (out / "summary.json").write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    return md
