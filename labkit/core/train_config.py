"""`TrainConfig`: everything one training run needs, and its one command-line form.

Both engines (`labkit.torch.trainer.fit`, `labkit.tf.engine.fit`) take this config and write the
same metrics schema (`labkit.core.metrics`), so a notebook compares frameworks through one API.

Each field carries its help text (and its choices, where it has them) beside its default, so the
`labkit train` flags are generated from the dataclass: a new field gets a flag, a help line and
its validation at once. `to_argv(config)` and `from_argv(argv)` are the one round trip between a
config and flags, used by local replicas and by Vertex job specs alike; `None` is written as
``none`` for fields whose default is not None (``--grad-clip none``) and left out otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from labkit.core.config import (
    SCALES,
    ParameterError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_path,
    check_str,
    parse_int,
)
from labkit.core.fingerprint import CHANGEABLE, parse_allowed
from labkit.core.gcs import aip_mount_paths
from labkit.core.models import MODEL_NAMES
from labkit.core.parallelism import Layout, check_config
from labkit.core.placement import DEVICES
from labkit.core.precisions import PRECISIONS, help_text, why_not_trains

FRAMEWORKS = ("torch", "tf")
# torch.compile's modes, and "tuned": CUDA graphs plus coordinate-descent tuning of the generated
# Triton kernels, without max-autotune's matmul search (which takes minutes and rarely beats cuBLAS).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune", "tuned")
# How several processes split the work (labkit.torch.parallel): data parallel (DDP), ZeRO stages
# 1-3, tensor parallel, pipeline parallel. Degrees and schedules: labkit.core.parallelism.
PARALLEL_MODES = ("ddp", "zero1", "zero2", "zero3", "tp", "pp")
SHARDING_BACKENDS = ("torch", "deepspeed")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
GRAD_COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
# How checkpoints are written (labkit.torch.state): each mode's own format, or every rank's shards
# through torch.distributed.checkpoint (labkit.torch.dcp), which a run of another size can load.
CHECKPOINT_FORMATS = ("auto", "dcp")
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a process killed by SIGTERM reports
# Characters W&B refuses in a project name (wandb/sdk/wandb_settings.py, validate_project, in
# https://github.com/wandb/wandb, read 2026-11-29).
WANDB_PROJECT_FORBIDDEN = "/\\#?%:"


class Preempted(Exception):
    """Raised by an engine after it checkpointed in response to SIGTERM (or `preempt_at`), or
    to Ctrl-C (`reason` then says so)."""

    def __init__(self, step: int, reason: str = "SIGTERM", saved: bool = True):
        self.step = step
        self.reason = reason
        self.saved = saved
        what = "preempted" if reason == "SIGTERM" else f"stopped by {reason}"
        state = "state checkpointed" if saved else "nothing saved (no checkpoint_dir)"
        super().__init__(f"{what} during step {step}; {state}")


@contextlib.contextmanager
def metrics_file(config: TrainConfig, prefix: str) -> Iterator[TrainConfig]:
    """`config` as it is when it names its metrics file; otherwise with one in a temporary folder
    (`prefix`) that lives as long as the `with` block: a local multi-process run reads rank 0's
    metrics back and leaves nothing behind."""
    if config.metrics_out is not None:
        yield config
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield replace(config, metrics_out=os.path.join(tmp, "metrics.json"))


def finished_replicas_log(metrics_out: str, exit_codes: list[int], reason: str = "SIGTERM"):
    """Rank 0's MetricsLog after every replica of a local multi-process run has exited 0 or 143;
    raises `Preempted` (for `reason`) at the last recorded step when they checkpointed and
    exited 143."""
    from labkit.core.metrics import MetricsLog

    log = MetricsLog.read(metrics_out)
    if PREEMPTED_EXIT_CODE in exit_codes:
        raise Preempted(log.steps[-1]["step"] if log.steps else -1, reason)
    return log


def stop_reason(signum: int | None, timed_out: bool = False, timeout_s: float | None = None) -> str:
    """How a launcher's stop reads in messages: the signal it passed on, or its timeout."""
    import signal

    if timed_out:
        return f"--timeout {timeout_s:g}s"
    return "Ctrl-C (SIGINT)" if signum == signal.SIGINT else "SIGTERM"


