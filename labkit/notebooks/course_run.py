"""Every course notebook in order: `labkit course` (the CLI adds the summary report).

Before the first notebook starts, every notebook's parameters are checked (a name no notebook
declares, or a value one of them cannot take, stops the course before anything runs) and the
output folder must be writable. Each notebook is written executed as `<out>/<notebook>.ipynb`,
its kernel's log beside it, and the files it makes under `<out>/artifacts/`. A failing notebook
does not stop the others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from labkit.core.config import ParameterError
from labkit.core.lease import Lease
from labkit.core.notebook_params import check_parameters, notebook_parameters
from labkit.core.outputs import check_folder
from labkit.notebooks.artifacts import ARTIFACTS_ENV
from labkit.notebooks.execute import NotebookRun, run_notebook


def find_notebook_dir(start: str | os.PathLike | None = None) -> Path:
    """The course's `notebooks/` folder: under `start` (default: the working directory) or
    beside the installed package (an editable install from the repository)."""
    candidates = [Path(start or Path.cwd()) / "notebooks", Path(__file__).resolve().parents[2] / "notebooks"]
    for c in candidates:
        if c.is_dir() and any(c.glob("[0-9][0-9]_*.ipynb")):
            return c
    raise FileNotFoundError("no notebooks/ folder with NN_name.ipynb notebooks found (looked in "
                            + ", ".join(str(c) for c in candidates) + ")")


def course_notebooks(notebook_dir: str | os.PathLike | None = None) -> list[Path]:
    """The course notebooks in order: `NN_name.ipynb`."""
    d = Path(notebook_dir) if notebook_dir else find_notebook_dir()
    return sorted(d.glob("[0-9][0-9]_*.ipynb"))


def run_course(
    out_dir: str | os.PathLike,
    parameters: dict[str, Any] | None = None,
    *,
    notebook_dir: str | os.PathLike | None = None,
    only: list[str] | None = None,
    echo=print,
    overwrite: bool = False,
) -> list[NotebookRun]:
    """Run the course into `out_dir`; `parameters` go to each notebook that declares them.
    Raises ParameterError (a parameter no notebook declares, or one a notebook cannot take) or
    UnwritableOutput before any notebook runs."""
    out = Path(out_dir)
    check_folder("out", out)
    notebooks = course_notebooks(notebook_dir)
    if only:
        notebooks = [nb for nb in notebooks if any(key in nb.stem for key in only)]
        if not notebooks:
            raise FileNotFoundError(f"no course notebook matches {only}")
    plan = course_parameters(notebooks, parameters or {})
    if not overwrite:
        check_no_earlier_run(out)
    previous = os.environ.get(ARTIFACTS_ENV)
    os.environ[ARTIFACTS_ENV] = str((out / "artifacts").resolve())
    runs = []
    lease = Lease(str(out), name="-o").acquire()  # one course run per folder: a second is refused, naming it
    try:
        for nb, params in plan:
            echo(f"running {nb.name} ...", flush=True)
            run = run_notebook(nb, out / nb.name, params, kernel_log=True)
            status = "ok" if run.ok else f"FAILED: {run.error} (kernel log: {run.log})"
            echo(f"  {status} ({run.seconds:.0f}s)", flush=True)
            runs.append(run)
    finally:
        lease.release()
        if previous is None:
            os.environ.pop(ARTIFACTS_ENV, None)
        else:
            os.environ[ARTIFACTS_ENV] = previous
    return runs


def check_no_earlier_run(out: Path) -> None:
    """A folder that holds another course run (its summary or executed notebooks) would have
    them replaced one by one: refused, naming what is there."""
    found = [p.name for p in (out / "summary.json", out / "summary.md") if p.exists()]
    found += sorted(p.name for p in out.glob("*.ipynb"))[:3] if out.is_dir() else []
    if found:
        raise ParameterError("out", str(out), f"holds another course run ({', '.join(found)}); a new run "
                             "would replace it: give --overwrite, or another folder")


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
