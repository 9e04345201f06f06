"""Measuring an input pipeline: samples/s, the machine's ceilings for the same bytes, and the
share of a training step spent waiting for data.

The ceiling of a single-core reader that verifies CRCs is 1 / (1/raw_read + 1/crc32c): every
byte is read once and checksummed once. Both rates are measured here on the same shards, in the
same run, so a pipeline's fraction of the ceiling is a ratio of figures taken side by side.
They are measured the way labkit's reader works: `read()` into one reused buffer of
`READ_BYTES` (small enough to stay in the CPU cache), and CRC-32C of pieces of that size held
in memory, so the CRC reads from cache as it does right after a read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import crc32c

from labkit.data.tfrecord import READ_BYTES, expand_paths


@dataclass(frozen=True)
class Throughput:
    """One timed pass: `samples` delivered and `nbytes` of shard files covered in `seconds`."""

    name: str
    samples: int
    nbytes: int
    seconds: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


def batch_size_of(batch) -> int:
    """Samples in a batch: a dict of arrays/tensors (first value's length) or a sequence."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else len(batch)


def files_bytes(paths) -> int:
    return sum(os.path.getsize(p) for p in expand_paths(paths))


def measure(name: str, make_batches: Callable[[], Iterable], *, nbytes: int = 0, repeats: int = 1,
            warmup: bool = True) -> Throughput:
    """Time full passes over `make_batches()` (a fresh iterable each pass); the best of `repeats`
    after one untimed warm-up pass (page cache, worker start, graph tracing)."""
    if warmup:
        for _ in make_batches():
            pass
    best = None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        samples = sum(batch_size_of(b) for b in make_batches())
        dt = time.perf_counter() - t0
        if best is None or dt < best.seconds:
            best = Throughput(name, samples, nbytes, dt)
    return best


def count_pass(make_batches: Callable[[], Iterable]) -> Callable[[], int]:
    """A full pass over `make_batches()` as a callable returning the samples it delivered."""
    return lambda: sum(batch_size_of(b) for b in make_batches())


def raw_read_pass(paths, chunk_bytes: int = READ_BYTES) -> Callable[[], int]:
    """A sequential read of the files into one reused buffer (no parsing, no CRC)."""
    files = expand_paths(paths)
    buf = memoryview(bytearray(chunk_bytes))

    def run() -> int:
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
        return 0

    return run


def _pieces(paths, piece_bytes: int) -> list[bytes]:
    pieces = []
    for p in expand_paths(paths):
        with open(p, "rb") as f:
            while piece := f.read(piece_bytes):
                pieces.append(piece)
    return pieces


def crc32c_pass(paths, piece_bytes: int = READ_BYTES) -> Callable[[], int]:
    """CRC-32C of the files' bytes, held in memory in pieces of `piece_bytes` (so only the
    checksum is timed, over data the size of what one read() brings into cache)."""
    pieces = _pieces(paths, piece_bytes)

    def run() -> int:
        for piece in pieces:
            crc32c.crc32c(piece)
        return 0

    return run


def compare(passes: dict[str, Callable[[], int]], *, nbytes: int, repeats: int = 3) -> dict[str, Throughput]:
    """Time each pass `repeats` times, round-robin (so a noisy neighbour hurts every entry
    alike), after one untimed warm-up of each; keep each entry's best time."""
    for run in passes.values():
        run()
    best: dict[str, Throughput] = {}
    for _ in range(max(1, repeats)):
        for name, run in passes.items():
            t0 = time.perf_counter()
            samples = run()
            dt = time.perf_counter() - t0
            if name not in best or dt < best[name].seconds:
                best[name] = Throughput(name, samples, nbytes, dt)
    return best


def single_core_ceiling(raw_bytes_per_s: float, crc_bytes_per_s: float) -> float:
    """1 / (1/raw + 1/crc): read every byte once and checksum it once, on one core."""
    return 1.0 / (1.0 / raw_bytes_per_s + 1.0 / crc_bytes_per_s)


@dataclass(frozen=True)
class DataTime:
    """Over `steps` timed steps: seconds waiting for the next batch vs computing the step."""

    steps: int
    data_s: float
    compute_s: float

    @property
    def fraction(self) -> float:
        total = self.data_s + self.compute_s
        return self.data_s / total if total else 0.0

    @property
    def step_s(self) -> float:
        return (self.data_s + self.compute_s) / max(1, self.steps)