def _opt(default: Any, help: str, choices: tuple[Any, ...] | None = None) -> Any:
    """A field with its help text (and choices) kept beside its default."""
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class TrainConfig:
    """Everything one run needs. `batch_size` is the GLOBAL batch of one optimizer step: summed
    over all replicas and all gradient-accumulation micro-steps (per-replica micro-batch =
    batch_size / (world_size * grad_accum)), so changing the replica count keeps the maths."""

    framework: str = _opt("torch", "training engine", FRAMEWORKS)
    model: str = _opt("cnn", "model family; sizes come from --scale", MODEL_NAMES)
    scale: str = _opt("smoke", "model/data sizes: smoke (CPU, seconds), full (GPU: ResNet-50, "
                      "GPT-2 small); auto picks", SCALES)
    steps: int = _opt(20, "total optimizer steps of the run (a resumed run finishes the remaining ones)")
    batch_size: int = _opt(32, "GLOBAL batch per optimizer step, over all replicas and accumulation "
                           "micro-steps")
    grad_accum: int = _opt(1, "micro-steps per optimizer step (gradients all-reduced on the last one only)")
    lr: float = _opt(1e-3, "peak learning rate (AdamW)")
    warmup_steps: int = _opt(0, "linear LR warm-up steps")
    scale_lr_with_world_size: bool = _opt(False, "multiply the LR by the number of replicas "
                                          "(linear scaling rule)")
    precision: str = _opt("fp32", help_text(), PRECISIONS)
    channels_last: bool = _opt(False, "NHWC memory format for conv nets (tensor-core friendly)")
    compile: bool = _opt(False, "torch.compile the model (TensorFlow: XLA jit_compile)")
    compile_mode: str = _opt("default", "torch.compile mode with --compile (torch): default, "
                             "reduce-overhead (CUDA graphs), max-autotune(-no-cudagraphs), tuned "
                             "(CUDA graphs + Triton kernel tuning)", COMPILE_MODES)
    # GPT with bf16 on an fp8 GPU (Hopper, Ada): the output projection and the loss run as one
    # function whose three matmuls use fp8 tensor cores (labkit.torch.fp8).
    fp8_head: bool = _opt(False, "GPT + bf16: output projection and loss with fp8 matmuls (fastest "
                          "on Hopper/Ada; torch only)")
    # After a few normal steps, the whole optimizer step (every micro-step's forward and backward,
    # clipping, AdamW) is captured as one CUDA graph and replayed (labkit.torch.step_graph).
    cuda_graph_step: bool = _opt(False, "CUDA, one process: replay the whole step (forward, backward, "
                                 "optimizer) as one CUDA graph after 3 normal steps (torch only; not "
                                 "with fp16)")
    activation_checkpointing: bool = _opt(False, "recompute block activations in the backward pass "
                                          "(less memory, more time)")
    grad_clip: float | None = _opt(1.0, "clip the global gradient norm to this value (none or 0: no "
                                   "clipping)")
    seed: int = _opt(0, "seed of weights and data order")
    num_samples: int | None = _opt(None, "synthetic dataset size (default: max(4096, 64 x batch))")
    # Samples of the same source the run never trains on (labkit.data.synthetic.held_out): their
    # loss after the last step (and at each checkpoint of a tuning trial that optimises it) is
    # the metrics' `heldout_loss`. Throughput ladders set 0: a smoke CPU run pays about a second.
    eval_samples: int = _opt(256, "held-out samples whose loss is measured after the last step "
                             "(0: none)")
    # Input pipeline knobs: loader worker processes, pinned host memory, and an injected per-batch
    # input latency (remote storage / decode cost) for building input-bound runs.
    num_workers: int = _opt(0, "DataLoader worker processes")
    pin_memory: bool = _opt(False, "page-locked host batches for faster host-to-device copies (CUDA)")
    input_latency_ms: float = _opt(0.0, "injected delay per batch in the input pipeline (emulates "
                                   "slow storage)")
    checkpoint_dir: str | None = _opt(None, "full-state checkpoints here (local path, gs://, /gcs/); "
                                      "resumes from the newest committed step (defaults to "
                                      "$AIP_CHECKPOINT_DIR on Vertex AI)")
    checkpoint_every: int = _opt(0, "checkpoint every K steps (0: only at the end and on SIGTERM)")
    # Old steps are deleted once a newer one is committed, so a long run cannot fill the disk;
    # more than one is kept so a resume can fall back past a step that turns out corrupt.
    keep_checkpoints: int = _opt(3, "keep the newest K committed checkpoints, delete older ones (0: "
                                 "keep all)")
    checkpoint_format: str = _opt("auto", "auto: the full state from rank 0 (ddp, zero1) or one file per "
                                  "rank (other --parallel modes; resumed by the same layout); dcp: "
                                  "torch.distributed.checkpoint, each rank writes its shards, resumable "
                                  "on another number of processes (torch, --parallel ddp or zero3)",
                                  CHECKPOINT_FORMATS)
    metrics_out: str | None = _opt(None, "per-step metrics JSON file written by rank 0")
    tensorboard_dir: str | None = _opt(None, "TensorBoard event files, rank 0 (defaults to "
                                       "$AIP_TENSORBOARD_LOG_DIR on Vertex AI)")
    preempt_at: int | None = _opt(None, "preemption drill: SIGTERM to itself during this step, "
                                  "checkpoint, exit 143 (needs --checkpoint-dir)")
    # A resume under settings other than the checkpoint's is refused unless each changed field
    # is named here (labkit.core.fingerprint says what each change does).
    allow_resume_change: str | None = _opt(None, "resume a checkpoint written with other settings, "
                                           "allowing these fields to differ (comma-separated: "
                                           + ", ".join(CHANGEABLE) + ")")
    device: str = _opt("auto", "auto: CUDA when available, else CPU", DEVICES)
    progress: bool = _opt(True, "progress bar on rank 0")
    # Off unless named here (labkit.core.wandb_scalars): W&B's own variables (WANDB_MODE,
    # WANDB_ENTITY, WANDB_DIR) then apply; an exported WANDB_PROJECT alone switches nothing on.
    wandb_project: str | None = _opt(None, "also send the run's scalars (the TensorBoard ones) to "
                                     "this Weights & Biases project, from rank 0 (needs the wandb "
                                     "extra; WANDB_MODE=offline keeps the run on disk)")
    # Several processes (torch): how they split the model and the work.
    parallel: str = _opt("ddp", "how processes split the work: ddp (replicas), zero1 (optimizer "
                         "state sharded), zero2 (+ gradients), zero3 (+ parameters), tp (tensor "
                         "parallel), pp (pipeline parallel)", PARALLEL_MODES)
    sharding_backend: str = _opt("torch", "zero1-3 through torch (ZeroRedundancyOptimizer, labkit's "
                                 "ZeRO-2, FSDP2) or deepspeed (deepspeed.initialize)",
                                 SHARDING_BACKENDS)
    reshard_after_forward: bool = _opt(True, "zero3 (torch): free the gathered parameters after "
                                       "each block's forward and gather them again for backward "
                                       "(less memory, one more all-gather)")
    tp_degree: int | None = _opt(None, "tp: processes per tensor-parallel group (default: all; the "
                                 "rest data-parallel)")
    pp_degree: int | None = _opt(None, "pp: pipeline stages (default: all processes; the rest "
                                 "data-parallel)")
    microbatches: int = _opt(4, "pp: micro-batches per replica batch")
    pp_schedule: str = _opt("1f1b", "pp: pipeline schedule", PIPELINE_SCHEDULES)
    grad_compression: str = _opt("none", "ddp: compress the gradient all-reduce (torch comm hooks)",
                                 GRAD_COMPRESSIONS)
    powersgd_rank: int = _opt(1, "--grad-compression powersgd: rank of the low-rank approximation")

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
        if problem := why_not_trains(self.precision, self.framework, self.model):
            raise ParameterError("precision", self.precision, problem)
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
        check_int("eval_samples", self.eval_samples, minimum=0)
        check_int("num_workers", self.num_workers, minimum=0)
        check_bool("pin_memory", self.pin_memory)
        check_float("input_latency_ms", self.input_latency_ms, minimum=0.0)
        check_int("checkpoint_every", self.checkpoint_every, minimum=0)
        check_int("keep_checkpoints", self.keep_checkpoints, minimum=0)
        for name in ("checkpoint_dir", "tensorboard_dir"):
            check_path(name, getattr(self, name))
        check_path("metrics_out", self.metrics_out, file=True)
        check_int("preempt_at", self.preempt_at, minimum=0, allow_none=True)
        if self.preempt_at is not None and self.preempt_at >= self.steps:
            raise ParameterError("preempt_at", self.preempt_at,
                                 f"must be below steps={self.steps}: the drill stops the run during "
                                 f"that step, and steps 0..{self.steps - 1} are all there is")
        parse_allowed(self.allow_resume_change)
        check_choice("device", self.device, DEVICES)
        check_bool("progress", self.progress)
        self._check_wandb_project()
        self._check_parallel()

    def _check_wandb_project(self) -> None:
        """W&B's own rule for a project name (wandb's Settings.validate_project: at most 128
        characters, none of / \\ # ? % :), checked before a job starts rather than at its first
        step; the entity goes in WANDB_ENTITY, not before a slash."""
        name = self.wandb_project
        if name is None:
            return
        check_str("wandb_project", name)
        bad = sorted(set(name) & set(WANDB_PROJECT_FORBIDDEN))
        if bad or len(name) > 128 or not name.strip():
            raise ParameterError("wandb_project", name,
                                 f"is not a W&B project name: at most 128 characters, none of "
                                 f"{' '.join(WANDB_PROJECT_FORBIDDEN)} (set WANDB_ENTITY for the entity)")

    def _check_parallel(self) -> None:
        check_choice("parallel", self.parallel, PARALLEL_MODES)
        check_choice("sharding_backend", self.sharding_backend, SHARDING_BACKENDS)
        check_bool("reshard_after_forward", self.reshard_after_forward)
        check_int("tp_degree", self.tp_degree, minimum=1, allow_none=True)
        check_int("pp_degree", self.pp_degree, minimum=1, allow_none=True)
        check_int("microbatches", self.microbatches, minimum=1)
        check_choice("pp_schedule", self.pp_schedule, PIPELINE_SCHEDULES)
        check_choice("grad_compression", self.grad_compression, GRAD_COMPRESSIONS)
        check_int("powersgd_rank", self.powersgd_rank, minimum=1)
        check_config(self)
        check_choice("checkpoint_format", self.checkpoint_format, CHECKPOINT_FORMATS)
        if self.checkpoint_format == "dcp" and (self.framework != "torch" or self.parallel not in ("ddp", "zero3")
                                                or self.sharding_backend != "torch" or self.cuda_graph_step):
            raise ParameterError("checkpoint_format", "dcp", "saves the torch engine's --parallel ddp or zero3 "
                                 f"state (sharding backend torch, no --cuda-graph-step); got --framework "
                                 f"{self.framework} --parallel {self.parallel} --sharding-backend "
                                 f"{self.sharding_backend}" + (" --cuda-graph-step" if self.cuda_graph_step else ""))

    def check_world_size(self, world_size: int) -> None:
        """Refuse settings that need a single process, for a run of `world_size` replicas (the
        launcher checks before starting any; the engine checks again in each replica)."""
        if self.cuda_graph_step and world_size > 1:
            raise ParameterError("cuda_graph_step", True,
                                 f"needs a single process (got {world_size}): DDP's gradient all-reduce "
                                 f"is driven from the host, outside any graph")
        Layout.of(self, world_size)  # degrees divide the processes, batches divide evenly

    def allowed_resume_changes(self) -> frozenset[str]:
        """The fingerprint fields a resume may change (`allow_resume_change`, parsed)."""
        return parse_allowed(self.allow_resume_change)

    def peak_lr(self, replicas: int) -> float:
        """The LR after warm-up for a run of `replicas` data-parallel replicas: `lr`, times the
        replica count under the linear scaling rule (`scale_lr_with_world_size`)."""
        return self.lr * (replicas if self.scale_lr_with_world_size else 1)

    def num_samples_or_default(self) -> int:
        """The synthetic dataset size: independent of `steps`, so extending a run keeps the data
        order of the steps already run (both engines use this rule)."""
        return self.num_samples or max(4096, 64 * self.batch_size)


