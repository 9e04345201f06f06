"""Precision modes: fp32, tf32, bf16 autocast, fp16 autocast with a GradScaler.

`PrecisionPolicy.for_mode(mode, device)` says what a mode switches on; `apply_matmul_precision`
sets the TF32 switches (they are process-global in torch, so every run sets them explicitly
instead of inheriting the previous run's). Notebook 04's ladder over these modes lives in `labkit.course.precision`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from labkit.core.config import check_choice
from labkit.core.train_config import PRECISIONS


@dataclass(frozen=True)
class PrecisionPolicy:
    """`autocast_dtype` None means no autocast; `tf32` lets fp32 matmuls/convs use TF32 tensor
    cores; `grad_scaler` multiplies the loss so fp16 gradients do not underflow."""

    mode: str
    device_type: str
    autocast_dtype: torch.dtype | None
    tf32: bool
    grad_scaler: bool

    @classmethod
    def for_mode(cls, mode: str, device_type: str) -> PrecisionPolicy:
        check_choice("precision", mode, PRECISIONS)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
        # bf16/fp16 runs keep TF32 on for the matmuls autocast leaves in fp32 (as AMP recipes do).
        return cls(mode, device_type, dtype, tf32=mode != "fp32", grad_scaler=mode == "fp16")

    def autocast(self, cache_enabled: bool = True):
        """Autocast for this mode (a no-op without one). `cache_enabled=False` for CUDA-graph
        capture: autocast's cache of cast weights must not outlive the captured region."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype,
                              cache_enabled=cache_enabled)

    def make_scaler(self, init_scale: float = 2.0**16) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(self.device_type, init_scale=init_scale, enabled=self.grad_scaler)

    @property
    def peak_dtype(self) -> torch.dtype:
        """The matmul dtype whose measured peak is this mode's MFU reference."""
        if self.autocast_dtype is not None:
            return self.autocast_dtype
        return torch.float32


def apply_matmul_precision(policy: PrecisionPolicy) -> None:
    torch.backends.cuda.matmul.allow_tf32 = policy.tf32
    torch.backends.cudnn.allow_tf32 = policy.tf32
    torch.set_float32_matmul_precision("high" if policy.tf32 else "highest")
