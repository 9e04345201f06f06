"""fp8 matmuls for `nn.Linear` layers: tensor-wise dynamic scaling through `torch._scaled_mm`.

Activations and weights are cast to float8 e4m3 (more mantissa) and gradients to e5m2 (more
range), each tensor scaled so its largest magnitude lands on the format's maximum; the product is
accumulated in fp32 by the tensor cores and returned in the input's compute dtype (bf16 under
autocast). The weight stays an fp32 parameter, so the optimizer and checkpoints do not change.
Only the matmuls run in fp8: layer norms, attention, the loss and the optimizer keep their
precision. fp8 tensor cores need compute capability 8.9+ (Ada, Hopper); `_scaled_mm` needs every
matmul dimension to be a multiple of 16, which `convert_linears` checks before switching a layer.

`convert_linears(model, "lm_head")` switches only the output projection (the largest matmul of a
small GPT, 50304 wide); `"all"` switches every eligible Linear. `head_cross_entropy` goes further
for the output projection: projection and loss in one function, so the gradient of the logits is
cast to fp8 without measuring its range first (it is bounded; see `_Float8HeadCrossEntropy`).
This is what `TrainConfig.fp8_head` uses.
"""

from __future__ import annotations

import torch
from torch import nn

FORWARD_DTYPE = torch.float8_e4m3fn
GRADIENT_DTYPE = torch.float8_e5m2
SCOPES = ("lm_head", "all")


