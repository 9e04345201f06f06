"""The measured matmul peak of this device, the reference for MFU.

Datasheet peaks overstate what a GEMM reaches (on one H100 the bf16 GEMM timed by
benchmarks/bench_torch.py reached about 80% of the datasheet figure: see `peak_tflops` in
benchmarks/results/2026-11-22-h100-bench-torch-*.json), so MFU is reported against a square GEMM
timed here, once per process and dtype.
"""

from __future__ import annotations

import time

import torch

_CACHE: dict[tuple[str, torch.dtype], float] = {}


def _gemm(device: torch.device, dtype: torch.dtype) -> tuple[int, int, torch.dtype]:
    """(n, repeats, dtype) of the timed matmul on `device`."""
    cuda = device.type == "cuda"
    if not cuda and dtype in (torch.float16,):
        dtype = torch.float32  # CPU fp16 GEMMs are emulated; fp32 is the honest CPU ceiling
    return (8192, 20, dtype) if cuda else (512, 5, dtype)


def describe(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> str:
    """What MFU is relative to, for the metrics `run` section."""
    n, repeats, dtype = _gemm(device, dtype)
    timing = f"mean of {repeats} back to back" if device.type == "cuda" else f"best of {repeats}"
    return f"measured: {n}x{n}x{n} {str(dtype).removeprefix('torch.')} matmul on {device.type}, {timing}"


def measured_peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16,
                        size: int | None = None, repeats: int | None = None) -> float:
    """FLOP/s of an n×n×n matmul in `dtype` (n = 8192 on CUDA, 512 on CPU): the mean of `repeats`
    back-to-back runs on CUDA, the best of `repeats` on the CPU."""
    key = (str(device), dtype)
    if key in _CACHE and size is None:
        return _CACHE[key]
    cuda = device.type == "cuda"
    default_n, default_repeats, dtype = _gemm(device, dtype)
    n = size or default_n
    repeats = repeats or default_repeats
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    if cuda:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            a @ b
        end.record()
        end.synchronize()
        best = start.elapsed_time(end) / 1000.0 / repeats
    else:
        for _ in range(repeats):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
    flops = 2.0 * n**3 / best
    if size is None:
        _CACHE[key] = flops
    return flops
