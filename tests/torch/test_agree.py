"""The end of a DDP step: every replica gets the mean loss and stops when any replica was asked
to (`labkit.torch.trainer.agree`), on two real gloo processes."""

from __future__ import annotations

import os

import pytest

from labkit.core.cluster import free_ports


def _worker(rank: int, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    from labkit.torch.distributed import DistInfo
    from labkit.torch.trainer import agree

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        info = DistInfo(rank=rank, world_size=2, local_rank=rank, local_world_size=2)
        losses = (torch.tensor(1.0 + rank), torch.tensor(0.5))
        results[rank] = [agree(loss, stop=(rank == 1 and step == 1), info=info)
                         for step, loss in enumerate(losses)]
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_replicas_agree_on_the_mean_loss_and_on_any_stop():
    import torch.multiprocessing as mp

    (port,) = free_ports(1)
    results = mp.get_context("spawn").Manager().dict()
    mp.start_processes(_worker, args=(port, results), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        # step 0: losses 1 and 2, nobody asked to stop; step 1: rank 1 was asked, both stop
        assert results[rank] == [(1.5, False), (0.5, True)], results[rank]


def test_a_lone_process_reads_its_loss_and_keeps_its_own_stop_flag():
    torch = pytest.importorskip("torch")
    from labkit.torch.distributed import DistInfo
    from labkit.torch.trainer import agree

    assert agree(torch.tensor(0.25), True, DistInfo()) == (0.25, True)