def supported(device: torch.device) -> bool:
    """fp8 tensor cores: CUDA compute capability 8.9 or newer. (CPU `_scaled_mm` exists but is
    emulated; it is used by the tests, not for speed.)"""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def to_fp8(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` cast to `dtype` with one scale for the whole tensor; returns (fp8 tensor, the fp32
    inverse scale that `_scaled_mm` multiplies back in)."""
    fmax = torch.finfo(dtype).max
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = fmax / amax
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


def _mm(a: torch.Tensor, a_inv: torch.Tensor, b_t: torch.Tensor, b_inv: torch.Tensor,
        out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b_t.T with a [M, K] row-major and b_t [N, K] row-major (the layout cuBLASLt's fp8 path
    wants: both operands contiguous along K)."""
    return torch._scaled_mm(a, b_t.t(), scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the surrounding code computes in: autocast's (bf16) when it is on, else x's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def _forward(x2: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype):
    """x2 [M, K] @ weight.T in fp8; returns the product and the fp8 operands with their inverse
    scales, kept for the backward pass (fp8 copies: a quarter of fp32's memory)."""
    x8, x_inv = to_fp8(x2, FORWARD_DTYPE)
    w8, w_inv = to_fp8(weight, FORWARD_DTYPE)
    return _mm(x8, x_inv, w8, w_inv, out_dtype), (x8, x_inv, w8, w_inv)


def _backward(g8: torch.Tensor, g_inv: torch.Tensor, saved, dx_dtype: torch.dtype):
    """Input and weight gradients from the fp8 output gradient g8 [M, N] and `_forward`'s
    operands: dx [M, K] = g @ w, dw [N, K] = g.T @ x (fp32, the parameter's dtype)."""
    x8, x_inv, w8, w_inv = saved
    # Each product wants both operands contiguous along its reduction dimension: N for dx, the
    # token dimension M for dw; hence the transposed copies.
    dx = _mm(g8, g_inv, w8.t().contiguous(), w_inv, dx_dtype)
    dw = _mm(g8.t().contiguous(), g_inv, x8.t().contiguous(), x_inv, torch.float32)
    return dx, dw


class _Float8Matmul(torch.autograd.Function):
    """y = x @ w.T in fp8; backward: dx = dy @ w, dw = dy.T @ x, also in fp8."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        y, saved = _forward(x.reshape(-1, x.shape[-1]), weight, out_dtype)
        ctx.save_for_backward(*saved)
        ctx.shapes = (x.shape, x.dtype, weight.dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x_shape, x_dtype, w_dtype = ctx.shapes
        g8, g_inv = to_fp8(grad_out.reshape(-1, grad_out.shape[-1]), GRADIENT_DTYPE)
        dx, dw = _backward(g8, g_inv, ctx.saved_tensors, grad_out.dtype)
        return dx.reshape(x_shape).to(x_dtype), dw.to(w_dtype), None


class Float8Linear(nn.Linear):
    """An `nn.Linear` whose matmul runs in fp8 (bias added in the compute dtype)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_dtype = _compute_dtype(x)
        with torch.autocast(x.device.type, enabled=False):
            y = _Float8Matmul.apply(x, self.weight, out_dtype)
            if self.bias is not None:
                y = y + self.bias.to(out_dtype)
        return y


def eligible(layer: nn.Linear) -> bool:
    """`_scaled_mm` needs both weight dimensions to be multiples of 16 (the token count is checked
    when the matmul runs)."""
    return layer.in_features % 16 == 0 and layer.out_features % 16 == 0


def convert_linears(model: nn.Module, scope: str = "all") -> list[str]:
    """Switch `model`'s Linear layers to `Float8Linear` in place (parameters, and so weight tying
    and optimizer state, are kept); returns the names switched. `scope`: "lm_head" or "all"."""
    if scope not in SCOPES:
        raise ValueError(f"fp8 scope must be one of {SCOPES}, got {scope!r}")
    switched = []
    for name, module in model.named_modules():
        if type(module) is not nn.Linear or not eligible(module):
            continue
        if scope == "lm_head" and not name.endswith("lm_head"):
            continue
        module.__class__ = Float8Linear
        switched.append(name)
    return switched


class _Float8HeadCrossEntropy(torch.autograd.Function):
    """mean cross-entropy(x @ w.T, targets), its three matmuls in fp8.

    The output gradient needs no amax pass: d loss / d logits = (softmax − onehot) · g / n, and
    |softmax − onehot| ≤ 1, so (softmax − onehot) times e5m2's maximum always fits the format and
    g / n goes into the inverse scale. Cast, scale and softmax then fuse into one kernel under
    torch.compile instead of costing three extra passes over the (tokens × vocabulary) tensor."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                out_dtype: torch.dtype) -> torch.Tensor:
        t = targets.reshape(-1)
        logits, saved = _forward(x.reshape(-1, x.shape[-1]), weight, out_dtype)
        lse = torch.logsumexp(logits.float(), dim=-1)
        loss = (lse - logits.gather(1, t[:, None]).squeeze(1).float()).mean()
        ctx.save_for_backward(*saved, logits, lse, t)
        ctx.shapes = (x.shape, x.dtype, weight.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        *saved, logits, lse, t = ctx.saved_tensors
        x_shape, x_dtype, w_dtype = ctx.shapes
        n, vocab = logits.shape
        fmax = torch.finfo(GRADIENT_DTYPE).max
        onehot = torch.arange(vocab, device=logits.device)[None, :] == t[:, None]
        unit = torch.exp(logits.float() - lse[:, None]) - onehot.float()  # in [-1, 1]
        g8 = (unit * fmax).to(GRADIENT_DTYPE)
        g_inv = (grad_loss.float() / (n * fmax)).reshape(())
        dx, dw = _backward(g8, g_inv, saved, logits.dtype)
        return dx.reshape(x_shape).to(x_dtype), dw.to(w_dtype), None, None


def head_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the logits `x @ weight.T` against `targets`, computed with fp8
    matmuls (forward, input gradient and weight gradient); logits in the autocast dtype (bf16)
    or x's dtype. x: [..., K], weight: [V, K], targets: [...] (token count and K, V multiples
    of 16)."""
    out_dtype = _compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        return _Float8HeadCrossEntropy.apply(x, weight, targets, out_dtype)
