"""Framework-free model configurations.

`labkit.torch` and `labkit.tf` each build their model from the same config object, which is what
makes them twins: same layers, same shapes, same parameter count (a test checks the count).
`build_config(name, scale)` gives the sizes the notebooks and `labkit train` use.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.config import ParameterError, Scale, check_choice, check_float, check_int

MODEL_NAMES = ("cnn", "resnet", "gpt")


@dataclass(frozen=True)
class CNNConfig:
    """A small image classifier: `depth` blocks of (3×3 conv, ReLU, 2×2 max-pool), the channel
    count starting at `width` and doubling each block, then global average pooling and one linear
    layer to `num_classes` logits. No batch norm, so DDP and TF replicas carry no buffers."""

    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    width: int = 32
    depth: int = 2

    def __post_init__(self) -> None:
        check_int("image_size", self.image_size, minimum=2 ** self.depth)
        check_int("channels", self.channels, minimum=1)
        check_int("num_classes", self.num_classes, minimum=2)
        check_int("width", self.width, minimum=1)
        check_int("depth", self.depth, minimum=1, maximum=6)


@dataclass(frozen=True)
class ResNetConfig:
    """A ResNet (He et al. 2016) with batch norm: stem conv, four stages of residual blocks
    (`layers` blocks each, `bottleneck` selects 1×1-3×3-1×1 blocks with expansion 4), global
    average pooling, linear head. `ResNetConfig.resnet50()` matches torchvision's ResNet-50
    (25.6M parameters); the default is a small CIFAR-sized variant for CPU runs."""

    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    width: int = 16
    layers: tuple[int, int, int, int] = (1, 1, 1, 1)
    bottleneck: bool = False
    # Small images skip the 7×7/2 stem conv and the max-pool, as CIFAR ResNets do.
    imagenet_stem: bool = False

    def __post_init__(self) -> None:
        check_int("image_size", self.image_size, minimum=8)
        check_int("num_classes", self.num_classes, minimum=2)
        check_int("width", self.width, minimum=1)
        if len(self.layers) != 4 or any(n < 1 for n in self.layers):
            raise ParameterError("layers", self.layers, "must be four positive block counts")

    @classmethod
    def resnet50(cls, num_classes: int = 1000) -> ResNetConfig:
        return cls(image_size=224, num_classes=num_classes, width=64, layers=(3, 4, 6, 3),
                   bottleneck=True, imagenet_stem=True)


@dataclass(frozen=True)
class GPTConfig:
    """A GPT-2-style decoder (pre-norm, causal self-attention, GELU MLP of 4× width, tied
    token-embedding and output weights). `GPTConfig.gpt2_small()` is the 124M model of the
    performance targets (vocab padded to 50304, block 1024, no biases, no dropout)."""

    vocab_size: int = 512
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = False

    def __post_init__(self) -> None:
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("block_size", self.block_size, minimum=2)
        check_int("n_layer", self.n_layer, minimum=1)
        check_int("n_head", self.n_head, minimum=1)
        check_int("n_embd", self.n_embd, minimum=1)
        check_float("dropout", self.dropout, minimum=0.0, maximum=1.0)
        if self.n_embd % self.n_head:
            raise ParameterError("n_embd", self.n_embd, f"must be divisible by n_head={self.n_head}")

    @classmethod
    def gpt2_small(cls) -> GPTConfig:
        return cls(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)


ModelConfig = CNNConfig | ResNetConfig | GPTConfig


def build_config(name: str, scale: Scale = "smoke") -> ModelConfig:
    """The config `labkit train --model NAME` uses at a scale ('smoke' on CPU, 'full' on GPU)."""
    check_choice("model", name, MODEL_NAMES)
    full = scale == "full"
    if name == "cnn":
        return CNNConfig(width=64, depth=3) if full else CNNConfig()
    if name == "resnet":
        return ResNetConfig.resnet50() if full else ResNetConfig()
    return GPTConfig.gpt2_small() if full else GPTConfig()
