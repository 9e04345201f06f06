"""The TensorFlow trainer (the custom loop): `Trainer(config, plan, device).train()`, read top to
bottom in this file, the twin of `labkit.torch.trainer`.

    trainer = Trainer(config, plan, device)  # strategy, model, optimizer, input, train step, saver;
                                             # restored from the newest checkpoint when there is one
    trainer.train()                          # the loop: drill, batch, step, report, checkpoint, stop

`labkit.tf.engine.fit(config)` chooses this loop (or Keras `model.fit`, or the parameter-server
loop), claims the outputs (`labkit.tf.state.claim`), trains, and turns running out of GPU
memory into one line naming the batch.

Where things are:

- the step: `labkit.tf.step` (`make_train_step`: `strategy.run` of one replica's step inside a
  `tf.function`, fed an already fetched distributed batch, so the fetch is the step's data
  time): accumulation, the all-reduce of the summed gradients, clipping of that sum (as DDP +
  `clip_grad_norm_`), AdamW with the torch engine's hyper-parameters, fp16 loss scaling; the
  mean loss, the skip flag and the stop flag are reduced over the replicas in the same step, so
  every worker checkpoints and leaves at the same step after SIGTERM or the `preempt_at` drill;
- the loop: `Trainer.train`; the decisions it calls keep one owner in `labkit.core`: when to
  checkpoint (`loop.CheckpointPolicy`), what a step reports (`loop.Reporter`: metrics,
  TensorBoard, W&B, progress, job log lines, the non-finite loss check), SIGTERM
  (`core.preemption.PreemptionGuard`), whether a resume may change the run
  (`core.fingerprint.Resume`), the checkpoint folder's owner (`core.lease.Lease`);
- checkpoints: `labkit.tf.state` over `labkit.core.checkpoint` (the chief writes, with the run's
  fingerprint and data position; every worker restores); the input: `labkit.tf.data`; MFU is
  against a GEMM measured here (`labkit.tf.peak`).

Each step is read as soon as it ran (there is no late reading as in torch: the stop flag the
workers agreed on comes back with the step's loss). With several workers each writes its own
metrics file (`labkit.tf.step.metrics_path`).
"""

from __future__ import annotations

from typing import Any

from labkit.core import loop
from labkit.core.fingerprint import Resume
from labkit.core.lease import Lease
from labkit.core.loop import StepCallback
from labkit.core.metrics import MetricsLog
from labkit.core.preemption import PreemptionGuard
from labkit.core.train_config import TrainConfig
from labkit.data import synthetic
from labkit.tf import state
from labkit.tf.data import BatchLayout, DataOrigin, make_dataset_fn, step_position
from labkit.tf.step import (
    build,
    make_train_step,
    metrics_path,
    peak_memory,
    precision_and_model,
    run_info,
    scheduled_lr,
    throughput,
    training_arrays,
    weights_fingerprint,
)
from labkit.tf.strategy import StrategyPlan, make_strategy


