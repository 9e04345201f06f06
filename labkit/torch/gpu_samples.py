"""GPU utilisation and memory of the training device while a run trains, for the job's logs.

`sampler_for(device)` is the trainer's `system` sampler for `labkit.core.loop.Reporter`: None for a
CPU device (a CPU run samples nothing), else a `CudaSampler` that the loop's Reporter calls
after each step on the main process and writes as ``system/gpu_util`` (percent) and
``system/gpu_mem_gib`` TensorBoard scalars, W&B values, and fields of the job's JSON step lines.

How it reads (`NVML_UTILIZATION`): NVML's ``nvmlDeviceGetUtilizationRates``, the "percent of
time over the past sample period during which one or more kernels was executing on the GPU",
over a period of 1/6 s to 1 s depending on the GPU, and ``nvmlDeviceGetMemoryInfo``, the
device's used memory, every process's (what nvidia-smi shows). NVML is ``libnvidia-ml.so.1``,
which comes with the driver, reached through ctypes: no Python binding to install (PyTorch's own
``torch.cuda.utilization`` needs the nvidia-ml-py package, which training images rarely have).
Without NVML only the memory is read, through ``torch.cuda.mem_get_info`` (cudaMemGetInfo, the
same device-wide figure).

Pace: a sample at most every `every_s` (1 s, about NVML's own averaging period); a call in
between costs one clock read and returns None, so a step pays nothing. A read that fails ends
sampling (`reason` says why): monitoring never stops training.

The NVML device is the CUDA device's: with ``CUDA_VISIBLE_DEVICES`` set, its entry for that
CUDA index (an NVML index or a ``GPU-`` UUID), as PyTorch maps them (`nvml_target`).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Mapping

import torch

NVML_UTILIZATION = ("https://docs.nvidia.com/deploy/nvml-api/api/structnvmlUtilization__t.html "
                    "(nvmlUtilization_t.gpu: percent of time over the past sample period, 1/6 s to "
                    "1 s by product, during which one or more kernels was executing; read 2026-11-29)")
EVERY_S = 1.0
GIB = 2**30


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_target(cuda_index: int, env: Mapping[str, str] | None = None) -> int | str:
    """The NVML device behind CUDA device `cuda_index`: an NVML index, or the UUID that
    CUDA_VISIBLE_DEVICES names it by."""
    env = os.environ if env is None else env
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible or cuda_index >= len(visible):
        return cuda_index
    entry = visible[cuda_index]
    return int(entry) if entry.isdigit() else entry


class _Nvml:
    """The two NVML queries, on one device handle."""

    def __init__(self, target: int | str):
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")
        handle = ctypes.c_void_p()
        code = (lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(target), ctypes.byref(handle))
                if isinstance(target, int) else
                lib.nvmlDeviceGetHandleByUUID(target.encode(), ctypes.byref(handle)))
        if code != 0:
            raise OSError(f"NVML has no device {target!r} (error {code})")
        self.lib, self.handle = lib, handle

    def read(self) -> tuple[float, float]:
        """(utilisation in percent, used memory in bytes)."""
        util, mem = _Utilization(), _Memory()
        for name, out in (("nvmlDeviceGetUtilizationRates", util), ("nvmlDeviceGetMemoryInfo", mem)):
            code = getattr(self.lib, name)(self.handle, ctypes.byref(out))
            if code != 0:
                raise OSError(f"{name} failed (error {code})")
        return float(util.gpu), float(mem.used)


class CudaSampler:
    """``sampler()`` -> ``{"gpu_util": percent, "gpu_mem_gib": GiB}`` when a sample is due, else
    None (see the module docstring)."""

    def __init__(self, device: torch.device, every_s: float = EVERY_S):
        self.device, self.every_s = device, every_s
        self.reason = ""
        self._next = 0.0
        index = device.index if device.index is not None else torch.cuda.current_device()
        try:
            self._nvml: _Nvml | None = _Nvml(nvml_target(index))
        except (OSError, AttributeError) as e:  # no NVML here: memory through torch only
            self._nvml, self.reason = None, f"NVML unavailable ({e}): memory only"
        self.stopped = False

    def __call__(self) -> dict[str, float] | None:
        now = time.monotonic()
        if self.stopped or now < self._next:
            return None
        self._next = now + self.every_s
        try:
            if self._nvml is not None:
                util, used = self._nvml.read()
                return {"gpu_util": util, "gpu_mem_gib": used / GIB}
            free, total = torch.cuda.mem_get_info(self.device)
            return {"gpu_mem_gib": (total - free) / GIB}
        except (OSError, RuntimeError, AttributeError) as e:
            self.stopped, self.reason = True, f"sampling stopped: {e}"
            return None


def sampler_for(device: torch.device) -> CudaSampler | None:
    """The training device's sampler: a `CudaSampler` on CUDA, None elsewhere."""
    return CudaSampler(device) if device.type == "cuda" else None
