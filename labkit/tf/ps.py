"""Training under ParameterServerStrategy: the chief coordinates, workers compute, `ps` tasks
hold the variables. Asynchronous: each optimizer step runs on whichever worker is free and
applies its update to the variables on the parameter servers without waiting for the others.

It fits many CPU workers and large (embedding-heavy) models whose variables do not fit one
machine; synchronous data parallelism (MultiWorkerMirrored, DDP) is the default for dense
models on GPUs. labkit keeps the step's meaning: optimizer step `s` trains on global batch `s`
(the same samples as every other strategy). The samples live in variables on a parameter
server and a scheduled step gathers its rows there, so which worker runs a step does not
change what it trains on. Per-step losses are collected; step times are window averages
(steps overlap, so a single step has no wall time of its own).
"""

from __future__ import annotations

import time

from labkit.core.config import resolve_scale
from labkit.core.metrics import MetricsLog, StepMetrics
from labkit.core.models import GPTConfig, build_config
from labkit.core.train_config import Preempted, TrainConfig


def fit_parameter_server(config: TrainConfig, plan, on_step, data_dir) -> MetricsLog:
    import tensorflow as tf

    from labkit.tf import engine
    from labkit.tf import strategy as strategies
    from labkit.tf.data import BatchLayout, replica_indices
    from labkit.tf.precision import TFPrecision, apply_matmul_precision

    strategy = strategies.make_strategy(plan)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    precision = TFPrecision.for_mode(config.precision)
    apply_matmul_precision(precision)
    model_cfg = build_config(config.model, resolve_scale(config.scale))
    layout = BatchLayout(config.batch_size, 1, config.grad_accum)  # one worker per step
    x_all, y_all = engine.training_arrays(model_cfg, config, data_dir)
    with strategy.scope():
        parts = engine.build(config, model_cfg, precision, 1)
        x_var = tf.Variable(x_all, trainable=False, name="samples")  # lands on a ps task
        y_var = tf.Variable(y_all, trainable=False, name="targets")
    model, optimizer, step_var = parts["model"], parts["optimizer"], parts["step"]
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    manager = (tf.train.CheckpointManager(ckpt, config.checkpoint_dir, max_to_keep=2)
               if config.checkpoint_dir else None)
    start = 0
    if manager is not None and manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint).expect_partial()
        start = int(step_var.numpy())
    replica_step = engine.make_replica_step(model, optimizer, layout, config.grad_clip, precision)

    @tf.function
    def ps_step(idx):
        batch = (tf.gather(x_var, idx), tf.gather(y_var, idx))
        loss, _, skipped = strategy.run(replica_step, args=(batch, tf.constant(0.0)))
        return loss, skipped

    run_info = {"framework": "tf", "model": config.model, "strategy": plan.kind,
                  "world_size": plan.num_workers, "task": f"{plan.task_type}:{plan.task_index}",
                  "micro_batch": layout.micro_batch, "asynchronous": True,
                  "resumed_from_step": start - 1 if start else None}
    log = MetricsLog(run=run_info)
    tokens = model_cfg.block_size if isinstance(model_cfg, GPTConfig) else None
    window = max(1, config.checkpoint_every or 10)
    with engine._SigtermFlag() as flag:
        # Steps are scheduled a window at a time, then joined: the window is the checkpoint
        # cadence (`checkpoint_every`, else 10) and the unit of SIGTERM response.
        for first in range(start, config.steps, window):
            last = min(first + window, config.steps)
            t0 = time.perf_counter()
            pending = []
            for s in range(first, last):
                idx = replica_indices(s, 0, layout, len(x_all), config.seed)
                pending.append((s, coordinator.schedule(ps_step, args=(tf.constant(idx),))))
            coordinator.join()
            per_step = (time.perf_counter() - t0) / (last - first)
            for s, remote in pending:
                loss, skipped = remote.fetch()
                m = StepMetrics(step=s, loss=float(loss), step_time_s=per_step,
                                samples_per_s=config.batch_size / per_step,
                                tokens_per_s=config.batch_size * tokens / per_step if tokens else None,
                                skipped=bool(skipped > 0))
                log.append(m)
                if on_step is not None:
                    on_step(s, m.to_dict())
            step_var.assign(last)
            if manager is not None:
                manager.save(checkpoint_number=last)
            if config.preempt_at is not None and first <= config.preempt_at < last:
                flag.trigger()
            if flag.requested and last < config.steps:
                engine._finish(log, config, plan, model)
                raise Preempted(last - 1)
    return engine._finish(log, config, plan, model)
