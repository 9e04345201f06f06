"""What every recipe needs and none of them teaches: the common flags, the model and synthetic data
of `--model`, AdamW as `labkit train` builds it, this process's device, and the metrics file.

This file runs without labkit, and so does a recipe beside it. To take a PyTorch recipe away,
copy four files into one folder: the recipe, this file, `plain.py` (the networks and the samples
as a torch Dataset: labkit/torch/plain.py) and `samples.py` (the synthetic samples in NumPy:
labkit/data/samples.py). Then `python ddp.py --model gpt`, or `torchrun --standalone
--nproc-per-node 2 ddp.py --model gpt`, trains there with PyTorch and NumPy alone. labkit's engine
builds its networks and data from those same two files: that is why a recipe's losses equal
`labkit train`'s.

A recipe's flags mean what the `labkit train` flags of the same name mean, with the same
defaults (`--batch-size` is the GLOBAL batch of one optimizer step, over all processes and
accumulation micro-steps), and a bad value is refused in the same words. The metrics file has
`labkit train`'s layout. labkit's tests keep what is written out here (the defaults, the model
sizes, the checks, the device rule, the file's layout) equal to labkit's own.

How one file serves both: `python -m labkit.recipes.NAME` (or an import from labkit) sets a
module's `__package__` to its package, while a file run by name has it None ("When the main
module is specified by its filename, then the __package__ attribute will be set to None",
https://peps.python.org/pep-0366/, read 2026-11-29) and a module imported from beside it has
the empty string. So `if __package__:` takes labkit's copy of a sibling file, and `else:` the one
beside this file.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

if __package__:  # inside labkit: the file its engine draws the samples from
    from labkit.data import samples
else:  # a copy: samples.py beside this file
    import samples

MODELS = ("cnn", "resnet", "gpt")
SCALES = ("auto", "smoke", "full")
# `labkit train`'s defaults for the flags every recipe takes.
DEFAULTS = {"model": "cnn", "scale": "smoke", "steps": 20, "batch_size": 32, "lr": 1e-3,
            "warmup_steps": 0, "grad_clip": 1.0, "seed": 0, "device": "auto"}
# The sizes `--model NAME --scale S` trains: smoke runs on a CPU in seconds; full is ResNet-50
# and GPT-2 small (124M parameters, vocabulary padded to 50304) for a GPU.
SIZES = {
    ("cnn", "smoke"): {"image_size": 32, "channels": 3, "num_classes": 10, "width": 32, "depth": 2},
    ("cnn", "full"): {"image_size": 32, "channels": 3, "num_classes": 10, "width": 64, "depth": 3},
    ("resnet", "smoke"): {"image_size": 32, "channels": 3, "num_classes": 10, "width": 16,
                          "layers": (1, 1, 1, 1), "bottleneck": False, "imagenet_stem": False},
    ("resnet", "full"): {"image_size": 224, "channels": 3, "num_classes": 1000, "width": 64,
                         "layers": (3, 4, 6, 3), "bottleneck": True, "imagenet_stem": True},
    ("gpt", "smoke"): {"vocab_size": 512, "block_size": 64, "n_layer": 2, "n_head": 2, "n_embd": 64,
                       "dropout": 0.0, "bias": False},
    ("gpt", "full"): {"vocab_size": 50304, "block_size": 1024, "n_layer": 12, "n_head": 12,
                      "n_embd": 768, "dropout": 0.0, "bias": False},
}
# A tenth of a training image's labels are drawn at random: a floor under the loss, so a long run
# cannot reach zero (token sequences carry their own share of random tokens).
LABEL_NOISE = 0.1


def parser(description: str) -> argparse.ArgumentParser:
    """The flags every recipe takes (defaults are `labkit train`'s); a recipe adds its own."""
    d = DEFAULTS
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", choices=MODELS, default=d["model"])
    p.add_argument("--scale", choices=SCALES, default=d["scale"],
                   help="model and data sizes (auto: full with a GPU, else smoke)")
    p.add_argument("--steps", type=int, default=d["steps"], help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=d["batch_size"],
                   help="GLOBAL batch of one optimizer step (all processes, all micro-steps)")
    p.add_argument("--lr", type=float, default=d["lr"], help="peak learning rate (AdamW)")
    p.add_argument("--warmup-steps", type=int, default=d["warmup_steps"])
    p.add_argument("--grad-clip", type=float, default=d["grad_clip"], help="0: no clipping")
    p.add_argument("--seed", type=int, default=d["seed"])
    p.add_argument("--num-samples", type=int, default=None,
                   help="synthetic dataset size (default: max(4096, 64 x batch))")
    p.add_argument("--metrics-out", default=None, help="per-step metrics JSON (rank 0)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d["device"],
                   help="auto: a GPU per process when there are enough, else the CPU; cuda: "
                        "fail at once without them")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the flags as `labkit train` checks its own: a bad value exits 2 with the
    usage line and one message naming it."""
    args = p.parse_args(argv)
    problem = first_problem(args)
    if problem:
        p.error(problem)
    return args


def first_problem(args: argparse.Namespace) -> str | None:
    """The first flag value `labkit train` would refuse, in its words; None when all are fine.
    Flags only some recipes take (--grad-accum, --checkpoint-dir, ...) are checked where present."""
    def at_least(low):
        return lambda v: f"must be >= {low}" if v < low else None

    def finite_at_least(low):
        return lambda v: "must be a finite number" if not math.isfinite(v) else at_least(low)(v)

    def optional(check):
        return lambda v: None if v is None else check(v)

    def path(v):
        return None if v is None or v.strip() else (
            "must be a path (an empty one would mean no output at all; leave the setting out for that)")

    def file_path(v):
        return path(v) or (v is not None and v.endswith(("/", "\\")) and "ends with a separator, "
                           "so it names a folder; give a file path, e.g. " + v.rstrip("/\\") + "/metrics.json")

    def drill_step(v):
        return at_least(0)(v) or (v >= args.steps and f"must be below steps={args.steps}: the drill "
                                  f"stops the run during that step, and steps 0..{args.steps - 1} "
                                  f"are all there is")

    checks = [  # in the order `labkit train` checks them
        ("steps", args.steps, at_least(1)),
        ("batch_size", args.batch_size, at_least(1)),
        ("grad_accum", getattr(args, "grad_accum", 1), at_least(1)),
        ("lr", args.lr, finite_at_least(0.0)),
        ("warmup_steps", args.warmup_steps, at_least(0)),
        ("grad_clip", args.grad_clip or None, optional(finite_at_least(0.0))),
        ("seed", args.seed, at_least(0)),
        ("num_samples", args.num_samples, optional(at_least(1))),
        ("checkpoint_every", getattr(args, "checkpoint_every", 0), at_least(0)),
        ("checkpoint_dir", getattr(args, "checkpoint_dir", None), path),
        ("metrics_out", args.metrics_out, file_path),
        ("preempt_at", getattr(args, "preempt_at", None), optional(drill_step)),
        ("num_samples", num_samples(args),
         lambda v: v < args.batch_size and f"must hold at least one global batch of {args.batch_size}"),
    ]
    for name, value, check in checks:
        if problem := check(value):
            return f"parameter {name!r} {problem} (got {value!r})"
    return None


def model_config(args: argparse.Namespace) -> SimpleNamespace:
    """The sizes of `--model` at `--scale` (`cfg.width`, `cfg.n_layer`, ...)."""
    scale = args.scale
    if scale == "auto":
        import torch

        scale = "full" if torch.cuda.is_available() else "smoke"
    return SimpleNamespace(**SIZES[args.model, scale])


def num_samples(args: argparse.Namespace) -> int:
    """The synthetic dataset's size: `--num-samples`, else max(4096, 64 x batch). It does not
    depend on `--steps`, so a longer run repeats the data order of a shorter one."""
    return args.num_samples or max(4096, 64 * args.batch_size)


# ---------------------------------------------------------------- PyTorch


def plain_torch():
    """plain.py, the networks and the samples as a torch Dataset. Imported on first use: the
    Keras recipes share this file and need no PyTorch."""
    if __package__:  # inside labkit: the file its engine builds the networks from
        from labkit.torch import plain
    else:  # a copy: plain.py beside this file
        import plain
    return plain


def torch_model(args: argparse.Namespace):
    """The network of `--model`, initialised from `--seed` (every process builds the same
    weights, as in `labkit train`)."""
    import torch

    plain = plain_torch()
    network = {"cnn": plain.CNN, "resnet": plain.ResNet, "gpt": plain.GPT}[args.model]
    torch.manual_seed(args.seed)
    return network(model_config(args))


def torch_dataset(args: argparse.Namespace):
    """The synthetic samples, one per index: images as uint8 CHW with an int64 label, tokens as
    (inputs, targets)."""
    cfg, n = model_config(args), num_samples(args)
    if args.model == "gpt":
        source = samples.SyntheticTokens(samples.TokenDatasetConfig(
            num_sequences=n, block_size=cfg.block_size, vocab_size=cfg.vocab_size, seed=args.seed))
    else:
        source = samples.SyntheticImages(samples.ImageDatasetConfig(
            num_samples=n, image_size=cfg.image_size, channels=cfg.channels,
            num_classes=cfg.num_classes, label_noise=LABEL_NOISE, seed=args.seed))
    return plain_torch().SampleDataset(source)


def placement(processes: int, gpus: int, choice: str = "auto") -> str:
    """"cuda" (process i on GPU i) or "cpu" for the `processes` processes of a machine with
    `gpus` GPUs: a GPU each when there are enough (NCCL refuses two ranks on one GPU), else the
    CPU. `choice` "cpu" always takes the CPU; "cuda" raises ValueError without enough GPUs."""
    if choice == "cuda" and gpus == 0:
        raise ValueError("parameter 'device' needs a CUDA GPU, and none is visible here (no NVIDIA "
                         "driver reachable, or CUDA_VISIBLE_DEVICES hides them) (got 'cuda')")
    if choice == "cuda" and processes > gpus:
        raise ValueError(f"parameter 'device' puts one process on each GPU, and {processes} processes "
                         f"need {processes} GPUs; this machine has {gpus} (NCCL refuses two ranks on "
                         f"one GPU). Use device='cpu' or fewer processes (got 'cuda')")
    return "cuda" if choice != "cpu" and 0 < processes <= gpus else "cpu"


def device(choice: str = "auto"):
    """This process's device: under torchrun, GPU LOCAL_RANK when the machine has a GPU for each
    of its LOCAL_WORLD_SIZE processes, else the CPU for all of them (`placement`).
    `choice="cuda"` without enough GPUs exits with one line naming --device."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        where = placement(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), gpus, choice)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if where == "cpu":
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def batches(dataset, batch_size: int, seed: int, *, rank: int = 0, world_size: int = 1,
            num_workers: int = 0, pin_memory: bool = False):
    """Endless batches in `labkit train`'s order: DistributedSampler's seeded shuffle (the same
    for one process or many), reshuffled each epoch by `set_epoch`."""
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
    x, y = (t.to(device, non_blocking=True) for t in batch)
    return plain_torch().to_float_images(x), y


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
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# ---------------------------------------------------------------- Keras


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


# ---------------------------------------------------------------- metrics


class MetricsFile:
    """`labkit train`'s metrics file: `{"run": {...}, "steps": [{"step": 0, "loss": ...}, ...],
    "summary": {...}}`, written whole or not at all (a reader never sees half a file)."""

    TIMED = ("step_time_s", "data_time_s", "samples_per_s", "tokens_per_s", "mfu")

    def __init__(self, run: dict[str, Any]):
        self.run = dict(run)
        self.steps: list[dict[str, Any]] = []

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.steps]

    def summary(self) -> dict[str, Any]:
        """The step count, first and last loss, and medians of the timings after step 0 (which
        pays for warm-up)."""
        steps = self.steps
        timed = steps[1:] if len(steps) > 1 else steps
        out: dict[str, Any] = {"num_steps": len(steps)}
        if steps:
            out["first_loss"], out["final_loss"] = steps[0]["loss"], steps[-1]["loss"]
        for key in self.TIMED:
            values = [s[key] for s in timed if s.get(key) is not None]
            if values:
                out[f"median_{key}"] = statistics.median(values)
        evaluated = [s["heldout_loss"] for s in steps if s.get("heldout_loss") is not None]
        if evaluated:
            out["heldout_loss"] = evaluated[-1]
        peaks = [s["peak_memory_bytes"] for s in steps if s.get("peak_memory_bytes") is not None]
        if peaks:
            out["peak_memory_bytes"] = max(peaks)
        return out

    def continue_from(self, path: str | None, start: int) -> int:
        """Before a run resumed at step `start` logs its steps: keep the steps below `start` that
        an earlier attempt wrote to `path` (later ones are trained again). Returns how many."""
        if not path or start <= 0 or not os.path.isfile(path):
            return 0
        try:
            with open(path, encoding="utf-8") as f:
                earlier = json.load(f)["steps"]
        except (OSError, ValueError, KeyError, TypeError):
            return 0
        kept = [row for row in earlier if isinstance(row, dict) and isinstance(row.get("step"), int)
                and row["step"] < start]
        self.steps[:0] = kept
        return len(kept)

    def write(self, path: str) -> None:
        """A temporary file beside `path`, then a rename over it."""
        target = os.path.realpath(path)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target) or ".", prefix=f".{os.path.basename(target)}.",
                                   suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"run": self.run, "steps": self.steps, "summary": self.summary()}, f, indent=1)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise


