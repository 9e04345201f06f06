"""Every place a run writes, checked before its first step (or a notebook's kernel start).

Unchecked, a checkpoint folder that cannot be written shows at the first save, after the
training, and a metrics path that is a folder at the end. `check_folder` and `check_file` try
the real thing first: create the folder (a write probe goes in and out again) or make sure a
file can be created beside where the output goes, and raise `UnwritableOutput`, naming the
setting, the path and the cause, on one line. Folders may be local, ``/gcs/`` mounts or fsspec
URLs (``gs://``); files are local (metrics, executed notebooks).

`check_run_outputs(config)` applies them to a `TrainConfig` run, after its Vertex AI defaults are
filled in, and refuses a preemption drill with nowhere to save.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from labkit.core.config import ParameterError

PROBE_PREFIX = ".labkit-write-probe-"


class UnwritableOutput(ParameterError):
    """An output location cannot be written (a file where a folder goes, a read-only folder, a
    folder where a file goes)."""


def check_folder(name: str, path: str | os.PathLike) -> None:
    """Make sure folder `path` (for setting `name`) exists and takes a new file: the folder is
    created if missing (the run would create it anyway), a probe file is written and removed."""
    problem = folder_problem(path)
    if problem:
        raise UnwritableOutput(name, os.fspath(path), problem)


def check_file(name: str, path: str | os.PathLike) -> None:
    """Make sure file `path` (for setting `name`) can be written: it is not a folder, and its
    folder exists or can be created and takes a new file."""
    p = Path(path)
    if p.is_dir():
        raise UnwritableOutput(name, str(path), "is a folder; give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise UnwritableOutput(name, str(path), "cannot be written: Permission denied")
    problem = folder_problem(p.parent)
    if problem:
        raise UnwritableOutput(name, str(path), f"cannot be written: its folder {p.parent} {problem}")


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why folder `path` cannot take new files (None: it can). Creates the folder if missing."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    fs, root = fsspec.core.url_to_fs(os.fspath(path) or ".")
    root = root.rstrip("/") or root
    if isinstance(fs, LocalFileSystem):
        for parent in [Path(root), *Path(root).parents]:
            if parent.exists():
                if not parent.is_dir():
                    return ("is a file, not a folder" if parent == Path(root)
                            else f"cannot be created: {parent} is a file, not a folder")
                break
    elif fs.exists(root) and not fs.isdir(root):
        return "is a file, not a folder"
    probe = f"{root}/{PROBE_PREFIX}{uuid.uuid4().hex}"
    try:
        fs.makedirs(root, exist_ok=True)
        with fs.open(probe, "wb") as f:
            f.write(b"")
        fs.rm(probe)
    except OSError as e:
        return f"cannot be written: {e.strerror or type(e).__name__}"
    return None


def check_run_outputs(config, *, main: bool = True) -> None:
    """Check the outputs of a `TrainConfig` run before its first step: the checkpoint folder
    (every process writes there), and on the `main` process the metrics file and TensorBoard
    folder. A preemption drill without a checkpoint folder is refused: it would stop the run
    and save nothing."""
    if config.preempt_at is not None and not config.checkpoint_dir:
        raise ParameterError("preempt_at", config.preempt_at,
                             "needs checkpoint_dir: the drill stops the run to be resumed, and "
                             "without a checkpoint folder nothing would be saved")
    if config.checkpoint_dir:
        check_folder("checkpoint_dir", config.checkpoint_dir)
    if main and config.metrics_out:
        check_file("metrics_out", config.metrics_out)
    if main and config.tensorboard_dir:
        check_folder("tensorboard_dir", config.tensorboard_dir)
