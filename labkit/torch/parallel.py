"""The torch engine's parallel modes beyond DDP: one `Strategy` per mode.

`setup(config, layout, model, groups, device)` turns the freshly built model (same seed, same
weights on every rank) and its AdamW parameter groups into the mode's training state:

- `zero1`: DDP for the gradients, torch's `ZeroRedundancyOptimizer` for the optimizer: each rank
  keeps the AdamW state of its share of the parameters (whole tensors, greedily balanced) and
  broadcasts what it updated. The step is the engine's DDP step.
- `zero2`: `FlatZero2` (labkit's, ~60 lines): parameters replicated as views into one flat
  buffer per parameter group; after backward the flat gradient is reduce-scattered, so each
  rank keeps 1/N of the gradients and updates 1/N of the weights with 1/N of the optimizer
  state, then all-gathers the updated weights.
- `zero3`: FSDP2 `fully_shard` on every block and the root; `TrainConfig.reshard_after_forward`
  (`--[no-]reshard-after-forward`) chooses whether a block's gathered weights are freed after
  its forward (and gathered again for backward) or kept until backward.
- `tp`: Megatron-style tensor parallelism (`labkit.torch.tensor_parallel`) over `tp` ranks, the
  `dp` replicas of that group averaging their gradients with one all-reduce.
- `pp`: pipeline stages (`labkit.torch.pipeline_parallel`), GPipe or 1F1B, likewise replicated.
- `--sharding-backend deepspeed`: `labkit.torch.deepspeed_zero`.

The engine's step (`labkit.torch.engine.train_step`) runs every mode: each strategy supplies the
stages it does its own way (`gradient_sync`, `forward_backward` for the pipeline and DeepSpeed,
`reduce_gradients`, `clip`, `optimizer_step`). Every strategy reports what this rank holds (`held_bytes`: parameters, gradients at the
optimizer step, optimizer state, counted once per storage, DTensors by their local shard) and
saves its state sharded: each rank writes the parameters and optimizer state it holds
(`labkit.torch.state.save_sharded`), and a resumed run of the same layout loads its own.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from labkit.core.parallelism import Layout
from labkit.core.train_config import TrainConfig
from labkit.torch.pipeline_parallel import Pipeline
from labkit.torch.strategy import (
    Strategy,
    clip_grad_norm,
    held_bytes,
    local,
)
from labkit.torch.tensor_parallel import TensorParallel

__all__ = ["FlatZero2", "Pipeline", "Strategy", "TensorParallel", "Zero1", "Zero3", "held_bytes", "setup"]


# ---------------------------------------------------------------- ZeRO 1 (torch)


class Zero1(Strategy):
    """DDP + ZeroRedundancyOptimizer; the engine runs its usual DDP step (DDP reduces the
    gradients, the optimizer is sharded)."""

    name = "zero1"

    @staticmethod
    def optimizer_for(groups: list[dict[str, Any]], lr: float, foreach: bool):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        zero = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW, lr=lr,
                                       betas=(0.9, 0.95), weight_decay=groups[0]["weight_decay"],
                                       foreach=foreach)
        for group in groups[1:]:
            zero.add_param_group(group)
        return zero


# ---------------------------------------------------------------- ZeRO 2 (labkit's, flat buffers)


class FlatZero2(Strategy):
    """ZeRO stage 2 on flat buffers. Each AdamW parameter group's parameters become views into
    one flat buffer, padded to a multiple of N; rank r owns slice r. After backward the flat
    gradient is reduce-scattered (summed, divided by N: the mean over replicas), the full
    gradients are freed, AdamW updates the owned slice with the owned state, and the slices
    are all-gathered back into every rank's buffer."""

    name = "zero2"
    reduces_gradients = True

    def __init__(self, layout: Layout, rank: int, model: nn.Module, groups: list[dict[str, Any]],
                 lr: float, foreach: bool):
        super().__init__(layout, rank, model)
        n = layout.world
        self.flats: list[tuple[list[nn.Parameter], torch.Tensor, nn.Parameter]] = []
        shard_groups = []
        for group in groups:
            params = list({id(p): p for p in group["params"]}.values())
            total = sum(p.numel() for p in params)
            size = -(-total // n)
            flat = torch.zeros(size * n, dtype=params[0].dtype, device=params[0].device)
            offset = 0
            for p in params:
                flat[offset:offset + p.numel()].copy_(p.detach().reshape(-1))
                p.data = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            shard = nn.Parameter(flat[rank * size:(rank + 1) * size])  # a view: updates land in flat
            self.flats.append((params, flat, shard))
            shard_groups.append({"params": [shard], "weight_decay": group["weight_decay"]})
        self.optimizer = torch.optim.AdamW(shard_groups, lr=lr, betas=(0.9, 0.95), foreach=foreach)

    def reduce_gradients(self) -> None:
        """Reduce-scatter each flat gradient: this rank keeps the mean of its slice only."""
        world = self.layout.world
        for params, flat, shard in self.flats:
            grads = [p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1)
                     for p in params]
            pad = flat.numel() - sum(g.numel() for g in grads)
            full = torch.cat(grads + [flat.new_zeros(pad)])
            for p in params:
                p.grad = None  # the full gradients go; only this rank's slice stays
            mine = flat.new_empty(shard.numel())
            dist.reduce_scatter_tensor(mine, full, op=dist.ReduceOp.SUM)
            shard.grad = mine.div_(world)

    def clip(self, max_norm: float) -> None:
        clip_grad_norm([(s.grad, dist.group.WORLD) for _, _, s in self.flats], max_norm)

    def optimizer_step(self) -> None:
        """Update this rank's slice, then all-gather the updated slices into every buffer."""
        self.optimizer.step()
        for _, flat, shard in self.flats:
            dist.all_gather_into_tensor(flat, shard.detach().clone())


