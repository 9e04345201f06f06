"""Attention without the T×T matrix: `F.scaled_dot_product_attention` (SDPA) against the attention
written out by hand, in the same GPT, loss for loss.

    python -m labkit.recipes.attention --model gpt --steps 10 --batch-size 8 --attention sdpa --metrics-out m.json
    python -m labkit.recipes.attention --model gpt --steps 10 --batch-size 8 --attention manual
    python -m labkit.recipes.attention --model gpt --precision bf16 --backend flash --device cuda

Written out, causal attention is softmax(q kᵀ / √d + mask) v: it stores a (batch, heads, T, T)
score matrix per layer for the backward pass, memory that grows with the square of the sequence.
SDPA computes the same function with fused kernels that walk over k and v in tiles and keep
only a running maximum and sum per row, recomputing the tiles in backward: memory grows with T.
Its backends (`--backend`, `torch.nn.attention.sdpa_kernel`):

  flash      FlashAttention-2. CUDA: fp16 / bf16 only, GPUs of compute capability 8.0 and newer
             (A100, L4, H100, H200). CPU: PyTorch's fused CPU kernel (any float dtype).
  efficient  memory-efficient attention (xFormers' kernel). CUDA only: fp32, fp16 and bf16, older
             GPUs too (T4, V100).
  math       the written-out formula in C++, T×T matrix and all: any device, the reference.
  auto       SDPA picks the fastest that applies to these inputs (what labkit's model does).

Sources (read 2026-11-26): https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html
and https://docs.pytorch.org/docs/stable/generated/torch.nn.attention.sdpa_kernel.html; the
dtype and GPU conditions are those PyTorch checks before it picks a kernel (sdp_utils).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

if __package__:  # inside labkit: python -m labkit.recipes.attention
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}


def manual_attention(q, k, v):
    """Causal attention written out; q, k, v are (batch, heads, T, head_dim)."""
    t = q.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (batch, heads, T, T)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))  # position i sees positions 0..i only
    return torch.softmax(scores, dim=-1) @ v  # softmax's output is kept for backward: T×T again


def sdpa_attention(q, k, v):
    """The same function, fused: no T×T matrix is stored (what labkit's GPT calls)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """labkit's attention layer (its own qkv and proj layers, so the same weights) with the
    attention itself a function you pass in."""

    def __init__(self, labkit_attention: nn.Module, attend):
        super().__init__()
        self.qkv, self.proj = labkit_attention.qkv, labkit_attention.proj
        self.head_dim = labkit_attention.head_dim
        self.attend = attend

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, -1, self.head_dim).permute(2, 0, 3, 1, 4)
        y = self.attend(q, k, v)  # (batch, heads, T, head_dim)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


def kernel(backend: str):
    """Inside this block only the chosen SDPA kernel may run; "auto" leaves SDPA's own choice."""
    return contextlib.nullcontext() if backend == "auto" else sdpa_kernel(BACKENDS[backend])


def check_backend(p, args, device) -> None:
    """One line naming --backend when the chosen kernel cannot run these inputs here."""
    if args.backend == "auto":
        return
    if args.attention != "sdpa":
        p.error(f"--backend {args.backend}: picks an SDPA kernel, so it needs --attention sdpa")
    if device.type == "cpu" and args.backend == "efficient":
        p.error("--backend efficient: CUDA only (on the CPU: flash, math or auto)")
    if device.type == "cuda" and args.backend == "flash":
        if args.precision == "fp32":
            p.error("--backend flash: FlashAttention needs fp16 or bf16 on CUDA (add --precision bf16)")
        if torch.cuda.get_device_capability(device) < (8, 0):
            p.error("--backend flash: needs a GPU of compute capability 8.0 or newer (try efficient)")


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa")
    p.add_argument("--backend", choices=["auto", *BACKENDS], default="auto",
                   help="the SDPA kernel (with --attention sdpa)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = common.parse(p, argv)
    if args.model != "gpt":
        p.error(f"--model {args.model}: only gpt has attention")
    device = common.device(args.device)
    check_backend(p, args, device)
    torch.backends.cuda.matmul.allow_tf32 = args.precision != "fp32"  # as labkit train's bf16
    torch.backends.cudnn.allow_tf32 = args.precision != "fp32"
    dtype = torch.bfloat16 if args.precision == "bf16" else None

    model = common.torch_model(args)
    attend = {"sdpa": sdpa_attention, "manual": manual_attention}[args.attention]
    for block in model.blocks:  # swapped in place: parameter names and order stay labkit's
        block.attn = Attention(block.attn, attend)
    model = model.to(device)
    optimizer, scheduler = common.adamw(model, args)
    data = common.batches(common.torch_dataset(args), args.batch_size, args.seed)
    log = common.StepLog("attention", args, device=str(device), attention=args.attention,
                         backend=args.backend)

    for step in range(args.steps):
        x, y = common.to_device(next(data), device)
        lr = scheduler.get_last_lr()[0]
        with kernel(args.backend), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(x)
            loss = F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())
        loss.backward()  # each forward kernel recorded its own backward
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        log.log(step, loss.item(), lr=lr)

    log.write()
    return log


if __name__ == "__main__":
    main()
