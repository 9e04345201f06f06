"""What a PyTorch run is made of: `build(config, info, device)` → `Components`.

The trainer that runs them is `labkit.torch.trainer` (`Trainer`, `train_step`, `fit`); this
module builds the parts so benchmarks, notebooks and the batch finder reuse exactly what it
trains:

- `build`: the model (same seed, same weights on every replica), precision policy, the DDP wrap
  (`labkit.torch.parallel.ddp.wrap`: gloo on CPU, nccl on CUDA; with `grad_compression`, its
  communication hook), torch.compile of model and loss (`compile_mode` adds CUDA graphs
  and kernel tuning), fused AdamW on CUDA with decay on matrices only, the warm-up schedule, the
  GradScaler, and for every other `--parallel` mode (ZeRO 1-3, tensor and pipeline parallelism,
  DeepSpeed) its `labkit.torch.parallel.Strategy` (`labkit.torch.parallel.setup`);
- `resolve_device`: this process's device, by `labkit.core.placement`'s one rule;
- `to_device`, `loss_fn`, `scheduled_lr`, `heldout_loss` (the mean loss on samples the run never
  trained on), `micro_batch_size`, and `OutOfDeviceMemory` (the one line a run that does not fit
  its GPU ends with).

One optimizer step = `grad_accum` micro-steps on every replica; `config.batch_size` is the global
batch of that step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from labkit.core import placement
from labkit.core.config import ParameterError, resolve_scale
from labkit.core.models import GPTConfig, ModelConfig, build_config
from labkit.core.parallelism import Layout
from labkit.core.schedule import WarmupThenConstant
from labkit.core.train_config import TrainConfig
from labkit.data import synthetic
from labkit.torch import distributed, fp8, speed
from labkit.torch.data import to_float_images
from labkit.torch.models import build_model
from labkit.torch.parallel import ddp
from labkit.torch.parallel.base import Strategy
from labkit.torch.precision import PrecisionPolicy, apply_matmul_precision
from labkit.torch.step_graph import StepGraph


def resolve_device(choice: str, info: distributed.DistInfo) -> torch.device:
    """This process's device under `labkit.core.placement.place` (the one rule: one process per
    GPU with NCCL, else every process of the machine on the CPU with gloo; `cuda` refused
    without enough GPUs), for the processes this machine runs."""
    where = placement.place_here(info.local_world_size, device=choice)
    return torch.device(where.device_for(info.local_rank))


class OutOfDeviceMemory(ParameterError):
    """A run did not fit its GPU's memory: one line naming the batch and the GPU's memory (the
    caught out-of-memory error is its cause; the memory it held is released first, so a notebook's
    kernel carries on)."""

    @classmethod
    def of(cls, config: TrainConfig, device: torch.device, info: distributed.DistInfo) -> OutOfDeviceMemory:
        props = torch.cuda.get_device_properties(device)
        micro = config.batch_size // max(1, info.world_size * config.grad_accum)
        return cls("batch_size", config.batch_size,
                   f"does not fit in the memory of {props.name} ({props.total_memory / 2**30:.1f} GiB) "
                   f"with model {config.model!r} at scale {config.scale!r}, precision {config.precision} "
                   f"({micro} samples per micro-step): use a smaller batch_size, grad_accum, bf16 or "
                   f"activation_checkpointing")


def release_device_memory(error: BaseException) -> BaseException:
    """Drop what the failed run held on the GPU (its frames hold tensors until collected)."""
    import gc

    error.__traceback__ = None
    gc.collect()
    torch.cuda.empty_cache()
    return error


def micro_batch_size(config: TrainConfig, world_size: int) -> int:
    """Per-replica micro-batch: global batch / (replicas × accumulation steps), exactly."""
    parts = world_size * config.grad_accum
    if config.batch_size % parts:
        raise ParameterError("batch_size", config.batch_size,
                             f"must be divisible by world_size × grad_accum = {world_size} × "
                             f"{config.grad_accum}")
    return config.batch_size // parts


@dataclass
class Components:
    """What one run is made of; `model` is the unwrapped module (for state), `forward_model` the
    DDP/compiled wrapper that the step calls."""

    model: nn.Module
    forward_model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    policy: PrecisionPolicy
    device: torch.device
    info: distributed.DistInfo
    model_config: ModelConfig
    compute_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    cuda_graphs: bool = False
    # `cuda_graph_step`: the optimizer step, replayed as one CUDA graph (made by the first step:
    # `labkit.torch.trainer.train_step`)
    cuda_graph_step: bool = False
    step_graph: StepGraph | None = None
    # --parallel other than ddp: the mode's model, optimizer, step and sharded state
    strategy: Strategy | None = None
    layout: Layout = field(default_factory=Layout)
    # bytes of parameters, gradients and optimizer state this rank held at its last update
    held: dict[str, int] | None = None
    # the DDP compression hook's state (PowerSGD's error feedback), checkpointed per rank
    comm_state: Any = None


def build(config: TrainConfig, info: distributed.DistInfo, device: torch.device,
          model_config: ModelConfig | None = None) -> Components:
    """Model, optimizer, schedule and scaler for `config` on `device` (no data, no loop), so
    benchmarks and the batch finder reuse exactly what `fit` trains."""
    if config.fp8_head and device.type == "cuda" and not fp8.supported(device):
        major, minor = torch.cuda.get_device_capability(device)
        raise ParameterError("fp8_head", True,
                             f"needs fp8 tensor cores (compute capability 8.9+: L4, H100, H200); "
                             f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
    if config.cuda_graph_step and device.type != "cuda":
        raise ParameterError("cuda_graph_step", True, f"needs a CUDA GPU (this run is on {device.type})")
    config.check_world_size(info.world_size)
    layout = Layout.of(config, info.world_size)
    policy = PrecisionPolicy.for_mode(config.precision, device.type)
    apply_matmul_precision(policy)
    model_config = model_config or build_config(config.model, resolve_scale(config.scale))
    layout.check_model(model_config)
    torch.manual_seed(config.seed)  # same initial weights on every replica and every run
    model = build_model(model_config, activation_checkpointing=config.activation_checkpointing)
    model = model.to(device)
    model = policy.prepare_model(model, device)  # what the precision changes in the model (fp8: its Linears)
    if config.channels_last and not isinstance(model_config, GPTConfig):
        model = model.to(memory_format=torch.channels_last)
    if layout.mode not in ("ddp", "zero1") or config.sharding_backend == "deepspeed":
        return _build_sharded(config, info, device, model_config, model, policy, layout)
    forward_model: nn.Module = model
    state_ = None
    if info.distributed:
        forward_model, state_ = ddp.wrap(model, device, config)
    loss_of_logits: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_fn
    if config.compile:
        # The loss is compiled too: eager, the cross-entropy over GPT-2's 50304-wide logits
        # cost a third of the step on an H100 (fp32 copies, unfused softmax forward and backward).
        # The step graph captures Inductor's kernels itself: no CUDA graphs inside it.
        cudagraphs = not config.cuda_graph_step
        forward_model = compile_(forward_model, config.compile_mode, cudagraphs)
        loss_of_logits = compile_(loss_fn, config.compile_mode, cudagraphs)
    lr = config.peak_lr(layout.dp)
    groups = _param_groups(model)
    fused = device.type == "cuda"
    chosen = None
    if layout.mode == "zero1":
        from labkit.torch.parallel.zero import Zero1

        optimizer = Zero1.optimizer_for(groups, lr, foreach=not fused)
        chosen = Zero1(layout, info.rank, model, optimizer)
    else:
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused or None,
                                      foreach=None if fused else True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupThenConstant(config.warmup_steps))
    def compute_loss(x, y):
        return loss_of_logits(forward_model(x), y)

    if config.fp8_head:  # GPT: output projection + loss in one fp8 function
        compute_loss = speed.fp8_head_loss(model, forward_model)
    return Components(model, forward_model, optimizer, scheduler, policy.make_scaler(), policy,
                      device, info, model_config, compute_loss,
                      cuda_graphs=(config.compile and device.type == "cuda" and not config.cuda_graph_step
                                   and uses_cuda_graphs(config.compile_mode)),
                      cuda_graph_step=config.cuda_graph_step, strategy=chosen, layout=layout,
                      comm_state=state_)


def _param_groups(model: nn.Module) -> list[dict]:
    """AdamW's groups: weight decay on matrices and embeddings, not on biases and norm scales."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def _build_sharded(config: TrainConfig, info: distributed.DistInfo, device: torch.device,
                   model_config: ModelConfig, model: nn.Module, policy: PrecisionPolicy,
                   layout: Layout) -> Components:
    """Components of a run whose step is its strategy's (zero2, zero3, tp, pp; any DeepSpeed stage)."""
    lr = config.peak_lr(layout.dp)
    if config.sharding_backend == "deepspeed":
        from labkit.torch.parallel.deepspeed import DeepSpeedZero

        strategy: Strategy = DeepSpeedZero(config, layout, info.rank, model,
                                                    _param_groups(model), lr)
    else:
        from labkit.torch.parallel import setup

        strategy = setup(config, layout, info.rank, model, _param_groups(model), lr, device)
    forward_model = strategy.model

    def compute_loss(x, y):
        return loss_fn(forward_model(x), y)

    scheduler = torch.optim.lr_scheduler.LambdaLR(strategy.optimizer, WarmupThenConstant(config.warmup_steps))
    return Components(strategy.model, forward_model, strategy.optimizer, scheduler, policy.make_scaler(),
                      policy, device, info, model_config, compute_loss, strategy=strategy, layout=layout)


