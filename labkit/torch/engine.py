"""The PyTorch training engine: `fit(config, on_step=None)`, driven by `labkit.core.loop`.

Where things are, for a first read of this file:

- the DDP wrap: `build` (`DistributedDataParallel(model, ...)`, its gradient hook registered
  beside it); the sharded modes' wrapping: `labkit.torch.parallel.setup`;
- the step, top to bottom: `train_step` → `_update`: forward, loss and backward of each
  micro-batch (`no_sync` on all but the last under DDP), the gradient reduction (DDP's in the
  last backward, through `labkit.torch.agreement`'s hook, or the sharded mode's
  `reduce_gradients`), clipping, the optimizer step, the LR schedule;
- the agreement on loss and stop across ranks: `agree` (under DDP the two numbers rode on the
  gradient all-reduce);
- the commit marker of a checkpoint: `labkit.torch.state.Saver` (rank 0, after a barrier) →
  `labkit.core.checkpoint.commit`.

One optimizer step = `grad_accum` micro-steps on every replica; `config.batch_size` is the global
batch of that step. Features switch on one at a time from `TrainConfig`: precision (fp32, tf32,
bf16, fp16 + GradScaler), channels_last, torch.compile (model and loss; `compile_mode` adds CUDA
graphs and kernel tuning), the whole step as one CUDA graph (`cuda_graph_step`), the fp8 output
head for GPT, fused AdamW (CUDA), accumulation with
`no_sync` on all but the last micro-step, clipping, activation checkpointing, LR warm-up and
world-size scaling, DDP (gloo on CPU, nccl on CUDA) with optional gradient compression
(`labkit.torch.compression`), and the other `--parallel` modes (ZeRO 1-3, tensor and pipeline
parallelism, DeepSpeed: `labkit.torch.parallel`), which supply the stages of the step they do
their own way (`labkit.torch.strategy.Strategy`). With several
processes the metrics `run` section records `parallel`, `memory_per_rank` (bytes of parameters,
gradients at the update and optimizer state this rank held) and `comm_bytes_per_step` (bytes it
sent, counted from its collectives on two steps: `labkit.torch.comm_count`). DDP checkpoints are
gathered (rank 0 writes model and optimizer); every other mode's are sharded (each rank writes
what it holds: `labkit.torch.state.ShardedSaver`).

The cadence around the steps (when to checkpoint, the preemption drill, metrics, TensorBoard,
progress, the non-finite loss check) is `labkit.core.loop`, shared with the TF engine; this
module hands it the torch parts (`_loop_engine`): micro-batches placed on the device, the
dispatched step (`train_step`), its loss read back and agreed (`agree`; on one GPU one step
late), the LR, and checkpoints through `labkit.torch.state` (written in the background once
copied to the host, under the folder's lease, with the run's fingerprint). MFU is against a
GEMM measured on this device (`labkit.torch.peak`). A resumed run continues bit for bit on CPU;
one resumed under other settings is refused unless `allow_resume_change` names them
(`labkit.core.fingerprint`).

Building blocks are public so benchmarks and notebooks reuse exactly what `fit` trains:
`build(config, info, device)` → `Components` (whose `compute_loss(x, y)` is the forward pass and
loss, compiled when asked), `to_device`, `train_step(components, micro_batches, grad_clip)`.
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.core import host_memory, loop, placement
from labkit.core.config import ParameterError, resolve_scale
from labkit.core.fingerprint import Resume
from labkit.core.lease import Lease
from labkit.core.loop import StepCallback
from labkit.core.metrics import MetricsLog
from labkit.core.models import GPTConfig, ModelConfig, build_config, flops_per_sample
from labkit.core.parallelism import Layout, pipeline_bubble
from labkit.core.schedule import WarmupThenConstant
from labkit.core.train_config import Preempted, TrainConfig, with_vertex_dirs
from labkit.data import synthetic
from labkit.torch import compression, distributed, fp8, gpu_samples, peak, state
from labkit.torch.agreement import StepAgreement
from labkit.torch.comm_count import CommCounter
from labkit.torch.data import DataPosition, ResumableLoader, make_dataset, to_float_images
from labkit.torch.models import build_model, count_parameters
from labkit.torch.precision import PrecisionPolicy, apply_matmul_precision
from labkit.torch.step_graph import StepGraph
from labkit.torch.strategy import Strategy, held_bytes


def resolve_device(choice: str, info: distributed.DistInfo) -> torch.device:
    """This process's device under `labkit.core.placement.place` (the one rule: one process per
    GPU with NCCL, else every process of the machine on the CPU with gloo; `cuda` refused
    without enough GPUs), for the processes this machine runs."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    where = placement.place(info.local_world_size, gpus, device=choice)
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


