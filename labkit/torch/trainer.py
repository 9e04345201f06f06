"""The PyTorch trainer: `Trainer(config, ...).train()`, read top to bottom in this file.

    trainer = Trainer(config, info, device)  # model, optimizer, schedule, scaler, loader, saver;
                                             # restored from the newest checkpoint when there is one
    trainer.train()                          # the loop: drill, batch, step, report, checkpoint, stop

`fit(config)` is what `labkit train` calls: it places the process (`resolve_device`), joins the
process group, claims the outputs (`labkit.torch.state.claim`), trains, and turns running out
of GPU memory into one line naming the batch.

Where things are:

- the step: `train_step` below, written top to bottom: forward, loss and backward of each
  micro-batch (`no_sync` on all but the last under DDP, whose last backward all-reduces the
  gradients bucket by bucket), a sharded mode's reduction, clipping, the optimizer step, the LR
  schedule; the replicas' mean loss and stop flag: `agree`, one all-reduce of two numbers;
- the loop: `Trainer.train`; the decisions it calls keep one owner in `labkit.core`: when to
  checkpoint (`loop.CheckpointPolicy`), what a step reports (`loop.Reporter`: metrics,
  TensorBoard, W&B, progress, job log lines, the non-finite loss check), SIGTERM
  (`core.preemption.PreemptionGuard`), whether a resume may change the run
  (`core.fingerprint.Resume`), the checkpoint folder's owner (`core.lease.Lease`);
- what a run is made of (`build` → `Components`: DDP wrap, compilation, precision, the
  parallel modes' strategies): `labkit.torch.engine`; the state a checkpoint holds and the
  commit marker: `labkit.torch.state`.

On a single GPU the loss of step i is read once step i+1 is queued (`read_loss_late`), so the
host never waits for the device between steps. With several processes the metrics `run` section
records `memory_per_rank` and `comm_bytes_per_step` (`labkit.torch.comm_count.StepComm`).
"""

from __future__ import annotations

import contextlib
import resource
from dataclasses import asdict
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from labkit.core import loop
from labkit.core.fingerprint import Resume
from labkit.core.lease import Lease
from labkit.core.loop import StepCallback
from labkit.core.metrics import MetricsLog
from labkit.core.models import GPTConfig, flops_per_sample
from labkit.core.preemption import PreemptionGuard
from labkit.core.train_config import Preempted, TrainConfig, with_vertex_dirs
from labkit.data import synthetic
from labkit.torch import distributed, gpu_samples, peak, speed, state
from labkit.torch.comm_count import StepComm
from labkit.torch.data import DataPosition, ResumableLoader, make_dataset
from labkit.torch.engine import (
    Components,
    OutOfDeviceMemory,
    build,
    heldout_loss,
    micro_batch_size,
    release_device_memory,
    resolve_device,
    scheduled_lr,
    to_device,
)
from labkit.torch.models import count_parameters
from labkit.torch.parallel.base import Strategy, held_bytes


def fit(config: TrainConfig, *, on_step: StepCallback | None = None,
        read_loss_late: bool | None = None) -> MetricsLog:
    """Train as configured; returns the MetricsLog (also written to `config.metrics_out` by rank
    0). Raises `labkit.core.train_config.Preempted` after checkpointing when SIGTERM arrives (or at
    `config.preempt_at`). `on_step(step, metrics_dict)` runs on every rank after each step (one
    step late when `read_loss_late`, the default on a single GPU)."""
    config = with_vertex_dirs(config)
    info = distributed.info_from_env()
    device = resolve_device(config.device, info)
    info = distributed.init(device.type, info)
    clean, lease = False, None
    try:
        lease = state.claim(config, info)  # outputs writable, the checkpoint folder ours alone
        log = Trainer(config, info, device, lease=lease, on_step=on_step, read_loss_late=read_loss_late).train()
        clean = True
        return log
    except torch.OutOfMemoryError as e:
        raise OutOfDeviceMemory.of(config, device, info) from release_device_memory(e)
    except Preempted:
        clean = True  # every rank agreed on the step to stop at, so all of them are here
        raise
    finally:
        if lease is not None:
            lease.release()
        # After a failure a peer may be gone: a barrier would wait for it until the timeout.
        distributed.shutdown(clean=clean)


