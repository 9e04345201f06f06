"""The TensorFlow training engine: `fit(config, on_step=None)`, twin of `labkit.torch.engine`.

Why a custom loop and not `model.fit`: with TensorFlow 2.21 and Keras 3, `model.fit` under
MultiWorkerMirroredStrategy fails on two workers ("Attempt to convert a value (PerReplica...)
to a Tensor"); `labkit.tf.keras_fit` keeps that path (with BackupAndRestore) and a test tracks
when it starts working. The loop below (`strategy.run` inside a `tf.function` over a
distributed dataset) trains under every strategy today with the current Keras, and gives
exactly the torch engine's semantics: `batch_size` is the global batch, gradients are summed
across replicas before clipping (as DDP + clip_grad_norm_), accumulation, warm-up, AdamW with
the same hyper-parameters, fp16 loss scaling, a per-step loss (not Keras' running mean), and a
resume that continues with exactly the next step.

Preemption: SIGTERM (or the `preempt_at` drill) sets a flag; the flag is all-reduced with the
loss so every worker checkpoints and leaves at the same step; the process raises
`labkit.core.train_config.Preempted` (the CLI exits 143). Checkpoints are `tf.train.Checkpoint`s (model,
optimizer with its loss scale, step); the data position is the step itself.
"""

from __future__ import annotations

import hashlib
import math
import os
import resource
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from labkit.core.config import resolve_scale
from labkit.core.metrics import MetricsLog, StepMetrics
from labkit.core.models import GPTConfig, build_config
from labkit.core.train_config import Preempted, TrainConfig

StepCallback = Callable[[int, dict[str, Any]], None]
LOOPS = ("custom", "keras")


def fit(config: TrainConfig, *, on_step: StepCallback | None = None,
        loop: str | None = None, data_dir: str | None = None) -> Any:
    """Train as configured; returns the MetricsLog (written to `config.metrics_out` by the chief;
    other workers write `<name>.worker<i>.json` beside it).

    `loop="keras"` (or LABKIT_TF_LOOP=keras) trains with Keras `model.fit` + BackupAndRestore
    instead of the custom loop. `data_dir` (or LABKIT_TF_DATA_DIR) makes the samples come
    through labkit's TFRecord layer (shards written there once, read with tf.data) rather than
    straight from the synthetic generator; the bytes are the same either way."""
    from labkit.core.config import ParameterError, check_choice

    if config.fp8_head:
        raise ParameterError("fp8_head", True, "is a torch engine feature; TensorFlow has no fp8 head")
    if config.cuda_graph_step:
        raise ParameterError("cuda_graph_step", True, "is a torch engine feature (TensorFlow: use XLA)")
    loop = check_choice("loop", loop or os.environ.get("LABKIT_TF_LOOP", "custom"), LOOPS)
    data_dir = data_dir or os.environ.get("LABKIT_TF_DATA_DIR") or None
    if loop == "keras":
        from labkit.tf.keras_fit import fit_keras

        return fit_keras(config, on_step=on_step, data_dir=data_dir)
    return _fit_custom(config, on_step, data_dir)


def training_arrays(model_cfg, config: TrainConfig, data_dir: str | None):
    """Every sample of the run, in memory, from the generator or the TFRecord shards."""
    from labkit.tf.data import arrays_from_shards, load_arrays

    n = config.num_samples_or_default()
    if data_dir:
        return arrays_from_shards(model_cfg, n, config.seed, data_dir)
    return load_arrays(model_cfg, n, config.seed)