def _released(error: BaseException) -> BaseException:
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
    # DDP: the replicas' loss and stop flag travel with the last gradient bucket
    agreement: StepAgreement | None = None
    # `cuda_graph_step`: the optimizer step, replayed as one CUDA graph (set by `build`)
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
    if config.fp8_head:
        model.fp8_head = True  # GPT: output projection + loss in one fp8 function
    if config.channels_last and not isinstance(model_config, GPTConfig):
        model = model.to(memory_format=torch.channels_last)
    if layout.mode not in ("ddp", "zero1") or config.sharding_backend == "deepspeed":
        return _build_sharded(config, info, device, model_config, model, policy, layout)
    forward_model: nn.Module = model
    agreement = None
    state_ = None
    if info.distributed:
        forward_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                            gradient_as_bucket_view=True)
        agreement = StepAgreement()
        if config.grad_compression == "none":
            forward_model.register_comm_hook(None, agreement.hook)
        else:  # the compression hook reduces the gradients; the agreement rides on the last bucket
            inner, state_ = compression.hook(config.grad_compression, config.powersgd_rank, device.type)
            forward_model.register_comm_hook(state_, agreement.around(inner))
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
        from labkit.torch.parallel import Zero1

        optimizer = Zero1.optimizer_for(groups, lr, foreach=not fused)
        chosen = Zero1(layout, info.rank, model, optimizer)
    else:
        optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), fused=fused or None,
                                      foreach=None if fused else True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupThenConstant(config.warmup_steps))
    if config.fp8_head:
        def compute_loss(x, y):
            return forward_model(x, y)  # the model returns the loss itself
    else:
        def compute_loss(x, y):
            return loss_of_logits(forward_model(x), y)
    c = Components(model, forward_model, optimizer, scheduler, policy.make_scaler(), policy,
                   device, info, model_config, compute_loss,
                   cuda_graphs=(config.compile and device.type == "cuda" and not config.cuda_graph_step
                                and uses_cuda_graphs(config.compile_mode)),
                   agreement=agreement, strategy=chosen, layout=layout, comm_state=state_)
    if config.cuda_graph_step:
        c.step_graph = StepGraph(lambda batches, grad_clip: _update(c, batches, grad_clip, graphed=True)[0],
                                 optimizer, device)
    return c


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
        from labkit.torch.deepspeed_zero import DeepSpeedZero

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


