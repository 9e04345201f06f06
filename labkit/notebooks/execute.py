"""Running one notebook headless with papermill.

`run_notebook` checks the parameters against the notebook's `parameters` cell before starting a
kernel (an unknown name or a value of the wrong type fails at once, naming the parameter), that
the kernel it names is registered, and that the executed notebook and its kernel log can be
written; then it executes it and returns the key figures it recorded. `labkit run NOTEBOOK -p
name value` is the command-line form; a Vertex notebook job runs it in the container.

The parameter checks themselves (names, kinds, the course-wide domains of `scale` and `device`)
are `labkit.core.notebook_params`'s, shared with Vertex notebook jobs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from labkit.core.notebook_params import check_parameters
from labkit.core.outputs import check_file
from labkit.notebooks.figures import KeyFigure, figures_in_notebook
from labkit.notebooks.kernel import require_kernel
from labkit.notebooks.stderr import KERNEL_LOG_ENV

# jupyter_client's words for a kernel process that ended before it answered. One cause is not
# the notebook's: the client picks the kernel's ports free, and before the kernel binds them
# another process on the machine can take one ("Address already in use" in the kernel's log).
DIED_AT_START = "Kernel died before replying to kernel_info"
KERNEL_START_TRIES = 2


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
    """Local time as a run folder's name (YYYYMMDD-HHMMSS)."""
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
    kernel = require_kernel(notebook)  # a notebook that names none runs in labkit's kernel
    output = Path(output) if output else Path("runs") / timestamp() / notebook.name
    if output.resolve() == notebook.resolve():  # papermill would write over the notebook it runs
        raise ValueError(f"output {output} is the notebook itself: it would be replaced by the executed "
                         f"copy with its parameters injected; write the executed notebook elsewhere")
    log = output.with_suffix(".log") if kernel_log else None
    check_file("output", output)  # before the kernel starts, not after the notebook ran
    if log is not None:
        check_file("output", log)
    start = time.perf_counter()
    error = ""
    existed = {path: path.exists() for path in (output, log) if path is not None}
    try:
        for attempt in range(1, KERNEL_START_TRIES + 1):
            try:
                with _stderr_to(log), _environ({KERNEL_LOG_ENV: str(log.resolve())} if log else {}):
                    papermill.execute_notebook(
                        str(notebook), str(output), parameters=parameters,
                        cwd=str(cwd or notebook.parent), progress_bar=False, log_output=log_output,
                        execution_timeout=cell_timeout, kernel_name=kernel,
                    )
                break
            except RuntimeError as e:  # no cell has run yet, so starting again changes nothing
                if not str(e).startswith(DIED_AT_START) or attempt == KERNEL_START_TRIES:
                    raise
    except papermill.PapermillExecutionError as e:
        error = f"cell {e.cell_index}: {e.ename}: {e.evalue}"
    except _kernel_errors() as e:  # the kernel died or a cell ran past its limit: this run failed
        error = f"{_last_cell(output)}{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        error += " (the kernel process ended: out of memory, a crash in native code, or os._exit)" \
            if type(e).__name__ == "DeadKernelError" else ""
    except RuntimeError as e:
        if not str(e).startswith(DIED_AT_START):
            raise
        error = (f"the kernel {kernel!r} ended before it started, {KERNEL_START_TRIES} times"
                 + (f"; its log: {log}" if log else ""))
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


def _kernel_errors() -> tuple[type[BaseException], ...]:
    """nbclient's errors for a run that ended without a cell's own exception."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    return (DeadKernelError, CellTimeoutError)


def _last_cell(output: Path) -> str:
    """"cell N: " for the last cell papermill recorded as started in `output`, or ""."""
    import nbformat

    try:
        nb = nbformat.read(output, as_version=4)
    except (OSError, ValueError):
        return ""
    started = [i for i, c in enumerate(nb.cells)
               if (c.get("metadata", {}).get("papermill") or {}).get("status") in ("running", "failed")]
    return f"cell {started[-1]}: " if started else ""


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
