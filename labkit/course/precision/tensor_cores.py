"""Notebook 04's tensor-core alignment demo: matmuls whose sizes are, or are not, multiples of the
tile tensor cores work on. Needs torch (imported when the demo runs)."""

from __future__ import annotations

import time
from typing import Any

from labkit.core import stats


def alignment_demo(sizes: tuple[int, ...] | None = None, device: str = "auto",
                   dtype: str = "auto", repeats: int = 10) -> list[dict[str, Any]]:
    """Square matmuls at sizes that are / are not multiples of 64: tensor cores work on tiles, so
    a size one off the multiple pays for padding or falls off the fast kernels. Also GPT's vocab
    projection at 50257 (GPT-2's vocab) vs 50304 (padded to a multiple of 64)."""
    import torch

    from labkit.torch.distributed import DistInfo
    from labkit.torch.engine import resolve_device

    dev = resolve_device(device, DistInfo())
    cuda = dev.type == "cuda"
    dt = _dtype(dtype, dev)
    sizes = sizes or ((4096, 4095, 4097, 4160) if cuda else (512, 511, 513, 576))
    shapes = [(n, n, n, f"{n}³") for n in sizes]
    tokens = 8192 if cuda else 64
    repeats = repeats if cuda else min(repeats, 5)
    shapes += [(tokens, 768, v, f"{tokens}×768 @ 768×{v} (vocab {v})") for v in (50257, 50304)]
    rows = []
    for m, k, n, label in shapes:
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        seconds = _best_time(lambda a=a, b=b: a @ b, dev, repeats)
        rows.append({"shape": label, "m": m, "k": k, "n": n, "multiple_of_64": all(x % 64 == 0 for x in (m, k, n)),
                     "tflops": 2 * m * k * n / seconds / 1e12, "ms": seconds * 1000, "dtype": str(dt).split(".")[-1]})
    return rows


def _dtype(name: str, device):
    """The matmul dtype: "auto" is the 16-bit format the GPU has tensor cores for (bf16 from
    compute capability 8.0, fp16 before: a T4 has no bf16), float32 on a CPU."""
    import torch

    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] >= 8 else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _best_time(fn, device, repeats: int) -> float:
    """Fastest of `repeats` calls after one warm-up call, synchronising a CUDA device."""
    import torch

    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return best


def vocab_comparison(device: str = "auto", dtype: str = "auto", repeats: int = 5) -> stats.Comparison:
    """GPT's output projection at vocab 50257 against 50304, timed in turns (`repeats` calls of
    each after a discarded one), as TFLOP/s: the verdict says whether padding is measurably
    faster here."""
    import torch

    from labkit.torch.distributed import DistInfo
    from labkit.torch.engine import resolve_device

    dev = resolve_device(device, DistInfo())
    cuda = dev.type == "cuda"
    dt = _dtype(dtype, dev)
    tokens = 8192 if cuda else 64
    a = torch.randn(tokens, 768, device=dev, dtype=dt)

    def rate(vocab: int):
        b = torch.randn(768, vocab, device=dev, dtype=dt)
        return lambda: 2 * tokens * 768 * vocab / _best_time(lambda: a @ b, dev, 1) / 1e12

    runs = stats.round_robin({50257: rate(50257), 50304: rate(50304)}, repeats=max(repeats, stats.MIN_REPEATS))
    return stats.compare(runs[50257], runs[50304])