class StepLog:
    """Per-step records in `labkit train`'s metrics file; each `log` call also times the step
    since the previous call."""

    def __init__(self, recipe: str, args: argparse.Namespace, framework: str = "torch", **run: Any):
        self.args = args
        self.metrics = MetricsFile({"framework": framework, "recipe": recipe, "model": args.model,
                                    "config": vars(args), **run})
        self._last = time.perf_counter()

    def log(self, step: int, loss: float, *, lr: float | None = None, **extra: Any) -> None:
        now = time.perf_counter()
        seconds, self._last = now - self._last, now
        row = {"step": step, "loss": loss, "step_time_s": seconds,
               "samples_per_s": self.args.batch_size / seconds}
        if lr is not None:
            row["lr"] = lr
        row["skipped"] = False  # an fp16 step whose overflowing gradients were not applied
        row.update(extra)
        self.metrics.steps.append(row)

    @property
    def losses(self) -> list[float]:
        return self.metrics.losses

    def write(self, path: str | None = None) -> None:
        """Write the file to `path` (default: `--metrics-out`; nothing when neither is set)."""
        path = path or self.args.metrics_out
        if path:
            self.metrics.write(path)


# ---------------------------------------------------------------- labkit's side

# What labkit's tests and notebooks compare a recipe with (the `labkit train` run its command line
# stands for), and what the Keras and TFRecord recipes take from labkit (its Keras twins, its
# data layer). Each imports labkit when called; a copied PyTorch recipe calls none of them.

