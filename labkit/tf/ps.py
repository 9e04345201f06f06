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

Steps are scheduled a window at a time, then joined, so this loop is not the custom loop's
step-by-step one (`labkit.tf.trainer`); it calls the same decisions of `labkit.core`: the
SIGTERM guard, the checkpoint policy (a window ends at each periodic checkpoint: `checkpoint_every` steps, else
10), the metrics reporter and the metrics file. Checkpoints go through `labkit.core.checkpoint`
(`labkit.tf.state`): the coordinator reads the variables from the parameter servers, writes the
blobs and commits the marker (with the run's fingerprint, under the folder's lease); a restarted
job assigns them back before scheduling any step.
"""

from __future__ import annotations

import time

from labkit.core.fingerprint import Resume
from labkit.core.loop import CheckpointPolicy, Reporter, StepCallback
from labkit.core.metrics import MetricsLog
from labkit.core.preemption import PreemptionGuard
from labkit.core.train_config import Preempted, TrainConfig
from labkit.data import synthetic
from labkit.tf import state
from labkit.tf.step import (
    build,
    make_replica_step,
    metrics_path,
    precision_and_model,
    scheduled_lr,
    throughput,
    training_arrays,
    write_final_metrics,
)


def fit_parameter_server(config: TrainConfig, plan, device: str, on_step: StepCallback | None,
                         data_dir: str | None) -> MetricsLog:
    """Train `config` as the coordinator of a parameter-server job (the chief's part)."""
    lease = state.claim(config, is_chief=True)
    try:
        return _coordinate(config, plan, device, on_step, data_dir, lease)
    finally:
        if lease is not None:
            lease.release()


def _coordinate(config: TrainConfig, plan, device: str, on_step: StepCallback | None,
                data_dir: str | None, lease) -> MetricsLog:
    import tensorflow as tf

    from labkit.tf import strategy as strategies
    from labkit.tf.data import BatchLayout, DataOrigin, replica_indices, step_position

    strategy = strategies.make_strategy(plan)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    precision, model_cfg = precision_and_model(config)
    layout = BatchLayout(config.batch_size, 1, config.grad_accum)  # one worker per step
    x_all, y_all = training_arrays(model_cfg, config, data_dir)
    with strategy.scope():
        parts = build(config, model_cfg, precision, 1)
        x_var = tf.Variable(x_all, trainable=False, name="samples")  # lands on a ps task
        y_var = tf.Variable(y_all, trainable=False, name="targets")
    model, optimizer = parts["model"], parts["optimizer"]
    start = 0
    resume = Resume.of(config, world_size=1, model_config=model_cfg,  # one worker per step
                       data=synthetic.source_name(model_cfg))
    if config.checkpoint_dir:
        start = state.restore(config.checkpoint_dir, model, optimizer, resume) or 0
    origin = DataOrigin.resumed(start, resume.data_position)
    replica_step = make_replica_step(model, optimizer, layout, config.grad_clip, precision)

    @tf.function
    def ps_step(idx):
        batch = (tf.gather(x_var, idx), tf.gather(y_var, idx))
        loss, _, skipped = strategy.run(replica_step, args=(batch, tf.constant(0.0)))
        return loss, skipped

    def schedule(s: int):  # step s trains on global batch s, whichever worker runs it
        idx = replica_indices(s, 0, layout, len(x_all), config.seed, origin)
        return coordinator.schedule(ps_step, args=(tf.constant(idx),))

    log = MetricsLog(run={"framework": "tf", "model": config.model, "strategy": plan.kind,
                          "world_size": plan.num_workers,
                          "task": f"{plan.task_type}:{plan.task_index}",
                          "micro_batch": layout.micro_batch, "asynchronous": True,
                          "resumed_from_step": start - 1 if start else None,
                          "resume_changes": resume.record() or None})
    log.continue_from(metrics_path(config, plan), start)  # the earlier attempt's steps
    saver = state.Saver(config.checkpoint_dir, model, optimizer, replicas=1,
                        fingerprint=resume.fingerprint, lease=lease, keep=config.keep_checkpoints,
                        position=lambda s: step_position(s, layout.global_batch, len(x_all), origin)) \
        if config.checkpoint_dir else None
    reporter = Reporter(config, throughput(config, model_cfg, precision, device, 1), log,
                        start=start, on_step=on_step)
    with PreemptionGuard() as guard, reporter:
        stopped = _run_windows(config, start, schedule, coordinator, guard, reporter, saver)
        write_final_metrics(log, config, plan, model)
        if stopped is not None:
            guard.chain()
            raise Preempted(stopped, guard.reason, saved=saver is not None)
    return log


def _run_windows(config: TrainConfig, start: int, schedule, coordinator, guard: PreemptionGuard,
                 reporter: Reporter, saver: state.Saver | None) -> int | None:
    """Steps `start` … `config.steps - 1`, scheduled a window at a time. When SIGTERM (or the
    drill) arrives, the window finishes and is checkpointed, and its last step is returned;
    None when every step ran."""
    policy = CheckpointPolicy.of(config, enabled=saver is not None)
    window = max(1, config.checkpoint_every or 10)
    try:
        for first in range(start, config.steps, window):
            last = min(first + window, config.steps)
            if config.preempt_at is not None and first <= config.preempt_at < last:
                guard.trigger()  # the drill: SIGTERM during this window
            t0 = time.perf_counter()
            pending = [(s, schedule(s)) for s in range(first, last)]
            coordinator.join()
            per_step = (time.perf_counter() - t0) / (last - first)
            for s, remote in pending:
                loss, skipped = remote.fetch()
                reporter.record(s, float(loss), per_step, skipped=bool(skipped > 0),
                                lr=scheduled_lr(config, 1, s))
            stop = guard.requested and last < config.steps
            if saver is not None and policy.saves_after(last - 1, stop):
                saver.save(last - 1, wait=policy.waits_after(last - 1, stop))
            if stop:
                return last - 1
    finally:
        if saver is not None:
            saver.wait()
    return None
