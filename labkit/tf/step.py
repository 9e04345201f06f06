"""What one TensorFlow optimizer step is made of, shared by every TF loop (the custom loop of
`labkit.tf.trainer`, `labkit.tf.ps`, `labkit.tf.keras_fit`).

- `build`: the Keras model twin, AdamW with the torch engine's hyper-parameters (fp16: wrapped in
  a LossScaleOptimizer) and the shared warm-up schedule (`labkit.core.schedule`);
- `make_replica_step` (one replica: accumulation, the all-reduce of summed gradients, clipping,
  the update) and `make_train_step` (one step on every replica of a strategy, as a tf.function
  of an already fetched distributed batch, so the loop can time the fetch);
- `training_arrays`, the samples of a run; `throughput`, what turns step times into samples/s,
  tokens/s and MFU (FLOPs per sample from `labkit.core.models`, the peak measured by
  `labkit.tf.peak`); `run_info`, `metrics_path`, `peak_memory`, `weights_fingerprint` and
  `write_final_metrics` for the metrics file.
"""

from __future__ import annotations

import hashlib
import math
import os
import resource
from dataclasses import asdict
from typing import Any

from labkit.core.config import resolve_scale
from labkit.core.loop import Throughput, write_metrics
from labkit.core.metrics import MetricsLog
from labkit.core.models import GPTConfig, ModelConfig, build_config, flops_per_sample
from labkit.core.schedule import warmup_multiplier
from labkit.core.train_config import TrainConfig


def precision_and_model(config: TrainConfig):
    """The run's `TFPrecision` (its TF32 switch applied: it is process-global) and model config."""
    from labkit.tf.precision import TFPrecision, apply_matmul_precision

    precision = TFPrecision.for_mode(config.precision)
    apply_matmul_precision(precision)
    return precision, build_config(config.model, resolve_scale(config.scale))


def build(config: TrainConfig, model_cfg, precision, num_replicas: int) -> dict[str, Any]:
    """Model, optimizer (AdamW as in the torch engine) and LR schedule, as
    `{"model", "optimizer", "schedule"}`; call inside `strategy.scope()` so variables are
    mirrored."""
    import keras

    from labkit.tf.models import build_model
    from labkit.tf.precision import wrap_optimizer

    model = build_model(model_cfg, dtype=precision.policy, seed=config.seed)
    schedule = warmup_schedule(config.peak_lr(num_replicas), config.warmup_steps)
    inner = _pre_reduced(keras.optimizers.AdamW)(
        learning_rate=schedule, beta_1=0.9, beta_2=0.95, epsilon=1e-8, weight_decay=0.1)
    # torch twin: decay on matrices and kernels only, not on biases and norm scales.
    inner.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables
                                              if len(v.shape) < 2])
    optimizer = wrap_optimizer(inner, precision)
    optimizer.build(model.trainable_variables)
    return {"model": model, "optimizer": optimizer, "schedule": schedule}


def warmup_schedule(peak: float, warmup: int):
    """A Keras LearningRateSchedule: `peak` times `labkit.core.schedule.warmup_multiplier`, the
    rule torch's LambdaLR follows too."""
    import keras

    class WarmupThenConstant(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):
            step = keras.ops.cast(step, "float32")
            return keras.ops.cast(peak * warmup_multiplier(step, warmup, keras.ops.minimum),
                                  "float32")

        def get_config(self):
            return {"peak": peak, "warmup": warmup}

    return WarmupThenConstant()


def scheduled_lr(config: TrainConfig, num_replicas: int, step: int) -> float:
    """The LR optimizer step `step` uses (what the schedule computes, without running TF)."""
    return config.peak_lr(num_replicas) * warmup_multiplier(step, config.warmup_steps)


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
    """A `tf.function(batch, stop_flag) -> (mean loss, any stop, skipped)` running one optimizer
    step on every replica; `batch` is an element of a distributed dataset, fetched by the caller
    (`next(iterator)`, timed as the step's data time). `jit_compile` compiles each micro-step's
    forward and backward with XLA (TF's counterpart of torch.compile; one replica only)."""
    import tensorflow as tf

    replica_step = make_replica_step(model, optimizer, layout, grad_clip, precision,
                                     jit_compile=jit_compile)

    @tf.function
    def train_step(batch, stop_flag):
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


def training_arrays(model_cfg, config: TrainConfig, data_dir: str | None):
    """Every sample of the run, in memory, from the generator or the TFRecord shards
    (`config.num_samples_or_default()` of them, the torch engine's count)."""
    from labkit.tf.data import arrays_from_shards, load_arrays

    n = config.num_samples_or_default()
    if data_dir:
        return arrays_from_shards(model_cfg, n, config.seed, data_dir)
    return load_arrays(model_cfg, n, config.seed)


def throughput(config: TrainConfig, model_cfg: ModelConfig, precision, device: str,
               num_replicas: int) -> Throughput:
    """Samples, tokens and FLOPs of a step, and the measured peak of one device of this run."""
    from labkit.tf import peak

    tokens = model_cfg.block_size if isinstance(model_cfg, GPTConfig) else None
    return Throughput(config.batch_size, tokens, flops_per_sample(model_cfg),
                      peak.measured_peak_flops(device, precision.compute_dtype),
                      devices=num_replicas)


def run_info(config: TrainConfig, plan, layout, model, device: str, rates: Throughput,
             precision) -> dict[str, Any]:
    """The metrics `run` section of a TF run."""
    from labkit.tf import peak
    from labkit.tf.models import count_parameters

    return {"framework": "tf", "model": config.model, "config": asdict(config),
            "strategy": plan.kind, "world_size": layout.num_replicas,
            "task": f"{plan.task_type}:{plan.task_index}", "micro_batch": layout.micro_batch,
            "device": device, "parameters": count_parameters(model),
            "flops_per_sample": rates.flops_per_sample, "peak_flops": rates.peak_flops,
            "mfu_peak": peak.describe(device, precision.compute_dtype)}


def metrics_path(config: TrainConfig, plan) -> str | None:
    """This task's metrics file: `metrics_out` for the chief, `<name>.<task><i>.json` beside it
    for the other workers."""
    if not config.metrics_out or plan.is_chief:
        return config.metrics_out
    root, ext = os.path.splitext(config.metrics_out)
    return f"{root}.{plan.task_type}{plan.task_index}{ext or '.json'}"


def write_final_metrics(log: MetricsLog, config: TrainConfig, plan, model) -> None:
    """This task's metrics file, with the final weights' fingerprint in its `run` section."""
    write_metrics(log, metrics_path(config, plan), {"final_weights": weights_fingerprint(model)})


def peak_memory(device: str) -> int:
    """Peak bytes of GPU:0 on a GPU, else the process's peak resident memory."""
    if device == "gpu":
        import tensorflow as tf

        return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


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
