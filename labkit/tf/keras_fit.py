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
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from labkit.core.config import ParameterError, resolve_scale
from labkit.core.metrics import MetricsLog, StepMetrics
from labkit.core.models import GPTConfig, build_config
from labkit.core.train_config import Preempted, TrainConfig


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


def fit_keras(config: TrainConfig, *, on_step=None, data_dir: str | None = None) -> MetricsLog:
    from labkit.tf import runtime

    device = runtime.configure(config.device)
    import keras
    import tensorflow as tf

    from labkit.tf import engine
    from labkit.tf import strategy as strategies
    from labkit.tf.data import BatchLayout, gather_fn, index_table
    from labkit.tf.precision import TFPrecision, apply_matmul_precision

    if config.grad_accum != 1:
        raise ParameterError("grad_accum", config.grad_accum,
                             "must be 1 with the keras loop (use the default custom loop)")
    per_epoch, epochs = epoch_plan(config)
    plan = strategies.plan_strategy(local_gpus=len(tf.config.get_visible_devices("GPU")))
    strategy = strategies.make_strategy(plan)
    precision = TFPrecision.for_mode(config.precision)
    apply_matmul_precision(precision)
    model_cfg = build_config(config.model, resolve_scale(config.scale))
    layout = BatchLayout(config.batch_size, strategy.num_replicas_in_sync, 1)
    with strategy.scope():
        parts = engine.build(config, model_cfg, precision, strategy.num_replicas_in_sync)
        model = parts["model"]
        clip = {"global_clipnorm": config.grad_clip} if config.grad_clip else {}
        optimizer = keras.optimizers.AdamW(learning_rate=parts["schedule"], beta_1=0.9,
                                           beta_2=0.95, epsilon=1e-8, weight_decay=0.1, **clip)
        optimizer.exclude_from_weight_decay(
            var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
        if precision.loss_scaling:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0**16)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    backup_dir = os.path.join(config.checkpoint_dir, "backup") if config.checkpoint_dir else None
    first_epoch = backed_up_epoch(backup_dir)
    x_all, y_all = engine.training_arrays(model_cfg, config, data_dir)
    # Global batches in the custom loop's order (one replica = the global sample order).
    table = index_table(first_epoch * per_epoch, config.steps, range(1),
                        BatchLayout(config.batch_size, 1, 1), len(x_all), config.seed)
    table = table.reshape(len(table), config.batch_size)
    dataset = tf.data.Dataset.from_tensor_slices(table).map(
        gather_fn(x_all, y_all, config.input_latency_ms / 1000.0)).prefetch(2)

    tokens = model_cfg.block_size if isinstance(model_cfg, GPTConfig) else None
    log = MetricsLog(run=engine._run_info(config, plan, layout, model, device,
                                          first_epoch * per_epoch))
    log.run.update(loop="keras", steps_per_epoch=per_epoch, epochs=epochs,
                   resumed_from_epoch=first_epoch or None)
    with engine._SigtermFlag() as flag:
        steps_cb = _step_metrics_callback(config, plan, per_epoch, log, tokens, on_step, flag)
        callbacks: list[Any] = [steps_cb]
        if backup_dir:
            callbacks.insert(0, keras.callbacks.BackupAndRestore(backup_dir, save_freq="epoch"))
        try:
            model.fit(dataset, epochs=epochs, steps_per_epoch=per_epoch, callbacks=callbacks,
                      shuffle=False, verbose=0)
        except _Interrupted:
            engine._finish(log, config, plan, model)
            raise Preempted(steps_cb.last_step) from None
    return engine._finish(log, config, plan, model)


def _step_metrics_callback(config, plan, per_epoch, log, tokens, on_step, flag):
    """Per-step loss and timings from Keras callbacks, in labkit's metrics schema.

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
            if config.preempt_at is not None and self.epoch * per_epoch + batch == config.preempt_at:
                flag.trigger()

        def on_train_batch_end(self, batch, logs=None):
            mean = float(logs["loss"])
            loss = (batch + 1) * mean - batch * self.prev_mean
            self.prev_mean = mean
            now = time.perf_counter()
            dt, self.last = now - self.last, now
            step = self.epoch * per_epoch + batch
            b = config.batch_size
            m = StepMetrics(step=step, loss=loss, step_time_s=dt, samples_per_s=b / dt,
                            tokens_per_s=b * tokens / dt if tokens else None)
            log.append(m)
            self.last_step = step
            if on_step is not None:
                on_step(step, m.to_dict())
            if config.progress and plan.is_chief and not os.environ.get("LABKIT_NO_PROGRESS"):
                print(f"step {step + 1}/{config.steps} loss {loss:.4f}", flush=True)
            if flag.requested:
                raise _Interrupted()

    return StepMetricsCallback()
