"""Reading labkit TFRecord shards into PyTorch: an IterableDataset and a tuned DataLoader.

Two mechanisms, measured against each other in notebook 03 and `benchmarks/bench_input.py`:

- `mechanism="batch"` (default): each loader worker reads its share of the shards and decodes
  records straight into a whole batch (one copy per payload, into shared memory so handing the
  batch to the main process copies nothing more). The DataLoader runs with `batch_size=None`.
- `mechanism="sample"`: the textbook way, the dataset yields one sample at a time and the
  DataLoader's collate stacks them: a Python object and a tensor per sample, then a copy.
- `mechanism="thread"`: batches decoded in the training process by one background thread,
  `prefetch_factor` batches ahead (pinned there when `pin_memory`). The heavy work (CRC32C, the
  copy into the batch) runs outside the GIL, and batches never cross a process boundary, which
  for already-decoded payloads (raw pixels, token ids) is cheaper than worker processes whose
  every batch is a fresh shared-memory segment. Needs `num_workers=0`.

Splitting: reader k = rank × num_workers + worker_id of world_size × num_workers readers gets
its share from `labkit.data.reader.assign_shards`, so across DDP ranks and loader workers every
record is read exactly once per epoch (the tests check it over the record ids).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from labkit.core.config import check_bool, check_choice, check_int
from labkit.data.reader import SHARD_MODES, BufferPool, ReadConfig, read_batches
from labkit.data.tfrecord import Opener, expand_paths

MECHANISMS = ("batch", "sample", "thread")


@dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader knobs: worker processes, pinned memory, batches prefetched per worker,
    workers kept alive across epochs, the reading mechanism, how shards are split, and the DDP
    `rank` / `world_size` (None: taken from torch.distributed when initialised, else 0 / 1), and
    how workers start (None: the platform default; "spawn" is what macOS and Windows use).

    Every record is read exactly once per epoch, so when the record count does not divide
    evenly, some readers get one batch more than others: with DDP, make every rank stop at the
    same step (e.g. the shortest rank's batch count) or use `drop_remainder`."""

    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    mechanism: str = "batch"
    shard_mode: str = "auto"
    shuffle_files: bool = False
    rank: int | None = None
    world_size: int | None = None
    multiprocessing_context: str | None = None

    def __post_init__(self) -> None:
        check_int("num_workers", self.num_workers, minimum=0)
        check_bool("pin_memory", self.pin_memory)
        check_int("prefetch_factor", self.prefetch_factor, minimum=1, allow_none=True)
        check_bool("persistent_workers", self.persistent_workers)
        check_choice("mechanism", self.mechanism, MECHANISMS)
        check_choice("shard_mode", self.shard_mode, SHARD_MODES)
        check_bool("shuffle_files", self.shuffle_files)
        check_int("world_size", self.world_size, minimum=1, allow_none=True)
        check_int("rank", self.rank, minimum=0, allow_none=True)
        if self.multiprocessing_context is not None:
            check_choice("multiprocessing_context", self.multiprocessing_context, ("fork", "spawn", "forkserver"))
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ValueError(f"parameter 'rank' must be < world_size {self.world_size} (got {self.rank})")
        if self.mechanism == "thread":
            if self.num_workers:
                raise ValueError("mechanism 'thread' reads in the training process: set num_workers=0")
            if self.persistent_workers:
                raise ValueError("parameter 'persistent_workers' needs num_workers > 0")
        elif self.num_workers == 0 and (self.prefetch_factor is not None or self.persistent_workers):
            raise ValueError("parameters 'prefetch_factor' and 'persistent_workers' need num_workers > 0")


def dist_rank_world(config: LoaderConfig) -> tuple[int, int]:
    import torch.distributed as dist

    if config.rank is not None and config.world_size is not None:
        return config.rank, config.world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return config.rank or 0, config.world_size or 1


def _make_dataset(paths, read: ReadConfig, loader: LoaderConfig, opener: Opener | None):
    files = expand_paths(paths)
    rank, world = dist_rank_world(loader)
    return _iterable_class()(files, read, loader, rank, world, opener)


