"""Precision modes: fp32, tf32, bf16 autocast, fp16 autocast with a GradScaler, fp8 Linear layers
under bf16 autocast. The modes, and which of them scale the loss, are `labkit.core.precisions`;
what each switches on in torch is here.

`PrecisionPolicy.for_mode(mode, device)` says what a mode switches on; `policy.prepare_model(model,
device)` makes what a mode changes in the model (fp8: every eligible Linear computes in fp8,
`labkit.torch.fp8`; the others change nothing), once, after the model is on its device;
`apply_matmul_precision` sets the TF32 switches (they are process-global in torch, so every run
sets them explicitly instead of inheriting the previous run's). Notebook 04's ladder over these
modes lives in `labkit.course.precision`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from labkit.core import precisions
from labkit.core.config import ParameterError, check_choice
from labkit.torch import fp8

# What autocast computes in, per mode (none: fp32 and tf32). fp8 runs its Linear matmuls in fp8
# and everything autocast covers besides them in bf16.
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


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
        check_choice("precision", mode, [p.name for p in precisions.precisions("torch")])
        # bf16/fp16/fp8 runs keep TF32 on for the matmuls autocast leaves in fp32 (as AMP recipes do).
        return cls(mode, device_type, _AUTOCAST.get(mode), tf32=mode != "fp32",
                   grad_scaler=precisions.get(mode).loss_scaling)

    def prepare_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """`model` (on `device`) with what this mode changes in it: fp8 switches its Linear
        layers to fp8 matmuls in place (`labkit.torch.fp8.convert_linears`, parameters kept);
        the other modes return it unchanged. A GPU without fp8 tensor cores is refused."""
        if self.mode != "fp8":
            return model
        if device.type == "cuda" and not fp8.supported(device):
            major, minor = torch.cuda.get_device_capability(device)
            raise ParameterError("precision", self.mode,
                                 f"needs fp8 tensor cores (compute capability 8.9+: L4, H100, H200); "
                                 f"{torch.cuda.get_device_name(device)} is {major}.{minor}")
        if not fp8.convert_linears(model, "all"):
            raise ParameterError("precision", self.mode, "found no Linear layer whose sizes fp8 matmuls take "
                                 "(multiples of 16): it would change nothing in this model")
        return model

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
        """The matmul dtype whose measured peak is this mode's MFU reference. fp8's is bf16's:
        `labkit.torch.peak` times `a @ b` of `torch.randn` tensors (no float8 kernel for randn;
        fp8 tensor-core matmuls go through `torch._scaled_mm`). So an fp8 run's MFU is a share of the
        bf16 peak, as its metrics say (`mfu_peak`), not of the fp8 one, which labkit's GPU table
        gives as twice bf16's (L4, H100)."""
        if self.autocast_dtype is not None:
            return self.autocast_dtype
        return torch.float32


def apply_matmul_precision(policy: PrecisionPolicy) -> None:
    torch.backends.cuda.matmul.allow_tf32 = policy.tf32
    torch.backends.cudnn.allow_tf32 = policy.tf32
    torch.set_float32_matmul_precision("high" if policy.tf32 else "highest")