def train_step(c: Components, micro_batches, grad_clip: float | None,
               stop_requested: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over already-placed micro-batches, then the LR schedule's step.
    Returns (mean loss, a 0-dim tensor that is 1 when fp16 overflow skipped the update, or None
    without a GradScaler), both still on the device: reading them is the caller's choice. Under
    DDP, this replica's loss and `stop_requested` ride on the gradient all-reduce (read back by
    `agree`). With `c.step_graph` the update is replayed as one CUDA graph."""
    if c.step_graph is not None:
        total, skipped = c.step_graph(micro_batches, grad_clip), None  # it zeroes gradients as it needs
    else:
        total, skipped = _update(c, micro_batches, grad_clip, stop_requested)
        if c.info.distributed:  # what this rank holds, gradients included, before they are freed
            c.held = c.strategy.held_bytes() if c.strategy is not None else \
                held_bytes(c.model, c.optimizer)
        c.optimizer.zero_grad(set_to_none=True)
    if c.scaler.is_enabled() or c.step_graph is not None:  # a skipped or replayed update: it warns
        with _quiet_scheduler_warning():
            c.scheduler.step()
    else:
        c.scheduler.step()
    return total, skipped


def _update(c: Components, micro_batches, grad_clip: float | None, stop_requested: bool = False,
            graphed: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The step, top to bottom: forward, loss and backward of each micro-batch, the gradient
    reduction over the replicas, clipping, the optimizer update. The part `StepGraph` captures
    (`graphed`), so it reads nothing on the host. `c.strategy` (zero2, zero3, tp, pp, DeepSpeed:
    `labkit.torch.parallel`) supplies the stages a sharded mode does its own way."""
    sharded = c.strategy if c.strategy is not None and c.strategy.reduces_gradients else None

    # 1. Forward, loss, backward. Each micro-batch's loss is divided by their number, so the
    #    gradients add up to the mean over the step's global batch.
    if sharded is not None and sharded.owns_forward_backward:  # a pipeline schedule, DeepSpeed
        total = sharded.forward_backward(micro_batches, c.policy.autocast)
    else:
        n = len(micro_batches)
        total = torch.zeros((), device=c.device)
        for k, (x, y) in enumerate(micro_batches):
            last = k == n - 1
            if c.cuda_graphs and k == 0:
                # A new step's replays may reuse the previous step's output memory: nothing from
                # it is held any more. Later micro-steps must not: their gradients accumulate.
                torch.compiler.cudagraph_mark_step_begin()
            with _sync_gradients_if(c, sharded, last):
                with c.policy.autocast(cache_enabled=not graphed):
                    loss = c.compute_loss(x, y)
                    if n > 1:
                        loss = loss / n
                total += loss.detach()
                if last and c.agreement is not None:
                    # DDP: this replica's loss and stop flag ride on the last gradient bucket's
                    # all-reduce (`labkit.torch.agreement`): no collective of their own.
                    c.agreement.offer(total, stop_requested)
                # DDP: the last micro-batch's backward all-reduces the gradients, bucket by
                # bucket, overlapping the rest of backward (the hook registered in `build`).
                c.scaler.scale(loss).backward()

    # 2. The gradient reduction of a sharded mode: zero2 reduce-scatters its flat gradients,
    #    tp and pp average over their data-parallel replicas (zero3's FSDP and DeepSpeed
    #    reduced them in backward). Without a strategy (and for zero1) DDP already did.
    if sharded is not None:
        sharded.reduce_gradients()

    # 3. Clipping to a global norm over the whole model (a sharded mode sums its ranks' squares).
    if grad_clip:
        if sharded is not None:
            sharded.clip(grad_clip)
        else:
            c.scaler.unscale_(c.optimizer)
            torch.nn.utils.clip_grad_norm_(c.model.parameters(), grad_clip)

    # 4. The optimizer step (fp16: the GradScaler's, which skips the update on overflow).
    skipped = None
    if sharded is not None:
        sharded.optimizer_step()  # zero2 all-gathers the updated slices; DeepSpeed's engine step
    elif c.scaler.is_enabled():
        before = c.scaler.get_scale()
        c.scaler.step(c.optimizer)
        c.scaler.update()
        skipped = torch.tensor(float(c.scaler.get_scale() < before))
    else:
        c.optimizer.step()
    return total, skipped


def _sync_gradients_if(c: Components, sharded: Strategy | None, last: bool):
    """The context of one micro-batch: gradients are reduced on the step's last micro-batch
    only, the others just accumulate (DDP's `no_sync`; FSDP's `set_requires_gradient_sync`)."""
    if sharded is not None:
        return sharded.gradient_sync(last)
    if last or not c.info.distributed:
        return contextlib.nullcontext()
    ddp = c.forward_model
    if not isinstance(ddp, DDP):
        ddp = getattr(ddp, "_orig_mod", ddp)  # compiled DDP
    return ddp.no_sync()


def agree(loss: torch.Tensor, stop: bool, info: distributed.DistInfo,
          agreement: StepAgreement | None = None,
          strategy: Strategy | None = None) -> tuple[float, bool]:
    """The end of a step: the mean loss over the replicas and whether any replica was asked to
    stop (every replica must checkpoint and leave at the same step). Under DDP that is what the
    step's gradient all-reduce carried (`train_step`), else one all-reduce of its own (a
    sharded mode's, which knows which ranks hold a loss). One process: the loss read back."""
    if not info.distributed:
        return float(loss.item()), stop
    if strategy is not None and strategy.reduces_gradients:
        return strategy.agree(loss, stop)
    agreed = agreement.take() if agreement is not None else None
    if agreed is not None:
        return agreed
    t = torch.stack([loss.detach().float(), torch.tensor(float(stop), device=loss.device)])
    dist.all_reduce(t)
    return float(t[0].item()) / info.world_size, bool(t[1].item() > 0)


def scheduled_lr(c: Components) -> float:
    """The learning rate of the next step (the schedule's value, read without touching the device:
    under `cuda_graph_step` the optimizer holds it as a device tensor)."""
    return c.scheduler.base_lrs[0] * c.scheduler.lr_lambdas[0](c.scheduler.last_epoch)


@contextlib.contextmanager
def _quiet_scheduler_warning():
    # A step skipped by the GradScaler makes the scheduler warn that it ran before the optimizer.
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
        yield


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # process peak RSS


