"""The TensorFlow training engine: `fit(config, on_step=None)`, twin of `labkit.torch.engine`.

Why a custom loop and not `model.fit`: with TensorFlow 2.21 and Keras 3, `model.fit` under
MultiWorkerMirroredStrategy fails on two workers ("Attempt to convert a value (PerReplica...)
to a Tensor"); `labkit.tf.keras_fit` keeps that path (with BackupAndRestore) and a test tracks
when it starts working. The loop below (`strategy.run` inside a `tf.function`, fed from a
distributed dataset) trains under every strategy today with the current Keras, and gives
exactly the torch engine's semantics: `batch_size` is the global batch, gradients are summed
across replicas before clipping (as DDP + clip_grad_norm_), accumulation, warm-up, AdamW with
the same hyper-parameters, fp16 loss scaling, a per-step loss (not Keras' running mean), and a
resume that continues with exactly the next step.

The loop itself is `labkit.core.loop`, shared with the torch engine (step cadence, the
preemption drill, checkpoint cadence, metrics, TensorBoard, progress, the non-finite loss
check); this module hands it the TF parts (`_loop_engine`): the next distributed batch (fetched
outside the tf.function, so its wait is the step's data time), the step, its loss and the stop
flag all-reduced with it (every worker checkpoints and leaves at the same step after SIGTERM or
the `preempt_at` drill), and checkpoints through `labkit.core.checkpoint` (`labkit.tf.state`:
the chief writes under the folder's lease, with the run's fingerprint; every worker restores).
MFU is against a GEMM measured here (`labkit.tf.peak`). Building blocks (`build`,
`make_train_step`, `make_replica_step`, `training_arrays`, `weights_fingerprint`) live in
`labkit.tf.step` and are re-exported here.
"""

from __future__ import annotations

import os

