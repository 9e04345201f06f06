"""ZeRO stages 1-3 through DeepSpeed (`--sharding-backend deepspeed`), an optional extra.

`deepspeed.initialize` wraps labkit's model and AdamW (the same parameter groups as every other
mode) under a config whose `zero_optimization.stage` is the mode's number; `deepspeed_config`
builds that dict, the one a DeepSpeed user would write. DeepSpeed joins the process group
labkit already started (gloo on CPU) and picks its CPU accelerator when there is no GPU; no
operator is compiled. DeepSpeed keeps an fp32 master copy of its partition even in fp32 training
(stage 1 and 2 flatten the weights into buffers of their own), so its memory per rank sits
above the torch modes' by that partition.

Checkpoints go through `labkit.core.checkpoint` like every mode: each rank's blob holds its
optimizer partition as DeepSpeed's `state_dict()` gives it (master weights included) and, in
stages 1 and 2, the whole weights; stage 3's weights come back from the fp32 masters.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from labkit.core.config import ParameterError
from labkit.core.parallelism import Layout
from labkit.core.train_config import TrainConfig
from labkit.torch.parallel.base import Strategy, local

STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}


def available() -> str | None:
    """None when DeepSpeed imports, else the one-line reason it does not."""
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure means the backend is unusable
        return (f"sharding_backend: DeepSpeed is not installed ({type(e).__name__}: {e}); "
                f"install the optional extra: pip install 'labkit[deepspeed]'")
    return None


def deepspeed_config(mode: str, batch_size: int, micro_batch: int, grad_clip: float | None,
                     precision: str = "fp32") -> dict[str, Any]:
    """DeepSpeed's config for ZeRO `mode` at this batch: what `deepspeed.initialize` reads."""
    config: dict[str, Any] = {
        "train_batch_size": batch_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": STAGES[mode]},
        "gradient_clipping": grad_clip or 0.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    return config


class DeepSpeedZero(Strategy):
    """A DeepSpeed engine as a labkit strategy: forward, `engine.backward`, `engine.step`."""

    reduces_gradients = True
    owns_forward_backward = True

    def __init__(self, config: TrainConfig, layout: Layout, rank: int, model: nn.Module,
                 groups: list[dict[str, Any]], lr: float):
        reason = available()
        if reason:
            raise ParameterError("sharding_backend", "deepspeed", reason.split(": ", 1)[1])
        # DeepSpeed's accelerator is where the engine placed the model (labkit.core.placement: two
        # ranks on one GPU train on the CPU), not merely whether a GPU exists.
        os.environ.setdefault("DS_ACCELERATOR", next(model.parameters()).device.type)
        import deepspeed

        self.name = layout.mode
        client = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), foreach=True)
        self.ds_config = deepspeed_config(layout.mode, config.batch_size, config.batch_size // layout.dp,
                                          config.grad_clip, config.precision)
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client,
                                                       config=self.ds_config, dist_init_required=False)
        super().__init__(layout, rank, engine.module, client)
        self.engine = engine
        self.zero_optimizer = optimizer

    def forward_backward(self, micro_batches, autocast) -> torch.Tensor:
        (x, y), = micro_batches
        with autocast():
            logits = self.engine(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))
        self.engine.backward(loss)  # DeepSpeed reduces (or reduce-scatters) the gradients here
        self._grads = self._grad_bytes()  # DeepSpeed frees them in its step
        return loss.detach()

    def clip(self, max_norm: float) -> None:
        """Nothing here: DeepSpeed clips in its step (`gradient_clipping` in its config)."""

    def optimizer_step(self) -> None:
        self.engine.step()

    def _grad_bytes(self) -> int:
        z = self.zero_optimizer
        grads = [t for t in getattr(z, "averaged_gradients", {}).values()] if hasattr(z, "averaged_gradients") else []
        flat = [g for part in grads for g in (part if isinstance(part, list) else [part]) if g is not None]
        if not flat:  # stage 3, or stage 1 (gradients stay on the parameters until the step)
            flat = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
            flat += [g for g in getattr(z, "fp32_partitioned_groups_flat", []) if getattr(g, "grad", None) is not None]
            flat = [g.grad if hasattr(g, "grad") and g.grad is not None and not isinstance(g, torch.Tensor) else g
                    for g in flat]
        return sum(local(g).numel() * g.element_size() for g in flat)

    def held_bytes(self) -> dict[str, int]:
        z = self.zero_optimizer
        base = getattr(z, "optimizer", self.optimizer)
        params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
                  for p in self.engine.module.parameters() if p.numel()}
        if hasattr(z, "fp16_partitioned_groups_flat"):  # stage 3: the partitions are the weights
            params = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                      for t in z.fp16_partitioned_groups_flat if t is not None}
        states: dict[int, int] = {}
        for s in base.state.values():
            for v in s.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    states[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
        masters = [p for g in base.param_groups for p in g["params"]]  # the fp32 partitions
        master_bytes = {p.untyped_storage().data_ptr(): p.numel() * p.element_size() for p in masters}
        for ptr in list(master_bytes):
            if ptr in params:
                del master_bytes[ptr]  # the weights themselves, not a copy
        return {"params_bytes": sum(params.values()), "grads_bytes": getattr(self, "_grads", 0),
                "optimizer_bytes": sum(states.values()) + sum(master_bytes.values())}

    def local_state(self) -> dict[str, Any]:
        state = {"zero": self.zero_optimizer.state_dict()}
        if STAGES[self.name] < 3:  # weights whole on every rank: DeepSpeed loads them from the module
            state["module"] = {k: v.clone() for k, v in self.engine.module.state_dict().items()}
        return state

    def load_local_state(self, state: dict[str, Any]) -> None:
        import torch.distributed as dist

        if "module" in state:
            self.engine.module.load_state_dict(state["module"])
        parts: list[Any] = [None] * dist.get_world_size()
        parts[dist.get_rank()] = state["zero"]
        # stage 3: the weights come back from the fp32 partitions; 1 and 2: the partitions from
        # the weights just loaded
        self.zero_optimizer.load_state_dict(parts, load_optimizer_states=True,
                                            load_from_fp32_weights=STAGES[self.name] == 3)
