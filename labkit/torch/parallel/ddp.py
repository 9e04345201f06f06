"""Data parallelism (`--parallel ddp`, and the gradient side of `zero1`): every rank holds the
whole model; during backward DDP all-reduces the gradients (their mean over the ranks) bucket
by bucket, overlapping the rest of backward, so every replica applies the same update.

`wrap(model, device, config)` is the engine's DDP wrap: `gradient_as_bucket_view=True` (the
gradients are views into DDP's all-reduce buckets, so they take no second copy; torch's
DistributedDataParallel docstring, rendered at
https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html,
read 2026-11-29: "gradients will be views pointing to different offsets of allreduce
communication buckets. This can reduce peak memory usage"), and with `config.grad_compression`
its communication hook (`labkit.torch.compression`: fp16, bf16 or PowerSGD buckets).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.core.train_config import TrainConfig
from labkit.torch import compression


def wrap(model: nn.Module, device: torch.device, config: TrainConfig) -> tuple[DDP, Any]:
    """`model` under DDP on `device` (gloo on the CPU, nccl on CUDA: the process group's) and the
    compression hook's state (PowerSGD's error feedback, checkpointed per rank; None without)."""
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                    gradient_as_bucket_view=True)
    comm_state = None
    if config.grad_compression != "none":  # the compression hook reduces the gradients
        names = {id(p): name for name, p in model.named_parameters()}
        hook, comm_state = compression.hook(config.grad_compression, config.powersgd_rank, device.type, names)
        ddp_model.register_comm_hook(comm_state, hook)
    return ddp_model, comm_state
