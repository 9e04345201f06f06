"""Torch models built from the framework-free configs in `labkit.core.models`.

The networks themselves are plain PyTorch in `labkit.torch.plain` (a file that runs without
labkit, which the recipes carry when copied out of it), re-exported here: CNN (no batch norm,
so DDP replicas carry no buffers), a ResNet (torchvision-equivalent ResNet-50 at
`ResNetConfig.resnet50()`), and a GPT-2-style decoder (nanoGPT layout, fused
scaled-dot-product attention). `activation_checkpointing=True` recomputes each block's
activations in the backward pass instead of storing them. This module adds what is labkit's:
`build_model` for a `labkit.core.models` config, and the fp8 output head (`GPT.fp8_head`,
`labkit.torch.fp8`). Training FLOPs per sample (for MFU) are framework-free:
`labkit.core.models.flops_per_sample`.
"""

from __future__ import annotations

from torch import nn

from labkit.core.models import CNNConfig, GPTConfig, ModelConfig, ResNetConfig
from labkit.torch.fp8 import head_cross_entropy
from labkit.torch.plain import (
    CNN,
    GPT,
    BasicBlock,
    Block,
    Bottleneck,
    CausalSelfAttention,
    ResNet,
)

__all__ = ["CNN", "GPT", "BasicBlock", "Block", "Bottleneck", "CausalSelfAttention", "ResNet",
           "build_model", "count_parameters"]

# `model.fp8_head = True` (TrainConfig.fp8_head): the output projection and the loss in one fp8
# function. plain.py cannot import labkit's fp8 kernels, so labkit hands them to the class here.
GPT.fused_head_loss = staticmethod(head_cross_entropy)


def build_model(cfg: ModelConfig, *, activation_checkpointing: bool = False) -> nn.Module:
    """The torch twin of a `labkit.core.models` config."""
    if isinstance(cfg, CNNConfig):
        return CNN(cfg, activation_checkpointing)
    if isinstance(cfg, ResNetConfig):
        return ResNet(cfg, activation_checkpointing)
    if isinstance(cfg, GPTConfig):
        return GPT(cfg, activation_checkpointing)
    raise TypeError(f"no torch model for config type {type(cfg).__name__}")


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
