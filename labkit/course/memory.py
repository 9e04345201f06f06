"""Notebook 08's measurements: gradient accumulation against one big batch, activation
checkpointing's time-for-memory trade, and the state bytes per GPU of each sharding scheme."""

from __future__ import annotations

from labkit.torch import engine
from labkit.torch.distributed import DistInfo
from labkit.torch.memory import activation_bytes, gradients


def accumulation_gradient_gap(config, micro_steps: int = 4) -> dict[str, float]:
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
