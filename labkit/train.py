"""`labkit train`: one training run, PyTorch or TensorFlow, configured by `TrainConfig`.

The engines (`labkit.torch.engine.fit`, `labkit.tf.engine.fit`) take the same config and write
the same metrics schema (`labkit.metrics`), so a notebook compares frameworks through one API.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from labkit.config import (
    SCALES,
    check_bool,
    check_choice,
    check_float,
    check_int,
)
from labkit.models import MODEL_NAMES

FRAMEWORKS = ("torch", "tf")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a process killed by SIGTERM reports


class Preempted(Exception):
    """Raised by an engine after it checkpointed in response to SIGTERM (or `preempt_at`)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"preempted during step {step}; state checkpointed")


@dataclass
class TrainConfig:
    """Everything one run needs. `batch_size` is the GLOBAL batch of one optimizer step: summed
    over all replicas and all gradient-accumulation micro-steps (per-replica micro-batch =
    batch_size / (world_size * grad_accum)), so changing the replica count keeps the maths."""

    framework: str = "torch"
    model: str = "cnn"
    scale: str = "smoke"
    steps: int = 20
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 1e-3
    warmup_steps: int = 0
    scale_lr_with_world_size: bool = False
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    activation_checkpointing: bool = False
    grad_clip: float | None = 1.0
    seed: int = 0
    num_samples: int | None = None
    # Input pipeline knobs: loader worker processes, pinned host memory, and an injected
    # per-batch input latency (remote storage / decode cost) for building input-bound runs.
    num_workers: int = 0
    pin_memory: bool = False
    input_latency_ms: float = 0.0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    metrics_out: str | None = None
    tensorboard_dir: str | None = None
    preempt_at: int | None = None
    device: str = "auto"
    progress: bool = True

    def __post_init__(self) -> None:
        check_choice("framework", self.framework, FRAMEWORKS)
        check_choice("model", self.model, MODEL_NAMES)
        check_choice("scale", self.scale, SCALES)
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("grad_accum", self.grad_accum, minimum=1)
        check_float("lr", self.lr, minimum=0.0)
        check_int("warmup_steps", self.warmup_steps, minimum=0)
        check_bool("scale_lr_with_world_size", self.scale_lr_with_world_size)
        check_choice("precision", self.precision, PRECISIONS)
        check_bool("channels_last", self.channels_last)
        check_bool("compile", self.compile)
        check_bool("activation_checkpointing", self.activation_checkpointing)
        check_float("grad_clip", self.grad_clip, minimum=0.0, allow_none=True)
        check_int("seed", self.seed, minimum=0)
        check_int("num_samples", self.num_samples, minimum=1, allow_none=True)
        check_int("num_workers", self.num_workers, minimum=0)
        check_bool("pin_memory", self.pin_memory)
        check_float("input_latency_ms", self.input_latency_ms, minimum=0.0)
        check_int("checkpoint_every", self.checkpoint_every, minimum=0)
        check_int("preempt_at", self.preempt_at, minimum=0, allow_none=True)
        check_choice("device", self.device, ("auto", "cpu", "cuda"))


def run_training(config: TrainConfig):
    """Train with the configured framework; returns the engine's MetricsLog."""
    if config.framework == "torch":
        from labkit.torch.engine import fit
    else:
        from labkit.tf.engine import fit
    return fit(config)


def add_train_command(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model (torch or tf) and write per-step metrics")
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            kind = {"lr": float, "grad_clip": float, "input_latency_ms": float}.get(f.name)
            if kind is None:
                kind = int if isinstance(default, int) or f.name in ("num_samples", "preempt_at") else str
            p.add_argument(flag, type=kind, default=default)
    p.set_defaults(handler=_train_command)


def _train_command(args) -> int:
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    config = TrainConfig(**values)
    try:
        log = run_training(config)
    except Preempted as e:
        print(f"labkit train: {e}; run the same command again to resume")
        return PREEMPTED_EXIT_CODE
    summary = log.to_dict()["summary"]
    print(f"labkit train: {summary.get('num_steps', 0)} steps, final loss {summary.get('final_loss')}")
    return 0
