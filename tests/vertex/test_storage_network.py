"""The local Cloud Storage's network (`labkit.vertex.storage.network`): the latency it waits before
each request, the rate it caps each download at, and the requests it counts."""

from __future__ import annotations

import time
import urllib.request

import pytest

from labkit.core.config import ParameterError
from labkit.vertex.storage import LocalStorage
from labkit.vertex.storage.network import Network


def fetch(server: LocalStorage, name: str) -> tuple[bytes, float]:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    t0 = time.perf_counter()
    with direct.open(f"{server.endpoint}/storage/v1/b/bkt/o/{name}?alt=media", timeout=60) as reply:
        data = reply.read()
    return data, time.perf_counter() - t0


@pytest.mark.slow
def test_latency_and_stream_rate_are_played_and_requests_counted(tmp_path):
    (tmp_path / "root" / "bkt").mkdir(parents=True)
    (tmp_path / "root" / "bkt" / "small").write_bytes(b"x" * 100)
    (tmp_path / "root" / "bkt" / "big").write_bytes(b"y" * 3_000_000)
    with LocalStorage(tmp_path / "root", tmp_path / "state", network=Network(latency_ms=80, stream_mb_s=10)) as server:
        before = server.stats()
        data, small_s = fetch(server, "small")
        assert data == b"x" * 100 and small_s >= 0.08
        data, big_s = fetch(server, "big")
        assert len(data) == 3_000_000 and big_s >= 0.08 + 0.3 * 0.9  # 3 MB at 10 MB/s after the wait
        after = server.stats()
    assert after["requests"] - before["requests"] == 2 and after["media_requests"] - before["media_requests"] == 2
    assert after["media_bytes"] - before["media_bytes"] == 3_000_100


@pytest.mark.slow
def test_no_network_by_default_is_fast(tmp_path):
    (tmp_path / "root" / "bkt").mkdir(parents=True)
    (tmp_path / "root" / "bkt" / "small").write_bytes(b"x")
    with LocalStorage(tmp_path / "root", tmp_path / "state") as server:
        times = [fetch(server, "small")[1] for _ in range(5)]
    assert min(times) < 0.03  # no Nagle stall on kept-alive replies either


@pytest.mark.parametrize(("kwargs", "name"), [({"latency_ms": -1}, "latency_ms"), ({"stream_mb_s": 0}, "stream_mb_s")])
def test_bad_figures_are_named(kwargs, name):
    with pytest.raises(ParameterError, match=name):
        Network(**kwargs)
