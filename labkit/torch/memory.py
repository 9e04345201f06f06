"""Memory tools: gradients of a (possibly accumulated) step, the largest-batch finder, and a
memory report. The finder tries a batch, catches out-of-memory, backs off, and bisects."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from labkit.torch.engine import Components, loss_fn


def gradients(c: Components, micro_batches) -> dict[str, torch.Tensor]:
    """Gradients of one step over `micro_batches` (accumulated as the engine does: each
    micro-loss divided by their count), without updating the weights."""
    c.optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    for x, y in micro_batches:
        with c.policy.autocast():
            loss = loss_fn(c.forward_model(x.to(c.device)), y.to(c.device)) / n
        loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in c.model.named_parameters() if p.grad is not None}
    c.optimizer.zero_grad(set_to_none=True)
    return grads


def is_oom(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "DefaultCPUAllocator" in text)


@dataclass
class BatchSearch:
    """Outcome of `find_max_batch`: the largest batch that ran, and every try (batch, ok)."""

    batch_size: int
    tries: list[tuple[int, bool]]


def find_max_batch(try_batch: Callable[[int], None], *, start: int = 1, limit: int = 1 << 16,
                   multiple_of: int = 1) -> BatchSearch:
    """Double the batch from `start` until `try_batch(b)` runs out of memory (or `limit`), then
    bisect between the last success and the first failure. Non-OOM errors propagate."""
    tries: list[tuple[int, bool]] = []

    def ok(b: int) -> bool:
        try:
            try_batch(b)
            result = True
        except Exception as e:  # noqa: BLE001 - only OOM is swallowed, see below
            if not is_oom(e):
                raise
            result = False
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        tries.append((b, result))
        return result

    good, bad = 0, None
    b = max(start, multiple_of)
    while b <= limit:
        if ok(b):
            good, b = b, b * 2
        else:
            bad = b
            break
    if good == 0:
        return BatchSearch(0, tries)
    hi = bad if bad is not None else min(b, limit + multiple_of)
    while hi - good > multiple_of:
        mid = (good + hi) // 2 // multiple_of * multiple_of
        if mid <= good:
            break
        if ok(mid):
            good = mid
        else:
            hi = mid
    return BatchSearch(good, tries)


@contextlib.contextmanager
def cuda_memory_limit(fraction: float, device: torch.device):
    """Cap this process's CUDA allocator at `fraction` of the device (to demo OOM back-off)."""
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def memory_report(device: torch.device) -> dict[str, int]:
    """Allocator figures in bytes: allocated, reserved, peak allocated (CUDA), or the process's
    peak resident set on CPU."""
    if device.type == "cuda":
        return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
                "peak_allocated": torch.cuda.max_memory_allocated(device),
                "total": torch.cuda.get_device_properties(device).total_memory}
    import resource

    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
