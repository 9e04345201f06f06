"""The networks labkit trains, and its synthetic samples as a PyTorch Dataset: plain PyTorch, a
file that runs without labkit.

- `CNN`: `depth` blocks of (3×3 conv, ReLU, 2×2 max-pool), the channels starting at `width` and
  doubling each block, global average pooling, one linear layer. No batch norm, so DDP replicas
  carry no buffers.
- `ResNet`: stem, four stages of residual blocks (`bottleneck`: 1×1-3×3-1×1 with expansion 4),
  batch norm; torchvision's ResNet-50 at width 64, layers (3, 4, 6, 3), ImageNet stem.
- `GPT`: a GPT-2-style decoder (nanoGPT layout): pre-norm blocks, causal self-attention through
  `F.scaled_dot_product_attention`, GELU MLP of 4× width, tied token-embedding and output weights.

A config is any object with the fields a network reads (`cfg.width`, `cfg.n_layer`, ...):
labkit passes its checked dataclasses (`labkit.core.models`), a copied recipe a plain namespace.
`activation_checkpointing=True` recomputes each block's activations in the backward pass instead
of storing them. `SampleDataset` turns the samples of `samples.py` (NumPy) into tensors, one per
index, for `DataLoader(..., sampler=DistributedSampler(...))`.

labkit's engine builds these very classes (`labkit.torch.models`, `labkit.torch.data` re-export
them), so a recipe that imports this file trains what `labkit train` trains.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset


def _maybe_checkpoint(block: nn.Module, x: torch.Tensor, enabled: bool) -> torch.Tensor:
    if enabled and torch.is_grad_enabled():
        return checkpoint(block, x, use_reentrant=False)
    return block(x)


class CNN(nn.Module):
    def __init__(self, cfg, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        blocks, c_in = [], cfg.channels
        for i in range(cfg.depth):
            c_out = cfg.width * 2**i
            blocks.append(nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)))
            c_in = c_out
        self.blocks = nn.ModuleList(blocks)
        self.head = nn.Linear(c_in, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = _maybe_checkpoint(block, x, self.activation_checkpointing)
        return self.head(x.mean(dim=(2, 3)))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = _shortcut(c_in, c_out, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)  # stride on 3×3 (v1.5)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.shortcut = _shortcut(c_in, c_out, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


def _shortcut(c_in: int, c_out: int, stride: int) -> nn.Module:
    if stride == 1 and c_in == c_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))


class ResNet(nn.Module):
    def __init__(self, cfg, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        block = Bottleneck if cfg.bottleneck else BasicBlock
        w = cfg.width
        if cfg.imagenet_stem:
            self.stem = nn.Sequential(nn.Conv2d(cfg.channels, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        else:
            self.stem = nn.Sequential(nn.Conv2d(cfg.channels, w, 3, 1, 1, bias=False), nn.BatchNorm2d(w),
                                      nn.ReLU())
        blocks, c_in = [], w
        for stage, n in enumerate(cfg.layers):
            width = w * 2**stage
            for i in range(n):
                blocks.append(block(c_in, width, 2 if (i == 0 and stage > 0) else 1))
                c_in = width * block.expansion
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(c_in, cfg.num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = _maybe_checkpoint(b, x, self.activation_checkpointing)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x):
        b, t, _ = x.shape
        # Heads counted from the projection's width: under tensor parallelism a rank's qkv holds
        # only its own heads.
        q, k, v = self.qkv(x).view(b, t, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.out = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    # With `fp8_head` set and targets given, forward returns the loss of the output projection
    # computed by `fused_head_loss(hidden, weight, targets)` instead of the logits. labkit's
    # engine sets its fp8 function here (labkit.torch.models); plain PyTorch has none to set.
    fused_head_loss = None

    def __init__(self, cfg, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied embeddings (GPT-2)
        self.fp8_head = False
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "out.weight")):  # GPT-2 residual scaling
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets=None):
        """Logits; or, when `fp8_head` is set and `targets` given, the mean cross-entropy loss
        from `fused_head_loss`."""
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for b in self.blocks:
            x = _maybe_checkpoint(b, x, self.activation_checkpointing)
        x = self.ln_f(x)
        if targets is not None and self.fp8_head:
            if self.fused_head_loss is None:
                raise RuntimeError("fp8_head is set but no fused_head_loss function is")
            return self.fused_head_loss(x, self.lm_head.weight, targets)
        return self.lm_head(x)


class SampleDataset(Dataset):
    """`ds[i] -> (input, target)` tensors, one sample of `source` (`samples.SyntheticImages` or
    `samples.SyntheticTokens`): images as uint8 CHW with an int64 label, token sequences as
    (inputs, targets) int64 of `block_size`. Images stay uint8 until they reach the device (a
    quarter of float32's bytes to move); `to_float_images` scales them there."""

    def __init__(self, source):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = self.source[index]
        if isinstance(sample, tuple):  # an image and its label
            image, label = sample
            return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))), torch.tensor(label)
        seq = torch.from_numpy(sample)
        return seq[:-1], seq[1:]


def to_float_images(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels → float in [0, 1] (on whatever device `x` is); token ids pass unchanged."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x