class Trainer:
    """One run of `config` on this process: built, restored and ready to `train()`."""

    def __init__(self, config: TrainConfig, info: distributed.DistInfo, device: torch.device, *,
                 lease: Lease | None = None, on_step: StepCallback | None = None,
                 read_loss_late: bool | None = None):
        speed.keep_host_memory(device)  # the opt-in speed-ups: labkit.torch.speed
        self.config, self.info, self.on_step = config, info, on_step
        self.c = c = build(config, info, device)
        sharded = c.strategy is not None
        data_rank, data_world = ((c.strategy.data_rank, c.strategy.data_world) if sharded
                                 else (info.rank, info.world_size))
        self.micro = micro_batch_size(config, data_world)
        self.resume = Resume.of(config, world_size=info.world_size, model_config=c.model_config,
                                data=synthetic.source_name(c.model_config))
        self.start, position = 0, DataPosition()
        if config.checkpoint_dir:
            restore = state.restore_sharded if sharded else state.restore
            self.start, position = restore(config.checkpoint_dir, c, info, self.resume) or (0, position)
        self.loader = ResumableLoader(
            make_dataset(c.model_config, config.num_samples_or_default(), config.seed,
                         config.input_latency_ms / 1000.0),
            self.micro, world_size=data_world, rank=data_rank, seed=config.seed,
            num_workers=config.num_workers, pin_memory=config.pin_memory and device.type == "cuda",
            position=position)
        saver_class = state.saver_class(config.checkpoint_format, sharded)
        self.saver = (saver_class(config.checkpoint_dir, info, fingerprint=self.resume.fingerprint,
                                  lease=lease, keep=config.keep_checkpoints)
                      if config.checkpoint_dir else None)
        self.throughput = loop.Throughput(
            config.batch_size, c.model_config.block_size if isinstance(c.model_config, GPTConfig) else None,
            flops_per_sample(c.model_config), peak.measured_peak_flops(device, c.policy.peak_dtype),
            devices=info.world_size)
        self.log = MetricsLog(run=self._run_info())
        self.metrics_path = config.metrics_out if info.is_main else None
        self.late = (device.type == "cuda" if read_loss_late is None else read_loss_late) and not info.distributed
        self.comm = StepComm(c, config.steps - self.start, self.start)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    # ---------------------------------------------------------------- the loop

    def train(self) -> MetricsLog:
        """Steps `start` … `config.steps - 1`; returns the log (also written to the metrics file).
        Raises `Preempted` once a stop is checkpointed, FloatingPointError on a non-finite loss."""
        config, log = self.config, self.log
        if self.start >= config.steps:  # its checkpoint holds the last step: nothing to train
            return loop.already_complete(log, self.metrics_path, self.start)
        loop.begin(log, self.metrics_path, self.start)
        policy = loop.CheckpointPolicy.of(config, enabled=self.saver is not None)
        try:
            with loop.saves_joined(self.saver), PreemptionGuard() as guard, self.reporter() as reporter:
                clock, waiting = loop.StepClock(), None
                for step in range(self.start, config.steps):
                    if step == config.preempt_at:
                        guard.trigger()  # the drill: SIGTERM to ourselves, mid-step
                    batches, data_time = loop.timed(self.next_batch)
                    requested, lr = guard.requested, scheduled_lr(self.c)
                    dispatched = (step, data_time, lr, *self.train_step(batches), requested)
                    if self.late:  # report the previous step while this one runs
                        waiting, dispatched = dispatched, waiting
                    # Replicas stop at the step they agreed on; a lone process as soon as asked.
                    stop = self.report(dispatched, reporter, clock) or (guard.requested and not self.info.distributed)
                    saves = policy.saves_after(step, stop)
                    if saves or stop or step + 1 == config.steps:
                        self.report(waiting, reporter, clock)
                        waiting = None
                    if saves:
                        loop.save_checkpoint(self.save, step, wait=policy.waits_after(step, stop), stop=stop,
                                             guard=guard, on_failed_stop=lambda: self.write_metrics(final=True))
                    if stop:
                        self.write_metrics(final=True)
                        raise loop.stopped(guard, step, saved=self.saver is not None)
                    if saves:
                        if step + 1 < config.steps and loop.evaluates_at_checkpoints():
                            with clock.paused():
                                loop.keep_heldout(log, self.evaluate())
                        self.write_metrics()
        except FloatingPointError:
            self.write_metrics(final=True)  # the file shows the step that diverged
            raise
        loop.keep_heldout(log, self.evaluate())
        self.write_metrics(final=True)
        return log

    def next_batch(self) -> list:
        """The step's micro-batches, on the device."""
        return [to_device(next(self.loader), self.c, self.config.channels_last)
                for _ in range(self.config.grad_accum)]

    def train_step(self, batches: list) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Dispatch one optimizer step (`train_step` below); its loss and skip flag stay on the
        device (with several processes its collectives are counted on two steps)."""
        with self.comm.start():
            return train_step(self.c, batches, self.config.grad_clip)

    def report(self, dispatched: tuple | None, reporter: loop.Reporter, clock: loop.StepClock) -> bool:
        """Read a dispatched step's loss (agreed over the replicas), report it; returns whether
        the replicas agreed to stop after it. None (nothing dispatched): False."""
        if dispatched is None:
            return False
        step, data_time, lr, loss, skipped, stop_requested = dispatched
        with self.comm.counting():
            loss_value, stop = agree(loss, stop_requested, self.info, self.c.strategy)
        self.comm.finish()
        reporter.record(step, loss_value, clock.lap(), data_time=data_time, lr=lr,
                        skipped=bool(skipped.item()) if skipped is not None else False,
                        peak_memory=peak_memory(self.c.device))
        return stop

    def reporter(self) -> loop.Reporter:
        return loop.Reporter(self.config, self.throughput, self.log, is_main=self.info.is_main,
                             start=self.start, on_step=self.on_step,
                             system=gpu_samples.sampler_for(self.c.device) if self.info.is_main else None)

    def save(self, step: int, wait: bool) -> None:
        self.saver.save(self.c, step, self.loader.position, wait=wait)

    def evaluate(self) -> dict[str, Any]:
        return heldout_loss(self.config, self.c, self.micro)

    def write_metrics(self, final: bool = False) -> None:
        loop.write_metrics(self.log, self.metrics_path, self.comm.run_info() if final else None)

    def _run_info(self) -> dict[str, Any]:
        config, c, t = self.config, self.c, self.throughput
        return {"framework": "torch", "model": config.model, "config": asdict(config),
                "world_size": self.info.world_size, "micro_batch": self.micro, "device": str(c.device),
                "parameters": count_parameters(c.model), "flops_per_sample": t.flops_per_sample,
                "peak_flops": t.peak_flops, "mfu_peak": peak.describe(c.device, c.policy.peak_dtype),
                "parallel": parallel_info(config, c), "resume_changes": self.resume.record() or None}


# ---------------------------------------------------------------- the step


def train_step(c: Components, micro_batches, grad_clip: float | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over already-placed micro-batches, then the LR schedule's step.
    Returns (mean loss, a 0-dim tensor that is 1 when fp16 overflow skipped the update, or None
    without a GradScaler), both still on the device: reading them is the caller's choice. With
    `cuda_graph_step` the update is replayed as one CUDA graph (`labkit.torch.step_graph`)."""
    if c.cuda_graph_step:
        if c.step_graph is None:
            c.step_graph = speed.graphed(c, lambda batches, clip: update(c, batches, clip, graphed=True)[0])
        total, skipped = c.step_graph(micro_batches, grad_clip), None  # it zeroes gradients as it needs
    else:
        total, skipped = update(c, micro_batches, grad_clip)
        if c.info.distributed:  # what this rank holds, gradients included, before they are freed
            c.held = c.strategy.held_bytes() if c.strategy is not None else held_bytes(c.model, c.optimizer)
        c.optimizer.zero_grad(set_to_none=True)
    if c.scaler.is_enabled() or c.step_graph is not None:  # a skipped or replayed update: it warns
        with _quiet_scheduler_warning():
            c.scheduler.step()
    else:
        c.scheduler.step()
    return total, skipped