def with_vertex_dirs(config: TrainConfig, env: Mapping[str, str] | None = None) -> TrainConfig:
    """Fill unset checkpoint / TensorBoard folders from the variables Vertex AI sets when a job
    has a base output directory (AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR), so a restarted
    Spot job resumes without extra flags. Vertex gives them as ``gs://`` addresses; they are
    used through the job's ``/gcs/`` mount (`labkit.core.gcs.aip_mount_paths`), which needs
    neither gcsfs nor TensorFlow in the image. Explicit settings always win. Both engines apply
    it when a run starts."""
    folders = aip_mount_paths(env)
    updates = {}
    if config.checkpoint_dir is None and folders.get("AIP_CHECKPOINT_DIR"):
        updates["checkpoint_dir"] = folders["AIP_CHECKPOINT_DIR"]
    if config.tensorboard_dir is None and folders.get("AIP_TENSORBOARD_LOG_DIR"):
        updates["tensorboard_dir"] = folders["AIP_TENSORBOARD_LOG_DIR"]
    return replace(config, **updates) if updates else config


# ---------------------------------------------------------------- the command-line form

def flag(name: str) -> str:
    """`grad_clip` -> `--grad-clip`."""
    return "--" + name.replace("_", "-")


def _field_types() -> dict[str, tuple[type, bool]]:
    """Field name -> (value type, whether None is allowed), from the annotations."""
    out = {}
    for name, hint in typing.get_type_hints(TrainConfig).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        out[name] = (args[0], True) if args else (hint, False)
    return out


