"""labkit's background checkpoint and PyTorch's own asynchronous one
(`torch.distributed.checkpoint.async_save`, in a gloo process group of one), saving the same
trained state while training goes on, both load back to exactly the state at the save: the
correctness half of benchmarks/bench_checkpoint_peers.py (which times them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from labkit.core import checkpoint
from labkit.core.train_config import TrainConfig


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, dist, tree_flatten, tree_map, engine, trainer, state, DataPosition, DistInfo
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.utils._pytree import tree_flatten, tree_map

    from labkit.torch import engine, state, trainer
    from labkit.torch.data import DataPosition
    from labkit.torch.distributed import DistInfo


CONFIG = TrainConfig(model="gpt", batch_size=4, lr=1e-2, eval_samples=0, progress=False,
                     device="cpu")  # no held-out evaluation: these tests are about checkpoints


def _assert_identical(saved, loaded) -> int:
    a, spec_a = tree_flatten(saved)
    b, spec_b = tree_flatten(loaded)
    assert spec_a == spec_b
    tensors = 0
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
            assert torch.equal(x, y)
            tensors += 1
        else:
            assert x == y
    return tensors


@pytest.fixture
def trained():
    """A GPT after two AdamW steps, a batch to train on, and a step function."""
    c = engine.build(replace(CONFIG, grad_clip=1.0), DistInfo(), torch.device("cpu"))
    x = torch.randint(c.model_config.vocab_size, (4, c.model_config.block_size + 1),
                      generator=torch.Generator().manual_seed(0))
    batch = [(x[:, :-1], x[:, 1:])]
    for _ in range(2):
        trainer.train_step(c, batch, 1.0)
    return c, lambda: trainer.train_step(c, batch, 1.0)


def _state_at(c, step: int, position: DataPosition) -> dict:
    snap = state.snapshot(c, DistInfo(), step, position)
    return {"model": snap["model.pt"], "train": snap["train.pt"]}


def test_labkit_background_save_loads_back_the_state_at_the_save(trained, tmp_path):
    c, train_step = trained
    position = DataPosition(0, 2)
    expected = _state_at(c, 1, position)
    saver = state.Saver(str(tmp_path), DistInfo())
    saver.save(c, 1, position)
    train_step()  # the live state changes while the writer may still be writing
    saver.wait()
    ckpt = checkpoint.load(str(tmp_path), 1)
    loaded = {"model": state.from_bytes(ckpt.files["model.pt"]), "train": state.from_bytes(ckpt.files["train.pt"])}
    assert _assert_identical(expected, loaded) > 20  # weights, both moments and step per parameter
    assert not torch.equal(c.model.state_dict()["lm_head.weight"], expected["model"]["lm_head.weight"])


def test_torch_async_save_in_a_group_of_one_loads_back_the_state_at_the_save(trained, tmp_path):
    import torch.distributed.checkpoint as dcp

    c, train_step = trained
    position = DataPosition(0, 2)
    expected = _state_at(c, 1, position)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        live = {"model": c.model.state_dict(),
                "train": {"optimizer": c.optimizer.state_dict(), "scheduler": c.scheduler.state_dict(),
                          "scaler": c.scaler.state_dict(), "next_step": 2,
                          "data_position": {"epoch": position.epoch, "sample": position.sample}}}
        future = dcp.async_save(live, checkpoint_id=str(tmp_path / "dcp"))
        train_step()
        future.result()
        # DCP loads into a state dict of the same structure: nothing in it may come from the saved one
        loaded = tree_map(lambda v: torch.full_like(v, 7) if isinstance(v, torch.Tensor) else "not loaded", expected)
        dcp.load(loaded, checkpoint_id=str(tmp_path / "dcp"))
    finally:
        dist.destroy_process_group()
    assert _assert_identical(expected, loaded) > 20
