"""Mixed precision in PyTorch: the TF32 switches, autocast to bf16 or fp16, GradScaler for fp16,
fp8 matmuls in the Linear layers.

    python -m labkit.recipes.mixed_precision --model gpt --precision bf16 --steps 20 --batch-size 32

fp32: everything in float32. tf32: float32 tensors, matmuls and convolutions on TF32 tensor cores
(10-bit mantissa; Ampere and newer GPUs). bf16: inside autocast, matmuls and convolutions run in
bfloat16 (float32's range, 8-bit mantissa); weights, optimizer state and the loss stay float32.
fp16: the same with float16, whose range ends at 65504 and whose small gradients underflow to
zero, so the loss is scaled up before backward (GradScaler). fp8: bf16 autocast, and every
Linear layer's matmul in 8-bit floats on fp8 tensor cores (compute capability 8.9+: L4, H100,
H200; see `Fp8Linear`); only the GPT has Linear layers whose sizes fp8 takes.

`--mistake softmax` trains with a common mistake instead of the right loss: probabilities fed to
`F.cross_entropy`, which applies log-softmax itself (see `cross_entropy`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

if __package__:  # inside labkit: python -m labkit.recipes.mixed_precision
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common

# ---------------------------------------------------------------- fp8 (--precision fp8)
# Each tensor gets one scale that puts its largest magnitude on the format's maximum: activations
# and weights in e4m3 (3 mantissa bits), gradients in e5m2 (2 bits, more range). torch._scaled_mm
# multiplies two such tensors on fp8 tensor cores, multiplies the scales back in and accumulates in
# float32; it wants both operands contiguous along the summed dimension, and every size a multiple
# of 16. Weights stay float32 parameters: the optimizer and checkpoints do not change. (A CPU runs
# _scaled_mm emulated: the same numbers, none of the speed.)
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def to_fp8(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`t` scaled so its largest magnitude is `dtype`'s maximum and cast; and the inverse scale."""
    fmax = torch.finfo(dtype).max
    scale = fmax / t.detach().abs().amax().float().clamp(min=1e-12)
    return (t.float() * scale).clamp(-fmax, fmax).to(dtype), scale.reciprocal()


def fp8_mm(a, a_inv, b_t, b_inv, out_dtype: torch.dtype) -> torch.Tensor:
    """a @ b_t.T for a [M, K] and b_t [N, K], both contiguous along K."""
    return torch._scaled_mm(a, b_t.t(), scale_a=a_inv, scale_b=b_inv, out_dtype=out_dtype)


class Fp8Matmul(torch.autograd.Function):
    """y = x @ w.T in fp8; backward: dx = dy @ w and dw = dy.T @ x, also in fp8."""

    @staticmethod
    def forward(ctx, x, w, out_dtype):
        x8, x_inv = to_fp8(x.reshape(-1, x.shape[-1]), E4M3)
        w8, w_inv = to_fp8(w, E4M3)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)  # fp8 copies: a quarter of float32's memory
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return fp8_mm(x8, x_inv, w8, w_inv, out_dtype).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x8, x_inv, w8, w_inv = ctx.saved_tensors
        g8, g_inv = to_fp8(dy.reshape(-1, dy.shape[-1]), E5M2)
        dx = fp8_mm(g8, g_inv, w8.t().contiguous(), w_inv, dy.dtype)
        dw = fp8_mm(g8.t().contiguous(), g_inv, x8.t().contiguous(), x_inv, torch.float32)
        return dx.reshape(ctx.x_shape).to(ctx.x_dtype), dw, None


class Fp8Linear(torch.nn.Linear):
    """nn.Linear with its matmul in fp8, its output (and bias) in autocast's dtype (bf16)."""

    def forward(self, x):
        on = x.device.type
        out_dtype = torch.get_autocast_dtype(on) if torch.is_autocast_enabled(on) else x.dtype
        with torch.autocast(on, enabled=False):
            y = Fp8Matmul.apply(x, self.weight, out_dtype)
            return y if self.bias is None else y + self.bias.to(out_dtype)


def fp8_linears(model: torch.nn.Module) -> int:
    """Switch, in place, every nn.Linear whose sizes are multiples of 16 to Fp8Linear (the same
    parameters, so a tied weight stays tied); returns how many."""
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear
               and m.in_features % 16 == 0 and m.out_features % 16 == 0]
    for m in linears:
        m.__class__ = Fp8Linear
    return len(linears)


def fp8_problem(args, device: torch.device) -> str | None:
    """Why `--precision fp8` cannot run here, in `labkit train`'s words; None when it can."""
    if args.model != "gpt":
        return (f"parameter 'precision' applies to model 'gpt' only (in model {args.model!r} it would "
                f"change nothing) (got 'fp8')")
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        return (f"parameter 'precision' needs fp8 tensor cores (compute capability 8.9+: L4, H100, "
                f"H200); {torch.cuda.get_device_name(device)} is {major}.{minor} (got 'fp8')")
    return None


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, mistake: str | None = None) -> torch.Tensor:
    """The loss of the model's raw scores: F.cross_entropy applies log-softmax itself.
    `mistake="softmax"` runs the common mistake instead, so it can be measured beside the fix."""
    if mistake == "softmax":
        return F.cross_entropy(F.softmax(logits, -1), y)
    return F.cross_entropy(logits, y)


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16", "fp8"], default="fp32")
    p.add_argument("--mistake", choices=["softmax"], default=None,
                   help="softmax: train with probabilities fed to cross_entropy (the mistake)")
    args = common.parse(p, argv)
    device = common.device(args.device)
    if args.precision == "fp8" and (problem := fp8_problem(args, device)):
        p.error(problem)

    # TF32 switches are process-wide, and PyTorch's defaults disagree with each other (matmuls
    # off, cuDNN convolutions on): set both. Lower-precision modes keep TF32 for what autocast
    # leaves in float32.
    tf32 = args.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}.get(args.precision)

    model = common.torch_model(args).to(device)
    if args.precision == "fp8":
        fp8_linears(model)  # on its device, before the optimizer takes its parameters
    optimizer, scheduler = common.adamw(model, args)
    # fp16 only: multiply the loss by a large factor (2**16 to start) so small gradients survive
    # float16; gradients are divided back before the update, and a step whose gradients
    # overflowed is skipped while the factor halves. A disabled scaler passes everything through.
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    data = common.batches(common.torch_dataset(args), args.batch_size, args.seed)
    log = common.StepLog("mixed_precision", args, device=str(device))

    for step in range(args.steps):
        x, y = common.to_device(next(data), device)
        lr = scheduler.get_last_lr()[0]
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            # The loss in float32: a softmax over many classes in 16 bits loses small probabilities.
            loss = cross_entropy(model(x).flatten(0, -2).float(), y.flatten(), args.mistake)
        scaler.scale(loss).backward()
        if args.grad_clip:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        scale = scaler.get_scale() if scaler.is_enabled() else None
        scaler.step(optimizer)  # skipped when fp16 gradients overflowed
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        skipped = scale is not None and scaler.get_scale() < scale
        log.log(step, loss.item(), lr=lr, skipped=skipped)

    log.write()
    return log


if __name__ == "__main__":
    main()
