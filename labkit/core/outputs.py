"""Every place a run writes, checked before its first step (or a notebook's kernel start).

Unchecked, a checkpoint folder that cannot be written shows at the first save, after the
training, and a metrics path that is a folder at the end. `check_folder` and `check_file` try
the real thing first: create the folder (a write probe goes in and out again) or make sure a
file can be created beside where the output goes, and raise `UnwritableOutput`, naming the
setting, the path and the cause, on one line. Folders may be local, ``/gcs/`` mounts or fsspec
URLs (``gs://``); files are local (metrics, executed notebooks).

Before any write is tried, what would lose data or hang is refused: a ``/gcs/`` path with no
Cloud Storage mount on this machine, a ``gs://`` address when Cloud Storage cannot be reached
(`labkit.core.gcs`), a URL whose protocol needs a package that is not installed, and a dangling
symbolic link.

`check_run_outputs(config)` applies them to a `TrainConfig` run, after its Vertex AI defaults are
filled in (a folder that came from ``AIP_CHECKPOINT_DIR`` or ``AIP_TENSORBOARD_LOG_DIR`` is
named by that variable too), and refuses a preemption drill with nowhere to save.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from labkit.core.config import ParameterError
from labkit.core.gcs import aip_mount_paths, fuse_path, is_gcs_uri, unmounted, unreachable

PROBE_PREFIX = ".labkit-write-probe-"


class UnwritableOutput(ParameterError):
    """An output location cannot be written (a file where a folder goes, a read-only folder, a
    folder where a file goes)."""


def check_folder(name: str, path: str | os.PathLike, *, source: str | None = None) -> None:
    """Make sure folder `path` (for setting `name`; `source`: the variable it came from) exists
    and takes a new file: the folder is created if missing (the run would create it anyway), a
    probe file is written and removed."""
    problem = folder_problem(path)
    if problem:
        raise UnwritableOutput(name, os.fspath(path), _from(source) + problem)


def check_file(name: str, path: str | os.PathLike, *, source: str | None = None) -> None:
    """Make sure file `path` (for setting `name`) can be written: it is not a folder, and its
    folder exists or can be created and takes a new file. A ``gs://`` address is refused: the
    file is written through a file path (`Path` would turn ``gs://b/m.json`` into a local folder
    named ``gs:``); on Vertex that path is the bucket's mount, ``/gcs/BUCKET/...``."""
    if is_gcs_uri(os.fspath(path)):
        raise UnwritableOutput(name, str(path), _from(source) + "is a Cloud Storage address, and this file is "
                               f"written through a file path: in a Vertex job give {fuse_path(os.fspath(path))} "
                               "(the bucket's mount), elsewhere a local path")
    p = Path(path)
    too_long = name_too_long(p)  # before any stat: those raise on such a name
    if too_long:
        raise UnwritableOutput(name, str(path), _from(source) + too_long)
    if p.is_dir():
        raise UnwritableOutput(name, str(path), _from(source) + "is a folder; give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise UnwritableOutput(name, str(path), _from(source) + "cannot be written: Permission denied")
    problem = folder_problem(p.parent)
    if problem:
        raise UnwritableOutput(name, str(path), _from(source) +
                               f"cannot be written: its folder {p.parent} {problem}")


def name_too_long(path: Path) -> str | None:
    """Why the file system cannot hold a file named `path` (None: it can): a name longer than
    its limit (255 bytes on most), which the write would otherwise fail on after the run."""
    folder = next((q for q in [path.parent, *path.parent.parents] if q.is_dir()), Path("."))
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    longest = max((part for part in path.parts), key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(longest)) > limit:
        return (f"has a name of {len(os.fsencode(longest))} bytes ({longest[:24]}...); this file system "
                f"allows {limit}")
    return None


def _from(source: str | None) -> str:
    return f"from {source} " if source else ""


def folder_problem(path: str | os.PathLike) -> str | None:
    """Why folder `path` cannot take new files (None: it can). Creates the folder if missing."""
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    text = os.fspath(path) or "."
    if "://" not in text:
        too_long = name_too_long(Path(text))
        if too_long:
            return too_long
    reason = unmounted(text) or unreachable(text)
    if reason:
        return f"cannot be used: {reason}"
    try:
        fs, root = fsspec.core.url_to_fs(text)
    except (ImportError, ValueError) as e:  # a protocol fsspec does not know, or its package is missing
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"cannot be used: {first}"
    root = root.rstrip("/") or root
    if isinstance(fs, LocalFileSystem):
        for parent in [Path(root), *Path(root).parents]:
            if parent.is_symlink() and not parent.exists():
                return (f"cannot be created: {parent} is a symbolic link to {os.readlink(parent)}, "
                        f"which does not exist")
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


# The settings Vertex AI's variables fill in when they are not given (`with_vertex_dirs`).
_VERTEX_SOURCES = {"checkpoint_dir": "AIP_CHECKPOINT_DIR", "tensorboard_dir": "AIP_TENSORBOARD_LOG_DIR"}


def _source(name: str, value: str, env: Mapping[str, str] | None) -> str | None:
    """`VARIABLE=value` when setting `name` holds what that Vertex variable maps to, else None."""
    variable = _VERTEX_SOURCES.get(name)
    env = os.environ if env is None else env
    if variable and aip_mount_paths(env).get(variable) == value:
        return f"{variable}={env[variable]}"
    return None


def check_run_outputs(config, *, main: bool = True, env: Mapping[str, str] | None = None) -> None:
    """Check the outputs of a `TrainConfig` run before its first step: the checkpoint folder
    (every process writes there), and on the `main` process the metrics file and TensorBoard
    folder. A preemption drill without a checkpoint folder is refused: it would stop the run
    and save nothing. A folder that came from a Vertex AI variable is named by it as well."""
    if config.preempt_at is not None and not config.checkpoint_dir:
        raise ParameterError("preempt_at", config.preempt_at,
                             "needs checkpoint_dir: the drill stops the run to be resumed, and "
                             "without a checkpoint folder nothing would be saved")
    if config.checkpoint_dir:
        check_folder("checkpoint_dir", config.checkpoint_dir,
                     source=_source("checkpoint_dir", config.checkpoint_dir, env))
    if main and config.metrics_out:
        check_file("metrics_out", config.metrics_out)
    if main and config.tensorboard_dir:
        check_folder("tensorboard_dir", config.tensorboard_dir,
                     source=_source("tensorboard_dir", config.tensorboard_dir, env))
