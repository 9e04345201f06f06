"""Full-state checkpoints through fsspec, committed by a marker written last.

Framework-free: a checkpoint is a set of named byte blobs, which each engine fills with its state
(`labkit.torch.state`: `torch.save` objects; `labkit.tf.state`: NumPy arrays and JSON). Layout
under a directory URL (a local path, `gs://bucket/run`, or a `/gcs/bucket/run` mount):

    step-00000042/model.pt            the blobs, written first
    step-00000042/COMMITTED           JSON {step, files: {name: {size, crc32c}}, meta}, written last

A step counts only once its marker exists: no rename is relied on (folder renames are not atomic
on Cloud Storage or its `/gcs` mount). Loading verifies every blob against the sizes and
checksums in the marker (and the marker's own shape); a truncated or corrupt blob, or a
malformed marker, makes `load` warn, naming the file, and fall back to the previous committed
step (saying so when there is none, and the run starts from step 0); `restore` does the same for
a blob that verifies but does not decode. `BackgroundWrite` runs one save at a time in a
thread, so training waits only for the host copy of its state.

A write that fails (a full disk, a bucket that refuses it) raises `CheckpointWriteError` naming
the file and the storage's own reason ("No space left on device"), and removes the half-written
blob. `commit(..., keep=K)` then deletes all but the newest K committed steps, so a long run
does not fill its disk.

The checksum is CRC-32C, the one Cloud Storage uses to check objects end to end: it catches
truncation and corruption (not tampering) several times faster than sha256 (see the checkpoint
section of benchmarks/RESULTS.md), which matters in the seconds a Spot VM has after SIGTERM.
"""

from __future__ import annotations

import json
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import crc32c
import fsspec

MARKER = "COMMITTED"
T = TypeVar("T")
# Writes one blob's bytes to the file it is given (e.g. `lambda f: torch.save(obj, f)`).
BlobWriter = Callable[[IO[bytes]], None]
_STEP_DIR = re.compile(r"^step-(\d{8,})$")


class CheckpointWarning(UserWarning):
    """A committed checkpoint could not be used (truncated or corrupt); an older one was taken."""


class CheckpointError(RuntimeError):
    """A checkpoint blob does not match what its commit marker recorded."""


class CheckpointWriteError(OSError, RuntimeError):
    """Writing a checkpoint failed (an OSError, as the storage's own errors are; a RuntimeError
    for code that caught the background write's error as one)."""


@dataclass
class Checkpoint:
    """One committed step read back: `files` maps blob names to their bytes."""

    step: int
    path: str
    files: dict[str, bytes]
    meta: dict[str, Any] = field(default_factory=dict)


def _fs(directory: str):
    fs, root = fsspec.core.url_to_fs(str(directory))
    return fs, root.rstrip("/")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def write_blob(directory: str, step: int, name: str, data: bytes | BlobWriter) -> dict[str, Any]:
    """Write one blob of a step that is not committed yet; returns its marker entry. Several
    processes (DDP ranks) may each write their own blobs before one of them commits. `data` is
    the blob's bytes, or a function that writes them to the file it is given (a serialiser
    streaming into the file: no copy of the whole blob in memory first). Raises
    CheckpointWriteError naming the file when the storage refuses the write."""
    fs, root = _fs(directory)
    folder = f"{root}/{step_dir_name(step)}"
    path = f"{folder}/{name}"
    out = None
    try:
        fs.makedirs(folder, exist_ok=True)
        with fs.open(path, "wb") as f:
            if not callable(data):
                f.write(data)
                entry = {"size": len(data), "crc32c": _crc32c(data)}
            else:
                out = _Checksummed(f)
                data(out)
                out.flush()
                entry = {"size": out.size, "crc32c": f"{out.crc:08x}"}
    except Exception as e:
        # A serialiser that meets a failing write reports its own error ("unexpected pos"):
        # the storage's error, kept by the file wrapper, is the one that says what happened.
        cause = out.error if out is not None and out.error is not None else e
        _discard(fs, path)
        raise CheckpointWriteError(f"cannot write checkpoint file {path}: {_reason(cause)}") from cause
    return entry


