"""Megatron-style tensor parallelism (`--parallel tp`) of labkit's GPT through DTensor
`parallelize_module`.

In each block, attention's `qkv` and the MLP's `fc` are column-parallel (each of the t ranks
computes a slice of the output features: its heads, its quarter of the hidden units) and
attention's `proj` and the MLP's `out` are row-parallel (each rank multiplies its slice, and one
all-reduce sums the partial outputs). So a block costs two all-reduces of (batch, seq, d) in the
forward pass and two in the backward pass, and holds 1/t of its matrices. Embeddings, norms and
the output head stay replicated: every rank of the group computes them on the same batch.

`qkv` packs [q | k | v], each [head 0 | head 1 | ...]. Column sharding takes contiguous rows, so
its rows are first reordered to [q, k, v of group 0 | q, k, v of group 1 | ...] (`head_grouped`):
rank g then holds whole heads. The model's attention counts its heads from the width it gets.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.core.parallelism import Layout
from labkit.torch.parallel.base import (
    Strategy,
    all_reduce_mean,
    clip_grad_norm,
    local,
)


def head_grouped(n_embd: int, n_head: int, groups: int) -> torch.Tensor:
    """Row order of a packed qkv weight that puts each group's q, k and v heads together."""
    hd = n_embd // n_head
    per = n_head // groups
    order = []
    for g in range(groups):
        for part in range(3):
            for h in range(g * per, (g + 1) * per):
                start = part * n_embd + h * hd
                order.extend(range(start, start + hd))
    return torch.tensor(order)


def parallelize_gpt(model: nn.Module, mesh) -> None:
    """Shard every block of `model` over the 1-D device mesh `mesh` (in place)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    t = mesh.size()
    for block in model.blocks:
        attn = block.attn
        order = head_grouped(attn.qkv.in_features, attn.n_head, t)
        with torch.no_grad():
            attn.qkv.weight.copy_(attn.qkv.weight[order])
            if attn.qkv.bias is not None:
                attn.qkv.bias.copy_(attn.qkv.bias[order])
        parallelize_module(block, mesh, {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                                         "fc": ColwiseParallel(), "out": RowwiseParallel()})


class TensorParallel(Strategy):
    """tp ranks share one model (consecutive ranks), dp such groups are replicas."""

    name = "tp"
    reduces_gradients = True

    def __init__(self, layout: Layout, rank: int, model: nn.Module, device: torch.device):
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(device.type, (layout.dp, layout.tp), mesh_dim_names=("dp", "tp"))
        parallelize_gpt(model, self.mesh["tp"])
        super().__init__(layout, rank, model)

    def reduce_gradients(self) -> None:
        """Average the gradients over the dp replicas of this tp group (one flat all-reduce)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        all_reduce_mean([local(p.grad) for p in params], self.mesh["dp"].get_group(), self.layout.dp)

    def clip(self, max_norm: float) -> None:
        tp_group = self.mesh["tp"].get_group()
        clip_grad_norm([(local(p.grad), tp_group if hasattr(p, "placements") and
                         any(pl.is_shard() for pl in p.placements) else None)
                        for p in self.model.parameters() if p.grad is not None], max_norm)