class Trainer:
    """One run of `config` on this task of `plan`: built, restored and ready to `train()`."""

    def __init__(self, config: TrainConfig, plan: StrategyPlan, device: str, *,
                 data_dir: str | None = None, lease: Lease | None = None,
                 on_step: StepCallback | None = None):
        import tensorflow as tf

        self.config, self.plan, self.device, self.on_step = config, plan, device, on_step
        self.strategy = strategy = make_strategy(plan)
        precision, model_cfg = precision_and_model(config)
        self.model_cfg = model_cfg
        replicas = strategy.num_replicas_in_sync
        self.layout = layout = BatchLayout(config.batch_size, replicas, config.grad_accum)
        with strategy.scope():  # variables mirrored over the replicas
            parts = build(config, model_cfg, precision, replicas)
        self.model, self.optimizer = parts["model"], parts["optimizer"]
        self.resume = Resume.of(config, world_size=replicas, model_config=model_cfg,
                                data=synthetic.source_name(model_cfg))
        self.start = 0
        if config.checkpoint_dir:
            self.start = state.restore(config.checkpoint_dir, self.model, self.optimizer, self.resume) or 0
        origin = DataOrigin.resumed(self.start, self.resume.data_position)
        self.batches = None  # a run whose checkpoint holds its last step reads no input
        if self.start < config.steps:
            self.batches = iter(strategy.distribute_datasets_from_function(make_dataset_fn(
                training_arrays(model_cfg, config, data_dir), layout, first_step=self.start,
                last_step=config.steps, seed=config.seed, latency_s=config.input_latency_ms / 1000.0,
                origin=origin)))
        jit = config.compile and replicas == 1
        self.step_fn = make_train_step(strategy, self.model, self.optimizer, layout, config.grad_clip,
                                       precision, jit_compile=jit)
        # The step's stop flag as one of two tensors: a Python value would retrace the tf.function.
        self.stop_flags = (tf.constant(0.0), tf.constant(1.0))
        self.saver, self.barrier = None, None
        if config.checkpoint_dir:
            num_samples = config.num_samples_or_default()
            self.saver = state.Saver(
                config.checkpoint_dir, self.model, self.optimizer, replicas=replicas,
                writes=plan.is_chief, fingerprint=self.resume.fingerprint, lease=lease,
                keep=config.keep_checkpoints,
                position=lambda step: step_position(step, layout.global_batch, num_samples, origin))
            self.barrier = _barrier(strategy) if plan.num_workers > 1 else None
        self.throughput = throughput(config, model_cfg, precision, device, replicas)
        self.log = MetricsLog(run=run_info(config, plan, layout, self.model, device, self.throughput, precision))
        self.log.run["xla"] = jit
        self.log.run["resume_changes"] = self.resume.record() or None
        self.metrics_path = metrics_path(config, plan)

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
                clock = loop.StepClock()
                for step in range(self.start, config.steps):
                    if step == config.preempt_at:
                        guard.trigger()  # the drill: SIGTERM to ourselves, mid-step
                    batch, data_time = loop.timed(self.next_batch)
                    lr = scheduled_lr(config, self.layout.num_replicas, step)
                    dispatched = (step, data_time, lr, *self.train_step(batch, guard.requested))
                    # Workers stop at the step they agreed on; a lone process as soon as asked.
                    stop = self.report(dispatched, reporter, clock) or (guard.requested and self.plan.num_workers == 1)
                    saves = policy.saves_after(step, stop)
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

    def next_batch(self):
        """The step's distributed batch (fetched outside the tf.function: its wait is data time)."""
        return next(self.batches)

    def train_step(self, batch, requested: bool) -> tuple:
        """Run one optimizer step on every replica: (mean loss, agreed stop, skipped), each a
        tensor summed over the replicas; `requested` is this process's SIGTERM flag."""
        return self.step_fn(batch, self.stop_flags[requested])

    def report(self, dispatched: tuple, reporter: loop.Reporter, clock: loop.StepClock) -> bool:
        """Read a step's loss, report it; returns whether the workers agreed to stop after it."""
        step, data_time, lr, loss, stop, skipped = dispatched
        loss_value = float(loss)
        reporter.record(step, loss_value, clock.lap(), data_time=data_time, lr=lr,
                        skipped=float(skipped) > 0, peak_memory=peak_memory(self.device))
        return float(stop) > 0

    def reporter(self) -> loop.Reporter:
        return loop.Reporter(self.config, self.throughput, self.log, is_main=self.plan.is_chief,
                             start=self.start, on_step=self.on_step)

    def save(self, step: int, wait: bool) -> None:
        self.saver.save(step, wait=wait)
        if wait and self.barrier is not None:
            # The process is about to exit: no worker leaves before the chief's marker exists
            # (a worker that exits may have the whole job restarted, the chief with it).
            self.barrier()

    def evaluate(self) -> dict[str, Any]:
        return heldout_loss(self.config, self.model, self.model_cfg, self.layout.micro_batch)

    def write_metrics(self, final: bool = False) -> None:
        loop.write_metrics(self.log, self.metrics_path,
                           {"final_weights": weights_fingerprint(self.model)} if final else None)


def heldout_loss(config: TrainConfig, model, model_cfg, micro_batch: int) -> dict:
    """`{"heldout": {"loss", "samples", "chance"}}`: the mean loss on `config.eval_samples`
    samples the run never trained on (`synthetic.held_out`, the ones torch's engine measures),
    `training=False`, in batches of the micro-batch; each worker computes it on its copy of the
    weights, so all agree. {} with `eval_samples=0`."""
    import tensorflow as tf

    if not config.eval_samples:
        return {}
    total = 0.0
    for x, y in synthetic.held_out_batches(model_cfg, config.num_samples_or_default(), config.seed,
                                           config.eval_samples, micro_batch):
        logits = tf.cast(model(tf.constant(x), training=False), tf.float32)
        per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        total += float(tf.reduce_sum(tf.reduce_mean(tf.reshape(per_sample, (len(y), -1)), axis=1)))
    return synthetic.heldout_record(total / config.eval_samples, config.eval_samples, model_cfg)


def _barrier(strategy):
    """A function that returns once every worker has called it: a one-number all-reduce."""
    import tensorflow as tf

    @tf.function
    def all_reduce_one():
        one = strategy.run(lambda: tf.constant(1.0))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, one, axis=None)

    return lambda: all_reduce_one().numpy()