from labkit.core.config import ParameterError, check_choice
from labkit.core.fingerprint import Resume
from labkit.core.loop import Engine, ProcessRole, StepCallback, StepOutcome
from labkit.core.loop import run as run_loop
from labkit.core.metrics import MetricsLog
from labkit.core.train_config import TrainConfig, with_vertex_dirs
from labkit.data import synthetic
from labkit.tf import state
from labkit.tf.data import DataOrigin
from labkit.tf.keras_fit import fit_keras
from labkit.tf.ps import fit_parameter_server
from labkit.tf.step import (
    build,
    make_replica_step,
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

__all__ = ["LOOPS", "build", "fit", "make_replica_step", "make_train_step", "training_arrays",
           "weights_fingerprint"]
LOOPS = ("custom", "keras")


def fit(config: TrainConfig, *, on_step: StepCallback | None = None,
        loop: str | None = None, data_dir: str | None = None) -> MetricsLog:
    """Train as configured; returns the MetricsLog (written to `config.metrics_out` by the chief;
    other workers write `<name>.worker<i>.json` beside it). Raises
    `labkit.core.train_config.Preempted` after checkpointing when SIGTERM arrives (or at
    `config.preempt_at`). Unset checkpoint and TensorBoard folders default to Vertex AI's
    (`with_vertex_dirs`).

    `loop="keras"` (or LABKIT_TF_LOOP=keras) trains with Keras `model.fit` + BackupAndRestore
    instead of the custom loop. `data_dir` (or LABKIT_TF_DATA_DIR) makes the samples come
    through labkit's TFRecord layer (shards written there once, read with tf.data) rather than
    straight from the synthetic generator; the bytes are the same either way."""
    config = with_vertex_dirs(config)
    if config.fp8_head:
        raise ParameterError("fp8_head", True, "is a torch engine feature; TensorFlow has no fp8 head")
    if config.cuda_graph_step:
        raise ParameterError("cuda_graph_step", True, "is a torch engine feature (TensorFlow: use XLA)")
    loop = check_choice("loop", loop or os.environ.get("LABKIT_TF_LOOP", "custom"), LOOPS)
    data_dir = data_dir or os.environ.get("LABKIT_TF_DATA_DIR") or None
    if loop == "keras":
        return fit_keras(config, on_step=on_step, data_dir=data_dir)
    from labkit.tf import runtime

    device = runtime.configure(config.device)  # before anything else touches TF devices
    import tensorflow as tf

    from labkit.tf import strategy as strategies

    plan = strategies.plan_strategy(local_gpus=len(tf.config.get_visible_devices("GPU")))
    if strategies.run_server_if_needed(plan):  # ps / worker tasks of a PS job serve, then exit
        return MetricsLog(run={"framework": "tf", "strategy": plan.kind,
                               "task": f"{plan.task_type}:{plan.task_index}"})
    if plan.kind == "parameter_server":
        return fit_parameter_server(config, plan, device, on_step, data_dir)
    return _fit_custom(config, plan, device, on_step, data_dir)


def _fit_custom(config: TrainConfig, plan, device: str, on_step: StepCallback | None,
                data_dir: str | None) -> MetricsLog:
    import tensorflow as tf

    lease = state.claim(config, plan.is_chief)  # outputs writable, the checkpoint folder ours alone
    try:
        return _fit_claimed(config, plan, device, on_step, data_dir, lease)
    except tf.errors.ResourceExhaustedError:
        gpus = [tf.config.experimental.get_device_details(g).get("device_name", g.name)
                for g in tf.config.get_visible_devices("GPU")]
        raise ParameterError("batch_size", config.batch_size,
                             f"does not fit in the memory of {', '.join(gpus) or 'this device'} with model "
                             f"{config.model!r} at scale {config.scale!r}, precision {config.precision}: use a "
                             f"smaller batch_size, grad_accum or bf16") from None
    finally:
        if lease is not None:
            lease.release()


def _fit_claimed(config: TrainConfig, plan, device: str, on_step: StepCallback | None,
                 data_dir: str | None, lease) -> MetricsLog:
    from labkit.tf import strategy as strategies
    from labkit.tf.data import BatchLayout

    strategy = strategies.make_strategy(plan)
    precision, model_cfg = precision_and_model(config)
    replicas = strategy.num_replicas_in_sync
    layout = BatchLayout(config.batch_size, replicas, config.grad_accum)
    with strategy.scope():
        parts = build(config, model_cfg, precision, replicas)
    model, optimizer = parts["model"], parts["optimizer"]
    start = 0
    resume = Resume.of(config, world_size=replicas, model_config=model_cfg,
                       data=synthetic.source_name(model_cfg))
    if config.checkpoint_dir:
        start = state.restore(config.checkpoint_dir, model, optimizer, resume) or 0
    rates = throughput(config, model_cfg, precision, device, replicas)
    log = MetricsLog(run=run_info(config, plan, layout, model, device, rates, precision))
    log.run["xla"] = jit = config.compile and replicas == 1
    log.run["resume_changes"] = resume.record() or None
    engine = _loop_engine(config, strategy, parts, layout, precision, device, plan, jit,
                          start, data_dir, model_cfg, resume, lease)
    role = ProcessRole(plan.is_chief, plan.num_workers, metrics_path(config, plan))
    return run_loop(config, engine, log, start=start, role=role, throughput=rates, on_step=on_step)


def _loop_engine(config: TrainConfig, strategy, parts, layout, precision, device: str, plan,
                 jit: bool, start: int, data_dir: str | None, model_cfg, resume: Resume,
                 lease=None) -> Engine:
    """This run's steps as the shared loop drives them (`labkit.core.loop.Engine`)."""
    import tensorflow as tf

    from labkit.tf.data import make_dataset_fn, step_position

    model, optimizer = parts["model"], parts["optimizer"]
    origin = DataOrigin.resumed(start, resume.data_position)
    num_samples = config.num_samples_or_default()
    batches = iter(())
    if start < config.steps:
        dataset = strategy.distribute_datasets_from_function(make_dataset_fn(
            training_arrays(model_cfg, config, data_dir), layout, first_step=start,
            last_step=config.steps, seed=config.seed, latency_s=config.input_latency_ms / 1000.0,
            origin=origin))
        batches = iter(dataset)
    train_step = make_train_step(strategy, model, optimizer, layout, config.grad_clip, precision,
                                 jit_compile=jit)
    stop_flags = (tf.constant(0.0), tf.constant(1.0))

    def read_step(handle) -> StepOutcome:
        loss, stop, skipped = handle
        return StepOutcome(float(loss), float(stop) > 0, float(skipped) > 0)

    checkpoints = {}
    if config.checkpoint_dir:
        saver = state.Saver(config.checkpoint_dir, model, optimizer, replicas=layout.num_replicas,
                            writes=plan.is_chief, fingerprint=resume.fingerprint, lease=lease,
                            keep=config.keep_checkpoints,
                            position=lambda step: step_position(step, layout.global_batch,
                                                                num_samples, origin))
        barrier = _barrier(strategy) if plan.num_workers > 1 else None

        def save(step: int, wait: bool) -> None:
            saver.save(step, wait=wait)
            if wait and barrier is not None:
                # The process is about to exit: no worker leaves before the chief's marker exists
                # (a worker that exits may have the whole job restarted, the chief with it).
                barrier()

        checkpoints = {"save": save, "wait_for_saves": saver.wait}
    return Engine(
        next_batch=lambda: next(batches),
        run_step=lambda batch, stop_requested: train_step(batch, stop_flags[stop_requested]),
        read_step=read_step,
        lr=lambda step: scheduled_lr(config, layout.num_replicas, step),
        peak_memory=lambda: peak_memory(device),
        final_run_info=lambda: {"final_weights": weights_fingerprint(model)},
        evaluate=lambda: heldout_loss(config, model, model_cfg, layout.micro_batch),
        **checkpoints)


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