def compile_options(mode: str, cudagraphs: bool = True) -> dict[str, bool]:
    """Inductor options of a `TrainConfig.compile_mode` (torch's modes, plus labkit's "tuned");
    `cudagraphs=False` drops the mode's CUDA graphs and keeps the rest (kernel tuning)."""
    if mode == "tuned":
        options = {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
    else:
        from torch._inductor import list_mode_options

        options = dict(list_mode_options(mode))
    if not cudagraphs:
        options.pop("triton.cudagraphs", None)
    return options


def uses_cuda_graphs(mode: str) -> bool:
    return bool(compile_options(mode).get("triton.cudagraphs"))


def compile_(fn, mode: str = "default", cudagraphs: bool = True):
    """torch.compile with static shapes (a run has one batch shape; dynamic-shape kernels are
    slower) and the options of `mode` (without its CUDA graphs if `cudagraphs` is False)."""
    return torch.compile(fn, dynamic=False, options=compile_options(mode, cudagraphs) or None)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def to_device(batch, c: Components, channels_last: bool):
    x, y = batch
    x = to_float_images(x.to(c.device, non_blocking=True))
    y = y.to(c.device, non_blocking=True)
    if channels_last and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y


def scheduled_lr(c: Components) -> float:
    """The learning rate of the next step (the schedule's value, read without touching the device:
    under `cuda_graph_step` the optimizer holds it as a device tensor)."""
    return c.scheduler.base_lrs[0] * c.scheduler.lr_lambdas[0](c.scheduler.last_epoch)


@torch.no_grad()
def heldout_loss(config: TrainConfig, c: Components, micro_batch: int) -> dict:
    """`{"heldout": {"loss", "samples", "chance"}}`: the mean loss on `config.eval_samples`
    samples the run never trained on (`synthetic.held_out`), in eval mode, in batches of the
    run's micro-batch. Every process computes it on the same samples: a sharded model's forward
    needs all ranks, and a replica's copy gives the same answer. {} without evaluation, and for
    a pipeline (each stage holds part of the model; its forward is the schedule's)."""
    if not config.eval_samples or c.layout.mode == "pp":
        return {}
    batches = synthetic.held_out_batches(c.model_config, config.num_samples_or_default(), config.seed,
                                         config.eval_samples, micro_batch)
    # Replicas (DDP, ZeRO-1) hold the whole model: its plain module, without DDP or compilation.
    model = c.model if c.strategy is None or c.layout.mode == "zero1" else c.forward_model
    was_training = c.model.training
    c.model.eval()
    total = torch.zeros((), device=c.device)
    try:
        for inputs, targets in batches:
            if inputs.ndim == 4:  # images: HWC as generated, NCHW as the model takes them
                inputs = np.ascontiguousarray(inputs.transpose(0, 3, 1, 2))
            x, y = to_device((torch.from_numpy(inputs), torch.from_numpy(targets)), c, config.channels_last)
            with c.policy.autocast():
                loss = model(x, y) if config.fp8_head else loss_fn(model(x), y)
            total += loss.float() * len(y)
    finally:
        c.model.train(was_training)
    return synthetic.heldout_record(total.item() / config.eval_samples, config.eval_samples, c.model_config)
