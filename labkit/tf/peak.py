"""The measured matmul peak of this device for TensorFlow, the reference for the TF engine's MFU.

The twin of `labkit.torch.peak`, with the same definition: an n×n×n matmul in the run's compute
dtype (n = 8192 on a GPU, 512 on the CPU; fp16 on the CPU is timed as fp32, since CPUs emulate
it), timed here once per process and dtype: the mean of back-to-back runs on a GPU, the best
single run on the CPU. Datasheet peaks overstate what a GEMM reaches, so MFU against this peak
says how far the model's step is from what this device does on its best kernel.
"""

from __future__ import annotations

import time

_CACHE: dict[tuple[str, str], float] = {}


def _gemm(device: str, dtype: str) -> tuple[int, int, str]:
    """(n, repeats, dtype) of the timed matmul on `device` ("cpu" or "gpu")."""
    if device == "gpu":
        return 8192, 20, dtype
    return 512, 5, "float32" if dtype == "float16" else dtype


def describe(device: str, dtype: str = "float32") -> str:
    """What MFU is relative to, for the metrics `run` section."""
    n, repeats, dtype = _gemm(device, dtype)
    timing = f"mean of {repeats} back to back" if device == "gpu" else f"best of {repeats}"
    return f"measured: {n}x{n}x{n} {dtype} matmul on {device}, {timing}"


def measured_peak_flops(device: str, dtype: str = "float32") -> float:
    """FLOP/s of this device's matmul in `dtype` ("float32", "bfloat16", "float16"), cached."""
    if (device, dtype) in _CACHE:
        return _CACHE[(device, dtype)]
    import tensorflow as tf

    n, repeats, tf_dtype = _gemm(device, dtype)
    a = tf.random.normal((n, n), dtype=tf_dtype)
    b = tf.random.normal((n, n), dtype=tf_dtype)
    for _ in range(2):
        (a @ b)[0, 0].numpy()  # warm-up; reading one element waits for the matmul
    if device == "gpu":
        t = time.perf_counter()
        for _ in range(repeats):
            c = a @ b
        c[0, 0].numpy()  # the GPU runs them in order: the last one done means all are
        best = (time.perf_counter() - t) / repeats
    else:
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            (a @ b)[0, 0].numpy()
            best = min(best, time.perf_counter() - t)
    _CACHE[(device, dtype)] = 2.0 * n**3 / best
    return _CACHE[(device, dtype)]
