"""The Keras way: `model.fit` with the `BackupAndRestore` callback, on the same model and data.

Selected with `labkit.tf.engine.fit(config, loop="keras")` or `LABKIT_TF_LOOP=keras labkit
train --framework tf ...`. It is what most Keras users write, and it shows what BackupAndRestore
gives: after a preemption the next `fit` call restores the weights and optimizer state of the
last finished *epoch* and runs the remaining epochs. An "epoch" here is `checkpoint_every` steps
(the whole run when 0), so the checkpoint cadence is the epoch length.

Limits (why the engine's default is the custom loop): with TensorFlow 2.21 and Keras 3.15 this
path fails under MultiWorkerMirroredStrategy on two workers ("Attempt to convert a value
(PerReplica...) to a Tensor"; a test notices the day it works); work since the last epoch
boundary is redone after a restart; Keras reports a running mean loss per epoch, from which
the per-step loss is recovered exactly (see `_step_metrics_callback`); no gradient accumulation.

Checkpoints: this path keeps Keras' own `BackupAndRestore` (under `<checkpoint_dir>/backup`), not
`labkit.core.checkpoint`: it exists to show the Keras way, and what BackupAndRestore restores is
part of that lesson. The custom loop's checkpoints carry the commit marker and fall back past a
corrupt step; these do not. The rest is shared with the other loops (`labkit.core.loop`): the
SIGTERM guard, the metrics reporter (TensorBoard, progress, `on_step`, the non-finite loss check)
and the metrics file.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from labkit.core.config import ParameterError
from labkit.core.loop import Reporter, StepCallback
from labkit.core.metrics import MetricsLog
from labkit.core.outputs import check_run_outputs
from labkit.core.preemption import PreemptionGuard
from labkit.core.train_config import Preempted, TrainConfig
from labkit.tf.step import (
    build,
    metrics_path,
    precision_and_model,
    run_info,
    scheduled_lr,
    throughput,
    training_arrays,
    write_final_metrics,
)


class _Interrupted(Exception):
    """Raised inside fit so Keras does not run on_train_end (which deletes the backup)."""


def epoch_plan(config: TrainConfig) -> tuple[int, int]:
    """(steps_per_epoch, epochs) for a run of `config.steps` steps."""
    per_epoch = config.checkpoint_every or config.steps
    if config.steps % per_epoch:
        raise ParameterError("checkpoint_every", config.checkpoint_every,
                             f"must divide steps={config.steps} with the keras loop "
                             "(BackupAndRestore restores whole epochs)")
    return per_epoch, config.steps // per_epoch


def backed_up_epoch(backup_dir: str | None) -> int:
    """The epoch BackupAndRestore will resume from (0 without a backup). Read here so the data
    pipeline starts at the same place as the weights."""
    if not backup_dir:
        return 0
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        return int(json.load(f)["epoch"])


def fit_keras(config: TrainConfig, *, on_step: StepCallback | None = None,
              data_dir: str | None = None) -> MetricsLog:
    """Train `config` with Keras `model.fit` and BackupAndRestore (see the module docstring)."""
    from labkit.tf import runtime

    device = runtime.configure(config.device)
    import keras
    import tensorflow as tf

    from labkit.tf import strategy as strategies
    from labkit.tf.data import BatchLayout

    if config.grad_accum != 1:
        raise ParameterError("grad_accum", config.grad_accum,
                             "must be 1 with the keras loop (use the default custom loop)")
    per_epoch, epochs = epoch_plan(config)
    plan = strategies.plan_strategy(local_gpus=len(tf.config.get_visible_devices("GPU")))
    check_run_outputs(config, main=plan.is_chief)  # BackupAndRestore's folder has no lease
    strategy = strategies.make_strategy(plan)
    precision, model_cfg = precision_and_model(config)
    layout = BatchLayout(config.batch_size, strategy.num_replicas_in_sync, 1)
    with strategy.scope():
        parts = build(config, model_cfg, precision, layout.num_replicas)
        model = parts["model"]
        _compile(model, parts["schedule"], config, precision)

    backup_dir = os.path.join(config.checkpoint_dir, "backup") if config.checkpoint_dir else None
    first_step = backed_up_epoch(backup_dir) * per_epoch
    dataset = _global_batches(config, training_arrays(model_cfg, config, data_dir), first_step)
    rates = throughput(config, model_cfg, precision, device, layout.num_replicas)
    log = MetricsLog(run=run_info(config, plan, layout, model, device, rates, precision))
    log.run.update(loop="keras", steps_per_epoch=per_epoch, epochs=epochs,
                   resumed_from_epoch=first_step // per_epoch or None,
                   resumed_from_step=first_step - 1 if first_step else None)
    log.continue_from(metrics_path(config, plan), first_step)  # the earlier attempt's steps
    with PreemptionGuard() as guard, Reporter(config, rates, log, is_main=plan.is_chief,
                                              start=first_step, on_step=on_step) as reporter:
        steps_cb = _step_metrics_callback(config, per_epoch, layout.num_replicas, reporter, guard)
        callbacks: list[Any] = [steps_cb]
        if backup_dir:
            callbacks.insert(0, keras.callbacks.BackupAndRestore(backup_dir, save_freq="epoch"))
        try:
            model.fit(dataset, epochs=epochs, steps_per_epoch=per_epoch, callbacks=callbacks,
                      shuffle=False, verbose=0)
        except _Interrupted:
            write_final_metrics(log, config, plan, model)
            guard.chain()
            raise Preempted(steps_cb.last_step, guard.reason, saved=backup_dir is not None) from None
    write_final_metrics(log, config, plan, model)
    return log


def _global_batches(config: TrainConfig, arrays, first_step: int):
    """Steps `first_step` … as one global batch each, in the custom loop's sample order (one
    replica sees the global order)."""
    import tensorflow as tf

    from labkit.tf.data import BatchLayout, gather_fn, index_table

    x_all, y_all = arrays
    table = index_table(first_step, config.steps, range(1), BatchLayout(config.batch_size, 1, 1),
                        len(x_all), config.seed)
    table = table.reshape(len(table), config.batch_size)
    return tf.data.Dataset.from_tensor_slices(table).map(
        gather_fn(x_all, y_all, config.input_latency_ms / 1000.0)).prefetch(2)


def summed_clip_adamw():
    """Keras' AdamW, except that `global_clipnorm` clips the gradient summed over the replicas.

    Keras 3 clips each replica's share before the shares are summed, so under MirroredStrategy
    a run clips differently from one device, from DDP + `clip_grad_norm_` and from the custom
    loop (tensorflow/tensorflow#33929, read 2026-11-26); `labkit.recipes.keras_mirrored_fit`
    measures the gap. Every share is scaled by the factor the summed gradient needs."""
    import keras
    import tensorflow as tf

    class AdamW(keras.optimizers.AdamW):
        def _clip_gradients(self, grads):
            context = tf.distribute.get_replica_context()
            if not self.global_clipnorm or context is None or context.num_replicas_in_sync == 1:
                return super()._clip_gradients(grads)
            norm = tf.linalg.global_norm(context.all_reduce(tf.distribute.ReduceOp.SUM, grads))
            return [g * tf.minimum(1.0, self.global_clipnorm / tf.maximum(norm, 1e-12)) for g in grads]

    return AdamW


def _compile(model, schedule, config: TrainConfig, precision) -> None:
    """Keras' AdamW (it all-reduces itself; clipping the summed gradient, `summed_clip_adamw`)
    with the engine's hyper-parameters."""
    import keras

    clip = {"global_clipnorm": config.grad_clip} if config.grad_clip else {}
    optimizer = summed_clip_adamw()(learning_rate=schedule, beta_1=0.9, beta_2=0.95,
                                    epsilon=1e-8, weight_decay=0.1, **clip)
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    if precision.loss_scaling:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0**16)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def _step_metrics_callback(config: TrainConfig, per_epoch: int, replicas: int, reporter: Reporter,
                           guard: PreemptionGuard):
    """Per-step loss and timings from Keras callbacks, reported like the other loops' steps.

    Keras logs the epoch's running mean m_b after batch b, so the loss of batch b alone is
    (b+1)·m_b − b·m_(b−1). SIGTERM (or the `preempt_at` drill) interrupts fit by raising."""
    import keras

    class StepMetricsCallback(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch = 0
            self.prev_mean = 0.0
            self.last = time.perf_counter()
            self.last_step = -1

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            self.prev_mean = 0.0

        def on_train_batch_begin(self, batch, logs=None):
            if self.epoch * per_epoch + batch == config.preempt_at:
                guard.trigger()

        def on_train_batch_end(self, batch, logs=None):
            mean = float(logs["loss"])
            loss = (batch + 1) * mean - batch * self.prev_mean
            self.prev_mean = mean
            now = time.perf_counter()
            step_time, self.last = now - self.last, now
            step = self.epoch * per_epoch + batch
            self.last_step = step
            reporter.record(step, loss, step_time, lr=scheduled_lr(config, replicas, step))
            if guard.requested:
                raise _Interrupted()

    return StepMetricsCallback()
