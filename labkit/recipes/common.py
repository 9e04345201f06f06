"""What every recipe needs and none of them teaches: the common flags, labkit's models and
synthetic data, AdamW as `labkit train` builds it, and the metrics file.

A recipe's flags mean what the `labkit train` flags of the same name mean, with the same
defaults (`--batch-size` is the GLOBAL batch of one optimizer step, over all processes and
accumulation micro-steps), so `engine_config(args)` is the run a recipe must reproduce, loss
for loss. The metrics file has `labkit train`'s schema (`labkit.core.metrics`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from labkit.core.config import SCALES, ParameterError, resolve_scale
from labkit.core.metrics import MetricsLog, StepMetrics
from labkit.core.models import MODEL_NAMES, ModelConfig, build_config
from labkit.core.train_config import TrainConfig

# Flags a recipe may add beside the common ones, and the TrainConfig field each one sets.
RECIPE_FIELDS = ("precision", "grad_accum", "checkpoint_dir", "checkpoint_every", "preempt_at")


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every recipe takes (defaults are `labkit train`'s); a recipe adds its own."""
    d = TrainConfig  # dataclass defaults are class attributes
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", choices=MODEL_NAMES, default=d.model)
    p.add_argument("--scale", choices=SCALES, default=d.scale, help="model and data sizes")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="GLOBAL batch of one optimizer step (all processes, all micro-steps)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW)")
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--grad-clip", type=float, default=d.grad_clip, help="0: no clipping")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--num-samples", type=int, default=None,
                   help="synthetic dataset size (default: max(4096, 64 x batch))")
    p.add_argument("--metrics-out", default=None, help="per-step metrics JSON (rank 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device,
                   help="auto: a GPU per process when there are enough, else the CPU; cuda: "
                        "fail at once without them")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags the way `labkit train` checks its own (a bad value raises
    `ParameterError` naming the flag)."""
    args = p.parse_args(argv)
    try:
        engine_config(args)
        if num_samples(args) < args.batch_size:
            raise ParameterError("num_samples", num_samples(args),
                                 f"must hold at least one global batch of {args.batch_size}")
    except ParameterError as e:
        p.error(str(e))  # exits 2 with the usage line and this message
    return args


def engine_config(args: argparse.Namespace, framework: str = "torch") -> TrainConfig:
    """The `labkit train` settings of a recipe run: what the recipe's losses must equal."""
    values: dict[str, Any] = {name: getattr(args, name) for name in
                              ("model", "scale", "steps", "batch_size", "lr", "warmup_steps",
                               "seed", "num_samples", "metrics_out")}
    values["device"] = getattr(args, "device", "auto")  # flags built by hand may leave it out
    values["grad_clip"] = args.grad_clip or None
    values.update({name: getattr(args, name) for name in RECIPE_FIELDS if hasattr(args, name)})
    return TrainConfig(framework=framework, progress=False, **values)


def engine_config_from_argv(argv: list[str], framework: str = "torch",
                            recipe: str | None = None) -> TrainConfig:
    """The `labkit train` settings of a recipe command line (its own extra flags ignored). For
    the parallelism recipes (`recipe` zero, deepspeed_zero, tensor_parallel, pipeline) the run
    uses the same `--parallel` mode, degrees and schedule."""
    import argparse
    from dataclasses import replace

    p = parser("recipe flags")
    p.add_argument("--precision", default=TrainConfig.precision)
    p.add_argument("--grad-accum", type=int, default=TrainConfig.grad_accum)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every)
    p.add_argument("--preempt-at", type=int, default=None)
    p.add_argument("--stage", type=int, default=1)
    p.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--tp-degree", type=int, default=None)
    p.add_argument("--microbatches", type=int, default=TrainConfig.microbatches)
    p.add_argument("--schedule", default=TrainConfig.pp_schedule)
    args, _ = p.parse_known_args(argv)
    config = engine_config(args, framework)
    parallel = {
        "zero": {"parallel": f"zero{args.stage}", "reshard_after_forward": args.reshard_after_forward},
        "deepspeed_zero": {"parallel": f"zero{args.stage}", "sharding_backend": "deepspeed"},
        "tensor_parallel": {"parallel": "tp", "tp_degree": args.tp_degree},
        "pipeline": {"parallel": "pp", "microbatches": args.microbatches, "pp_schedule": args.schedule},
    }.get(recipe or "", {})
    return replace(config, **parallel) if parallel else config


