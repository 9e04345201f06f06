"""Micro-benchmarks of this machine's ceilings: matmul TFLOP/s per dtype, memory-copy bandwidth,
and host↔device bandwidth (pinned and pageable) when a CUDA GPU is present.

These are the numbers every later claim is measured against (MFU, "the GPU waits for input").
Timing: warm-up runs first, then the median of `repeats` timed runs; on CUDA with CUDA events
after a synchronize, so asynchronous launches are not mistaken for finished work. With no
torch installed the CPU figures come from NumPy.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from labkit.core.config import check_choice, check_int
from labkit.core.frameworks import has_torch
from labkit.core.placement import DEVICES, place_here

# The formats the matmul benchmark can time, each with the torch dtype it is stored in ('tf32'
# is fp32 storage with TF32 tensor cores): the GPU defaults; the CPU times two of them.
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GPU_DTYPES = tuple(TORCH_DTYPES)
CPU_DTYPES = ("fp32", "bf16")


@dataclass
class BenchConfig:
    """Sizes of the micro-benchmarks. `dtypes=()` picks the defaults for the device."""

    device: str = "auto"
    matmul_size: int = 1024
    copy_mb: int = 64
    repeats: int = 5
    warmup: int = 2
    dtypes: tuple[str, ...] = ()
    threads: int = 0  # CPU intra-op threads for torch; 0 keeps torch's default (all cores)

    def __post_init__(self) -> None:
        check_int("threads", self.threads, minimum=0)
        check_choice("device", self.device, DEVICES)
        check_int("matmul_size", self.matmul_size, minimum=16, maximum=32768)
        check_int("copy_mb", self.copy_mb, minimum=1, maximum=65536)
        check_int("repeats", self.repeats, minimum=1)
        check_int("warmup", self.warmup, minimum=0)
        for d in self.dtypes:
            check_choice("dtypes", d, GPU_DTYPES)


@dataclass
class Ceilings:
    """What this device measured. Bandwidths in GB/s (1e9 bytes/s); copy counts read + write."""

    device: str
    device_name: str
    matmul_tflops: dict[str, float] = field(default_factory=dict)
    copy_gbs: float = 0.0
    h2d_pinned_gbs: float | None = None
    d2h_pinned_gbs: float | None = None
    h2d_pageable_gbs: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def best_tflops(self) -> float:
        return max(self.matmul_tflops.values())

    def rows(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = [{"ceiling": f"matmul {d}", "value": v, "unit": "TFLOP/s"}
                                        for d, v in self.matmul_tflops.items()]
        out.append({"ceiling": "memory copy (read+write)", "value": self.copy_gbs, "unit": "GB/s"})
        for name, v in (("host→device pinned", self.h2d_pinned_gbs), ("device→host pinned", self.d2h_pinned_gbs),
                        ("host→device pageable", self.h2d_pageable_gbs)):
            if v is not None:
                out.append({"ceiling": name, "value": v, "unit": "GB/s"})
        return out


def _time_torch(fn, device: str, repeats: int, warmup: int) -> float:
    """Median seconds of fn() on the device."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _time_plain(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_tflops(n: int, dtype: str = "fp32", device: str = "cpu", repeats: int = 5, warmup: int = 2) -> float:
    """TFLOP/s of an n×n @ n×n matmul (2n³ FLOPs). 'tf32' is fp32 storage with TF32 tensor cores."""
    flops = 2.0 * n**3
    if not has_torch():
        import numpy as np

        if dtype != "fp32":
            raise ValueError(f"dtype {dtype!r} needs torch; NumPy measures fp32 only")
        a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
        b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
        return flops / _time_plain(lambda: a @ b, repeats, warmup) / 1e12
    import torch

    torch_dtype = getattr(torch, TORCH_DTYPES[dtype])
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"  # fp32 means real fp32 here
    try:
        seconds = _time_torch(lambda: torch.mm(a, b), device, repeats, warmup)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return flops / seconds / 1e12


def copy_bandwidth_gbs(nbytes: int, device: str = "cpu", repeats: int = 5, warmup: int = 2) -> float:
    """Memory bandwidth of a large buffer copy, counting the read and the write (2 × nbytes)."""
    if not has_torch():
        import numpy as np

        src, dst = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
        return 2 * nbytes / _time_plain(lambda: np.copyto(dst, src), repeats, warmup) / 1e9
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _time_torch(lambda: dst.copy_(src), device, repeats, warmup) / 1e9


def host_device_bandwidth_gbs(nbytes: int, pinned: bool = True, repeats: int = 5,
                              warmup: int = 2) -> tuple[float, float]:
    """(host→device, device→host) GB/s over PCIe/NVLink-C2C; needs a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("host↔device bandwidth needs a CUDA GPU (none visible to torch)")
    host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    h2d = _time_torch(lambda: dev.copy_(host, non_blocking=pinned), "cuda", repeats, warmup)
    d2h = _time_torch(lambda: host.copy_(dev, non_blocking=pinned), "cuda", repeats, warmup)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    from labkit.core.devices import detect

    return f"{detect().cpu_model} ({detect().cpu_count} cores usable)"


def measure_ceilings(config: BenchConfig | None = None) -> Ceilings:
    """Run all micro-benchmarks for the configured device."""
    cfg = config or BenchConfig()
    device = place_here(device=cfg.device).device  # "cuda" without a GPU: a ParameterError naming device
    dtypes = cfg.dtypes or (GPU_DTYPES if device == "cuda" else CPU_DTYPES)
    if not has_torch():
        dtypes = ("fp32",)
    elif cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    out = Ceilings(device=device, device_name=device_name(device))
    for d in dtypes:
        if device == "cpu" and d not in CPU_DTYPES:
            out.notes.append(f"{d} skipped on CPU (no tensor cores)")
            continue
        out.matmul_tflops[d] = matmul_tflops(cfg.matmul_size, d, device, cfg.repeats, cfg.warmup)
    nbytes = cfg.copy_mb * 2**20
    out.copy_gbs = copy_bandwidth_gbs(nbytes, device, cfg.repeats, cfg.warmup)
    if device == "cuda":
        out.h2d_pinned_gbs, out.d2h_pinned_gbs = host_device_bandwidth_gbs(nbytes, True, cfg.repeats, cfg.warmup)
        out.h2d_pageable_gbs, _ = host_device_bandwidth_gbs(nbytes, False, cfg.repeats, cfg.warmup)
    else:
        out.notes.append("host↔device bandwidth not measured: no CUDA GPU here")
    return out
