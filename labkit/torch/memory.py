"""Memory tools: gradients of a (possibly accumulated) step, the largest-batch finder, and a
memory report. The finder tries a batch, catches out-of-memory, backs off, and bisects."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from labkit.torch import engine
from labkit.torch.data import to_float_images
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


class MemoryBudgetExceeded(RuntimeError):
    """A try needed more memory than the budget given to `largest_batch` (the CPU stand-in for a
    device out-of-memory error: a CPU has no device memory to exhaust safely)."""


def largest_batch(config, *, budget_mib: float | None = None, limit: int = 4096,
                  multiple_of: int = 1) -> BatchSearch:
    """The largest batch of `config`'s model that fits. On CUDA each try is a real training step
    (forward, backward, optimizer) and out-of-memory is caught; with `budget_mib` (required on
    CPU) a try fails when the bytes autograd saves for backward exceed the budget. Tries are
    normal steps even when `config.cuda_graph_step` is set."""
    from dataclasses import replace

    from labkit.torch.data import make_dataset
    from labkit.torch.ladder import activation_bytes

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
            engine.train_step(c, [engine.to_device((x, y), c, config.channels_last)], None)
            torch.cuda.synchronize(device)

    def guarded(b: int) -> None:
        try:
            try_batch(b)
        except MemoryBudgetExceeded as e:
            raise torch.OutOfMemoryError(str(e)) from e

    return find_max_batch(guarded, limit=limit, multiple_of=multiple_of)


def accumulation_check(config, micro_steps: int = 4) -> dict[str, float]:
    """Gradients of one batch vs the same batch as `micro_steps` accumulated micro-batches, from
    the same weights: the largest absolute and relative difference over all parameters."""
    from labkit.torch.data import make_dataset

    if config.batch_size % micro_steps:
        raise ValueError(f"batch_size={config.batch_size} is not divisible by micro_steps={micro_steps}")
    c = engine.build(config, DistInfo(), engine.resolve_device(config.device, DistInfo()))
    x, y = make_dataset(c.model_config, config.batch_size, config.seed)[list(range(config.batch_size))]
    whole = gradients(c, [(x, y)])
    parts = gradients(c, list(zip(x.chunk(micro_steps), y.chunk(micro_steps), strict=True)))
    diff = max((whole[k] - parts[k]).abs().max().item() for k in whole)
    scale = max(whole[k].abs().max().item() for k in whole)
    return {"max_abs_diff": diff, "max_rel_diff": diff / scale if scale else 0.0,
            "max_abs_grad": scale, "micro_steps": micro_steps}


def checkpointing_tradeoff(config, steps: int = 4) -> list[dict]:
    """Train with and without activation checkpointing: step time and memory for each."""
    from dataclasses import replace

    from labkit.torch.engine import fit
    from labkit.torch.ladder import activation_bytes

    rows = []
    for on in (False, True):
        cfg = replace(config, activation_checkpointing=on, steps=steps, progress=False)
        log = fit(cfg)
        s = log.to_dict()["summary"]
        rows.append({"activation_checkpointing": on, "step_time_ms": 1000 * s["median_step_time_s"],
                     "activation_mib": activation_bytes(cfg) / 2**20,
                     "peak_memory_mib": (s["peak_memory_bytes"] / 2**20
                                         if log.run["device"].startswith("cuda") else None),
                     "final_loss": s["final_loss"], "device": log.run["device"]})
    return rows


def sharding_table(num_params: int, world_sizes=(1, 2, 4, 8)) -> list[dict]:
    """Bytes per GPU for model state with mixed-precision Adam (ZeRO paper accounting: 2 bytes
    bf16 weights + 2 bytes bf16 grads + 12 bytes fp32 master weights, momentum and variance per
    parameter). A calculation, not a measurement: activations come on top."""
    rows = []
    for n in world_sizes:
        gib = num_params / 2**30
        rows.append({"gpus": n, "DDP (replicated)": 16 * gib, "ZeRO-1 (optimizer sharded)": (4 + 12 / n) * gib,
                     "ZeRO-2 (+ gradients)": (2 + 14 / n) * gib, "FSDP / ZeRO-3 (+ weights)": 16 / n * gib})
    return rows


def is_cuda(device: str = "auto") -> bool:
    """Whether a `TrainConfig.device` choice resolves to a CUDA device here."""
    return engine.resolve_device(device, DistInfo()).type == "cuda"
