"""`labkit train`: one training run, PyTorch or TensorFlow, configured by `TrainConfig`.

The engines (`labkit.torch.engine.fit`, `labkit.tf.engine.fit`) take the same config and write
the same metrics schema (`labkit.metrics`), so a notebook compares frameworks through one API.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from labkit.config import (
    SCALES,
    ParameterError,
    check_bool,
    check_choice,
    check_float,
    check_int,
)
from labkit.models import MODEL_NAMES

FRAMEWORKS = ("torch", "tf")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# torch.compile's modes, and "tuned": CUDA graphs plus coordinate-descent tuning of the generated
# Triton kernels, without max-autotune's matmul search (which takes minutes and rarely beats cuBLAS).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune", "tuned")
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a process killed by SIGTERM reports


class Preempted(Exception):
    """Raised by an engine after it checkpointed in response to SIGTERM (or `preempt_at`)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"preempted during step {step}; state checkpointed")



def finished_replicas_log(metrics_out: str, exit_codes: list[int]):
    """Rank 0's MetricsLog after every replica of a local multi-process run has exited 0 or 143;
    raises `Preempted` at the last recorded step when they checkpointed and exited 143."""
    from labkit.metrics import MetricsLog

    log = MetricsLog.read(metrics_out)
    if PREEMPTED_EXIT_CODE in exit_codes:
        raise Preempted(log.steps[-1]["step"] if log.steps else -1)
    return log

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
    compile_mode: str = "default"
    # GPT with bf16 on an fp8 GPU (Hopper, Ada): the output projection and the loss run as one
    # function whose three matmuls use fp8 tensor cores (labkit.torch.fp8). Torch engine only.
    fp8_head: bool = False
    # CUDA: after a few normal steps, capture the whole optimizer step (every micro-step's forward
    # and backward, clipping, AdamW) as one CUDA graph and replay it (labkit.torch.step_graph).
    cuda_graph_step: bool = False
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
        check_choice("compile_mode", self.compile_mode, COMPILE_MODES)
        check_bool("fp8_head", self.fp8_head)
        if self.fp8_head and (self.model != "gpt" or self.precision != "bf16"):
            raise ParameterError("fp8_head", self.fp8_head,
                                 f"needs model='gpt' and precision='bf16' (got model={self.model!r}, "
                                 f"precision={self.precision!r})")
        check_bool("cuda_graph_step", self.cuda_graph_step)
        if self.cuda_graph_step and self.precision == "fp16":
            raise ParameterError("cuda_graph_step", self.cuda_graph_step,
                                 "needs a precision without a loss scaler (fp32, tf32 or bf16): fp16's "
                                 "GradScaler reads its overflow flag on the host every step")
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

    def check_world_size(self, world_size: int) -> None:
        """Refuse settings that need a single process, for a run of `world_size` replicas (the
        launcher checks before starting any; the engine checks again in each replica)."""
        if self.cuda_graph_step and world_size > 1:
            raise ParameterError("cuda_graph_step", True,
                                 f"needs a single process (got {world_size}): DDP's gradient all-reduce "
                                 f"is driven from the host, outside any graph")


def run_training(config: TrainConfig):
    """Train with the configured framework; returns the engine's MetricsLog."""
    if config.framework == "torch":
        from labkit.torch.engine import fit
    else:
        from labkit.tf.engine import fit
    return fit(config)


