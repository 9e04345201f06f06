"""Memory tools: gradients of a (possibly accumulated) step, the bytes autograd saves for the
backward pass, the largest-batch finder, and a memory report. The finder tries a batch, catches out-of-memory, backs off, and bisects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from labkit.core.train_config import TrainConfig
from labkit.torch import engine, trainer
from labkit.torch.data import make_dataset, to_float_images
from labkit.torch.distributed import DistInfo
from labkit.torch.engine import Components


def gradients(c: Components, micro_batches) -> dict[str, torch.Tensor]:
    """Gradients of one step over `micro_batches` (accumulated as the engine does: each
    micro-loss divided by their count), without updating the weights."""
    c.optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    for x, y in micro_batches:
        with c.policy.autocast():
            loss = c.compute_loss(to_float_images(x.to(c.device)), y.to(c.device)) / n
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


class MemoryBudgetExceeded(RuntimeError):
    """A try needed more memory than the budget given to `largest_batch` (the CPU stand-in for a
    device out-of-memory error: a CPU has no device memory to exhaust safely)."""


def largest_batch(config, *, budget_mib: float | None = None, limit: int = 4096,
                  multiple_of: int = 1) -> BatchSearch:
    """The largest batch of `config`'s model that fits. On CUDA each try is a real training step
    (forward, backward, optimizer) and out-of-memory is caught; with `budget_mib` (required on
    CPU) a try fails when the bytes autograd saves for backward exceed the budget. Tries are
    normal steps even when `config.cuda_graph_step` is set."""

    device = engine.resolve_device(config.device, DistInfo())
    if budget_mib is None and device.type != "cuda":
        raise ValueError("largest_batch on CPU needs budget_mib (there is no device memory to run out of)")
    if budget_mib is not None:
        def try_batch(b: int) -> None:
            used = activation_bytes(replace(config, batch_size=b)) / 2**20
            if used > budget_mib:
                raise MemoryBudgetExceeded(f"batch {b} needs {used:.0f} MiB > budget {budget_mib:.0f} MiB")
    else:
        # Normal steps: a captured step graph replays one batch shape, and every try is a new one.
        c = engine.build(replace(config, cuda_graph_step=False), DistInfo(), device)
        data = make_dataset(c.model_config, 1, config.seed)

        def try_batch(b: int) -> None:
            x, y = data[[0] * b]
            trainer.train_step(c, [engine.to_device((x, y), c, config.channels_last)], None)
            torch.cuda.synchronize(device)

    def guarded(b: int) -> None:
        try:
            try_batch(b)
        except MemoryBudgetExceeded as e:
            raise torch.OutOfMemoryError(str(e)) from e

    return find_max_batch(guarded, limit=limit, multiple_of=multiple_of)


def activation_bytes(config: TrainConfig, batch_size: int | None = None) -> int:
    """Bytes autograd keeps for the backward pass during one forward of `config`'s model (what
    mixed precision halves and activation checkpointing avoids), counted with saved-tensor hooks
    on any device. Tensors sharing storage are counted once."""

    device = engine.resolve_device(config.device, DistInfo())
    c = engine.build(replace(config, compile=False), DistInfo(), device)
    n = batch_size or config.batch_size
    x, y = make_dataset(c.model_config, n, config.seed)[list(range(n))]
    x, y = engine.to_device((x, y), c, config.channels_last)
    seen: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> None:
        # The storage is kept here (alive until this function returns, so no address is reused
        # and counted twice), not in the graph: returning `t` would tie each saved output to its
        # own graph node, a cycle through C++ that Python's collector never frees (every call
        # would leak the whole forward's activations).
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("activation_bytes runs the forward pass only")

    params = {p.untyped_storage().data_ptr() for p in c.model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), c.policy.autocast():
        loss = c.compute_loss(x, y)
    del loss
    return sum(storage.nbytes() for ptr, storage in seen.items()
               if ptr not in params and ptr != x.untyped_storage().data_ptr())