def model_config(args: argparse.Namespace) -> ModelConfig:
    return build_config(args.model, resolve_scale(args.scale))


def num_samples(args: argparse.Namespace) -> int:
    return engine_config(args).num_samples_or_default()


def synthetic_samples(args: argparse.Namespace):
    """labkit's synthetic samples for `--model` (images or token sequences), indexable."""
    from labkit.data.synthetic import for_model

    return for_model(model_config(args), num_samples(args), args.seed)


def dataset_name(args: argparse.Namespace) -> str:
    """A folder name that changes whenever the synthetic samples would (shards written for other
    samples are then never read back as these)."""
    from labkit.data.synthetic import for_model

    cfg = model_config(args)
    size = "x".join(str(v) for v in (getattr(cfg, "image_size", None), getattr(cfg, "block_size", None),
                                      getattr(cfg, "vocab_size", None)) if v)
    label_noise = getattr(for_model(cfg, 1, args.seed).config, "label_noise", 0.0)
    labels = f"-labelnoise{label_noise:g}" if label_noise else ""
    return f"{args.model}-{size}-n{num_samples(args)}-seed{args.seed}{labels}"


# ---------------------------------------------------------------- PyTorch


def torch_model(args: argparse.Namespace):
    """labkit's torch model for `--model`, initialised from `--seed` (every process builds the
    same weights, as in `labkit train`)."""
    import torch

    from labkit.torch.models import build_model

    torch.manual_seed(args.seed)
    return build_model(model_config(args))


def torch_dataset(args: argparse.Namespace):
    """The synthetic samples, one per index: images as uint8 CHW with an int64 label, tokens as
    (inputs, targets)."""
    from labkit.torch.data import make_sample_dataset

    return make_sample_dataset(model_config(args), num_samples(args), args.seed)


def device(choice: str = "auto"):
    """This process's device: under torchrun, GPU LOCAL_RANK when the machine has a GPU for each
    of its LOCAL_WORLD_SIZE processes (NCCL refuses two ranks on one GPU), else the CPU for all
    of them (`labkit.core.placement`, the rule `labkit train` follows). `choice="cuda"` without
    enough GPUs exits with one line naming --device."""
    import os
    import sys

    import torch

    from labkit.core.placement import place

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        where = place(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), gpus, device=choice)
    except ParameterError as e:
        sys.exit(f"error: {e}")
    return torch.device(where.device_for(int(os.environ.get("LOCAL_RANK", 0))))


def batches(dataset, batch_size: int, seed: int, *, rank: int = 0, world_size: int = 1,
            num_workers: int = 0, pin_memory: bool = False):
    """Endless batches in `labkit train`'s order: DistributedSampler's seeded shuffle (the same
    for one process or many), reshuffled each epoch by `set_epoch`."""
    import itertools

    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True,
                        num_workers=num_workers, pin_memory=pin_memory)
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from loader


def to_device(batch, device):
    """Move a batch to `device`. Images travel as uint8 (a quarter of float32's bytes) and
    become floats in [0, 1] there; token ids stay integers."""
    import torch

    x, y = (t.to(device, non_blocking=True) for t in batch)
    return (x.float().div_(255.0) if x.dtype == torch.uint8 else x), y


def adamw(model, args: argparse.Namespace):
    """AdamW and its warm-up schedule exactly as `labkit train` builds them: weight decay 0.1 on
    matrices and kernels only (not on biases and norm scales), betas (0.9, 0.95), the LR rising
    linearly over `--warmup-steps`. Returns (optimizer, scheduler).

    Sharded parameters (tensor parallelism's DTensors) get groups of their own: the fused and
    multi-tensor kernels take one kind of tensor per call, and a mixed group fails on the GPU
    ("got mixed torch.Tensor and DTensor")."""
    import torch
    from torch.distributed.tensor import DTensor

    groups = []
    for sharded in (False, True):
        params = [p for p in model.parameters() if isinstance(p, DTensor) == sharded]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups += [g for g in ({"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0})
                   if g["params"]]
    # The fused CUDA kernel updates every parameter of a group in one launch.
    fused = next(model.parameters()).is_cuda
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), fused=fused)
    warmup = args.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)
    return optimizer, scheduler


