"""Framework-free reading of labkit shards into NumPy batches, and how shards are split among
readers (DDP ranks × loader workers) so that every record is read exactly once per epoch.

The torch DataLoader path (`labkit.data.torch_loader`) runs this code inside each worker.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from labkit.core.config import check_choice, check_int
from labkit.data.example import decode_example
from labkit.data.tfrecord import Opener, expand_paths, iter_views, normalize_compression

KINDS = ("images", "tokens", "raw")
SHARD_MODES = ("auto", "file", "record")


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


def _shuffled(views: Iterator[memoryview], size: int, rng: random.Random) -> Iterator[memoryview]:
    """A shuffle buffer as in tf.data: hold `size` records (copied, since views are reused)."""
    buf: list[bytes] = []
    for v in views:
        item = bytes(v)
        if len(buf) < size:
            buf.append(item)
            continue
        j = rng.randrange(size)
        yield memoryview(buf[j])
        buf[j] = item
    rng.shuffle(buf)
    for item in buf:
        yield memoryview(item)


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
        self._pool: dict[tuple, list[np.ndarray]] = {}
        self.reused = 0

    def array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        arrays = self._pool.setdefault((tuple(shape), np.dtype(dtype).str), [])
        for i in range(len(arrays)):
            if sys.getrefcount(arrays[i]) == 2:  # the list's reference + the call's argument
                self.reused += 1
                return arrays[i]
        a = np.empty(shape, dtype)
        if len(arrays) < self.capacity:
            arrays.append(a)
        return a

    def numpy_alloc(self, shape: tuple[int, ...], dtype) -> tuple[np.ndarray, np.ndarray]:
        a = self.array(shape, dtype)
        return a, a


Allocator = Callable[[tuple[int, ...], Any], tuple[Any, np.ndarray]]


class BatchDecoder:
    """Decodes record views straight into preallocated batch arrays (one copy per payload).
    `alloc(shape, dtype)` returns (what the batch holds, a writable NumPy view of it), so the
    torch path can decode straight into shared-memory tensors."""

    def __init__(self, kind: str, batch_size: int, alloc: Allocator = _numpy_alloc):
        self.kind = kind
        self.batch_size = batch_size
        self.alloc = alloc
        self._arrays: dict[str, np.ndarray] | None = None
        self._handles: dict[str, Any] = {}
        self.n = 0

    def _alloc(self, first) -> dict[str, np.ndarray]:
        b = self.batch_size
        if self.kind == "images":
            h, w, c = first["shape"]
            shapes = {"index": ((b,), np.int64), "label": ((b,), np.int64),
                      "image": ((b, h, w, c), np.uint8)}
        elif self.kind == "tokens":
            shapes = {"index": ((b,), np.int64),
                      "tokens": ((b, len(first["tokens"][0]) // 4), np.int64)}
        else:
            shapes = {"record": ((b, first), np.uint8)}
        made = {k: self.alloc(shape, dtype) for k, (shape, dtype) in shapes.items()}
        self._handles = {k: h for k, (h, _) in made.items()}
        return {k: a for k, (_, a) in made.items()}

    def add(self, view: memoryview) -> dict[str, np.ndarray] | None:
        """Add one record; returns the full batch when it completes (arrays are then new)."""
        if self.kind == "raw":
            if self._arrays is None:
                self._arrays = self._alloc(len(view))
            self._arrays["record"][self.n] = view
        else:
            ex = decode_example(view)
            try:
                if self._arrays is None:
                    self._arrays = self._alloc(ex)
                a = self._arrays
                a["index"][self.n] = ex["index"][0]
                if self.kind == "images":
                    a["label"][self.n] = ex["label"][0]
                    a["image"][self.n] = np.frombuffer(ex["image"][0], np.uint8).reshape(a["image"].shape[1:])
                else:
                    a["tokens"][self.n] = np.frombuffer(ex["tokens"][0], "<i4")
            except (KeyError, IndexError, ValueError) as e:
                raise PayloadError(f"record is not a labkit {self.kind} example "
                                   f"(features: {sorted(ex)}): {e}") from e
        self.n += 1
        return self.flush() if self.n == self.batch_size else None

    def flush(self) -> dict[str, Any] | None:
        if not self.n or self._arrays is None:
            return None
        n, full = self.n, self.n == self.batch_size
        out = {k: (h if full else h[:n]) for k, h in self._handles.items()}
        self._arrays, self._handles, self.n = None, {}, 0
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
    views = iter_assigned(assignment, config, opener)
    if config.shuffle_buffer > 1:
        views = _shuffled(views, config.shuffle_buffer, random.Random(config.seed * 7919 + epoch))
    decoder = BatchDecoder(config.kind, config.batch_size, alloc)
    for v in views:
        batch = decoder.add(v)
        if batch is not None:
            yield batch
    last = decoder.flush()
    if last is not None and not config.drop_remainder:
        yield last
