"""Precision modes for the TF engine, the twins of `labkit.torch.precision`.

| mode | Keras dtype policy | TF32 matmuls | loss scaling                 |
|------|--------------------|--------------|------------------------------|
| fp32 | float32            | off          | no                           |
| tf32 | float32            | on           | no                           |
| bf16 | mixed_bfloat16     | on           | no (bf16 has fp32's range)   |
| fp16 | mixed_float16      | on           | dynamic (LossScaleOptimizer) |

Note the default difference: TensorFlow enables TF32 on Ampere+ GPUs out of the box, torch does
not, so "fp32" must switch it off explicitly for a fair comparison. Policies are set per model
(layer `dtype=`), never globally, so runs in one notebook do not leak into each other. The modes,
which of them TensorFlow trains in (not fp8: that rung is torch's) and which scale the loss, are
`labkit.core.precisions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core import precisions
from labkit.core.config import check_choice

_POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16",
             "fp16": "mixed_float16"}


@dataclass(frozen=True)
class TFPrecision:
    """What one precision mode switches on in TensorFlow."""

    mode: str
    policy: str
    tf32: bool
    loss_scaling: bool

    @classmethod
    def for_mode(cls, mode: str) -> TFPrecision:
        check_choice("precision", mode, [p.name for p in precisions.precisions("tf")])
        return cls(mode, _POLICIES[mode], tf32=mode != "fp32", loss_scaling=precisions.get(mode).loss_scaling)

    @property
    def compute_dtype(self) -> str:
        return {"float32": "float32", "mixed_bfloat16": "bfloat16",
                "mixed_float16": "float16"}[self.policy]


def apply_matmul_precision(p: TFPrecision) -> None:
    """TF32 is process-global in TF too: set it explicitly for every run."""
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(p.tf32)


def wrap_optimizer(optimizer, p: TFPrecision, initial_scale: float = 2.0**16):
    """fp16 gets Keras' dynamic loss scaling: the loss is multiplied before backprop, gradients
    divided back, and a step whose gradients overflow is skipped while the scale halves."""
    if not p.loss_scaling:
        return optimizer
    import keras

    return keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=initial_scale)
