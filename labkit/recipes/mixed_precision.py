"""Mixed precision in PyTorch: the TF32 switches, autocast to bf16 or fp16, GradScaler for fp16.

    python -m labkit.recipes.mixed_precision --model gpt --precision bf16 --steps 20 --batch-size 32

fp32: everything in float32. tf32: float32 tensors, matmuls and convolutions on TF32 tensor cores
(10-bit mantissa; Ampere and newer GPUs). bf16: inside autocast, matmuls and convolutions run in
bfloat16 (float32's range, 8-bit mantissa); weights, optimizer state and the loss stay float32.
fp16: the same with float16, whose range ends at 65504 and whose small gradients underflow to
zero, so the loss is scaled up before backward (GradScaler).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

if __package__:  # inside labkit: python -m labkit.recipes.mixed_precision
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--precision", choices=["fp32", "tf32", "bf16", "fp16"], default="fp32")
    args = common.parse(p, argv)
    device = common.device(args.device)

    # TF32 switches are process-wide, and PyTorch's defaults disagree with each other (matmuls
    # off, cuDNN convolutions on): set both. Lower-precision modes keep TF32 for what autocast
    # leaves in float32.
    tf32 = args.precision != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    model = common.torch_model(args).to(device)
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
            logits = model(x)
            # The loss in float32: a softmax over many classes in 16 bits loses small probabilities.
            loss = F.cross_entropy(logits.flatten(0, -2).float(), y.flatten())
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