class _SigtermFlag:
    """Installs a flag-setting SIGTERM handler (main thread only) and restores the old one."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum, frame):
        self.requested = True

    def trigger(self) -> None:
        if self._previous is not None:
            os.kill(os.getpid(), signal.SIGTERM)  # the drill goes through the real handler
        else:
            self.requested = True

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _fit_custom(config: TrainConfig, on_step: StepCallback | None, data_dir: str | None):
    from labkit.tf import runtime

    device = runtime.configure(config.device)  # before anything else touches TF devices
    import tensorflow as tf

    from labkit.tf import strategy as strategies
    from labkit.tf.data import BatchLayout, make_dataset_fn
    from labkit.tf.precision import TFPrecision, apply_matmul_precision

    plan = strategies.plan_strategy(local_gpus=len(tf.config.get_visible_devices("GPU")))
    if strategies.run_server_if_needed(plan):  # ps / worker tasks of a PS job serve, then exit
        return MetricsLog(run={"framework": "tf", "strategy": plan.kind,
                               "task": f"{plan.task_type}:{plan.task_index}"})
    if plan.kind == "parameter_server":
        from labkit.tf.ps import fit_parameter_server

        return fit_parameter_server(config, plan, on_step, data_dir)
    strategy = strategies.make_strategy(plan)
    precision = TFPrecision.for_mode(config.precision)
    apply_matmul_precision(precision)
    model_cfg = build_config(config.model, resolve_scale(config.scale))
    layout = BatchLayout(config.batch_size, strategy.num_replicas_in_sync, config.grad_accum)

    with strategy.scope():
        parts = build(config, model_cfg, precision, strategy.num_replicas_in_sync)
    model, optimizer, step_var = parts["model"], parts["optimizer"], parts["step"]
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    manager = _checkpoint_manager(ckpt, config.checkpoint_dir, plan)
    start = 0
    if config.checkpoint_dir:
        latest = tf.train.latest_checkpoint(config.checkpoint_dir)
        if latest:
            ckpt.restore(latest).expect_partial()
            start = int(step_var.numpy())
    if start >= config.steps:
        return _finish(MetricsLog(run=_run_info(config, plan, layout, model, device, start)),
                       config, plan, model)

    arrays = training_arrays(model_cfg, config, data_dir)
    dataset = strategy.distribute_datasets_from_function(make_dataset_fn(
        arrays, layout, first_step=start, last_step=config.steps, seed=config.seed,
        latency_s=config.input_latency_ms / 1000.0))
    jit = config.compile and strategy.num_replicas_in_sync == 1
    train_step = make_train_step(strategy, model, optimizer, layout, config.grad_clip, precision,
                                 jit_compile=jit)
    tokens = model_cfg.block_size if isinstance(model_cfg, GPTConfig) else None
    log = MetricsLog(run=_run_info(config, plan, layout, model, device, start))
    log.run["xla"] = jit
    iterator = iter(dataset)
    writer = (tf.summary.create_file_writer(config.tensorboard_dir)
              if config.tensorboard_dir and plan.is_chief else None)
    with _SigtermFlag() as flag:
        last = time.perf_counter()
        for step in range(start, config.steps):
            if config.preempt_at is not None and step == config.preempt_at:
                flag.trigger()
            lr = float(parts["schedule"](step))
            loss, stop, skipped = train_step(iterator, tf.constant(float(flag.requested)))
            loss_value = float(loss)
            # Every worker learns of a SIGTERM through the all-reduced flag (they must save and
            # leave at the same step); a lone process can also act on one that came mid-step.
            stop = bool(stop > 0) or (plan.num_workers == 1 and flag.requested)
            step_var.assign(step + 1)
            now = time.perf_counter()
            step_time, last = now - last, now
            m = StepMetrics(step=step, loss=loss_value, step_time_s=step_time,
                            samples_per_s=config.batch_size / step_time,
                            tokens_per_s=config.batch_size * tokens / step_time if tokens else None,
                            peak_memory_bytes=_peak_memory(device), lr=lr,
                            skipped=bool(skipped > 0))
            log.append(m)
            if on_step is not None:
                on_step(step, m.to_dict())
            _progress(config, plan, m)
            _tensorboard(writer, m)
            done = step + 1 == config.steps
            due = config.checkpoint_every and (step + 1) % config.checkpoint_every == 0
            if manager is not None and (due or done or stop):
                manager.save(checkpoint_number=step + 1)
            if stop:
                _finish(log, config, plan, model)
                raise Preempted(step)
            if math.isnan(loss_value):
                raise FloatingPointError(f"loss is NaN at step {step}")
    return _finish(log, config, plan, model)


def build(config: TrainConfig, model_cfg, precision, num_replicas: int) -> dict[str, Any]:
    """Model, optimizer (AdamW as in the torch engine), LR schedule and step counter; call
    inside `strategy.scope()` so variables are mirrored."""
    import keras
    import tensorflow as tf

    from labkit.tf.models import build_model
    from labkit.tf.precision import wrap_optimizer

    model = build_model(model_cfg, dtype=precision.policy, seed=config.seed)
    peak = config.lr * (num_replicas if config.scale_lr_with_world_size else 1)
    schedule = WarmupThenConstant(peak, config.warmup_steps)
    inner = _pre_reduced(keras.optimizers.AdamW)(
        learning_rate=schedule, beta_1=0.9, beta_2=0.95, epsilon=1e-8, weight_decay=0.1)
    # torch twin: decay on matrices and kernels only, not on biases and norm scales.
    inner.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables
                                              if len(v.shape) < 2])
    optimizer = wrap_optimizer(inner, precision)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    return {"model": model, "optimizer": optimizer, "schedule": schedule, "step": step}


def WarmupThenConstant(peak: float, warmup: int):  # noqa: N802 (a schedule class factory)
    """Linear warm-up over `warmup` optimizer steps, then `peak` (the torch engine's schedule)."""
    import keras

    class _Schedule(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            step = keras.ops.cast(step, "float32")
            if not warmup:
                return keras.ops.convert_to_tensor(peak, "float32")
            return peak * keras.ops.minimum(1.0, (step + 1.0) / warmup)

        def get_config(self):
            return {"peak": peak, "warmup": warmup}

    return _Schedule()


def _pre_reduced(optimizer_cls):
    """An optimizer class that applies gradients the engine has already summed across replicas.
    Keras' TF optimizer all-reduces inside `apply`, *after* its own clipping; the engine
    all-reduces first and clips the summed gradient (what DDP + clip_grad_norm_ does), so the
    second reduction is switched off."""

    class PreReduced(optimizer_cls):
        def _all_reduce_sum_gradients(self, grads_and_vars):
            return list(grads_and_vars)

    PreReduced.__name__ = f"PreReduced{optimizer_cls.__name__}"
    return PreReduced


def make_train_step(strategy, model, optimizer, layout, grad_clip: float | None, precision,
                    *, jit_compile: bool = False):
    """A `tf.function(iterator, stop_flag) -> (mean loss, any stop, skipped)` running one
    optimizer step on every replica. `jit_compile` compiles each micro-step's forward and
    backward with XLA (TF's counterpart of torch.compile; one replica only)."""
    import tensorflow as tf

    replica_step = make_replica_step(model, optimizer, layout, grad_clip, precision,
                                     jit_compile=jit_compile)

    @tf.function
    def train_step(iterator, stop_flag):
        batch = next(iterator)
        loss, stop, skipped = strategy.run(replica_step, args=(batch, stop_flag))
        sum_ = tf.distribute.ReduceOp.SUM
        return (strategy.reduce(sum_, loss, axis=None), strategy.reduce(sum_, stop, axis=None),
                strategy.reduce(sum_, skipped, axis=None))

    return train_step


def make_replica_step(model, optimizer, layout, grad_clip: float | None, precision,
                      *, jit_compile: bool = False):
    """What one replica does in one optimizer step: `(batch, stop_flag) -> (loss, stop,
    skipped)`, batch = (inputs, targets) shaped (grad_accum, micro_batch, ...)."""
    import tensorflow as tf

    accum = layout.grad_accum
    scaled = precision.loss_scaling
    terms = None

    def micro_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                         from_logits=True)
            # Sum over this micro-batch / the global count: summing over replicas and
            # micro-steps then gives the mean over the global batch, as in torch.
            loss = tf.reduce_sum(per_sample) / float(layout.global_batch * terms)
            loss_for_grad = optimizer.scale_loss(loss) if scaled else loss
        grads = tape.gradient(loss_for_grad, model.trainable_variables)
        return loss, [tf.convert_to_tensor(g) for g in grads]

    if jit_compile:
        micro_step = tf.function(micro_step, jit_compile=True)

    def replica_step(batch, stop_flag):
        nonlocal terms
        x, y = batch  # (accum, micro, ...) each
        terms = _per_sample_terms(y)
        variables = model.trainable_variables
        grads = [tf.zeros_like(v) for v in variables]
        total = tf.constant(0.0)
        for k in range(accum):  # static unroll: accum is small and fixed per run
            loss, step_grads = micro_step(x[k], y[k])
            grads = [g + s for g, s in zip(grads, step_grads, strict=True)]
            total += loss
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        if grad_clip:
            # With fp16 the gradients are still multiplied by the loss scale here.
            limit = grad_clip * (optimizer.dynamic_scale if scaled else 1.0)
            grads, _ = tf.clip_by_global_norm(grads, limit)
        skipped = tf.constant(0.0)
        if scaled:
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
            skipped = 1.0 - tf.cast(finite, tf.float32)
        optimizer.apply(grads, variables)
        return total, stop_flag, skipped

    return replica_step


def _per_sample_terms(y) -> int:
    """Loss terms per sample: 1 for a class label, block_size for next-token targets."""
    return int(y.shape[-1]) if len(y.shape) == 3 else 1


def _checkpoint_manager(ckpt, directory: str | None, plan):
    """With several workers every one must take part in a save; only the chief's lands in
    `directory`, the others write to a private scratch folder that is deleted."""
    import tensorflow as tf

    if not directory:
        return None
    if not plan.is_chief:
        directory = os.path.join(directory, f".{plan.task_type}{plan.task_index}-scratch")
    return tf.train.CheckpointManager(ckpt, directory, max_to_keep=2)


def weights_fingerprint(model) -> dict[str, Any]:
    """sha256 over all weights' bytes, and their global L2 norm: replicas that agree on the
    weights report the same fingerprint."""
    import numpy as np

    h = hashlib.sha256()
    sq = 0.0
    for w in model.weights:
        a = np.ascontiguousarray(np.asarray(w.numpy()))
        h.update(a.tobytes())
        sq += float(np.square(a.astype(np.float64)).sum())
    return {"sha256": h.hexdigest(), "l2": math.sqrt(sq)}


def _run_info(config, plan, layout, model, device, start) -> dict[str, Any]:
    from labkit.tf.models import count_parameters

    return {"framework": "tf", "model": config.model, "config": asdict(config),
            "strategy": plan.kind, "world_size": layout.num_replicas,
            "task": f"{plan.task_type}:{plan.task_index}", "micro_batch": layout.micro_batch,
            "device": device, "parameters": count_parameters(model),
            "resumed_from_step": start - 1 if start else None}


def _finish(log: MetricsLog, config: TrainConfig, plan, model) -> MetricsLog:
    log.run["final_weights"] = weights_fingerprint(model)
    if config.metrics_out:
        path = config.metrics_out
        if not plan.is_chief:
            root, ext = os.path.splitext(path)
            path = f"{root}.{plan.task_type}{plan.task_index}{ext or '.json'}"
        log.write(path)
    if config.checkpoint_dir and not plan.is_chief:
        shutil.rmtree(os.path.join(config.checkpoint_dir,
                                   f".{plan.task_type}{plan.task_index}-scratch"),
                      ignore_errors=True)
    return log


def _peak_memory(device: str) -> int:
    if device == "gpu":
        import tensorflow as tf

        return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _tensorboard(writer, m: StepMetrics) -> None:
    """The torch engine's TensorBoard scalars, written with tf.summary."""
    if writer is None:
        return
    import tensorflow as tf

    with writer.as_default(step=m.step):
        for key, value in m.to_dict().items():
            if key in ("loss", "step_time_s", "samples_per_s", "tokens_per_s", "lr"):
                tf.summary.scalar(f"train/{key}", value)
    writer.flush()


def _progress(config: TrainConfig, plan, m: StepMetrics) -> None:
    # One line per step on the chief (a subprocess-friendly progress report).
    if config.progress and plan.is_chief and not os.environ.get("LABKIT_NO_PROGRESS"):
        print(f"step {m.step + 1}/{config.steps} loss {m.loss:.4f}", flush=True)
