"""Notebook 04's overflow demo: why fp16 needs a loss scale, and what a dynamic one does.

fp16 training is started from an absurd loss scale. Every step whose scaled gradients overflow
is skipped (the weights untouched) and the scale halved, until it fits and training proceeds:
torch's GradScaler and Keras' LossScaleOptimizer behave the same. Framework-free at import.
"""

from __future__ import annotations

from typing import Any

from labkit.core.config import check_choice, check_int
from labkit.core.train_config import TrainConfig


def overflow_demo(framework: str = "torch", *, steps: int = 14, init_scale: float = 2.0**28, model: str = "cnn",
                  batch_size: int = 8, device: str = "auto", seed: int = 0) -> list[dict[str, Any]]:
    """One row per step: the loss scale the step started with, whether it was skipped, its loss."""
    check_choice("framework", framework, ("torch", "tf"))
    check_int("steps", steps, minimum=1)
    cfg = TrainConfig(framework=framework, model=model, scale="smoke", batch_size=batch_size, precision="fp16",
                      device=device, seed=seed, grad_clip=None, progress=False)
    return (_torch_steps if framework == "torch" else _tf_steps)(cfg, steps, init_scale)


def _torch_steps(cfg: TrainConfig, steps: int, init_scale: float) -> list[dict[str, Any]]:
    from labkit.torch import engine, trainer
    from labkit.torch.data import make_dataset
    from labkit.torch.distributed import DistInfo

    c = engine.build(cfg, DistInfo(), engine.resolve_device(cfg.device, DistInfo()))
    c.scaler = c.policy.make_scaler(init_scale=init_scale)
    b = cfg.batch_size
    data = make_dataset(c.model_config, b * steps, cfg.seed)
    rows = []
    for step in range(steps):
        batch = engine.to_device(data[list(range(step * b, (step + 1) * b))], c, False)
        scale = c.scaler.get_scale()
        loss, skipped = trainer.train_step(c, [batch], None)
        rows.append({"step": step, "loss_scale": scale, "skipped": bool(skipped), "loss": float(loss)})
    return rows


def _tf_steps(cfg: TrainConfig, steps: int, init_scale: float) -> list[dict[str, Any]]:
    from labkit.tf import runtime

    runtime.configure(cfg.device)
    import tensorflow as tf

    from labkit.core.models import build_config
    from labkit.tf.data import BatchLayout, load_arrays, make_dataset_fn
    from labkit.tf.engine import build, make_train_step
    from labkit.tf.precision import TFPrecision

    model_cfg = build_config(cfg.model, "smoke")
    precision = TFPrecision.for_mode("fp16")
    strategy = tf.distribute.get_strategy()
    parts = build(cfg, model_cfg, precision, 1)
    optimizer = parts["optimizer"]
    optimizer.dynamic_scale.assign(init_scale)
    layout = BatchLayout(cfg.batch_size, 1, 1)
    arrays = load_arrays(model_cfg, cfg.batch_size * steps, cfg.seed)
    data = strategy.distribute_datasets_from_function(
        make_dataset_fn(arrays, layout, first_step=0, last_step=steps, seed=cfg.seed))
    step_fn = make_train_step(strategy, parts["model"], optimizer, layout, None, precision)
    it = iter(data)
    rows = []
    for step in range(steps):
        scale = float(optimizer.dynamic_scale.numpy())
        loss, _, skipped = step_fn(next(it), tf.constant(0.0))
        rows.append({"step": step, "loss_scale": scale, "skipped": bool(skipped > 0), "loss": float(loss)})
    return rows
