"""All-reduce bandwidth benchmark: the arithmetic, and a real 2-process gloo run."""

from __future__ import annotations

import pytest

from labkit.core.config import ParameterError
from labkit.hardware import allreduce as c


def test_size_ladder_and_bus_bandwidth():
    assert c.size_ladder(4 * c.KB, 256 * c.MB) == [4 * c.KB * 4**i for i in range(9)]
    assert c.size_ladder(4 * c.KB, 256 * c.MB)[-1] == 256 * c.MB
    assert c.bus_bandwidth(10.0, 2) == 10.0
    assert c.bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert c.bus_bandwidth(10.0, 1) == 10.0


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="backend"):
        c.AllReduceConfig(backend="mpi")
    with pytest.raises(ValueError, match="sizes"):
        c.AllReduceConfig(sizes=[])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_process_gloo_allreduce():
    pytest.importorskip("torch")
    sizes = [4 * c.KB, 256 * c.KB, 1 * c.MB]
    report = c.allreduce_benchmark(c.AllReduceConfig(sizes=sizes, world_size=2, backend="gloo",
                                                     target_s=0.05, max_iters=10))
    assert report.backend == "gloo" and report.world_size == 2
    assert [r.size_bytes for r in report.results] == sizes
    for r in report.results:
        assert r.time_s > 0 and 3 <= r.iters <= 10
        assert r.algbw_gbps == pytest.approx(r.size_bytes / r.time_s / 1e9)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps)  # 2(n-1)/n = 1 for two ranks


def test_nccl_needs_a_gpu_per_process():
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ParameterError, match="world_size"):
        c.allreduce_benchmark(c.AllReduceConfig(sizes=[c.KB], world_size=n + 1, backend="nccl"))


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_nccl_allreduce_on_gpus():
    import torch

    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("nccl all-reduce needs two GPUs (one per process)")
    report = c.allreduce_benchmark(c.AllReduceConfig(sizes=[1 * c.MB, 64 * c.MB], world_size=max(n, 2)))
    assert report.backend == "nccl" and report.peak_busbw_gbps > 0
