"""The network between a VM and Cloud Storage, as the local server plays it: a wait before each
request is answered (the request's latency) and a cap on each download stream's rate, plus
counts of what was asked, so a comparison can say how many requests each way of reading made.

    LocalStorage(root, state, network=Network(latency_ms=3.0, stream_mb_s=1343))
    storage.stats()    # {"requests": 212, "media_requests": 104, "media_bytes": 52_428_800}

Both costs are per request and per stream, never shared: N readers at once each get the full
rate, as on Cloud Storage, where a VM's aggregate is bounded by its network interface, not by
a stream (https://cloud.google.com/storage/docs/request-rate, read 2026-11-28). The figures a
notebook plays are cited where it sets them; the server only applies them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from labkit.core.config import check_float


@dataclass(frozen=True)
class Network:
    """`latency_ms` waited before each request is answered; `stream_mb_s` (MB/s, None: as fast
    as this machine serves) caps each download."""

    latency_ms: float = 0.0
    stream_mb_s: float | None = None

    def __post_init__(self) -> None:
        check_float("latency_ms", self.latency_ms, minimum=0.0)
        check_float("stream_mb_s", self.stream_mb_s, minimum=1e-3, allow_none=True)

    def argv(self) -> list[str]:
        """The server's command-line flags for this network."""
        cap = [] if self.stream_mb_s is None else ["--stream-mb-s", repr(self.stream_mb_s)]
        return ["--latency-ms", repr(self.latency_ms), *cap]

    def wait_for_request(self) -> None:
        if self.latency_ms:
            time.sleep(self.latency_ms / 1e3)

    def pace(self, chunks, start: float):
        """Yield `chunks` no faster than `stream_mb_s` counted from `start` (perf_counter)."""
        rate = None if self.stream_mb_s is None else self.stream_mb_s * 1e6
        sent = 0
        for chunk in chunks:  # a chunk leaves when the stream would have finished sending it
            sent += len(chunk)
            ahead = sent / rate - (time.perf_counter() - start) if rate else 0.0
            if ahead > 0:
                time.sleep(ahead)
            yield chunk


class Counts:
    """Requests answered, downloads among them, and the bytes downloaded (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "media_requests": 0, "media_bytes": 0}

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
