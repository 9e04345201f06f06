"""Full-state checkpoints through fsspec, committed by a marker written last.

Framework-free: a checkpoint is a set of named byte blobs, which each engine fills with its state
(`labkit.torch.state`: `torch.save` objects; `labkit.tf.state`: NumPy arrays and JSON). Layout
under a directory URL (a local path, `gs://bucket/run`, or a `/gcs/bucket/run` mount):

    step-00000042/model.pt            the blobs, written first
    step-00000042/COMMITTED           JSON {step, files: {name: {size, crc32c}}, meta}, written last

A step counts only once its marker exists: no rename is relied on (folder renames are not atomic
on Cloud Storage or its `/gcs` mount). Loading verifies every blob against the sizes and
checksums in the marker; a truncated or corrupt blob makes `load` warn, naming the file, and fall
back to the previous committed step; `restore` does the same for a blob that verifies but does
not decode. `BackgroundWrite` runs one save at a time in a thread, so training waits only for
the host copy of its state.

The checksum is CRC-32C, the one Cloud Storage uses to check objects end to end: it catches
truncation and corruption (not tampering) several times faster than sha256 (see the checkpoint
section of benchmarks/RESULTS.md), which matters in the seconds a Spot VM has after SIGTERM.
Markers written with sha256 digests by earlier versions are still verified with sha256.
"""

from __future__ import annotations

import hashlib
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
    streaming into the file: no copy of the whole blob in memory first)."""
    fs, root = _fs(directory)
    folder = f"{root}/{step_dir_name(step)}"
    fs.makedirs(folder, exist_ok=True)
    with fs.open(f"{folder}/{name}", "wb") as f:
        if not callable(data):
            f.write(data)
            return {"size": len(data), "crc32c": _crc32c(data)}
        out = _Checksummed(f)
        data(out)
        out.flush()
    return {"size": out.size, "crc32c": f"{out.crc:08x}"}


class _Checksummed:
    """A writable file that keeps the size and CRC-32C of what was written through it."""

    def __init__(self, f: IO[bytes]):
        self._f, self.size, self.crc = f, 0, 0

    def write(self, data) -> int:
        self.crc = crc32c.crc32c(data, self.crc)
        self.size += memoryview(data).nbytes
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()


def _crc32c(data: bytes) -> str:
    return f"{crc32c.crc32c(data):08x}"


def _matches(data: bytes, entry: dict[str, Any]) -> bool:
    """`data` has the checksum its marker entry recorded (sha256 in markers of earlier versions)."""
    if "crc32c" in entry:
        return _crc32c(data) == entry["crc32c"]
    return hashlib.sha256(data).hexdigest() == entry["sha256"]


def commit(directory: str, step: int, entries: dict[str, dict[str, Any]],
           meta: dict[str, Any] | None = None) -> str:
    """Write the marker for `step` (after all its blobs): from now on the step counts."""
    fs, root = _fs(directory)
    folder = f"{root}/{step_dir_name(step)}"
    marker = {"step": step, "files": entries, "meta": meta or {}}
    with fs.open(f"{folder}/{MARKER}", "w") as f:
        f.write(json.dumps(marker, indent=1))
    return folder


def save(directory: str, step: int, files: dict[str, bytes], meta: dict[str, Any] | None = None,
         *, keep: int | None = None) -> str:
    """Write `files` for `step`, then the marker; optionally keep only the newest `keep` steps."""
    entries = {name: write_blob(directory, step, name, data) for name, data in files.items()}
    folder = commit(directory, step, entries, meta)
    if keep:
        prune(directory, keep)
    return folder


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
    CheckpointError when it is unreadable."""
    fs, root = _fs(directory)
    path = f"{root}/{step_dir_name(step)}/{MARKER}"
    try:
        with fs.open(path, "r") as f:
            return json.loads(f.read())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable commit marker ({e})") from e


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
        if not _matches(data, entry):
            raise CheckpointError(f"{path}: contents do not match the digest in its commit marker")
        files[name] = data
    return Checkpoint(step=int(marker.get("step", step)), path=folder, files=files,
                      meta=marker.get("meta", {}))


def load(directory: str, step: int | None = None) -> Checkpoint | None:
    """The newest committed, intact step (or exactly `step`). A committed step whose blobs fail
    verification is skipped with a CheckpointWarning; None when nothing usable exists."""
    if step is not None:
        return read_step(directory, step)
    for candidate in reversed(committed_steps(directory)):
        try:
            return read_step(directory, candidate)
        except CheckpointError as e:
            warnings.warn(f"ignoring checkpoint step {candidate}: {e}; falling back to the "
                          "previous committed step", CheckpointWarning, stacklevel=2)
    return None


def restore(directory: str, decode: Callable[[Checkpoint], T],
            errors: tuple[type[BaseException], ...] = ()) -> T | None:
    """`decode` of the newest committed step that verifies and decodes; None when there is none.
    A step whose blobs fail verification, or whose decoding raises one of `errors` (the
    deserialiser's errors), is skipped with a CheckpointWarning and the previous committed step
    is tried. `decode` should only read the blobs: the caller applies its result to live state,
    so a failed decode leaves nothing half restored."""
    for step in reversed(committed_steps(directory)):
        try:
            return decode(read_step(directory, step))
        except (CheckpointError, *errors) as e:
            warnings.warn(f"ignoring checkpoint step {step} in {directory}: {e}; falling back to "
                          "the previous committed step", CheckpointWarning, stacklevel=2)
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
            raise CheckpointWriteError(f"writing a checkpoint to {self.directory} failed: {error}") from error


def prune(directory: str, keep: int) -> list[int]:
    """Delete all but the newest `keep` committed steps (marker first, so a half-deleted step
    is never taken for a committed one). Returns the deleted steps."""
    fs, root = _fs(directory)
    old = committed_steps(directory)[:-keep] if keep > 0 else []
    for step in old:
        folder = f"{root}/{step_dir_name(step)}"
        fs.rm(f"{folder}/{MARKER}")
        fs.rm(folder, recursive=True)
    return old
