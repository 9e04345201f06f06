"""The torch engine's parallel modes, one short file each; each wraps the freshly built model
(same seed, same weights on every rank) and its optimizer (DeepSpeed: `--sharding-backend
deepspeed`):

| `--parallel`         | file           | the wrap                                   |
|----------------------|----------------|--------------------------------------------|
| `ddp`                | `ddp.py`       | `wrap`: DDP, gradient compression hook     |
| `zero1`              | `zero.py`      | `Zero1`: DDP + `ZeroRedundancyOptimizer`   |
| `zero2`              | `zero.py`      | `FlatZero2`: flat buffers, reduce-scatter  |
| `zero3`              | `fsdp.py`      | `Zero3`: FSDP2 `fully_shard`               |
| `tp`                 | `tp.py`        | `TensorParallel`: Megatron-style DTensor   |
| `pp`                 | `pp.py`        | `Pipeline`: `torch.distributed.pipelining` |
| `zero1-3`, DeepSpeed | `deepspeed.py` | `DeepSpeedZero`: `deepspeed.initialize`    |

`base.py` holds what they share: the `Strategy` interface the engine's step
(`labkit.torch.trainer.update`) calls at each of its stages (`gradient_sync`, `reduce_gradients`,
`clip`, `optimizer_step`; `forward_backward` only for the modes that run forward and backward
themselves: the pipeline schedule and DeepSpeed's engine), what a rank holds (`held_bytes`:
parameters, gradients at the optimizer step, optimizer state, counted once per storage, DTensors
by their local shard), clipping over sharded gradients, and sharded checkpoint state: each rank
writes the parameters and optimizer state it holds (`labkit.torch.state.save_sharded`), and a
resumed run of the same layout loads its own. tp and pp ranks of one model replica form a
group; the `dp` replicas of that group average their gradients with one all-reduce.

`setup(config, layout, rank, model, groups, lr, device)` builds the strategy of zero2, zero3, tp
or pp with its AdamW; the engine (`labkit.torch.engine.build`) wraps ddp and zero1 itself
(`ddp.wrap`, `Zero1.optimizer_for`) and builds DeepSpeed's (`DeepSpeedZero`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from labkit.core.parallelism import Layout
from labkit.core.train_config import TrainConfig
from labkit.torch.parallel.base import Strategy, held_bytes
from labkit.torch.parallel.deepspeed import DeepSpeedZero
from labkit.torch.parallel.fsdp import Zero3
from labkit.torch.parallel.pp import Pipeline
from labkit.torch.parallel.tp import TensorParallel
from labkit.torch.parallel.zero import FlatZero2, Zero1

__all__ = ["DeepSpeedZero", "FlatZero2", "Pipeline", "Strategy", "TensorParallel", "Zero1", "Zero3",
           "held_bytes", "setup"]


def setup(config: TrainConfig, layout: Layout, rank: int, model: nn.Module,
          groups: list[dict[str, Any]], lr: float, device: torch.device) -> Strategy:
    """The strategy of `config.parallel` (not ddp) for `model`, with its optimizer. For zero1
    the caller wraps the model in DDP and uses `Zero1.optimizer_for`."""
    foreach = device.type != "cuda" or None
    mode = layout.mode
    if mode == "zero2":
        return FlatZero2(layout, rank, model, groups, lr, foreach)
    if mode == "zero3":
        s = Zero3(layout, rank, model, config.reshard_after_forward)
    elif mode == "tp":
        s = TensorParallel(layout, rank, model, device)
    elif mode == "pp":
        s = Pipeline(layout, rank, model, device, config.pp_schedule)
        groups = s.param_groups()
    else:
        raise ValueError(f"parallel: no strategy for {mode!r}")
    s.optimizer = torch.optim.AdamW(_regroup(groups, s.model), lr=lr, betas=(0.9, 0.95), foreach=foreach)
    return s


def _regroup(groups: list[dict[str, Any]], model: nn.Module) -> list[dict[str, Any]]:
    """The decay / no-decay groups over `model`'s parameters as they are now (FSDP2 and DTensor
    replace the parameter objects): matrices and embeddings decay, vectors do not. DTensor and
    plain parameters go to separate groups: AdamW's multi-tensor kernels take one kind at a time."""
    # imported here: every run imports this package, and DTensor's module takes half a second
    from torch.distributed.tensor import DTensor

    decay = [g["weight_decay"] for g in groups]
    out = []
    for is_dtensor in (True, False):
        params = [p for p in model.parameters() if isinstance(p, DTensor) == is_dtensor]
        for matrices, wd in ((True, decay[0]), (False, decay[-1])):
            chosen = [p for p in params if (p.dim() >= 2) == matrices]
            if chosen:
                out.append({"params": chosen, "weight_decay": wd})
    return out