# ---------------------------------------------------------------- ZeRO 3 (FSDP2)


class Zero3(Strategy):
    """FSDP2: every block, then the root, sharded over all ranks."""

    name = "zero3"
    reduces_gradients = True

    def __init__(self, layout: Layout, rank: int, model: nn.Module, reshard_after_forward: bool):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The mesh's device type is the model's: without one, fully_shard assumes CUDA whenever
        # the machine has a GPU, and a CPU rank r asks for GPU r ("invalid device ordinal").
        device = next(model.parameters()).device
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in getattr(model, "blocks", []):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
        super().__init__(layout, rank, model)

    def gradient_sync(self, last: bool):
        # FSDP reduce-scatters the gradients in backward: once per step, on the last micro-batch
        self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def clip(self, max_norm: float) -> None:
        clip_grad_norm([(local(p.grad), dist.group.WORLD) for p in self.model.parameters()
                        if p.grad is not None], max_norm)


def setup(config: TrainConfig, layout: Layout, rank: int, model: nn.Module,
          groups: list[dict[str, Any]], lr: float, device: torch.device) -> Strategy:
    """The strategy of `config.parallel` (not ddp) for `model`, with its optimizer. For zero1
    the caller wraps the model in DDP and uses `Zero1.optimizer_for`."""
    foreach = device.type != "cuda" or None
    mode = layout.mode
    if mode == "zero2":
        return FlatZero2(layout, rank, model, groups, lr, foreach)
    if mode == "zero3":
        s = Zero3(layout, rank, model, config.reshard_after_forward)
    elif mode == "tp":
        s = TensorParallel(layout, rank, model, device)
    elif mode == "pp":
        s = Pipeline(layout, rank, model, device, config.pp_schedule)
        groups = s.param_groups()
    else:
        raise ValueError(f"parallel: no strategy for {mode!r}")
    s.optimizer = torch.optim.AdamW(_regroup(groups, s.model), lr=lr, betas=(0.9, 0.95), foreach=foreach)
    return s


def _regroup(groups: list[dict[str, Any]], model: nn.Module) -> list[dict[str, Any]]:
    """The decay / no-decay groups over `model`'s parameters as they are now (FSDP2 and DTensor
    replace the parameter objects): matrices and embeddings decay, vectors do not. DTensor and
    plain parameters go to separate groups: AdamW's multi-tensor kernels take one kind at a time."""
    decay = [g["weight_decay"] for g in groups]
    out = []
    for is_dtensor in (True, False):
        params = [p for p in model.parameters() if isinstance(p, DTensor) == is_dtensor]
        for matrices, wd in ((True, decay[0]), (False, decay[-1])):
            chosen = [p for p in params if (p.dim() >= 2) == matrices]
            if chosen:
                out.append({"params": chosen, "weight_decay": wd})
    return out
