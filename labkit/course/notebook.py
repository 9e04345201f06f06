"""Running a course notebook headless with papermill, and what a running notebook needs.

`run_notebook` checks the parameters against the notebook's `parameters` cell before starting a
kernel (an unknown name or a value of the wrong type fails at once, naming the parameter), and
that the executed notebook and its kernel log can be written, then executes it and returns the
key figures it recorded. `labkit run NOTEBOOK -p name value` is the command-line form.

The parameter checks themselves (names, kinds, the course-wide domains of `scale` and
`device`) are `labkit.core.notebook_params`'s, shared with Vertex notebook jobs.

The kernel: every course notebook names the Jupyter kernel `KERNEL_NAME` ("labkit", shown as
"Python (labkit)"), which `make setup` registers in the course's environment (`python -m
ipykernel install --sys-prefix --name labkit --display-name "Python (labkit)"`; `--user` on
Vertex AI Workbench), so JupyterLab, papermill, nbval and `labkit run` all start the interpreter
that has labkit.

The lesson stays clean: inside a kernel, what C/C++ libraries and child processes write to file
descriptor 2 (TensorFlow's start-up chatter, gloo's connection messages, a child kernel's
warnings) goes to the notebook's log file (`kernel_log_path`), not into a cell's output.
Python's own stderr (warnings, tracebacks) still shows. A cell whose stderr output is a
deliberate part of the lesson carries the tag `STDERR_TAG`; the tests fail on any other stderr
output in an executed notebook (`unexpected_stderr`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# The parameters cell, read and checked before anything runs, lives in labkit.core so that a
# Vertex notebook job checks it too; the names stay importable from here.
from labkit.core.notebook_params import (  # noqa: F401
    check_parameters,
    notebook_parameters,
    parse_value,
    type_problem,
)
from labkit.core.outputs import check_file
from labkit.core.progress import in_kernel
from labkit.course.report import KeyFigure, figures_in_notebook

ARTIFACTS_ENV = "LABKIT_ARTIFACTS"
KERNEL_NAME = "labkit"
KERNEL_DISPLAY_NAME = "Python (labkit)"
# Where a kernel's file-descriptor-2 output goes (set by `run_notebook` for its kernel).
KERNEL_LOG_ENV = "LABKIT_KERNEL_LOG"
# "notebook": leave file descriptor 2 alone (C/C++ library output shows in the cells).
KERNEL_STDERR_ENV = "LABKIT_KERNEL_STDERR"
STDERR_TAG = "allow-stderr"


class KernelNotFound(FileNotFoundError):
    """The Jupyter kernel a notebook names is not registered in this environment."""


def kernel_install_command(*, user: bool = False) -> str:
    """The command that registers the course kernel for this environment's Python."""
    where = "--user" if user else "--sys-prefix"
    return (f'python -m ipykernel install {where} --name {KERNEL_NAME} '
            f'--display-name "{KERNEL_DISPLAY_NAME}"')


def kernel_spec(name: str = KERNEL_NAME):
    """The registered kernel spec called `name` (jupyter_client's KernelSpec), or None."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        return KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return None


def notebook_kernel(path: str | os.PathLike) -> str | None:
    """The kernel name a notebook's metadata asks for (None if it names none)."""
    import nbformat

    nb = nbformat.read(os.fspath(path), as_version=4)
    return nb.metadata.get("kernelspec", {}).get("name")


def require_kernel(path: str | os.PathLike) -> str:
    """The kernel `path` names, after checking it is registered here (KernelNotFound, with the
    command that registers it, when not)."""
    name = notebook_kernel(path) or KERNEL_NAME
    if kernel_spec(name) is None:
        hint = (f"; register it with `{kernel_install_command()}` (or run `make setup`)"
                if name == KERNEL_NAME else "")
        raise KernelNotFound(f"{Path(path).name} names the Jupyter kernel {name!r}, which is not "
                             f"registered in this environment{hint}")
    return name


def ensure_kernel() -> bool:
    """Register the course kernel for this Python (in `sys.prefix`) unless it exists; True if
    it was registered now. For containers that pip-install labkit and then run a notebook."""
    if kernel_spec() is not None:
        return False
    from ipykernel.kernelspec import install

    install(kernel_name=KERNEL_NAME, display_name=KERNEL_DISPLAY_NAME, prefix=sys.prefix)
    return True


def kernel_log_path(env: Mapping[str, str] | None = None) -> Path:
    """The notebook's log file: $LABKIT_KERNEL_LOG when a runner chose it (`labkit run` and
    `labkit course`: `<executed notebook>.log`), else `<notebook name>.log` under
    $LABKIT_ARTIFACTS or the temporary folder's `labkit-logs/` (the notebook's name comes from
    the Jupyter server, which tells its kernels in JPY_SESSION_NAME)."""
    env = os.environ if env is None else env
    if env.get(KERNEL_LOG_ENV):
        return Path(env[KERNEL_LOG_ENV])
    session = env.get("JPY_SESSION_NAME")
    stem = Path(session).stem if session else f"kernel-{os.getpid()}"
    base = Path(env[ARTIFACTS_ENV]) if env.get(ARTIFACTS_ENV) else Path(tempfile.gettempdir()) / "labkit-logs"
    return base / f"{stem}.log"


