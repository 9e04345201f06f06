"""A storage-latency injector: make local files behave like objects on Cloud Storage.

Reading from Cloud Storage costs a fixed latency per object opened (tens of milliseconds to the
first byte) and a per-stream bandwidth cap (one stream reaches some hundreds of MB/s, far below a
local NVMe). With many small files the per-file latency dominates; shards amortise it and
parallel reads overlap it. `StorageLatency` reproduces both effects on a laptop: pass
`.opener()` to the torch/NumPy readers, or `.tf_delay` to the tf.data pipeline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from labkit.core.config import check_float
from labkit.data.tfrecord import Opener, open_binary


@dataclass(frozen=True)
class StorageLatency:
    """`open_latency_ms` slept once per file opened; `bandwidth_mb_s` caps each open stream
    (None: uncapped). The defaults are the order of magnitude of one Cloud Storage stream.
    `clock` and `sleep` are the time it keeps (a test passes a fake one)."""

    open_latency_ms: float = 30.0
    bandwidth_mb_s: float | None = 200.0
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_float("open_latency_ms", self.open_latency_ms, minimum=0.0)
        check_float("bandwidth_mb_s", self.bandwidth_mb_s, minimum=1e-3, allow_none=True)

    @property
    def enabled(self) -> bool:
        return self.open_latency_ms > 0 or self.bandwidth_mb_s is not None

    def file_cost_s(self, nbytes: int) -> float:
        """Modelled time to fetch a whole object of `nbytes` on one stream."""
        bw = 0.0 if self.bandwidth_mb_s is None else nbytes / (self.bandwidth_mb_s * 1e6)
        return self.open_latency_ms / 1e3 + bw

    def opener(self) -> Opener:
        """An opener for `iter_views`/`read_batches`/`make_loader`: sleeps the open latency, then
        paces reads so one stream never exceeds the bandwidth cap. Picklable, so it travels to
        DataLoader workers however they are started."""
        return _SlowOpener(self)

    def tf_delay(self, path) -> bytes:
        """For `tf.py_function` in tf.data: sleep the whole-file cost, return the path. (tf.data
        opens files itself, so the cost is charged up front rather than paced per read.)"""
        p = path.numpy().decode() if hasattr(path, "numpy") else os.fspath(path)
        self.sleep(self.file_cost_s(os.path.getsize(p)))
        return p.encode()


@dataclass(frozen=True)
class _SlowOpener:
    latency: StorageLatency

    def __call__(self, path: str) -> BinaryIO:
        self.latency.sleep(self.latency.open_latency_ms / 1e3)
        return _PacedFile(open_binary(path, "rb"), self.latency)  # type: ignore[return-value]


class _PacedFile:
    """A file whose `readinto` keeps the cumulative rate at or below `bandwidth_mb_s`."""

    def __init__(self, raw: BinaryIO, latency: StorageLatency):
        self._raw = raw
        self._rate = None if latency.bandwidth_mb_s is None else latency.bandwidth_mb_s * 1e6
        self._clock, self._sleep = latency.clock, latency.sleep
        self._start = self._clock()
        self._bytes = 0

    def readinto(self, view) -> int:
        n = self._raw.readinto(view)
        if self._rate and n:
            self._bytes += n
            ahead = self._bytes / self._rate - (self._clock() - self._start)
            if ahead > 0:
                self._sleep(ahead)
        return n

    def read(self, n: int = -1) -> bytes:
        if n < 0:  # to the end, paced chunk by chunk
            return b"".join(iter(lambda: self.read(1 << 20), b""))
        buf = bytearray(n)
        got = self.readinto(memoryview(buf))
        return bytes(buf[:got])

    def close(self) -> None:
        self._raw.close()
