"""What every parallel mode of the torch engine shares: the `Strategy` interface the engine's
step (`labkit.torch.trainer.train_step`) calls at each of its stages, the bytes a rank holds
(`held_bytes`), clipping over sharded gradients (`clip_grad_norm`), one flat all-reduce over a
data-parallel group (`all_reduce_mean`), and sharded checkpoint state (each rank saves and loads
what it holds). The modes themselves: the other files of `labkit.torch.parallel`."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.core.parallelism import Layout


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (a DTensor's local shard, else the tensor)."""
    return t.to_local() if hasattr(t, "to_local") else t


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = local(t)
        if t.numel() == 0:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (tensors of one or more
    dimensions: AdamW's moments; its 0-dim step counters are left out), each storage counted once
    (tied weights, parameters viewing one flat buffer)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    params = list(model.parameters())
    opt_params = [p for g in inner.param_groups for p in g["params"]]
    states = [v for s in inner.state.values() for v in s.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0]
    return {"params_bytes": _storage_bytes(params),
            "grads_bytes": _storage_bytes(p.grad for p in params + opt_params),
            "optimizer_bytes": _storage_bytes(states)}


def clip_grad_norm(grads: list[tuple[torch.Tensor, Any]], max_norm: float) -> torch.Tensor:
    """Clip gradients to a global norm when parts of them are sharded. `grads` pairs each local
    gradient with the process group over which it is split (None: whole on this rank, or the
    same on every rank of the groups that share it). The squared norms of sharded parts are
    summed over their group, so every rank computes the norm of the whole model."""
    device = grads[0][0].device if grads else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=device)
    by_group: dict[Any, torch.Tensor] = {}
    for g, group in grads:
        sq = g.detach().float().pow(2).sum()
        if group is None:
            total = total + sq
        else:
            by_group[group] = by_group.get(group, torch.zeros((), device=device)) + sq
    for group, sq in by_group.items():
        dist.all_reduce(sq, group=group)
        total = total + sq
    norm = total.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g, _ in grads:
        g.mul_(scale)
    return norm


def all_reduce_mean(tensors: list[torch.Tensor], group, size: int) -> None:
    """Average `tensors` over `group` (of `size` ranks) in one all-reduce of a flat copy."""
    if size <= 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat.div_(size)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


class Strategy:
    """What the engine asks of a parallel mode at each stage of its step. `model` holds this
    rank's parameters (its state is what is saved), `optimizer` updates them.

    `reduces_gradients` False (zero1): the engine's DDP reduces the gradients and steps the
    optimizer as without a strategy. True (every other mode): the engine calls, in order,
    `gradient_sync(last)` around each micro-batch's forward and backward (or
    `forward_backward(micro_batches, autocast)` when `owns_forward_backward`: a pipeline
    schedule, DeepSpeed's engine), then `reduce_gradients()`, `clip(max_norm)` and
    `optimizer_step()`; `agree` turns this rank's share of the loss into the mean over the
    replicas and the agreed stop flag. `data_rank`/`data_world` pick this rank's slice of the
    batch (ranks of one model replica read the same samples)."""

    name = "ddp"
    reduces_gradients = False
    owns_forward_backward = False

    def __init__(self, layout: Layout, rank: int, model: nn.Module,
                 optimizer: torch.optim.Optimizer | None = None):
        self.layout = layout
        self.rank = rank
        self.model = model
        self.optimizer = optimizer

    def gradient_sync(self, last: bool):
        """The context of one micro-batch's forward and backward (`last`: the step's last)."""
        return contextlib.nullcontext()

    def forward_backward(self, micro_batches, autocast) -> torch.Tensor:
        """Forward and backward of the whole step, when the mode runs them itself; returns this
        rank's share of the step's loss."""
        raise NotImplementedError(f"{self.name} runs the engine's forward and backward")

    def reduce_gradients(self) -> None:
        """Reduce the gradients over the replicas after backward (nothing: backward did)."""

    def clip(self, max_norm: float) -> None:
        """Clip the gradients to a global norm over the whole model."""
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def optimizer_step(self) -> None:
        self.optimizer.step()

    @property
    def data_rank(self) -> int:
        return self.layout.dp_rank(self.rank)

    @property
    def data_world(self) -> int:
        return self.layout.dp

    def loss_divisor(self) -> int:
        return self.layout.world

    def agree(self, loss: torch.Tensor, stop: bool) -> tuple[float, bool]:
        loss = loss.detach().float().reshape(())
        t = torch.stack([loss, torch.tensor(float(stop), device=loss.device)])
        dist.all_reduce(t)
        return float(t[0]) / self.loss_divisor(), bool(t[1] > 0)

    def held_bytes(self) -> dict[str, int]:
        return held_bytes(self.model, self.optimizer)

    # ---- sharded checkpoints: this rank's parameters and optimizer state

    def local_state(self) -> dict[str, Any]:
        optimizer = getattr(self.optimizer, "optim", self.optimizer)
        return {"model": {k: local(v).clone() for k, v in self.model.state_dict().items()},
                "optimizer": _map_tensors(optimizer.state_dict(), lambda v: local(v).clone())}

    def load_local_state(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                local(v).copy_(state["model"][k])
        optimizer = getattr(self.optimizer, "optim", self.optimizer)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        saved = state["optimizer"]
        for index, entries in saved["state"].items():
            p = params[int(index)]
            for key, value in entries.items():
                if hasattr(p, "device_mesh") and isinstance(value, torch.Tensor) and value.dim() > 0:
                    from torch.distributed.tensor import DTensor

                    entries[key] = DTensor.from_local(value, p.device_mesh, p.placements,
                                                      run_check=False, shape=p.shape, stride=p.stride())
        optimizer.load_state_dict(saved)


def _map_tensors(tree: Any, fn) -> Any:
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: fn(v) if isinstance(v, torch.Tensor) else v, tree)