def _reason(error: BaseException) -> str:
    """An error's cause in words: an OSError's strerror ("No space left on device"), else its text."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _discard(fs, path: str) -> None:
    """Remove a half-written file (it would only take space), ignoring a failure to."""
    try:
        if fs.exists(path):
            fs.rm(path)
    except OSError:
        pass


class _Checksummed:
    """A writable file that keeps the size and CRC-32C of what was written through it, and the
    error its first failed write raised."""

    def __init__(self, f: IO[bytes]):
        self._f, self.size, self.crc = f, 0, 0
        self.error: BaseException | None = None

    def write(self, data) -> int:
        try:
            written = self._f.write(data)
        except BaseException as e:
            self.error = self.error or e
            raise
        self.crc = crc32c.crc32c(data, self.crc)
        self.size += memoryview(data).nbytes
        return written

    def flush(self) -> None:
        self._f.flush()


def _crc32c(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


def commit(directory: str, step: int, entries: dict[str, dict[str, Any]],
           meta: dict[str, Any] | None = None, *, keep: int | None = None) -> str:
    """Write the marker for `step` (after all its blobs): from now on the step counts. With
    `keep`, then delete all but the newest `keep` committed steps (`prune`)."""
    fs, root = _fs(directory)
    folder = f"{root}/{step_dir_name(step)}"
    marker = {"step": step, "files": entries, "meta": meta or {}}
    path = f"{folder}/{MARKER}"
    try:
        with fs.open(path, "w") as f:
            f.write(json.dumps(marker, indent=1))
    except OSError as e:
        _discard(fs, path)  # half a marker would read as a corrupt committed step
        raise CheckpointWriteError(f"cannot write checkpoint file {path}: {_reason(e)}") from e
    if keep:
        prune(directory, keep)
    return folder


def save(directory: str, step: int, files: dict[str, bytes], meta: dict[str, Any] | None = None,
         *, keep: int | None = None) -> str:
    """Write `files` for `step`, then the marker; optionally keep only the newest `keep` steps."""
    entries = {name: write_blob(directory, step, name, data) for name, data in files.items()}
    return commit(directory, step, entries, meta, keep=keep)


def committed_steps(directory: str) -> list[int]:
    """Steps whose marker exists, ascending. Folders without a marker (a save that was cut off)
    are ignored."""
    fs, root = _fs(directory)
    if not fs.exists(root):
        return []
    steps = []
    for entry in fs.ls(root, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        m = _STEP_DIR.match(name)
        if m and fs.exists(f"{root}/{name}/{MARKER}"):
            steps.append(int(m.group(1)))
    return sorted(steps)


def read_marker(directory: str, step: int) -> dict[str, Any]:
    """The commit marker of `step` ({step, files, meta}) without reading its blobs; raises
    CheckpointError when it is unreadable or not shaped like one."""
    fs, root = _fs(directory)
    path = f"{root}/{step_dir_name(step)}/{MARKER}"
    try:
        with fs.open(path, "r") as f:
            marker = json.loads(f.read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable commit marker ({e})") from e
    problem = _marker_problem(marker)
    if problem:
        raise CheckpointError(f"{path}: malformed commit marker: {problem}")
    return marker


def _marker_problem(marker: Any) -> str | None:
    """What makes `marker` not a commit marker (None: it is one): an object whose `files` maps
    each blob name to {size, crc32c}, and whose `meta`, if any, is an object."""
    if not isinstance(marker, dict):
        return f"an object is expected, not a {type(marker).__name__}"
    files = marker.get("files", {})
    if not isinstance(files, dict):
        return f"'files' must map file names to entries, not be a {type(files).__name__}"
    for name, entry in files.items():
        if not isinstance(entry, dict):
            return f"the entry of {name!r} must be an object, not a {type(entry).__name__}"
        size = entry.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return f"the entry of {name!r} has no valid 'size' (got {size!r})"
        if not isinstance(entry.get("crc32c"), str):
            return f"the entry of {name!r} has no 'crc32c' checksum"
    if not isinstance(marker.get("meta", {}), dict):
        return f"'meta' must be an object, not a {type(marker['meta']).__name__}"
    return None


def read_step(directory: str, step: int) -> Checkpoint:
    """Read and verify one committed step; raises CheckpointError naming the bad file."""
    fs, root = _fs(directory)
    folder = f"{root}/{step_dir_name(step)}"
    marker = read_marker(directory, step)
    files = {}
    for name, entry in marker.get("files", {}).items():
        path = f"{folder}/{name}"
        try:
            with fs.open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CheckpointError(f"{path}: missing ({e})") from e
        if len(data) != entry["size"]:
            raise CheckpointError(f"{path}: truncated, {len(data)} of {entry['size']} bytes")
        if _crc32c(data) != entry["crc32c"]:
            raise CheckpointError(f"{path}: contents do not match the digest in its commit marker")
        files[name] = data
    return Checkpoint(step=int(marker.get("step", step)), path=folder, files=files,
                      meta=marker.get("meta", {}))


def _fallback(steps: list[int], i: int) -> str:
    """What happens after the step at position `i` of `steps` (newest first) was ignored."""
    if i + 1 < len(steps):
        return f"falling back to the previous committed step, {steps[i + 1]}"
    return "no earlier committed step is left: the run starts from step 0"


def load(directory: str, step: int | None = None) -> Checkpoint | None:
    """The newest committed, intact step (or exactly `step`). A committed step whose blobs fail
    verification is skipped with a CheckpointWarning; None when nothing usable exists."""
    if step is not None:
        return read_step(directory, step)
    steps = committed_steps(directory)[::-1]
    for i, candidate in enumerate(steps):
        try:
            return read_step(directory, candidate)
        except CheckpointError as e:
            warnings.warn(f"ignoring checkpoint step {candidate}: {e}; {_fallback(steps, i)}",
                          CheckpointWarning, stacklevel=2)
    return None


def restore(directory: str, decode: Callable[[Checkpoint], T],
            errors: tuple[type[BaseException], ...] = ()) -> T | None:
    """`decode` of the newest committed step that verifies and decodes; None when there is none.
    A step whose blobs fail verification, or whose decoding raises one of `errors` (the
    deserialiser's errors), is skipped with a CheckpointWarning and the previous committed step
    is tried. `decode` should only read the blobs: the caller applies its result to live state,
    so a failed decode leaves nothing half restored."""
    steps = committed_steps(directory)[::-1]
    for i, step in enumerate(steps):
        try:
            return decode(read_step(directory, step))
        except (CheckpointError, *errors) as e:
            warnings.warn(f"ignoring checkpoint step {step} in {directory}: {e}; {_fallback(steps, i)}",
                          CheckpointWarning, stacklevel=2)
    return None


class BackgroundWrite:
    """Checkpoint writes in a background thread, at most one in flight (so host memory holds at
    most one extra copy of the state). `start` waits for the previous write first; `wait()`
    joins the one in flight and re-raises its error as a `CheckpointWriteError`."""

    def __init__(self, directory: str):
        self.directory = directory
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, step: int, write: Callable[[], None]) -> None:
        self.wait()

        def run() -> None:
            try:
                write()
            except BaseException as e:  # noqa: BLE001 - handed to the training thread in wait()
                self._error = e

        self._thread = threading.Thread(target=run, name=f"checkpoint-step-{step}", daemon=False)
        self._thread.start()

    @property
    def in_flight(self) -> bool:
        """A write has started and not finished yet."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            cause = str(error) if isinstance(error, CheckpointWriteError) else _reason(error)
            raise CheckpointWriteError(f"writing a checkpoint to {self.directory} failed: {cause}") from error


def prune(directory: str, keep: int) -> list[int]:
    """Delete all but the newest `keep` committed steps (marker first, so a half-deleted step
    is never taken for a committed one), and the folders of saves older than the newest
    committed step that never committed (cut off by a crash). Returns the deleted committed
    steps. A step that cannot be deleted is left with a CheckpointWarning: training goes on."""
    fs, root = _fs(directory)
    committed = committed_steps(directory)
    old = committed[:-keep] if keep > 0 else []
    newest = committed[-1] if committed else None
    abandoned = []
    if newest is not None:
        for entry in fs.ls(root, detail=False):
            m = _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if m and int(m.group(1)) < newest and int(m.group(1)) not in committed:
                abandoned.append(int(m.group(1)))
    deleted = []
    for step in [*old, *abandoned]:
        folder = f"{root}/{step_dir_name(step)}"
        try:
            if step in old:
                fs.rm(f"{folder}/{MARKER}")
                deleted.append(step)
            fs.rm(folder, recursive=True)
        except OSError as e:
            warnings.warn(f"could not delete old checkpoint {folder}: {_reason(e)}", CheckpointWarning,
                          stacklevel=2)
    return deleted
