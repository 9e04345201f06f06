"""ZeRO stage 3 of the torch backend (`--parallel zero3`): FSDP2's `fully_shard` on every block
and then the root, so each rank holds 1/N of the weights, gradients and optimizer state; a
block's weights are all-gathered for its forward and its gradients reduce-scattered in backward.
`TrainConfig.reshard_after_forward` (`--[no-]reshard-after-forward`) chooses whether a block's
gathered weights are freed after its forward (and gathered again for backward) or kept until
backward.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch import nn

from labkit.core.parallelism import Layout
from labkit.torch.parallel.base import Strategy, clip_grad_norm, local


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
