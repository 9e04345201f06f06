"""Framework-free model configurations.

`labkit.torch` and `labkit.tf` each build their model from the same config object, which is what
makes them twins: same layers, same shapes, same parameter count (a test checks the count).
`build_config(name, scale)` gives the sizes the notebooks and `labkit train` use, and
`flops_per_sample(config)` the training FLOPs both engines report MFU with.
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


# ---------------------------------------------------------------- training FLOPs (for MFU)


def flops_per_sample(cfg: ModelConfig) -> float:
    """Training FLOPs (forward + backward ≈ 3× forward) per sample: per token × block for GPT
    (6·N plus attention, the PaLM formula), per image for the conv nets (2 FLOPs per
    multiply-accumulate of the convolutions and linear layers)."""
    if isinstance(cfg, GPTConfig):
        return gpt_flops_per_token(cfg) * cfg.block_size
    return 3.0 * 2.0 * forward_macs(cfg)


def gpt_params(cfg: GPTConfig, include_position: bool = False) -> int:
    """Parameters of the GPT of `cfg`: tied token embedding and output head counted once, biases
    when `cfg.bias`, position embeddings only when asked (they are a lookup, not a matmul)."""
    d = cfg.n_embd
    per_block = 12 * d * d + (13 * d if cfg.bias else 2 * d)  # attention 4d², MLP 8d², norms
    n = cfg.n_layer * per_block + cfg.vocab_size * d + (2 * d if cfg.bias else d)
    return n + (cfg.block_size * d if include_position else 0)


def gpt_flops_per_token(cfg: GPTConfig) -> float:
    """Training FLOPs per token: 6·N + 12·n_layer·n_embd·block_size (N without position
    embeddings). GPT-2 small gives 0.8548 GFLOP, the figure the performance targets use."""
    return 6.0 * gpt_params(cfg) + 12.0 * cfg.n_layer * cfg.n_embd * cfg.block_size


def forward_macs(cfg: CNNConfig | ResNetConfig) -> float:
    """Multiply-accumulates of one forward pass of one image through the convolutions and linear
    layers (what the torch and Keras twins compute; pooling and norms are not counted)."""
    if isinstance(cfg, CNNConfig):
        return _cnn_macs(cfg)
    if isinstance(cfg, ResNetConfig):
        return _resnet_macs(cfg)
    raise TypeError(f"no convolutional model for config type {type(cfg).__name__}")


def _conv(size: int, c_in: int, c_out: int, kernel: int, stride: int = 1) -> tuple[int, int]:
    """(output size, MACs) of a square convolution padded by kernel // 2, as both twins pad."""
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1
    return out, out * out * c_out * c_in * kernel * kernel


def _cnn_macs(cfg: CNNConfig) -> float:
    macs, size, c_in = 0, cfg.image_size, cfg.channels
    for i in range(cfg.depth):
        c_out = cfg.width * 2**i
        _, m = _conv(size, c_in, c_out, 3)
        macs, size, c_in = macs + m, size // 2, c_out  # then a 2×2 max-pool
    return float(macs + c_in * cfg.num_classes)


def _resnet_macs(cfg: ResNetConfig) -> float:
    if cfg.imagenet_stem:
        size, macs = _conv(cfg.image_size, cfg.channels, cfg.width, 7, 2)
        size = (size - 1) // 2 + 1  # 3×3/2 max-pool, padded by 1
    else:
        size, macs = _conv(cfg.image_size, cfg.channels, cfg.width, 3)
    expansion = 4 if cfg.bottleneck else 1
    c_in = cfg.width
    for stage, blocks in enumerate(cfg.layers):
        width = cfg.width * 2**stage
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            c_out = width * expansion
            if cfg.bottleneck:  # 1×1, 3×3 (strided), 1×1
                _, m1 = _conv(size, c_in, width, 1)
                out, m2 = _conv(size, width, width, 3, stride)
                _, m3 = _conv(out, width, c_out, 1)
                m = m1 + m2 + m3
            else:  # 3×3 (strided), 3×3
                out, m1 = _conv(size, c_in, width, 3, stride)
                _, m2 = _conv(out, width, c_out, 3)
                m = m1 + m2
            if stride != 1 or c_in != c_out:  # 1×1 projection shortcut
                m += _conv(size, c_in, c_out, 1, stride)[1]
            macs, size, c_in = macs + m, out, c_out
    return float(macs + c_in * cfg.num_classes)
