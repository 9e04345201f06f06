"""`labkit estimate`: memory, FLOPs, the GPUs it fits and an epoch's time and cost, for your own
PyTorch model, counted on fake tensors (no memory: a 70B model in seconds).

    labkit estimate mymodels:build_cnn --input-shape 3,224,224 --batch-size 64
    labkit estimate mymodels:gpt --input-shape 1024 --batch-size 8 --gpus 8 --mode fsdp
    labkit estimate mymodels:vit --input-shape 3,224,224 --batch-size 128 --mfu 0.3 \\
        --samples-per-epoch 1281167 --input-samples-per-s 900 --json estimate.json

MODEL is `package.module:function`, a function that returns your nn.Module (importable from
the current folder). --input-shape is one example: C,H,W (a float tensor) or T (T token ids).
--batch-size is per GPU. The utilisation behind the time is --mfu or, by default, the one
labkit measured for a model of the same kind (convolutional or matmul-bound), printed with its
source. Exit 2 for a factory, shape or flag that cannot be used, naming it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FLAGS = {"MODEL": "MODEL", "input_shape": "--input-shape", "batch_size": "--batch-size", "precision": "--precision",
         "gpus": "--gpus", "mode": "--mode", "mfu": "--mfu", "samples_per_epoch": "--samples-per-epoch",
         "input_samples_per_s": "--input-samples-per-s"}


def add_estimate_command(subparsers) -> None:
    p = subparsers.add_parser("estimate", help="memory, FLOPs, fitting GPUs and cost of your own PyTorch model",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", metavar="MODEL", help="package.module:function returning your nn.Module")
    p.add_argument("--input-shape", required=True, help="one example: C,H,W (floats) or T (token ids)")
    p.add_argument("--batch-size", type=int, default=1, help="examples per GPU per step (default 1)")
    p.add_argument("--precision", default="bf16", help="fp32, bf16 or fp16 autocast (default bf16)")
    p.add_argument("--gpus", type=int, default=1, help="data-parallel GPUs (default 1)")
    p.add_argument("--mode", default="ddp", help="ddp, zero1, zero2, zero3 or fsdp (default ddp)")
    p.add_argument("--mfu", type=float, default=None,
                   help="your utilisation, a fraction of the datasheet peak (default: labkit's measured one "
                        "for a model of the same kind)")
    p.add_argument("--samples-per-epoch", type=int, default=None, help="default 1,000,000")
    p.add_argument("--input-samples-per-s", type=float, default=None,
                   help="what your input pipeline delivers per GPU (measured): says which machines it keeps fed")
    p.add_argument("--json", default=None, help="also write the whole estimate here")
    p.set_defaults(handler=_estimate)


def _shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise ValueError(f"--input-shape must be C,H,W or T, whole numbers (got {text!r})") from None
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"--input-shape must be positive sizes (got {text!r})")
    return shape


def _estimate(args: argparse.Namespace) -> int:
    from labkit.core.config import ParameterError
    from labkit.core.frameworks import has_torch, missing_reason

    if not has_torch():
        print(f"labkit estimate: {missing_reason('torch')}")
        return 2
    from labkit.torch.estimate import DEFAULT_SAMPLES_PER_EPOCH, estimate

    if args.json:
        parent = Path(args.json).resolve().parent
        if not parent.is_dir():
            print(f"labkit estimate: --json {args.json}: folder {parent} does not exist")
            return 2
    try:
        report = estimate(args.model, _shape(args.input_shape), batch_size=args.batch_size, precision=args.precision,
                          gpus=args.gpus, mode=args.mode, mfu=args.mfu,
                          samples_per_epoch=args.samples_per_epoch or DEFAULT_SAMPLES_PER_EPOCH,
                          input_samples_per_s=args.input_samples_per_s)
    except (ParameterError, ValueError) as e:
        message = str(e)
        for name, flag in FLAGS.items():
            message = message.replace(f"parameter '{name}'", flag)
        print(f"labkit estimate: {message}")
        return 2
    print(report.text())
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, default=str))
        except OSError as e:
            print(f"labkit estimate: --json {args.json}: {e.strerror or e}")
            return 2
    return 0
