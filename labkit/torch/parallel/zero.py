"""ZeRO stages 1 and 2 of the torch backend: the gradients and the optimizer state split over the
ranks, the weights whole on every rank.

- `Zero1` (`--parallel zero1`): DDP reduces the gradients (`labkit.torch.parallel.ddp.wrap`),
  torch's `ZeroRedundancyOptimizer` keeps the AdamW state of this rank's share of the parameters
  (whole tensors, greedily balanced) and broadcasts what it updated. The step is the engine's
  DDP step.
- `FlatZero2` (`--parallel zero2`, labkit's, ~60 lines): the parameters become views into one
  flat buffer per parameter group; after backward the flat gradient is reduce-scattered, each
  rank updates its 1/N of the weights with its 1/N of the optimizer state, then all-gathers the
  updated weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.core.parallelism import Layout
from labkit.torch.parallel.base import Strategy, clip_grad_norm


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