def fit(config: TrainConfig, *, on_step: StepCallback | None = None,
        read_loss_late: bool | None = None) -> MetricsLog:
    """Train as configured; returns the MetricsLog (also written to `config.metrics_out` by rank
    0). Raises `labkit.core.train_config.Preempted` after checkpointing when SIGTERM arrives (or at
    `config.preempt_at`). `on_step(step, metrics_dict)` runs on every rank after each step (one
    step late when `read_loss_late`, the default on a single GPU: the loss of a step is read
    once the next step is queued, so the host never stalls the device)."""
    config = with_vertex_dirs(config)
    info = distributed.info_from_env()
    device = resolve_device(config.device, info)
    info = distributed.init(device.type, info)
    clean = False
    lease = None
    try:
        lease = state.claim(config, info)  # outputs writable, the checkpoint folder ours alone
        log = _fit(config, info, device, on_step, read_loss_late, lease)
        clean = True
        return log
    except torch.OutOfMemoryError as e:
        raise OutOfDeviceMemory.of(config, device, info) from _released(e)
    except Preempted:
        clean = True  # every rank agreed on the step to stop at, so all of them are here
        raise
    finally:
        if lease is not None:
            lease.release()
        # After a failure a peer may be gone: a barrier would wait for it until the timeout.
        distributed.shutdown(clean=clean)


