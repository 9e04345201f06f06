"""Framework-free reading of labkit shards into NumPy batches, and how shards are split among
readers (DDP ranks × loader workers) so that every record is read exactly once per epoch.

The torch DataLoader path (`labkit.data.torch_loader`) runs this code inside each worker.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from labkit.core.config import check_choice, check_int
from labkit.data.example import ExampleLayout, decode_example, example_layout
from labkit.data.tfrecord import (
    Opener,
    expand_paths,
    iter_record_chunks,
    iter_views,
    normalize_compression,
)

KINDS = ("images", "tokens", "raw")
_VECTOR_MIN = 4  # runs shorter than this are decoded record by record
_LAYOUT_TRIES = 8  # records in a row that may miss the layout before layouts are given up
SHARD_MODES = ("auto", "file", "record")
T = TypeVar("T")


class PayloadError(ValueError):
    """A record does not hold the payload the reader was asked for."""


@dataclass(frozen=True)
class Assignment:
    """What one reader (consumer `consumer` of `num_consumers`) reads: files, and within each
    file the records i with i % every == offset (every == 1: the whole file)."""

    files: list[str]
    every: int
    offsets: list[int]


def assign_shards(files: Sequence[str], num_consumers: int, consumer: int, mode: str = "auto",
                  *, epoch: int = 0, shuffle_files: bool = False, seed: int = 0) -> Assignment:
    """Split files among `num_consumers` readers with no duplicates and no gaps.

    "file": reader k gets files k, k+n, ... (cheapest: each byte read once) but readers get
    unequal work when the file count is not a multiple of n. "record": every reader walks every
    file and keeps record i of file j when (i + j) % n == k (balanced to within one record per
    file; data CRCs are checked only for kept records). "auto" picks "file" when the files
    divide evenly, else "record". With `shuffle_files`, every reader applies the same
    per-epoch permutation before splitting, so the split stays a partition."""
    check_int("num_consumers", num_consumers, minimum=1)
    check_int("consumer", consumer, minimum=0, maximum=num_consumers - 1)
    check_choice("shard_mode", mode, SHARD_MODES)
    files = list(files)
    if shuffle_files:
        random.Random(seed * 1_000_003 + epoch).shuffle(files)
    n = num_consumers
    if mode == "auto":
        mode = "file" if len(files) >= n and len(files) % n == 0 else "record"
    if mode == "file" or n == 1:
        mine = files[consumer::n]
        return Assignment(mine, 1, [0] * len(mine))
    return Assignment(files, n, [(consumer - j) % n for j in range(len(files))])


@dataclass(frozen=True)
class ReadConfig:
    """How records become batches: `kind` of payload, `batch_size`, whether the last short
    batch is kept, CRC verification, a sample shuffle buffer (0: off) and its seed."""

    kind: str = "images"
    batch_size: int = 32
    drop_remainder: bool = False
    compression: str | None = None
    verify: bool = True
    shuffle_buffer: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("shuffle_buffer", self.shuffle_buffer, minimum=0)
        normalize_compression(self.compression)


def iter_assigned(assignment: Assignment, config: ReadConfig, opener: Opener | None = None) -> Iterator[memoryview]:
    for path, off in zip(assignment.files, assignment.offsets, strict=True):
        yield from iter_views(path, compression=config.compression, verify=config.verify,
                              opener=opener, every=assignment.every, offset=off)


def shuffle_buffer(items: Iterator[T], size: int, rng: random.Random) -> Iterator[T]:
    """A shuffle buffer as in tf.data: hold `size` items, hand out a random one as each new one
    arrives, then the rest in random order."""
    buf: list[T] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        yield buf[j]
        buf[j] = item
    rng.shuffle(buf)
    yield from buf


def _shuffled(views: Iterator[memoryview], size: int, rng: random.Random) -> Iterator[memoryview]:
    """Records through a shuffle buffer (copied: the views are reused)."""
    return (memoryview(b) for b in shuffle_buffer((bytes(v) for v in views), size, rng))


def _numpy_alloc(shape: tuple[int, ...], dtype) -> tuple[np.ndarray, np.ndarray]:
    a = np.empty(shape, dtype)
    return a, a


class BufferPool:
    """Batch arrays reused once nothing refers to them any more.

    Fresh multi-megabyte arrays cost page faults on every batch (about a third of the reading
    time for 100 KB records). A pooled array is handed out again only when the pool holds the
    sole reference to it: any live batch, slice, NumPy view or `torch.from_numpy` tensor (and
    every view of that tensor, through its storage) keeps a reference, so a batch the consumer
    still holds is never overwritten. In-process only: memory shared with another process is
    not tracked this way."""

    def __init__(self, capacity: int = 4):
        self.capacity = capacity
        self._pool: dict[tuple, list[np.ndarray]] = {}  # (shape, dtype) -> arrays
        self.reused = 0

    def array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        key = (tuple(shape), dtype)
        arrays = self._pool.get(key)
        if arrays is None:
            arrays = self._pool[key] = []
        for a in arrays:
            if sys.getrefcount(a) == 3:  # the list's reference, `a` and the call's argument
                self.reused += 1
                return a
        a = np.empty(shape, dtype)
        if len(arrays) < self.capacity:
            arrays.append(a)
        return a

    def numpy_alloc(self, shape: tuple[int, ...], dtype) -> tuple[np.ndarray, np.ndarray]:
        a = self.array(shape, dtype)
        return a, a


Allocator = Callable[[tuple[int, ...], Any], tuple[Any, np.ndarray]]


class BatchDecoder:
    """Decodes records straight into preallocated batch arrays (one copy per payload).
    `alloc(shape, dtype)` returns (what the batch holds, a writable NumPy view of it), so the
    torch path can decode straight into shared-memory tensors.

    Records of one schema share an `ExampleLayout`: once the first record is decoded, a record
    that matches the layout has its values read at known offsets (a few slice comparisons
    instead of a walk over every field), and a run of equal-sized records from
    `iter_record_chunks` is checked, decoded and copied into the batch with a few NumPy
    operations for the whole run."""

    def __init__(self, kind: str, batch_size: int, alloc: Allocator = _numpy_alloc):
        self.kind = kind
        self.batch_size = batch_size
        self.alloc = alloc
        self._arrays: dict[str, np.ndarray] | None = None
        self._handles: dict[str, Any] = {}
        self._payload: memoryview | None = None  # the batch's payload array, flat, as bytes
        self._payload_bytes = 0  # payload bytes per sample
        self.n = 0
        self.layout: ExampleLayout | None = None
        self._layout_shapes: dict[str, tuple[tuple[int, ...], Any]] = {}
        self._misses = 0  # records in a row that did not match the layout

    def _shapes(self, first) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Per-batch array shapes from the first record (decoded; raw records: their length)."""
        b = self.batch_size
        if self.kind == "images":
            h, w, c = first["shape"]
            return {"index": ((b,), np.int64), "label": ((b,), np.int64), "image": ((b, h, w, c), np.uint8)}
        if self.kind == "tokens":
            return {"index": ((b,), np.int64), "tokens": ((b, len(first["tokens"][0]) // 4), np.int64)}
        return {"record": ((b, first), np.uint8)}

    def _alloc(self, shapes) -> dict[str, np.ndarray]:
        made = {k: self.alloc(shape, dtype) for k, (shape, dtype) in shapes.items()}
        self._handles = {k: h for k, (h, _) in made.items()}
        arrays = {k: a for k, (_, a) in made.items()}
        if self.kind != "tokens":
            payload = arrays["image" if self.kind == "images" else "record"]
            self._payload = memoryview(payload.reshape(-1))
            self._payload_bytes = payload[0].size
        return arrays

    def add(self, view: memoryview) -> dict[str, np.ndarray] | None:
        """Add one record; returns the full batch when it completes (arrays are then new)."""
        n = self.n
        if self.kind == "raw":
            if self._arrays is None:
                self._arrays = self._alloc(self._shapes(len(view)))
            if len(view) != self._payload_bytes:
                raise PayloadError(f"raw records in one batch must have one length: "
                                   f"{len(view)} bytes after {self._payload_bytes}")
            self._payload[n * self._payload_bytes:(n + 1) * self._payload_bytes] = view
        elif self.layout is not None and self.layout.matches(view):
            self._misses = 0
            if self._arrays is None:
                self._arrays = self._alloc(self._layout_shapes)
            lay, a = self.layout, self._arrays
            a["index"][n] = lay.int64(view, "index")
            if self.kind == "images":
                a["label"][n] = lay.int64(view, "label")
                lo, hi = lay.blobs["image"]
                self._payload[n * self._payload_bytes:(n + 1) * self._payload_bytes] = view[lo:hi]
            else:
                lo, hi = lay.blobs["tokens"]
                a["tokens"][n] = np.frombuffer(view[lo:hi], "<i4")
        else:
            self._add_decoded(view)
        self.n += 1
        return self.flush() if self.n == self.batch_size else None

    def _add_decoded(self, view: memoryview) -> None:
        ex = decode_example(view)
        try:
            if self._arrays is None:
                self._arrays = self._alloc(self._shapes(ex))
            a = self._arrays
            a["index"][self.n] = ex["index"][0]
            if self.kind == "images":
                a["label"][self.n] = ex["label"][0]
                a["image"][self.n] = np.frombuffer(ex["image"][0], np.uint8).reshape(a["image"].shape[1:])
                blobs = ("image",) if list(ex["shape"]) == list(a["image"].shape[1:]) else None
                varints = ("index", "label")
            else:
                a["tokens"][self.n] = np.frombuffer(ex["tokens"][0], "<i4")
                blobs = ("tokens",) if len(ex["tokens"][0]) == 4 * a["tokens"].shape[1] else None
                varints = ("index",)
        except (KeyError, IndexError, ValueError) as e:
            raise PayloadError(f"record is not a labkit {self.kind} example "
                               f"(features: {sorted(ex)}): {e}") from e
        # Learn this record's layout for the next ones, unless layouts keep failing (records
        # whose other features vary, e.g. file names): then every record is walked.
        self._misses += 1
        if blobs is not None and self._misses <= _LAYOUT_TRIES:
            self.layout = example_layout(view, varints, blobs)
            self._layout_shapes = {k: (shape, dtype) for k, (shape, dtype) in self._shapes(ex).items()}

    def add_run(self, buf, first: int, stride: int, length: int, count: int) -> Iterator[dict[str, Any]]:
        """Add the records of a run from `iter_record_chunks` (record i's data at
        buf[first + i * stride:][:length]); yields each batch the run completes."""
        view = memoryview(buf)
        i = 0
        while i < count:
            m = 0
            if count - i >= _VECTOR_MIN:
                rows = np.ndarray((count - i, length), np.uint8, buf, first + i * stride, (stride, 1))
                if self.kind == "raw":
                    m = len(rows) if self._arrays is None or length == self._payload_bytes else 0
                elif self.layout is not None and self.layout.size == length:
                    m = self.layout.leading_matches(rows)
            if not m:  # one record at a time (which also learns the layout)
                s = first + i * stride
                batch = self.add(view[s:s + length])
                if batch is not None:
                    yield batch
                i += 1
                continue
            rows = rows[:m]
            if self._arrays is None:
                self._arrays = self._alloc(self._shapes(length) if self.kind == "raw" else self._layout_shapes)
            columns = self._columns(rows)
            done = 0
            while done < m:
                take = min(m - done, self.batch_size - self.n)
                self._add_rows(columns, done, take)
                done += take
                if self.n == self.batch_size:
                    yield self.flush()
                    if done < m:
                        self._arrays = self._alloc(self._shapes(length) if self.kind == "raw"
                                                   else self._layout_shapes)
            i += m

    def _columns(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each batch array's values for records `rows` that all match the layout (or raw
        records of the batch's length): varints decoded at once, payloads as strided views."""
        if self.kind == "raw":
            return {"record": rows}
        lay = self.layout
        out = {"index": lay.int64_column(rows, "index")}
        if self.kind == "images":
            lo, hi = lay.blobs["image"]
            out["label"] = lay.int64_column(rows, "label")
            out["image"] = rows[:, lo:hi]
        else:
            lo, hi = lay.blobs["tokens"]
            out["tokens"] = rows[:, lo:hi].view("<i4")
        return out

    def _add_rows(self, columns: dict[str, np.ndarray], start: int, count: int) -> None:
        n, a = self.n, self._arrays
        for name, values in columns.items():
            dst = a[name][n:n + count]
            if dst.ndim > 2:
                dst = dst.reshape(count, -1)
            dst[...] = values[start:start + count]
        self.n += count

    def flush(self) -> dict[str, Any] | None:
        if not self.n or self._arrays is None:
            return None
        n, full = self.n, self.n == self.batch_size
        out = {k: (h if full else h[:n]) for k, h in self._handles.items()}
        self._arrays, self._handles, self._payload, self.n = None, {}, None, 0
        return out


def read_batches(paths, config: ReadConfig | None = None, *, num_consumers: int = 1, consumer: int = 0,
                 shard_mode: str = "auto", epoch: int = 0, shuffle_files: bool = False,
                 opener: Opener | None = None, alloc: Allocator | None = None) -> Iterator[dict[str, Any]]:
    """Batches of `{"index", "image", "label"}` / `{"index", "tokens"}` / `{"record"}` arrays from
    this consumer's share of the shards (arrays made by `alloc`; default: NumPy arrays from a
    BufferPool, reused once the consumer has let go of them)."""
    config = config or ReadConfig()
    alloc = alloc or BufferPool().numpy_alloc
    files = expand_paths(paths)
    assignment = assign_shards(files, num_consumers, consumer, shard_mode, epoch=epoch,
                               shuffle_files=shuffle_files, seed=config.seed)
    decoder = BatchDecoder(config.kind, config.batch_size, alloc)
    if config.shuffle_buffer > 1:  # shuffling needs each record on its own
        views = _shuffled(iter_assigned(assignment, config, opener), config.shuffle_buffer,
                          random.Random(config.seed * 7919 + epoch))
        for v in views:
            batch = decoder.add(v)
            if batch is not None:
                yield batch
    else:
        for path, off in zip(assignment.files, assignment.offsets, strict=True):
            for buf, runs in iter_record_chunks(path, compression=config.compression, verify=config.verify,
                                                opener=opener, every=assignment.every, offset=off):
                for run in runs:
                    yield from decoder.add_run(buf, *run)
    last = decoder.flush()
    if last is not None and not config.drop_remainder:
        yield last
