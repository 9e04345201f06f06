"""Gradient compression for DDP through torch's communication hooks.

`hook(kind, rank, device)` returns (hook, state) for `ddp.register_comm_hook(state, hook)`:

- `fp16` / `bf16`: each bucket is cast to 16 bits (and divided by the world size) before the
  all-reduce and cast back after: half the bytes, rounding error in every gradient.
- `powersgd`: each gradient matrix M (n × m) is sent as two thin factors P (n × r) and Q (m × r)
  from one power iteration, (n + m)·r numbers instead of n·m; the error of the approximation is
  fed back into the next step's gradient (Vogels et al., 2019). Vectors (biases, norms) are
  all-reduced uncompressed. The first `start_iter` steps run plain all-reduce.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

POWERSGD_START_ITER = 2  # plain all-reduce for the first steps (torch requires > 1 with error feedback)


def hook(kind: str, rank: int, device: str, names: dict[int, str] | None = None) -> tuple[Callable, Any]:
    """The DDP communication hook of `kind` ("fp16", "bf16", "powersgd") and its state, for
    gradients on `device` ("cpu" or "cuda"). `names` (id of each parameter -> its name) lets
    PowerSGD's state record which parameters each bucket held, so a restored state is applied
    only to the same buckets (`BucketLayout`)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if kind == "powersgd" and device == "cpu" and torch.cuda.is_available():
        # torch's hook calls torch.cuda.synchronize(gradient device) whenever CUDA is available,
        # which fails for CPU gradients; labkit's local launcher hides the GPUs from CPU replicas.
        raise ValueError("grad_compression: torch's PowerSGD hook fails on CPU gradients in a process "
                         "that sees a GPU: train on the GPU, or start the process with "
                         "CUDA_VISIBLE_DEVICES=''")

    if kind == "fp16":
        return default_hooks.fp16_compress_hook, None
    if kind == "bf16":
        def bf16_hook(state, bucket):
            # DDP refuses a hook named bf16_compress_hook without CUDA and NCCL 2.10+; gloo
            # reduces the bf16 buckets on a CPU (notebook 06), so it is registered under this name.
            return default_hooks.bf16_compress_hook(state, bucket)

        return bf16_hook, None
    if kind == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=POWERSGD_START_ITER,
                                            min_compression_rate=1.0, use_error_feedback=True,
                                            warm_start=True, random_seed=0)
        layout = BucketLayout(powerSGD_hook.powerSGD_hook, names or {})
        _LAYOUTS[id(state)] = layout
        return layout, state
    raise ValueError(f"grad_compression: no hook for {kind!r}")


# PowerSGD's state that shapes the next steps (torch's PowerSGDState slots): the error feedback
# and warm-start factors per bucket, the step counter that decides when compression starts, and
# the RNG that draws new factors. Checkpointed per rank: the error feedback differs by rank.
STATE_SLOTS = ("rng", "error_dict", "p_memory_dict", "q_memory_dict", "iter",
               "total_numel_before_compression", "total_numel_after_compression")


class BucketLayout:
    """PowerSGD's hook, recording which parameters each DDP bucket holds. PowerSGD keys its error
    feedback and warm-start factors by bucket index, and DDP rebuilds its buckets after a
    process's first step: a resumed run's first buckets are not the ones the checkpoint's state
    was kept for. A restored state (`expect`) is therefore kept only while every bucket holds
    the parameters it held when saved; at the first bucket that differs the feedback starts
    afresh, with a warning (the run goes on, no longer exactly the uninterrupted one)."""

    def __init__(self, inner: Callable, names: dict[int, str]):
        self.inner, self.names = inner, names
        # DDP names a registered hook in its logs and errors
        self.__name__ = getattr(inner, "__name__", "hook")
        self.__qualname__ = getattr(inner, "__qualname__", self.__name__)
        self.layout: dict[int, tuple[str, ...]] = {}
        self.expected: dict[int, tuple[str, ...]] | None = None

    def expect(self, layout: dict[int, tuple[str, ...]]) -> None:
        self.expected = {int(k): tuple(v) for k, v in layout.items()}

    def __call__(self, state, bucket):
        index = bucket.index()
        held = tuple(self.names.get(id(p), f"#{i}") for i, p in enumerate(bucket.parameters()))
        self.layout[index] = held
        if self.expected is not None and self.expected.get(index) != held:
            import warnings

            for slot in ("error_dict", "p_memory_dict", "q_memory_dict"):
                getattr(state, slot).clear()
            self.expected = None
            warnings.warn(f"grad_compression: DDP's bucket {index} holds other parameters than when "
                          f"the PowerSGD state was checkpointed; its error feedback starts afresh",
                          stacklevel=2)
        return self.inner(state, bucket)


# The live PowerSGD states' bucket layouts (PowerSGDState has __slots__: no room for it there).
_LAYOUTS: dict[int, BucketLayout] = {}


def state_dict(state: Any) -> dict[str, Any] | None:
    """The compression hook's state to checkpoint (None for hooks without state), with the
    parameters of each bucket it was kept for."""
    if state is None:
        return None
    out = {slot: getattr(state, slot) for slot in STATE_SLOTS if hasattr(state, slot)}
    if id(state) in _LAYOUTS:
        out["bucket_layout"] = dict(_LAYOUTS[id(state)].layout)
    return out


def load_state_dict(state: Any, saved: dict[str, Any], device: Any) -> None:
    """Put a checkpointed `saved` back into the live hook `state`, tensors on `device`; the
    buckets it was kept for are checked as they come (`BucketLayout`)."""
    import torch

    saved = dict(saved)
    layout = saved.pop("bucket_layout", None)
    if layout is not None and id(state) in _LAYOUTS:
        _LAYOUTS[id(state)].expect(layout)
    for slot, value in saved.items():
        if isinstance(value, dict):
            value = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
        setattr(state, slot, value)

