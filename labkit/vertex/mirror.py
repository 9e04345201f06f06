"""A notebook job's working files on the VM's disk, copied to the bucket as they change.

A notebook job (`labkit.vertex.entry notebook`) runs papermill in a folder on the VM's own disk:
the notebook's working directory, the executed notebook papermill rewrites after every cell, the
kernel's log and every file the notebook makes (shards, checkpoints, traces). Doing that work
through the ``/gcs/`` mount would make each small write a Cloud Storage request, give no file
locking, and turn the storage figures the notebooks measure into Cloud Storage FUSE figures.

`Mirror` copies each of its (local folder -> destination folder) pairs to the destination: a
file whose size or modification time changed since its last copy is copied whole (a closed file
is one finished object), on a cadence (`every_s`), as soon as a new checkpoint is committed
(a file named `COMMIT_MARKERS` appears or changes), and once more at the end. Within one pass the
commit markers are copied last, so a checkpoint never reaches the bucket marked committed before
its files (labkit's checkpoint contract: a checkpoint counts only once its marker is written).
`restore(dest, local)` copies a previous attempt's files back before the notebook starts, so a
job restarted on a fresh VM (Spot) resumes from the checkpoints the last attempt left.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from labkit.core.checkpoint import MARKER

COMMIT_MARKERS = frozenset({MARKER})
EVERY_S = 60.0
POLL_S = 2.0


def _files(folder: Path) -> dict[Path, tuple[int, int]]:
    """Every file under `folder` (relative path -> (size, mtime_ns)); files that vanish while
    the folder is walked are left out."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            try:
                st = path.stat()
            except OSError:
                continue
            out[path.relative_to(folder)] = (st.st_size, st.st_mtime_ns)
    return out


def _copy(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)


def restore(dest: str | os.PathLike, local: str | os.PathLike) -> int:
    """Copy the files a previous attempt left at `dest` into `local` (not over newer local
    files); returns how many were copied."""
    dest, local = Path(dest), Path(local)
    if not dest.is_dir():
        return 0
    copied = 0
    for rel in _files(dest):
        if not (local / rel).exists():
            _copy(dest / rel, local / rel)
            copied += 1
    return copied


class Mirror:
    """Copies `pairs` of (local folder, destination folder) as described in the module
    docstring. Use as a context manager (a background thread; a final pass on exit), or call
    `sync()` directly."""

    def __init__(self, pairs: Sequence[tuple[str | os.PathLike, str | os.PathLike]], *,
                 every_s: float = EVERY_S, poll_s: float = POLL_S):
        self.pairs = [(Path(a), Path(b)) for a, b in pairs]
        self.every_s, self.poll_s = every_s, poll_s
        self._copied: dict[Path, tuple[int, int]] = {}
        self._lock = threading.RLock()  # the SIGTERM handler may sync on the main thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.errors: list[str] = []

    def _pending(self) -> list[tuple[Path, Path, tuple[int, int]]]:
        out = []
        for local, dest in self.pairs:
            for rel, stamp in _files(local).items():
                if self._copied.get(local / rel) != stamp:
                    out.append((local / rel, dest / rel, stamp))
        # markers last: a checkpoint reaches the bucket complete before it is marked committed
        return sorted(out, key=lambda item: item[0].name in COMMIT_MARKERS)

    def sync(self) -> int:
        """One pass: copy every new or changed file; returns how many were copied. A file that
        cannot be copied is recorded in `errors` and tried again next pass."""
        with self._lock:
            copied = 0
            for src, dest, stamp in self._pending():
                try:
                    _copy(src, dest)
                except OSError as e:
                    self.errors.append(f"{src} -> {dest}: {e}")
                    continue
                self._copied[src] = stamp
                copied += 1
            self.passes += 1
            return copied

    def _new_commit(self) -> bool:
        return any(src.name in COMMIT_MARKERS for src, _, _ in self._pending())

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.poll_s):
            if time.monotonic() - last >= self.every_s or self._new_commit():
                self.sync()
                last = time.monotonic()

    def __enter__(self) -> Mirror:
        self._thread = threading.Thread(target=self._run, name="labkit-mirror", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sync()
