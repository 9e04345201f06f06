"""The lesson stays clean: a kernel's file-descriptor-2 output goes to the notebook's log file.

Inside a kernel, what C/C++ libraries and child processes write to file descriptor 2
(TensorFlow's start-up chatter, gloo's connection messages, a child kernel's warnings) belongs in
the notebook's log file (`kernel_log_path`), not in a cell's output. Each course notebook asks for
that itself, first thing in its imports cell:

    from labkit.notebooks import route_kernel_stderr
    route_kernel_stderr()

Nothing does it on import: importing labkit never touches file descriptor 2. Python's own stderr
(warnings, tracebacks) still shows. A cell whose stderr output is a deliberate part of the lesson
carries the tag `STDERR_TAG`; the tests fail on any other stderr output in an executed notebook
(`unexpected_stderr`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from labkit.core.progress import in_kernel
from labkit.notebooks.artifacts import ARTIFACTS_ENV

# Where a kernel's file-descriptor-2 output goes (set by `run_notebook` for its kernel).
KERNEL_LOG_ENV = "LABKIT_KERNEL_LOG"
# "notebook": leave file descriptor 2 alone (C/C++ library output shows in the cells).
KERNEL_STDERR_ENV = "LABKIT_KERNEL_STDERR"
STDERR_TAG = "allow-stderr"


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
    process; returns the log's path, or None outside a kernel or with LABKIT_KERNEL_STDERR=notebook."""
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
