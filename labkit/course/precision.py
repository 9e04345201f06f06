"""What one run of notebook 04's mixed-precision ladder trains, for either framework.

`labkit.course.precision_torch` and `labkit.course.precision_tf` climb their own rungs (torch: autocast,
channels_last, torch.compile; TensorFlow: dtype policies, XLA) but take this one config, so the
two columns of the notebook are sized the same way and read the same parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.config import by_scale, check_bool, check_choice, check_int, resolve_scale
from labkit.core.models import MODEL_NAMES


@dataclass(frozen=True)
class LadderConfig:
    """One ladder run. Sizes default by scale. `include_compile` (torch.compile for torch, XLA
    `jit_compile` for TensorFlow) None means only at full scale: compiling takes minutes on a
    small CPU and would dominate a smoke run."""

    model: str = "resnet"
    scale: str = "auto"
    steps: int | None = None
    batch_size: int | None = None
    include_compile: bool | None = None
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("model", self.model, MODEL_NAMES)
        check_int("steps", self.steps, minimum=2, allow_none=True)
        check_int("batch_size", self.batch_size, minimum=1, allow_none=True)
        if self.include_compile is not None:
            check_bool("include_compile", self.include_compile)

    def resolved(self) -> tuple[str, int, int, bool]:
        """(scale, steps, batch size, include the compile rung) with the defaults filled in."""
        scale = resolve_scale(self.scale)
        steps = self.steps or by_scale(scale, smoke=5, full=30)
        batch = self.batch_size or default_batch(self.model, scale)
        return scale, steps, batch, compile_included(self.include_compile, scale)


def default_batch(model: str, scale: str) -> int:
    """Smoke: 16. Full: the PERFORMANCE.md peer batches (GPT-2 small 12, ResNet-50 256)."""
    return by_scale(scale, smoke=16, full=12 if model == "gpt" else 256)


def compile_included(include_compile: bool | None, scale: str) -> bool:
    """None means only at full scale: compiling takes minutes on a small CPU."""
    return include_compile if include_compile is not None else scale == "full"