def leave_worker() -> None:
    """End a torchrun worker after `main()` returned (its files written, its group destroyed).
    torch keeps gloo's worker threads alive past `destroy_process_group`; one that frees its last
    finished collective while Python shuts down aborts the process ("terminate called without
    an active exception") after a successful run. A worker of several therefore leaves at once,
    output flushed, without finalizing Python; a lone process exits normally."""
    import os
    import sys

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# ---------------------------------------------------------------- TensorFlow


def tf_data(args: argparse.Namespace):
    """Every synthetic sample in memory: (images uint8 NHWC, labels int32) or (tokens, targets)
    int32, the arrays `labkit train --framework tf` trains on."""
    from labkit.tf.data import load_arrays

    return load_arrays(model_config(args), num_samples(args), args.seed)


def tf_sample_order(args: argparse.Namespace, replica: int = 0, num_replicas: int = 1):
    """The sample indices `replica` of `num_replicas` trains on, step after step, in
    `labkit train --framework tf`'s order: a seeded permutation per epoch, replica r taking every
    R-th sample (DistributedSampler's rule), the tail that fills no global batch dropped."""
    import numpy as np

    n = num_samples(args)
    steps_per_epoch = n // args.batch_size
    take = steps_per_epoch * (args.batch_size // num_replicas)
    epochs = -(-args.steps // steps_per_epoch)
    return np.concatenate([np.random.default_rng([args.seed, e]).permutation(n)[replica::num_replicas][:take]
                           for e in range(epochs)])


def tf_model(args: argparse.Namespace, dtype_policy: str = "float32"):
    """labkit's Keras model for `--model` with `dtype_policy` on every layer, initialised from
    `--seed`. Call inside `strategy.scope()` when there is a strategy."""
    from labkit.tf.models import build_model

    return build_model(model_config(args), dtype=dtype_policy, seed=args.seed)


def keras_adamw(model, args: argparse.Namespace, optimizer_class=None):
    """Keras AdamW as `labkit train --framework tf` builds it (the torch twin's hyper-parameters:
    decay 0.1 on kernels and embeddings only, betas (0.9, 0.95), linear warm-up). It clips the
    global norm of the gradients it is given to `--grad-clip`. Create it inside
    `strategy.scope()` when there is a strategy. `optimizer_class`: a subclass of
    `keras.optimizers.AdamW` to build instead."""
    import keras

    peak, warmup = args.lr, args.warmup_steps

    class Warmup(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            return peak * keras.ops.minimum(1.0, (keras.ops.cast(step, "float32") + 1.0) / warmup)

    optimizer = (optimizer_class or keras.optimizers.AdamW)(
        learning_rate=Warmup() if warmup else peak, beta_1=0.9, beta_2=0.95, epsilon=1e-8,
        weight_decay=0.1, global_clipnorm=args.grad_clip or None)
    optimizer.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables
                                                  if len(v.shape) < 2])
    return optimizer


def tokens_per_sample(args: argparse.Namespace) -> int:
    """Predictions per sample: one label per image, one next token per position for GPT."""
    from labkit.core.models import GPTConfig

    cfg = model_config(args)
    return cfg.block_size if isinstance(cfg, GPTConfig) else 1


# ---------------------------------------------------------------- metrics


class StepLog:
    """Per-step records in `labkit train`'s metrics schema; each `log` call also times the
    step since the previous call."""

    def __init__(self, recipe: str, args: argparse.Namespace, framework: str = "torch", **run: Any):
        self.args = args
        self.metrics = MetricsLog(run={"framework": framework, "recipe": recipe, "model": args.model,
                                       "config": vars(args), **run})
        self._last = time.perf_counter()

    def log(self, step: int, loss: float, *, lr: float | None = None, **extra: Any) -> None:
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        self.metrics.append(StepMetrics(step=step, loss=loss, step_time_s=seconds, lr=lr,
                                        samples_per_s=self.args.batch_size / seconds, extra=extra))

    @property
    def losses(self) -> list[float]:
        return self.metrics.losses

    def write(self, path: str | None = None) -> None:
        """Write the file to `path` (default: `--metrics-out`; nothing when neither is set)."""
        path = path or self.args.metrics_out
        if path:
            self.metrics.write(path)
