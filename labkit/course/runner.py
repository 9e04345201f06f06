"""`labkit course`: every notebook in order, then one report of what this machine measured.

Writes `runs/<timestamp>/<notebook>.ipynb` (executed), `artifacts/` (what notebooks made),
`summary.md` and `summary.json`. Before the first notebook starts, every notebook's parameters
are checked (a name no notebook declares, or a value one of them cannot take, stops the course
before anything runs) and the output folder must be writable. A failing notebook does not stop
the others; the command exits non-zero if any failed.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from labkit.core.config import ParameterError
from labkit.core.outputs import check_folder
from labkit.course.notebook import (
    ARTIFACTS_ENV,
    NotebookRun,
    check_parameters,
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
    the path of the markdown report. Raises ParameterError (a parameter no notebook declares, or
    one a notebook cannot take) or UnwritableOutput before any notebook runs."""
    out = Path(out_dir) if out_dir else Path("runs") / timestamp()
    check_folder("out", out)
    notebooks = course_notebooks(notebook_dir)
    if only:
        notebooks = [nb for nb in notebooks if any(key in nb.stem for key in only)]
        if not notebooks:
            raise FileNotFoundError(f"no course notebook matches {only}")
    plan = course_parameters(notebooks, parameters or {})
    previous = os.environ.get(ARTIFACTS_ENV)
    os.environ[ARTIFACTS_ENV] = str((out / "artifacts").resolve())
    runs = []
    try:
        for nb, params in plan:
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


def course_parameters(notebooks: list[Path], parameters: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """Each notebook with the parameters it declares, all checked before any runs: a name that
    none of `notebooks` declares (a typo would otherwise run the whole course with defaults) or
    a value that one of them cannot take raises ParameterError naming it (and the notebook)."""
    declared = {nb: notebook_parameters(nb) for nb in notebooks}
    for name, value in parameters.items():
        if not any(name in d for d in declared.values()):
            known = sorted({k for d in declared.values() for k in d})
            raise ParameterError(name, value, f"is not a parameter of any notebook run here "
                                 f"(they have: {', '.join(known) or 'none'})")
    plan = []
    for nb, names in declared.items():
        params = {k: v for k, v in parameters.items() if k in names}
        check_parameters(nb, params, names)
        plan.append((nb, params))
    return plan


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
