"""The DDP communication hook that carries the replicas' loss and stop flag with the gradients:
two real gloo processes; gradients must equal DDP's default all-reduce exactly."""

from __future__ import annotations

import os

import pytest

from labkit.core.cluster import free_ports


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    _import_frameworks()


def _import_frameworks():
    """Also called in each spawned worker: a fresh process runs no fixture."""
    global torch, dist, mp, nn, DDP, StepAgreement
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit.torch.agreement import StepAgreement


def _batch(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))


def _worker(rank: int, port: int, results) -> None:
    _import_frameworks()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        x, y = _batch(rank)
        plain = DDP(_model())
        nn.functional.mse_loss(plain(x), y).backward()
        agreement = StepAgreement()
        hooked = DDP(_model())
        hooked.register_comm_hook(None, agreement.hook)
        out = []
        for step in range(2):  # the second step runs on DDP's rebuilt buckets
            hooked.zero_grad()
            loss = nn.functional.mse_loss(hooked(x), y)
            agreement.offer(loss, stop=(rank == 1 and step == 1))
            loss.backward()
            out.append(agreement.take())
        no_offer = DDP(_model())
        no_offer_agreement = StepAgreement()
        no_offer.register_comm_hook(None, no_offer_agreement.hook)
        nn.functional.mse_loss(no_offer(x), y).backward()
        same = all(torch.equal(a.grad, b.grad) and torch.equal(a.grad, c.grad) for a, b, c in
                   zip(plain.parameters(), hooked.parameters(), no_offer.parameters(), strict=True))
        results[rank] = {"agreed": out, "same_grads": same, "no_offer": no_offer_agreement.take()}
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_loss_and_stop_ride_with_the_gradients_and_change_nothing():
    (port,) = free_ports(1)
    results = mp.get_context("spawn").Manager().dict()
    mp.start_processes(_worker, args=(port, results), nprocs=2, start_method="spawn")
    model = _model()
    losses = [nn.functional.mse_loss(model(x), y).item() for x, y in map(_batch, (0, 1))]
    for rank in (0, 1):
        r = results[rank]
        assert r["same_grads"], f"rank {rank}: gradients differ from DDP's default all-reduce"
        (loss0, stop0), (_, stop1) = r["agreed"]
        assert loss0 == pytest.approx(sum(losses) / 2, rel=1e-6)
        assert (stop0, stop1) == (False, True)  # rank 1 asked at step 1: both ranks see it
        assert r["no_offer"] is None  # nothing offered: the engine falls back to its own all-reduce
