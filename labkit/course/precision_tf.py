"""The TensorFlow column of notebook 04: the mixed-precision ladder through `labkit.tf.engine`.

`ladder(LadderConfig(...))` mirrors `labkit.course.precision_torch.ladder`: one training run per rung,
rows with the same keys (so both frameworks fill one table). The rungs are TensorFlow's own:

    fp32 → tf32 → bf16 (mixed_bfloat16) → fp16 (mixed_float16 + loss scaling) → bf16 + XLA

There is no channels_last rung: TensorFlow is NHWC (channels last) natively. XLA
(`jit_compile=True`) is TensorFlow's counterpart of torch.compile; like it, it is included
only at full scale by default. `overflow_demo` shows Keras' LossScaleOptimizer skipping
overflowing fp16 steps and halving its scale, like the torch GradScaler demo.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.core.config import check_int
from labkit.core.train_config import TrainConfig
from labkit.course.precision import LadderConfig


@dataclass(frozen=True)
class TFRung:
    name: str
    precision: str
    xla: bool = False


TF_LADDER = (
    TFRung("fp32", "fp32"),
    TFRung("tf32", "tf32"),
    TFRung("bf16 (mixed_bfloat16)", "bf16"),
    TFRung("fp16 + loss scaling", "fp16"),
    TFRung("bf16 + XLA", "bf16", xla=True),
)




COLUMNS = ("framework", "rung", "samples_per_s", "speedup", "step_time_ms", "peak_memory_mib",
           "final_loss", "device")


def rungs(include_compile: bool) -> list[TFRung]:
    return [r for r in TF_LADDER if include_compile or not r.xla]


def ladder(config: LadderConfig) -> list[dict[str, Any]]:
    """Train once per rung with the TF engine; rows keyed like the torch ladder's."""
    from labkit.tf.engine import fit

    scale, steps, batch, include_compile = config.resolved()
    base = dict(framework="tf", model=config.model, scale=scale, batch_size=batch,
                seed=config.seed, device=config.device, progress=False, grad_clip=None)
    fit(TrainConfig(steps=2, **base))  # warm-up run, discarded (thread pools, first kernels)
    rows: list[dict[str, Any]] = []
    for rung in rungs(include_compile):
        log = fit(TrainConfig(steps=steps, precision=rung.precision, compile=rung.xla, **base))
        s = log.to_dict()["summary"]
        on_gpu = log.run["device"] == "gpu"
        rows.append({"framework": "tf", "rung": rung.name, "precision": rung.precision,
                     "channels_last": True, "compile": rung.xla,
                     "samples_per_s": s.get("median_samples_per_s"),
                     "step_time_ms": 1000 * s["median_step_time_s"], "mfu": None,
                     "peak_memory_mib": s["peak_memory_bytes"] / 2**20 if on_gpu else None,
                     "activation_mib": None, "final_loss": s["final_loss"],
                     "device": log.run["device"]})
    first = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup"] = r["samples_per_s"] / first if first else None
    return rows


def overflow_demo(steps: int = 14, init_scale: float = 2.0**28, model: str = "cnn",
                  batch_size: int = 8, device: str = "auto", seed: int = 0) -> list[dict[str, Any]]:
    """fp16 training started from an absurd loss scale: Keras' LossScaleOptimizer skips each
    step whose gradients overflow and halves the scale, until it fits."""
    from labkit.tf import runtime

    check_int("steps", steps, minimum=1)
    runtime.configure(device)
    import tensorflow as tf

    from labkit.core.models import build_config
    from labkit.tf.data import BatchLayout, load_arrays, make_dataset_fn
    from labkit.tf.engine import build, make_train_step
    from labkit.tf.precision import TFPrecision

    cfg = TrainConfig(framework="tf", model=model, batch_size=batch_size, precision="fp16",
                      seed=seed, grad_clip=None, device=device, progress=False)
    model_cfg = build_config(model, "smoke")
    precision = TFPrecision.for_mode("fp16")
    strategy = tf.distribute.get_strategy()
    parts = build(cfg, model_cfg, precision, 1)
    optimizer = parts["optimizer"]
    optimizer.dynamic_scale.assign(init_scale)
    layout = BatchLayout(batch_size, 1, 1)
    arrays = load_arrays(model_cfg, batch_size * steps, seed)
    data = strategy.distribute_datasets_from_function(
        make_dataset_fn(arrays, layout, first_step=0, last_step=steps, seed=seed))
    step_fn = make_train_step(strategy, parts["model"], optimizer, layout, None, precision)
    it = iter(data)
    rows = []
    for step in range(steps):
        scale = float(optimizer.dynamic_scale.numpy())
        loss, _, skipped = step_fn(next(it), tf.constant(0.0))
        rows.append({"step": step, "loss_scale": scale, "skipped": bool(skipped > 0),
                     "loss": float(loss)})
    return rows
