"""What hardware this process can see: CPU, NVIDIA GPUs, TPUs. Detection only, no benchmarks.

GPUs are read through torch when it is installed (it also gives compute capability), otherwise
through `nvidia-smi`, so a TF-only image still reports them. Nothing here touches the network.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field

from labkit.core.frameworks import has_torch


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_bytes: int
    compute_capability: str | None = None

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / 2**30

    @property
    def has_bf16_tensor_cores(self) -> bool:
        """Ampere (8.0) and newer run bf16 matmuls on tensor cores."""
        if not self.compute_capability:
            return False
        return float(self.compute_capability) >= 8.0


@dataclass(frozen=True)
class DeviceInfo:
    cpu_count: int
    cpu_model: str
    memory_bytes: int | None
    gpus: tuple[GPU, ...] = field(default_factory=tuple)
    tpu: str | None = None

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def kind(self) -> str:
        """'gpu', 'tpu' or 'cpu': what the course sizes its runs for."""
        if self.gpus:
            return "gpu"
        if self.tpu:
            return "tpu"
        return "cpu"


def _cpuinfo(field: str) -> str | None:
    """The first `field` of /proc/cpuinfo (None where there is no such file or field)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """This machine's CPU model name (from /proc/cpuinfo where there is one)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags this CPU reports (from /proc/cpuinfo; empty where there is
    none), e.g. "avx512_bf16" or "amx_fp16"."""
    return frozenset((_cpuinfo("flags") or "").split())


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def usable_cpu_count() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity, unlike os.cpu_count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _gpus_from_torch() -> tuple[GPU, ...]:
    import torch

    if not torch.cuda.is_available():
        return ()
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(GPU(i, p.name, int(p.total_memory), f"{p.major}.{p.minor}"))
    return tuple(gpus)


def _gpus_from_nvidia_smi() -> tuple[GPU, ...]:
    if shutil.which("nvidia-smi") is None:
        return ()
    query = "--query-gpu=index,name,memory.total,compute_cap"
    try:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return ()
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            cc = parts[3] if len(parts) > 3 and parts[3] not in ("", "[N/A]") else None
            gpus.append(GPU(int(parts[0]), parts[1], int(float(parts[2])) * 2**20, cc))
    return tuple(gpus)


def _tpu() -> str | None:
    # Cloud TPU VMs export the accelerator type; the chips appear as /dev/accel* or vfio devices.
    kind = os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("ACCELERATOR_TYPE")
    if kind:
        return kind
    if os.path.exists("/dev/accel0"):
        return "TPU (type unknown)"
    return None


@functools.lru_cache(maxsize=1)
def detect() -> DeviceInfo:
    """Describe this machine once per process (cached: detection can take a second)."""
    gpus = _gpus_from_torch() if has_torch() else ()
    if not gpus:
        gpus = _gpus_from_nvidia_smi()
    return DeviceInfo(
        cpu_count=usable_cpu_count(),
        cpu_model=cpu_model(),
        memory_bytes=_memory_bytes(),
        gpus=gpus,
        tpu=_tpu(),
    )


def unusable_gpus() -> str | None:
    """A sentence when this machine has an NVIDIA GPU that torch cannot use (a CPU-only torch
    build, a driver torch cannot load, CUDA_VISIBLE_DEVICES hiding it), else None. Training then
    runs on the CPU while the machine is billed as a GPU machine, so callers say it loudly."""
    if not has_torch():
        return None
    import torch

    if torch.cuda.is_available() or os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return None  # usable, or hidden on purpose (a CPU replica beside GPU ones)
    listed = _gpus_from_nvidia_smi()
    if not listed and not os.path.exists("/dev/nvidia0"):
        return None
    what = ", ".join(g.name for g in listed) or "an NVIDIA device (/dev/nvidia0)"
    build = torch.version.cuda
    why = ("this torch is a CPU-only build: install a CUDA build of torch" if build is None else
           f"torch (CUDA {build}) cannot use it: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    return f"this machine has {what}, but {why}; training would run on the CPU"


def cuda_available() -> bool:
    """True when torch can use a CUDA GPU here (False when torch is not installed)."""
    if not has_torch():
        return False
    import torch

    return torch.cuda.is_available()


def torch_gpu_count() -> int:
    """How many CUDA GPUs torch can use here (0 without torch or without a usable GPU): the GPU
    count `labkit.core.placement.place_here` places torch processes on."""
    if not cuda_available():
        return 0
    import torch

    return torch.cuda.device_count()