def _fit(config: TrainConfig, info: distributed.DistInfo, device: torch.device,
         on_step: StepCallback | None, read_loss_late: bool | None,
         lease: Lease | None = None) -> MetricsLog:
    if device.type == "cpu":
        # Every step frees and allocates the same large tensors: keep them in the heap instead of
        # faulting in fresh pages each step (up to a fifth of a smoke-size step otherwise).
        host_memory.keep_freed_memory()
    c = build(config, info, device)
    data_rank, data_world = ((c.strategy.data_rank, c.strategy.data_world) if c.strategy is not None
                             else (info.rank, info.world_size))
    micro = micro_batch_size(config, data_world)
    start, position = 0, DataPosition()
    sharded = c.strategy is not None
    resume = Resume.of(config, world_size=info.world_size, model_config=c.model_config,
                       data=synthetic.source_name(c.model_config))
    if config.checkpoint_dir:
        restore = state.restore_sharded if sharded else state.restore
        start, position = restore(config.checkpoint_dir, c, info, resume) or (start, position)
    dataset = make_dataset(c.model_config, config.num_samples_or_default(), config.seed,
                           config.input_latency_ms / 1000.0)
    loader = ResumableLoader(dataset, micro, world_size=data_world, rank=data_rank,
                             seed=config.seed, num_workers=config.num_workers,
                             pin_memory=config.pin_memory and device.type == "cuda", position=position)
    throughput = loop.Throughput(
        config.batch_size, c.model_config.block_size if isinstance(c.model_config, GPTConfig) else None,
        flops_per_sample(c.model_config), peak.measured_peak_flops(device, c.policy.peak_dtype),
        devices=info.world_size)
    log = MetricsLog(run={"framework": "torch", "model": config.model, "config": asdict(config),
                          "world_size": info.world_size, "micro_batch": micro, "device": str(device),
                          "parameters": count_parameters(c.model),
                          "flops_per_sample": throughput.flops_per_sample,
                          "peak_flops": throughput.peak_flops,
                          "mfu_peak": peak.describe(device, c.policy.peak_dtype),
                          "parallel": _parallel_info(config, c.layout),
                          "resume_changes": resume.record() or None})
    saver_class = state.saver_class(config.checkpoint_format, sharded)
    saver = (saver_class(config.checkpoint_dir, info, fingerprint=resume.fingerprint, lease=lease,
                         keep=config.keep_checkpoints) if config.checkpoint_dir else None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    # On a single GPU the loss of step i is read after step i+1 is queued, so the host never
    # waits for the device between steps; elsewhere it is read at once.
    late = (device.type == "cuda" if read_loss_late is None else read_loss_late) and not info.distributed
    role = loop.ProcessRole(info.is_main, info.world_size, config.metrics_out if info.is_main else None)
    return loop.run(config, _loop_engine(config, c, loader, saver, start), log, start=start, role=role,
                    throughput=throughput, on_step=on_step, read_loss_late=late,
                    system=gpu_samples.sampler_for(device) if info.is_main else None)


def _parallel_info(config: TrainConfig, layout: Layout) -> dict:
    """The metrics `run` section's description of how the processes split the work."""
    out = {"mode": layout.mode, "dp": layout.dp, "tp": layout.tp, "pp": layout.pp}
    if layout.mode in ("zero1", "zero2", "zero3"):
        out["sharding_backend"] = config.sharding_backend
    if layout.mode == "zero3":
        out["reshard_after_forward"] = config.reshard_after_forward
    if layout.mode == "pp":
        out.update(microbatches=layout.microbatches, schedule=config.pp_schedule)
    if layout.mode == "ddp":
        out["grad_compression"] = config.grad_compression
        if config.grad_compression == "powersgd":
            out["powersgd_rank"] = config.powersgd_rank
    return out


class _StepComm:
    """Bytes this rank sends per step (its collectives counted while the step runs and its loss
    is agreed), and for a pipeline the share of each step's schedule its stage sat idle.

    Counting sees every operation of the step in Python (a dispatch mode), which slows a small
    CPU step by a third or more: only steps `counted` (indices within this run, default the
    third and fourth, past warm-ups such as PowerSGD's) are counted, so the others keep their
    true step time."""

    def __init__(self, c: Components, run_steps: int, start: int = 0):
        self.c = c
        self.counter = CommCounter() if c.info.distributed else None
        self.counted = {min(2, run_steps - 1), min(3, run_steps - 1)}
        self.first_step = start
        self.calls = 0
        self.sent: list[float] = []
        self.ops: dict | None = None
        self.bubbles: list[float] = []
        self._pipeline = c.strategy if hasattr(c.strategy, "busy_s") else None
        self._before = (0.0, 0.0)

    def counting(self):
        """The context a step's collectives run in (the counter, on counted steps)."""
        counted = self.counter is not None and self.calls in self.counted
        return self.counter if counted else contextlib.nullcontext()

    def start(self):
        if self._pipeline is not None:
            self._before = (self._pipeline.busy_s, self._pipeline.schedule_s)
        return self.counting()

    def finish(self) -> None:
        if self.counter is not None and self.calls in self.counted:
            tally = self.counter.reset()
            self.sent.append(tally.sent)
            self.ops = tally.as_dict()
        self.calls += 1
        if self._pipeline is not None:
            busy = self._pipeline.busy_s - self._before[0]
            ran = self._pipeline.schedule_s - self._before[1]
            self.bubbles.append(1.0 - busy / ran if ran > 0 else 0.0)

    def run_info(self) -> dict:
        """The metrics `run` entries: rank 0's, and every rank's (gathered: all ranks call this)."""
        import statistics

        c = self.c
        if not c.info.distributed:
            return {}
        mine = {"memory": c.held, "comm_bytes_per_step": statistics.median(self.sent) if self.sent else None,
                "counted": sorted(self.first_step + i for i in self.counted if 0 <= i < self.calls),
                "comm_ops_last_step": self.ops,
                "bubble": statistics.median(self.bubbles[1:] or self.bubbles) if self.bubbles else None}
        everyone: list = [None] * c.info.world_size
        dist.all_gather_object(everyone, mine)
        out = {"memory_per_rank": mine["memory"], "comm_bytes_per_step": mine["comm_bytes_per_step"],
               "comm_ops_last_step": mine["comm_ops_last_step"],
               "comm_counted_steps": mine["counted"],
               "memory_by_rank": [e["memory"] for e in everyone],
               "comm_bytes_by_rank": [e["comm_bytes_per_step"] for e in everyone]}
        if c.layout.mode == "pp":
            out["pipeline_bubble"] = {"measured_by_rank": [e["bubble"] for e in everyone],
                                      "theory": pipeline_bubble(c.layout.pp, c.layout.microbatches)}
        return out


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


def _loop_engine(config: TrainConfig, c: Components, loader: ResumableLoader,
                 saver: state.Saver | state.ShardedSaver | None, start: int = 0) -> loop.Engine:
    """This run's steps as the shared loop drives them (`labkit.core.loop.Engine`)."""
    comm = _StepComm(c, config.steps - start, start)

    def next_batch() -> list:
        return [to_device(next(loader), c, config.channels_last) for _ in range(config.grad_accum)]

    def run_step(batches: list, stop_requested: bool) -> tuple:
        with comm.start():
            return (*train_step(c, batches, config.grad_clip, stop_requested), stop_requested)

    def read_step(handle: tuple) -> loop.StepOutcome:
        loss, skipped, stop_requested = handle
        with comm.counting():
            loss_value, stop = agree(loss, stop_requested, c.info, c.agreement, c.strategy)
        comm.finish()
        return loop.StepOutcome(loss_value, stop, bool(skipped.item()) if skipped is not None else False)

    checkpoints = {} if saver is None else {
        "save": lambda step, wait: saver.save(c, step, loader.position, wait=wait),
        "wait_for_saves": saver.wait}
    return loop.Engine(next_batch, run_step, read_step, lambda step: scheduled_lr(c),
                       peak_memory=lambda: _peak_memory(c.device), final_run_info=comm.run_info,
                       evaluate=lambda: heldout_loss(config, c, loader.micro_batch), **checkpoints)