_routed_to: Path | None = None


def route_kernel_stderr(path: str | os.PathLike | None = None) -> Path | None:
    """In a Jupyter kernel, point file descriptor 2 at the notebook's log file (appending), so
    C/C++ library output and inherited child-process stderr stay out of the cells. Once per
    process; returns the log's path, or None outside a kernel or with LABKIT_KERNEL_STDERR=notebook.
    Importing `labkit.course` calls it."""
    global _routed_to
    if _routed_to is not None:
        return _routed_to
    if not in_kernel() or os.environ.get(KERNEL_STDERR_ENV, "").lower() == "notebook":
        return None
    target = Path(path) if path else kernel_log_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    _routed_to = target
    return target


def stderr_text(outputs) -> str:
    """What a code cell's outputs (nbformat output dicts) wrote to stderr."""
    return "".join(o.get("text", "") for o in outputs
                   if o.get("output_type") == "stream" and o.get("name") == "stderr")


def allows_stderr(cell) -> bool:
    """Whether a cell's stderr output is a deliberate part of the lesson (tag `STDERR_TAG`)."""
    return STDERR_TAG in cell.get("metadata", {}).get("tags", [])


def unexpected_stderr(nb) -> list[tuple[int, str]]:
    """(cell index, its stderr text) for every code cell of an executed notebook (an nbformat
    node) that wrote to stderr without the `STDERR_TAG` tag."""
    return [(i, text) for i, cell in enumerate(nb.cells)
            if cell.get("cell_type") == "code" and not allows_stderr(cell)
            and (text := stderr_text(cell.get("outputs", []))).strip()]


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


def artifacts_dir(name: str) -> Path:
    """Where a notebook writes files it makes (shards, checkpoints, traces, plots): under
    $LABKIT_ARTIFACTS when the course runner sets it, else a fresh temporary folder, so a run
    never litters the repository."""
    base = os.environ.get(ARTIFACTS_ENV)
    if base:
        path = Path(base) / name
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"labkit-{name}-"))


@dataclass
class NotebookRun:
    """The outcome of one papermill execution."""

    notebook: Path
    output: Path
    parameters: dict[str, Any]
    seconds: float
    ok: bool
    error: str = ""
    figures: list[KeyFigure] = field(default_factory=list)
    log: Path | None = None  # the kernel's stderr, when it was kept out of the terminal


def timestamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def run_notebook(
    notebook: str | os.PathLike,
    output: str | os.PathLike | None = None,
    parameters: dict[str, Any] | None = None,
    *,
    cwd: str | os.PathLike | None = None,
    cell_timeout: int | None = 1800,
    log_output: bool = False,
    kernel_log: bool = False,
) -> NotebookRun:
    """Execute `notebook` with papermill; never raises for a failing cell (see `.ok`/`.error`).
    `kernel_log` sends what the kernel process prints to stderr (framework start-up chatter,
    warnings) to `<output>.log` instead of this terminal, and makes that file the notebook's
    log (`kernel_log_path`). Raises KernelNotFound when the kernel it names is not registered."""
    import nbformat
    import papermill

    notebook = Path(notebook)
    if not notebook.is_file():
        raise FileNotFoundError(f"no notebook at {notebook}")
    parameters = dict(parameters or {})
    check_parameters(notebook, parameters)
    require_kernel(notebook)
    output = Path(output) if output else Path("runs") / timestamp() / notebook.name
    log = output.with_suffix(".log") if kernel_log else None
    check_file("output", output)  # before the kernel starts, not after the notebook ran
    if log is not None:
        check_file("output", log)
    start = time.perf_counter()
    error = ""
    existed = {path: path.exists() for path in (output, log) if path is not None}
    try:
        with _stderr_to(log), _environ({KERNEL_LOG_ENV: str(log.resolve())} if log else {}):
            papermill.execute_notebook(
                str(notebook), str(output), parameters=parameters,
                cwd=str(cwd or notebook.parent), progress_bar=False, log_output=log_output,
                execution_timeout=cell_timeout,
            )
    except papermill.PapermillExecutionError as e:
        error = f"cell {e.cell_index}: {e.ename}: {e.evalue}"
    except OSError as e:  # writing the executed notebook failed (a full disk): say where and why
        for path, was_there in existed.items():
            if not was_there or _empty(path):  # what this run left is no notebook
                with contextlib.suppress(OSError):
                    path.unlink()
        where = e.filename or output
        raise OSError(f"cannot write {where}: {e.strerror or e}") from e
    seconds = time.perf_counter() - start
    figures = figures_in_notebook(nbformat.read(output, as_version=4)) if output.exists() else []
    return NotebookRun(notebook, output, parameters, seconds, not error, error, figures, log)


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


@contextlib.contextmanager
def _environ(values: Mapping[str, str]):
    """Set environment variables for the block (a kernel started in it inherits them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _stderr_to(path: Path | None):
    """Point file descriptor 2 at `path` for the block: the kernel is a child process and
    inherits it, so its stderr lands in the file (None: leave stderr alone)."""
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as f:
            os.dup2(f.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