# Flags a recipe may add beside the common ones, and the TrainConfig field each one sets.
RECIPE_FIELDS = ("precision", "grad_accum", "checkpoint_dir", "checkpoint_every", "preempt_at")


def engine_config(args: argparse.Namespace, framework: str = "torch"):
    """The `labkit train` settings of a recipe run (a TrainConfig): what its losses must equal."""
    from labkit.core.train_config import TrainConfig

    values: dict[str, Any] = {name: getattr(args, name) for name in
                              ("model", "scale", "steps", "batch_size", "lr", "warmup_steps",
                               "seed", "num_samples", "metrics_out")}
    values["device"] = getattr(args, "device", "auto")  # flags built by hand may leave it out
    values["grad_clip"] = args.grad_clip or None
    values.update({name: getattr(args, name) for name in RECIPE_FIELDS if hasattr(args, name)})
    return TrainConfig(framework=framework, progress=False, **values)


def engine_config_from_argv(argv: list[str], framework: str = "torch", recipe: str | None = None):
    """The `labkit train` settings of a recipe command line (its own extra flags ignored). For
    the parallelism recipes (`recipe` zero, deepspeed_zero, tensor_parallel, pipeline) the run
    uses the same `--parallel` mode, degrees and schedule."""
    from dataclasses import replace

    from labkit.core.train_config import TrainConfig

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