def _iterable_class():
    """The IterableDataset class, built on first use so that importing this module does not
    import torch. It lives at module level (see `__getattr__`), so datasets pickle for loader
    workers started with "spawn" (the default on macOS and Windows)."""
    cls = globals().get("_TFRecordIterable")
    if cls is not None:
        return cls
    from torch.utils.data import IterableDataset, get_worker_info

    class TFRecordIterable(IterableDataset):
        """This rank's and this worker's share of the shards, as batches or as samples."""

        def __init__(self, files, read, loader, rank, world_size, opener) -> None:
            self.files, self.read, self.loader = files, read, loader
            self.rank, self.world_size = rank, world_size
            self.epoch = 0
            self.opener = opener

        def set_epoch(self, epoch: int) -> None:
            """Reshuffle per epoch (like DistributedSampler.set_epoch); same on every reader."""
            self.epoch = epoch

        def _reader(self) -> tuple[int, int]:
            info = get_worker_info()
            workers, wid = (info.num_workers, info.id) if info else (1, 0)
            return self.rank * workers + wid, self.world_size * workers

        def __iter__(self) -> Iterator:
            consumer, n = self._reader()
            shared = get_worker_info() is not None and self.loader.mechanism == "batch"
            batches = read_batches(self.files, self.read, num_consumers=n, consumer=consumer,
                                   shard_mode=self.loader.shard_mode, epoch=self.epoch,
                                   shuffle_files=self.loader.shuffle_files, opener=self.opener,
                                   alloc=_shared_alloc if shared else _PooledTensors().alloc)
            for tensors in batches:
                if self.loader.mechanism != "sample":
                    yield tensors
                else:
                    for i in range(len(tensors["index"] if "index" in tensors else tensors["record"])):
                        yield {k: v[i] for k, v in tensors.items()}

    TFRecordIterable.__qualname__ = TFRecordIterable.__name__ = "_TFRecordIterable"
    TFRecordIterable.__module__ = __name__
    globals()["_TFRecordIterable"] = TFRecordIterable
    return TFRecordIterable


def __getattr__(name: str):
    if name == "_TFRecordIterable":  # unpickling in a spawned worker
        return _iterable_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _PooledTensors:
    """In-process batches: tensors over pooled NumPy arrays (see BufferPool for why reuse is safe:
    a tensor from `torch.from_numpy` and all its views hold a reference to the array)."""

    def __init__(self) -> None:
        self.pool = BufferPool()

    def alloc(self, shape: tuple[int, ...], dtype):
        import torch

        a = self.pool.array(shape, dtype)
        return torch.from_numpy(a), a


def _shared_alloc(shape: tuple[int, ...], dtype):
    """In a loader worker, batches are decoded straight into shared memory, so handing one to
    the main process passes a file descriptor instead of copying the batch again. The storage
    is created shared (`share_memory_()` on a fresh tensor would allocate it, then allocate and
    copy it again: measured 27 ms against 6 ms for a 6.4 MB batch)."""
    import torch

    torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # a torch without it: the public, slower way
        t = torch.empty(shape, dtype=torch_dtype).share_memory_()
    else:
        t = torch.empty(0, dtype=torch_dtype).set_(new_shared(nbytes)).view(shape)
    return t, t.numpy()


def make_loader(paths, read: ReadConfig | None = None, loader: LoaderConfig | None = None,
                *, opener: Opener | None = None):
    """A torch DataLoader over labkit shards yielding dicts of tensors: images
    `{"index", "image" (B,H,W,C uint8), "label"}`, tokens `{"index", "tokens" (B,L int64)}`.
    With mechanism "thread", a ThreadedLoader (same batches, iterated the same way)."""
    from torch.utils.data import DataLoader

    read, loader = read or ReadConfig(), loader or LoaderConfig()
    if loader.mechanism == "thread":
        return ThreadedLoader(_make_dataset(paths, read, loader, opener), depth=loader.prefetch_factor or 2,
                              pin_memory=loader.pin_memory)
    dataset = _make_dataset(paths, read if loader.mechanism != "sample" else replace(read, drop_remainder=False),
                            loader, opener)
    kwargs = {}
    if loader.num_workers:
        kwargs = {"prefetch_factor": loader.prefetch_factor or 2,
                  "persistent_workers": loader.persistent_workers,
                  "multiprocessing_context": loader.multiprocessing_context}
    if loader.mechanism == "batch":
        # The dataset already yields batches of tensors: nothing for the loader to convert.
        return DataLoader(dataset, batch_size=None, num_workers=loader.num_workers,
                          pin_memory=loader.pin_memory, collate_fn=as_is, **kwargs)
    return DataLoader(dataset, batch_size=read.batch_size, drop_last=read.drop_remainder,
                      num_workers=loader.num_workers, pin_memory=loader.pin_memory, **kwargs)


_END = object()


def as_is(batch):
    """The collate function of a dataset that yields whole batches (module level: picklable)."""
    return batch


class ThreadedLoader:
    """Iterates a dataset of batches on a background thread, `depth` batches ahead, optionally
    pinning them; exceptions from the reader are re-raised in the consumer."""

    def __init__(self, dataset, *, depth: int = 2, pin_memory: bool = False):
        self.dataset = dataset
        self.depth = depth
        self.pin_memory = pin_memory

    def __iter__(self) -> Iterator:
        import queue
        import threading

        q: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for batch in self.dataset:
                    if self.pin_memory:
                        batch = {k: v.pin_memory() for k, v in batch.items()}
                    if not put(batch):
                        return
                put(_END)
            except BaseException as e:  # handed to the consumer, raised there
                put(e)

        thread = threading.Thread(target=work, name="labkit-reader", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:  # the consumer stopped early or finished: release the reader
            stop.set()
            thread.join(timeout=5)
