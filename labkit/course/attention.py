"""Notebook 08's attention measurement: the attention written out (`softmax(q kᵀ/√d + mask) v`,
which stores a T×T score matrix per head) against `F.scaled_dot_product_attention` (SDPA, fused
kernels that never store it), both the functions of `labkit.recipes.attention`.

`measure(block_sizes, ...)` runs one forward and backward of each at every sequence length T and
reports the bytes autograd keeps for backward (counted with saved-tensor hooks, any device), on
CUDA the peak allocated during forward + backward as well, the median time over round-robin
repeats with its range, and beside them the bytes of one T×T score matrix per head
(batch × heads × T² × bytes per element), which explains the difference. `findings(rows)` answers
"what happens when T doubles" from those rows, as numbers and verdicts the notebook writes its
sentences from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.core import stats
from labkit.core.config import ParameterError, check_int
from labkit.course import ladder

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


# How the memory each method keeps grows with T: the T×T score matrix (T²), or per-row statistics
# and the output (T).
GROWTH_POWER = {"manual": 2, "sdpa": 1}


@dataclass(frozen=True)
class Growth:
    """How one method's kept memory grew from each T of the measurement to the next."""

    method: str
    ratios: tuple[float, ...]  # kept memory at each T over the previous T's
    power: int  # the growth its structure predicts: T ** power

    @property
    def law(self) -> str:
        """The growth its structure predicts, as written: "T²" or "T"."""
        return "T²" if self.power == 2 else "T"

    def expected(self, t_ratio: float) -> float:
        """The growth the structure predicts when T grows `t_ratio` times."""
        return t_ratio ** self.power


@dataclass(frozen=True)
class AttentionFindings:
    """What `measure`'s rows show: each method's growth with T, and at the longest T the memory
    each kept, the score matrix and causal mask beside them, the CUDA peaks (None elsewhere) and
    the time comparison (SDPA as `b` against manual as `a`, lower is better; None under
    `stats.MIN_REPEATS` repeats)."""

    sizes: tuple[int, ...]
    growth: tuple[Growth, ...]  # empty with one T
    longest: int
    manual_mib: float
    sdpa_mib: float
    score_matrix_mib: float  # one T×T score matrix per head, softmax's output
    mask_mib: float  # the T×T causal mask, a byte per (query, key) pair
    peak_mib: tuple[float | None, float | None]  # (manual, sdpa)
    time: stats.Comparison | None
    device: str

    @property
    def t_ratios(self) -> tuple[float, ...]:
        """How many times T grew from each size to the next."""
        return tuple(b / a for a, b in zip(self.sizes, self.sizes[1:], strict=False))

    @property
    def memory_ratio(self) -> float:
        """Manual's kept memory over SDPA's at the longest T."""
        return self.manual_mib / self.sdpa_mib

    @property
    def explained(self) -> float:
        """The share of manual's kept memory that the score matrix and the mask account for."""
        return (self.score_matrix_mib + self.mask_mib) / self.manual_mib

    @property
    def time_verdict(self) -> str:
        """SDPA's time against manual's: "faster", "slower", no measurable difference, or no
        verdict under 3 repeats (`labkit.course.ladder.verdict`)."""
        return ladder.verdict(self.time)


def findings(rows: list[dict]) -> AttentionFindings:
    """`measure`'s rows as `AttentionFindings`."""
    if not rows:
        raise ParameterError("rows", rows, "an empty measurement has no findings")
    sizes = tuple(sorted({r["T"] for r in rows}))
    growth = tuple(Growth(m, tuple(_row(rows, b, m)["saved_mib"] / _row(rows, a, m)["saved_mib"]
                                   for a, b in zip(sizes, sizes[1:], strict=False)), GROWTH_POWER[m])
                   for m in METHODS) if len(sizes) > 1 else ()
    t = sizes[-1]
    man, sd = _row(rows, t, "manual"), _row(rows, t, "sdpa")
    time = (stats.compare(man["times_ms"], sd["times_ms"], higher_is_better=False)
            if len(man["times_ms"]) >= stats.MIN_REPEATS else None)
    return AttentionFindings(sizes, growth, t, man["saved_mib"], sd["saved_mib"], man["score_matrix_mib"],
                             t * t / 2**20, (man["peak_mib"], sd["peak_mib"]), time, man["device"])
