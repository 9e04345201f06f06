"""GPU utilisation sampled in the background while a run goes: through NVML (pynvml) when it is
installed, else `nvidia-smi`. On a machine without an NVIDIA GPU the sampler says so and
records nothing, so the same code runs everywhere.

Utilisation here is NVML's "percent of time a kernel was running" over the sample period: a
GPU at 100% can still be badly used (tiny kernels), which is why the verdict also reads the
trace; but a GPU well below 100% is certainly waiting for something.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field


@dataclass
class GpuSample:
    t: float
    utilization: float  # percent
    memory_used_mb: float


@dataclass
class GpuSampler:
    """`with GpuSampler(0.2) as s: ...` then `s.summary()`."""

    interval_s: float = 0.2
    index: int = 0
    samples: list[GpuSample] = field(default_factory=list)
    backend: str | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read = self._pick_backend()

    def _pick_backend(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self.backend = "nvml"

            def read():
                u = pynvml.nvmlDeviceGetUtilizationRates(handle)
                m = pynvml.nvmlDeviceGetMemoryInfo(handle)
                return float(u.gpu), m.used / 2**20
            return read
        except Exception:  # pynvml missing, or no NVIDIA driver: try nvidia-smi
            pass
        if shutil.which("nvidia-smi"):
            def read():
                out = subprocess.run(
                    ["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu,memory.used",
                     "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5, check=True)
                util, mem = (float(x) for x in out.stdout.strip().split(",")[:2])
                return util, mem
            try:
                read()
                self.backend = "nvidia-smi"
                return read
            except (subprocess.SubprocessError, OSError, ValueError):
                pass
        self.reason = "no NVIDIA GPU visible (neither NVML nor nvidia-smi answered); nothing sampled"
        return None

    @property
    def available(self) -> bool:
        return self._read is not None

    def _loop(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.is_set():
            try:
                util, mem = self._read()  # type: ignore[misc]
                self.samples.append(GpuSample(time.perf_counter() - t0, util, mem))
            except Exception as e:  # a failed read ends sampling, it never breaks training
                self.reason = f"sampling stopped: {e}"
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> GpuSampler:
        if self.available:
            self._thread = threading.Thread(target=self._loop, name="labkit-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def summary(self) -> dict[str, float] | None:
        """Mean and max utilisation (0..1) and peak memory, or None when nothing was sampled."""
        if not self.samples:
            return None
        utils = [s.utilization / 100 for s in self.samples]
        return {"mean_utilization": statistics.fmean(utils), "max_utilization": max(utils),
                "peak_memory_mb": max(s.memory_used_mb for s in self.samples), "samples": len(self.samples)}