def labkit_model_config(args: argparse.Namespace):
    """labkit's config of `--model` at `--scale` (`labkit.core.models`), for its Keras twins."""
    from labkit.core.config import resolve_scale
    from labkit.core.models import build_config

    return build_config(args.model, resolve_scale(args.scale))


def synthetic_samples(args: argparse.Namespace):
    """labkit's synthetic samples for `--model` (images or token sequences), indexable."""
    from labkit.data.synthetic import for_model

    return for_model(labkit_model_config(args), num_samples(args), args.seed)


def dataset_name(args: argparse.Namespace) -> str:
    """A folder name that changes whenever the synthetic samples would (shards written for other
    samples are then never read back as these)."""
    from labkit.data.synthetic import for_model

    cfg = labkit_model_config(args)
    size = "x".join(str(v) for v in (getattr(cfg, "image_size", None), getattr(cfg, "block_size", None),
                                      getattr(cfg, "vocab_size", None)) if v)
    label_noise = getattr(for_model(cfg, 1, args.seed).config, "label_noise", 0.0)
    labels = f"-labelnoise{label_noise:g}" if label_noise else ""
    return f"{args.model}-{size}-n{num_samples(args)}-seed{args.seed}{labels}"


def tf_data(args: argparse.Namespace):
    """Every synthetic sample in memory: (images uint8 NHWC, labels int32) or (tokens, targets)
    int32, the arrays `labkit train --framework tf` trains on."""
    from labkit.tf.data import load_arrays

    return load_arrays(labkit_model_config(args), num_samples(args), args.seed)


def tf_model(args: argparse.Namespace, dtype_policy: str = "float32"):
    """labkit's Keras model for `--model` with `dtype_policy` on every layer, initialised from
    `--seed`. Call inside `strategy.scope()` when there is a strategy."""
    from labkit.tf.models import build_model

    return build_model(labkit_model_config(args), dtype=dtype_policy, seed=args.seed)


def tokens_per_sample(args: argparse.Namespace) -> int:
    """Predictions per sample: one label per image, one next token per position for GPT."""
    return getattr(labkit_model_config(args), "block_size", 1) if args.model == "gpt" else 1
