"""`labkit data stage SRC DEST`: a shard set copied from Cloud Storage (``gs://`` or the ``/gcs/``
mount) to the VM's local disk at the start of a job, many files at once, each checked against
its manifest on the way.

    report = stage("gs://bucket/shards", "/tmp/shards", workers=16)
    report.text()     # files, MB, seconds, MB/s, and what was already there

Why: every epoch after the first then reads local bytes instead of Cloud Storage's (a request
per file and per chunk, through the network); a job that reads its data once gains nothing
but the copy's parallelism. One stream from Cloud Storage is limited by its request latency
and per-stream throughput, so the copy runs `workers` files at once.

Resumable and safe: each file is written beside its final name and renamed when its SHA-256
(and size) match the manifest; a file already at the destination with the listed digest is
kept; the manifest is copied last, so a destination with a manifest holds a complete set
(`labkit data verify DEST` reads it all again).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from labkit.core.config import check_int
from labkit.core.progress import progress
from labkit.data.shards import MANIFEST_SUFFIX, ShardFolder, join_path, named_error, read_manifest
from labkit.data.tfrecord import is_remote, open_binary

CHUNK = 8 << 20


@dataclass(frozen=True)
class StageReport:
    files: int
    nbytes: int
    seconds: float
    kept: int

    def text(self) -> str:
        rate = self.nbytes / 1e6 / self.seconds if self.seconds else float("inf")
        kept = f", {self.kept} already there" if self.kept else ""
        return f"{self.files} files, {self.nbytes / 1e6:,.1f} MB in {self.seconds:.1f}s ({rate:,.0f} MB/s){kept}"


def stage(src: str | os.PathLike, dest: str | os.PathLike, *, workers: int = 16, prefix: str | None = None) -> StageReport:
    """Copy the shard set(s) in `src` (every `*-manifest.json` there, or only `prefix`'s) to the
    local folder `dest`; see the module docstring. Raises ManifestError / FileNotFoundError for
    a source without a manifest, OSError naming the file that could not be copied."""
    check_int("workers", workers, minimum=1)
    src, dest = os.fspath(src), os.fspath(dest)
    if is_remote(dest):
        raise ValueError(f"parameter 'dest' must be a local folder (got {dest!r}): staging copies to this VM's disk")
    folder = ShardFolder(src)
    names = folder.names()
    manifests = [n for n in names if n.endswith(MANIFEST_SUFFIX) and (prefix is None or n == prefix + MANIFEST_SUFFIX)]
    if not manifests:
        raise FileNotFoundError(f"{src}: no shard manifest{'' if prefix is None else f' for prefix {prefix!r}'} "
                                f"(stage a folder written by labkit data shard or labkit data write)")
    work: list[tuple[str, str]] = []
    for m in manifests:
        man = read_manifest(join_path(src, m))
        work += list(zip(man["shards"], man["sha256"], strict=True))
    os.makedirs(dest, exist_ok=True)
    t0 = time.perf_counter()
    kept, total = 0, 0
    lock = threading.Lock()
    with progress(len(work), "stage shards", unit="file") as bar:
        def one(item: tuple[str, str]) -> None:
            nonlocal kept, total
            name, digest = item
            final = os.path.join(dest, name)
            if os.path.exists(final) and _sha256_file(final) == digest:
                with lock:
                    kept += 1
                    bar.update(1)
                return
            n = _copy(join_path(src, name), final, digest)
            with lock:
                total += n
                bar.update(1)

        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(work)))) as pool:
            errors = [f.exception() for f in [pool.submit(one, w) for w in work]]
    error = next((e for e in errors if e is not None), None)
    if error is not None:
        raise error
    for m in manifests:  # last: a destination with a manifest holds the whole set
        _copy(join_path(src, m), os.path.join(dest, m), None)
    return StageReport(len(work), total, time.perf_counter() - t0, kept)


def _sha256_file(path: str) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def _copy(src: str, final: str, digest: str | None) -> int:
    """Copy one file through a temporary name, checking its SHA-256 against `digest`."""
    temp = f"{final}.partial-{os.getpid()}-{threading.get_ident()}"
    sha, n = hashlib.sha256(), 0
    try:
        with open_binary(src, "rb") as fin, open(temp, "wb") as fout:
            while chunk := fin.read(CHUNK):
                sha.update(chunk)
                fout.write(chunk)
                n += len(chunk)
        if digest is not None and sha.hexdigest() != digest:
            raise OSError(f"{src}: its bytes are not the ones its manifest lists (SHA-256 {sha.hexdigest()[:12]}..., "
                          f"listed {digest[:12]}...): the source changed while staging, or is another set")
        os.replace(temp, final)
    except OSError as e:
        if os.path.exists(temp):
            os.remove(temp)
        raise named_error(e, f"cannot stage {src}") if e.strerror else e from None
    return n