def _parser_of(kind: type):
    """How a flag of this type reads its text: integers through `parse_int`, which also takes
    Vertex AI's ``32.0`` for a tuned DISCRETE value."""
    return parse_int if kind is int else kind


def _none_or(kind: type):
    """An argparse type that reads `none` as None (for fields whose default is not None)."""
    read = _parser_of(kind)

    def parse(text: str):
        return None if text.strip().lower() == "none" else read(text)

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, with its help, default and choices."""
    types = _field_types()
    for f in fields(TrainConfig):
        kind, optional = types[f.name]
        help_text, choices = f.metadata["help"], f.metadata["choices"]
        if kind is bool:
            parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
            continue
        parse = (_none_or(kind) if optional and f.default is not None and kind is not str
                 else _parser_of(kind))
        shown = f" (default: {f.default})" if f.default is not None else ""
        parser.add_argument(flag(f.name), type=parse, default=f.default, choices=choices,
                            help=help_text + shown)


def from_namespace(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed `add_arguments` flags (validated: ParameterError names a field)."""
    return TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})


def from_argv(argv: list[str]) -> TrainConfig:
    """`to_argv`'s inverse: the TrainConfig that `labkit train argv...` runs."""
    parser = argparse.ArgumentParser(prog="labkit train", exit_on_error=False)
    add_arguments(parser)
    return from_namespace(parser.parse_args(argv))


def to_argv(config: TrainConfig, *, changed_only: bool = False) -> list[str]:
    """The `labkit train` flags that rebuild `config` exactly (`from_argv(to_argv(c)) == c`);
    `changed_only` leaves out fields at their default (shorter job specs)."""
    argv: list[str] = []
    for f in fields(TrainConfig):
        value = getattr(config, f.name)
        if changed_only and value == f.default:
            continue
        if isinstance(value, bool):
            argv.append(flag(f.name) if value else "--no-" + flag(f.name)[2:])
        elif value is None:
            if f.default is not None:
                argv += [flag(f.name), "none"]
        else:
            argv += [flag(f.name), repr(value) if isinstance(value, float) else str(value)]
    return argv
