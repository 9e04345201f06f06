"""The learning-rate schedule both engines follow: linear warm-up, then constant.

One rule, written once: the LR of optimizer step `step` (0-based) is the peak LR
(`TrainConfig.peak_lr`) times `warmup_multiplier(step, warmup_steps)`. torch's `LambdaLR` calls
it through `WarmupThenConstant`; the TF engine's Keras schedule calls it on a step tensor with
`keras.ops.minimum` as `minimum`; both engines report the LR of a step with it.
"""

from __future__ import annotations

from typing import Any


def warmup_multiplier(step: Any, warmup: int, minimum: Any = min) -> Any:
    """(step + 1) / warmup, capped at 1; 1 without warm-up. `step` may be a framework tensor when
    `minimum` is that framework's element-wise minimum."""
    if not warmup:
        return 1.0
    return minimum(1.0, (step + 1.0) / warmup)


class WarmupThenConstant:
    """`warmup_multiplier` as an object (not a lambda), so a torch LambdaLR holding it saves and
    restores its state."""

    def __init__(self, warmup: int):
        self.warmup = warmup

    def __call__(self, step: int) -> float:
        return warmup_multiplier(step, self.warmup)
