"""Notebook 08's attention measurement: the attention written out (`softmax(q kᵀ/√d + mask) v`,
which stores a T×T score matrix per head) against `F.scaled_dot_product_attention` (SDPA, fused
kernels that never store it), both the functions of `labkit.recipes.attention`.

`measure(block_sizes, ...)` runs one forward and backward of each at every sequence length T and
reports the bytes autograd keeps for backward (counted with saved-tensor hooks, any device), on
CUDA the peak allocated during forward + backward as well, the median time over round-robin
repeats with its range, and beside them the bytes of one T×T score matrix per head
(batch × heads × T² × bytes per element), which explains the difference. `doubling(rows)` answers
"what happens when T doubles" from those rows.
"""

from __future__ import annotations

from typing import Any

from labkit.core import stats
from labkit.core.config import check_int

METHODS = ("manual", "sdpa")
DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}  # bytes per element


def score_matrix_bytes(batch: int, heads: int, t: int, dtype: str = "fp32") -> int:
    """Bytes of one (batch, heads, T, T) score matrix: what the written-out attention stores."""
    return batch * heads * t * t * DTYPES[dtype]


def _inputs(batch: int, heads: int, t: int, head_dim: int, dtype: str, device, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    return [torch.randn(batch, heads, t, head_dim, generator=g).to(device, torch_dtype).requires_grad_()
            for _ in range(3)]


def saved_bytes(attend, q, k, v) -> int:
    """Bytes autograd keeps for backward in one call `attend(q, k, v)`, the inputs themselves not
    counted (they exist either way); tensors sharing storage are counted once."""
    import torch

    seen: dict[int, Any] = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage  # kept alive here, so no address is reused and recounted

    def unpack(_):
        raise RuntimeError("saved_bytes runs the forward pass only")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = attend(q, k, v)
    del out
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    return sum(s.nbytes() for ptr, s in seen.items() if ptr not in inputs)


def _step(attend, q, k, v, device) -> None:
    import torch

    attend(q, k, v).sum().backward()
    for t in (q, k, v):
        t.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(attend, q, k, v, device) -> int | None:
    """CUDA: the most memory allocated during one forward + backward above what was allocated
    before it (the inputs). None elsewhere (a CPU has no such counter)."""
    import torch

    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    _step(attend, q, k, v, device)
    return torch.cuda.max_memory_allocated(device) - before


def measure(block_sizes=(256, 512, 1024), *, batch: int = 4, heads: int = 2, head_dim: int = 32,
            dtype: str = "fp32", device: str = "auto", repeats: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (T, method): `saved_mib` (kept for backward), `peak_mib` (CUDA only, else
    None), `score_matrix_mib`, `time_ms` (median of `repeats`, all configurations in turns after
    one warm-up round) with `time_low_ms` / `time_high_ms`, and `times_ms` (every repeat)."""
    import time

    import torch

    from labkit.recipes.attention import manual_attention, sdpa_attention
    from labkit.torch.distributed import DistInfo
    from labkit.torch.engine import resolve_device

    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    for name, value in (("batch", batch), ("heads", heads), ("head_dim", head_dim), ("repeats", repeats)):
        check_int(name, value, minimum=1)
    for t in block_sizes:
        check_int("block_sizes", t, minimum=2)
    dev = resolve_device(device, DistInfo())
    functions = {"manual": manual_attention, "sdpa": sdpa_attention}
    inputs = {t: _inputs(batch, heads, t, head_dim, dtype, dev, seed) for t in block_sizes}

    def timed(method: str, t: int):
        def run() -> float:
            start = time.perf_counter()
            _step(functions[method], *inputs[t], dev)
            return 1000 * (time.perf_counter() - start)
        return run

    runs = stats.round_robin({(t, m): timed(m, t) for t in block_sizes for m in METHODS}, repeats=repeats,
                             desc="attention: manual vs SDPA")
    rows = []
    mib = 2**20
    for t in block_sizes:
        for m in METHODS:
            spread = stats.Spread(tuple(runs[(t, m)]))
            peak = _peak_bytes(functions[m], *inputs[t], dev)
            rows.append({"T": t, "method": m, "saved_mib": saved_bytes(functions[m], *inputs[t]) / mib,
                         "peak_mib": None if peak is None else peak / mib,
                         "score_matrix_mib": score_matrix_bytes(batch, heads, t, dtype) / mib,
                         "time_ms": spread.median, "time_low_ms": spread.low, "time_high_ms": spread.high,
                         "times_ms": list(runs[(t, m)]), "device": str(dev), "dtype": dtype})
    inputs.clear()  # free the inputs before the caller goes on
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def _row(rows: list[dict], t: int, method: str) -> dict:
    return next(r for r in rows if r["T"] == t and r["method"] == method)


def doubling(rows: list[dict]) -> list[str]:
    """Sentences computed from `measure`'s rows: how the kept memory grew each time T doubled
    (or grew), for each method; the memory ratio at the longest T and how much of the written-out
    version's the score matrix and mask account for; and the time ratio there with its verdict
    from the spreads."""
    sizes = sorted({r["T"] for r in rows})
    out = []
    if len(sizes) >= 2:
        for m in METHODS:
            steps = [f"{_row(rows, b, m)['saved_mib'] / _row(rows, a, m)['saved_mib']:.2f}×"
                     for a, b in zip(sizes, sizes[1:], strict=False)]
            growth = sizes[-1] / sizes[-2]
            out.append(f"{m}: from T={sizes[0]} to T={sizes[-1]} the memory kept for backward grew "
                       f"{', '.join(steps)} at each {growth:g}× step in T "
                       f"({'T²' if m == 'manual' else 'T'} would be {growth ** (2 if m == 'manual' else 1):g}×).")
    t = sizes[-1]
    man, sd = _row(rows, t, "manual"), _row(rows, t, "sdpa")
    mask_mib = t * t / 2**20  # the causal mask: one byte per (query, key) pair
    explained = man["score_matrix_mib"] + mask_mib
    out.append(f"At T={t}: manual kept {man['saved_mib']:.1f} MiB, SDPA {sd['saved_mib']:.2f} MiB "
               f"({man['saved_mib'] / sd['saved_mib']:.0f}× less with SDPA). One T×T score matrix per "
               f"head ({man['score_matrix_mib']:.1f} MiB, softmax's output, kept for its own backward and "
               f"the product with v) and the T×T causal mask ({mask_mib:.1f} MiB, a byte per entry) are "
               f"{explained / man['saved_mib']:.0%} of manual's; SDPA keeps its output and a maximum and "
               f"sum per row, which grow with T.")
    if man["peak_mib"] is not None:
        out.append(f"Peak allocated during forward + backward at T={t}: manual {man['peak_mib']:.1f} MiB, "
                   f"SDPA {sd['peak_mib']:.1f} MiB.")
    if len(man["times_ms"]) >= stats.MIN_REPEATS:
        cmp = stats.compare(man["times_ms"], sd["times_ms"], higher_is_better=False)
        out.append(f"Time at T={t}, forward + backward on {man['device']}: " + cmp.sentence("manual", "SDPA", "ms"))
    return out