# Help text per TrainConfig field (the CLI is generated from the dataclass, so a new field gets a
# flag automatically; its help lives here).
_HELP = {
    "framework": "training engine",
    "model": "model family; sizes come from --scale",
    "scale": "model/data sizes: smoke (CPU, seconds), full (GPU: ResNet-50, GPT-2 small); auto picks",
    "steps": "total optimizer steps of the run (a resumed run finishes the remaining ones)",
    "batch_size": "GLOBAL batch per optimizer step, over all replicas and accumulation micro-steps",
    "grad_accum": "micro-steps per optimizer step (gradients all-reduced on the last one only)",
    "lr": "peak learning rate (AdamW)",
    "warmup_steps": "linear LR warm-up steps",
    "scale_lr_with_world_size": "multiply the LR by the number of replicas (linear scaling rule)",
    "precision": "fp32, tf32 (fp32 maths on TF32 tensor cores), bf16 autocast, fp16 autocast + GradScaler",
    "channels_last": "NHWC memory format for conv nets (tensor-core friendly)",
    "compile": "torch.compile the model",
    "compile_mode": "torch.compile mode with --compile (torch): default, reduce-overhead (CUDA graphs), max-autotune(-no-cudagraphs), tuned (CUDA graphs + Triton kernel tuning)",
    "fp8_head": "GPT + bf16: output projection and loss with fp8 matmuls (fastest on Hopper/Ada; torch only)",
    "cuda_graph_step": "CUDA, one process: replay the whole step (forward, backward, optimizer) as one CUDA graph after 3 normal steps (torch only; not with fp16)",
    "activation_checkpointing": "recompute block activations in the backward pass (less memory, more time)",
    "grad_clip": "clip the global gradient norm to this value (omit with 0)",
    "seed": "seed of weights and data order",
    "num_samples": "synthetic dataset size (default: max(4096, 64 x batch))",
    "num_workers": "DataLoader worker processes",
    "pin_memory": "page-locked host batches for faster host-to-device copies (CUDA)",
    "input_latency_ms": "injected delay per batch in the input pipeline (emulates slow storage)",
    "checkpoint_dir": "full-state checkpoints here (local path, gs://, /gcs/); resumes from the newest committed step (torch: defaults to $AIP_CHECKPOINT_DIR on Vertex AI)",
    "checkpoint_every": "checkpoint every K steps (0: only at the end and on SIGTERM)",
    "metrics_out": "per-step metrics JSON file written by rank 0",
    "tensorboard_dir": "TensorBoard event files, rank 0 (torch: defaults to $AIP_TENSORBOARD_LOG_DIR)",
    "preempt_at": "preemption drill: SIGTERM to itself during this step, checkpoint, exit 143",
    "device": "auto: CUDA when available, else CPU",
    "progress": "tqdm progress bar on rank 0",
}
_CHOICES = {"framework": FRAMEWORKS, "model": MODEL_NAMES, "scale": SCALES, "precision": PRECISIONS,
            "device": ("auto", "cpu", "cuda")}
_FLOATS = ("lr", "grad_clip", "input_latency_ms")
_OPTIONAL_INTS = ("num_samples", "preempt_at")


def to_argv(config: TrainConfig) -> list[str]:
    """The `labkit train` arguments that rebuild `config` (used to start DDP replicas)."""
    argv: list[str] = []
    for f in fields(TrainConfig):
        value = getattr(config, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif value is None:
            if f.name == "grad_clip":
                argv += [flag, "0"]  # 0 switches clipping off; None would fall back to the default
        else:
            argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def add_train_command(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a model (torch or tf) and write per-step metrics",
        description="Train a model on deterministic synthetic data. Exit code 143 means the run "
                    "was preempted (SIGTERM or --preempt-at) after checkpointing: run the same "
                    "command again to resume.")
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        help_text = _HELP.get(f.name, "") + (f" (default: {default})" if default is not None else "")
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=_HELP.get(f.name))
            continue
        if f.name in _FLOATS:
            kind = float
        elif isinstance(default, int) or f.name in _OPTIONAL_INTS:
            kind = int
        else:
            kind = str
        p.add_argument(flag, type=kind, default=default, choices=_CHOICES.get(f.name), help=help_text)
    p.add_argument("--nproc-per-node", type=int, default=1,
                   help="start this many local DDP replicas (gloo on loopback; torch only)")
    p.set_defaults(handler=_train_command)


def _train_command(args) -> int:
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    if values.get("grad_clip") == 0:
        values["grad_clip"] = None
    try:
        config = TrainConfig(**values)
    except ParameterError as e:
        print(f"labkit train: {e}")
        return 2
    nproc = getattr(args, "nproc_per_node", 1)
    try:
        if nproc > 1:
            if config.framework != "torch":
                raise ParameterError("nproc_per_node", nproc, "is supported for --framework torch only")
            config.check_world_size(nproc)
            from labkit.torch.launch import run_local

            log = run_local(config, nproc)
        else:
            log = run_training(config)
    except Preempted as e:
        print(f"labkit train: {e}; run the same command again to resume")
        return PREEMPTED_EXIT_CODE
    except ParameterError as e:  # a setting this machine or engine cannot run (found on start-up)
        print(f"labkit train: {e}")
        return 2
    summary = log.to_dict()["summary"]
    print(f"labkit train: {summary.get('num_steps', 0)} steps, final loss {summary.get('final_loss')}")
    return 0