def update(c: Components, micro_batches, grad_clip: float | None,
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
                # DDP: the last micro-batch's backward all-reduces the gradients, bucket by
                # bucket, overlapping the rest of backward.
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
          strategy: Strategy | None = None) -> tuple[float, bool]:
    """The end of a step: the mean loss over the replicas and whether any replica was asked to
    stop (every replica must checkpoint and leave at the same step), in one all-reduce of the
    two numbers (a sharded mode's own, which knows which ranks hold a loss). One process: the
    loss read back."""
    if not info.distributed:
        return float(loss.item()), stop
    if strategy is not None and strategy.reduces_gradients:
        return strategy.agree(loss, stop)
    t = torch.stack([loss.detach().float(), torch.tensor(float(stop), device=loss.device)])
    dist.all_reduce(t)
    return float(t[0].item()) / info.world_size, bool(t[1].item() > 0)


@contextlib.contextmanager
def _quiet_scheduler_warning():
    # A step skipped by the GradScaler makes the scheduler warn that it ran before the optimizer.
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
        yield


def peak_memory(device: torch.device) -> int:
    """Peak bytes of the GPU so far, or on a CPU the process's peak resident memory."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def parallel_info(config: TrainConfig, c: Components) -> dict:
    """The metrics `run` section's description of how the processes split the work."""
    layout = c.layout
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
