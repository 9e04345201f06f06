"""Notebook 08's measurements: gradient accumulation against one big batch, activation
checkpointing's time-for-memory trade, the state bytes per GPU of each sharding scheme, and
sharded data parallelism (FSDP2 `fully_shard`, ZeRO-3 style) next to DDP, measured per rank.

`checkpointing_tradeoff(config, steps, repeats)` trains without and with activation
checkpointing, taking turns (off, on, off, on, ...) after one discarded warm-up run of each, so a
busy spell of the machine hits both; its `CheckpointingTradeoff` holds the step times of every
run as a `labkit.core.stats.Comparison` (a verdict only when the runs' ranges part: `step_verdict`)
beside the activation bytes, which are counted, not timed. `accumulation_gradient_gap` gives the
gradients' largest difference and its verdict. The notebook writes the sentences.

`compare_sharding(config, nproc)` runs the same few training steps twice with `nproc` local
processes (gloo on CPU, nccl on GPUs): once replicated with DDP, once with every block and the
root sharded by `fully_shard`. Each rank reports the bytes of parameters, gradients and optimizer
state it actually holds, and the losses, so the notebook shows both the memory saved and that
the maths did not change.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.core.config import check_int
from labkit.core.progress import track
from labkit.core.train_config import TrainConfig
from labkit.course import ladder
from labkit.torch import engine
from labkit.torch.distributed import DistInfo
from labkit.torch.memory import activation_bytes, gradients

# Accumulated gradients count as the large batch's when their largest difference is under this
# share of the largest gradient: float32 rounding from adding in another order stays far below it.
SAME_GRADIENTS_BELOW = 1e-4
SAME_GRADIENTS = "the same gradients, to float rounding"
DIFFERENT_GRADIENTS = "different gradients"


def accumulation_gradient_gap(config, micro_steps: int = 4) -> dict[str, Any]:
    """Gradients of one batch vs the same batch as `micro_steps` accumulated micro-batches, from
    the same weights: the largest absolute and relative difference over all parameters, and the
    verdict (`SAME_GRADIENTS` when the relative one is under `SAME_GRADIENTS_BELOW`)."""
    from labkit.torch.data import make_dataset

    if config.batch_size % micro_steps:
        raise ValueError(f"batch_size={config.batch_size} is not divisible by micro_steps={micro_steps}")
    c = engine.build(config, DistInfo(), engine.resolve_device(config.device, DistInfo()))
    x, y = make_dataset(c.model_config, config.batch_size, config.seed)[list(range(config.batch_size))]
    whole = gradients(c, [(x, y)])
    parts = gradients(c, list(zip(x.chunk(micro_steps), y.chunk(micro_steps), strict=True)))
    diff = max((whole[k] - parts[k]).abs().max().item() for k in whole)
    scale = max(whole[k].abs().max().item() for k in whole)
    rel = diff / scale if scale else 0.0
    return {"max_abs_diff": diff, "max_rel_diff": rel, "max_abs_grad": scale, "micro_steps": micro_steps,
            "verdict": SAME_GRADIENTS if rel < SAME_GRADIENTS_BELOW else DIFFERENT_GRADIENTS}


@dataclass(frozen=True)
class CheckpointingTradeoff:
    """Activation checkpointing off against on: `step_ms`, each run's median step time (ms),
    off as `a` and on as `b` (lower is better); the activation bytes autograd keeps, counted;
    the final loss and peak memory of the last run of each; the device."""

    step_ms: stats.Comparison
    activation_mib: tuple[float, float]  # (off, on)
    final_loss: tuple[float, float]
    peak_memory_mib: tuple[float | None, float | None]
    device: str
    steps: int

    @property
    def memory_ratio(self) -> float:
        """Activation memory with checkpointing over without."""
        off, on = self.activation_mib
        return on / off if off else float("nan")

    def rows(self) -> list[dict[str, Any]]:
        """One row per setting: median step time and the range of the runs, and the memory."""
        return [{"activation_checkpointing": on, "step_time_ms": spread.median,
                 "step_time_range_ms": spread.range_text(), "runs": len(spread.values),
                 "activation_mib": self.activation_mib[i], "peak_memory_mib": self.peak_memory_mib[i],
                 "final_loss": self.final_loss[i], "device": self.device}
                for i, (on, spread) in enumerate(((False, self.step_ms.a), (True, self.step_ms.b)))]

    @property
    def step_verdict(self) -> str:
        """The step time with checkpointing against without: "slower", "faster" or no measurable
        difference when the runs overlap (`labkit.course.ladder.verdict`)."""
        return ladder.verdict(self.step_ms)


def checkpointing_tradeoff(config, steps: int = 4, repeats: int = stats.MIN_REPEATS) -> CheckpointingTradeoff:
    """Train `steps` steps without and with activation checkpointing, `repeats` runs of each
    taking turns after one discarded warm-up run of each (`labkit.core.stats.interleave`)."""
    check_int("repeats", repeats, minimum=stats.MIN_REPEATS)  # fewer runs give no verdict
    from labkit.torch.trainer import fit

    last: dict[bool, dict] = {}

    def run(on: bool) -> float:
        cfg = replace(config, activation_checkpointing=on, steps=steps, progress=False)
        log = fit(cfg)
        last[on] = {"summary": log.to_dict()["summary"], "device": log.run["device"], "config": cfg}
        return 1000 * last[on]["summary"]["median_step_time_s"]

    off_ms, on_ms = stats.interleave(lambda: run(False), lambda: run(True), repeats=repeats)
    device = last[False]["device"]
    peak = tuple(last[on]["summary"]["peak_memory_bytes"] / 2**20 if device.startswith("cuda") else None
                 for on in (False, True))
    return CheckpointingTradeoff(
        stats.compare(off_ms, on_ms, higher_is_better=False),
        tuple(activation_bytes(last[on]["config"]) / 2**20 for on in (False, True)),
        tuple(last[on]["summary"]["final_loss"] for on in (False, True)), peak, device, steps)


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


# ---------------------------------------------------------------- FSDP next to DDP


def _local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def _worker(config: TrainConfig, mode: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from labkit.core.config import resolve_scale
    from labkit.core.models import build_config
    from labkit.torch import distributed
    from labkit.torch.data import ResumableLoader, make_dataset, to_float_images
    from labkit.torch.engine import loss_fn, micro_batch_size, resolve_device
    from labkit.torch.models import build_model

    info = distributed.info_from_env()
    device = resolve_device(config.device, info)
    distributed.init(device.type, info)
    model_cfg = build_config(config.model, resolve_scale(config.scale))
    torch.manual_seed(config.seed)
    model = build_model(model_cfg).to(device)
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(device.type, (info.world_size,))  # else CUDA whenever a GPU exists
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        net = model
    else:
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr)
    micro = micro_batch_size(config, info.world_size)
    loader = ResumableLoader(make_dataset(model_cfg, config.num_samples_or_default(), config.seed), micro,
                             world_size=info.world_size, rank=info.rank, seed=config.seed)
    losses = []
    for _ in range(config.steps):
        x, y = next(loader)
        x, y = to_float_images(x.to(device)), y.to(device)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        grads = _local_bytes(p.grad for p in model.parameters() if p.grad is not None)
        opt.zero_grad(set_to_none=True)
        t = loss.detach().clone()
        dist.all_reduce(t)
        losses.append(t.item() / info.world_size)
    state = _local_bytes(v for s in opt.state.values() for v in s.values()
                         if isinstance(v, torch.Tensor) and v.dim() > 0)
    record = {"mode": mode, "rank": info.rank, "world_size": info.world_size, "losses": losses,
              "param_bytes": _local_bytes(model.parameters()), "grad_bytes": grads,
              "optimizer_bytes": state}
    Path(out).write_text(json.dumps(record))
    dist.barrier()
    distributed.exit_if_replica(0)  # FSDP's gloo teardown can abort a finalizing process


def compare_sharding(config: TrainConfig, nproc: int = 2, *, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Rows (one per mode): per-rank MiB of parameters, gradients, optimizer state, and losses.
    The model must have `.blocks` (GPT, ResNet, CNN all do)."""
    with tempfile.TemporaryDirectory(prefix="labkit-fsdp-") as tmp:  # the replicas' reports
        return [_sharding_row(config, mode, nproc, Path(tmp), timeout_s)
                for mode in track(("ddp", "fsdp"), "sharding comparison", unit="mode")]


def _sharding_row(config: TrainConfig, mode: str, nproc: int, tmp: Path, timeout_s: float | None) -> dict[str, Any]:
    """One mode's row of `compare_sharding`: its replicas run, rank 0's report read from `tmp`."""
    from labkit.torch.launch import launch_replicas

    def cmd(rank: int) -> list[str]:
        return [sys.executable, "-m", "labkit.course.memory", "--mode", mode, "--out",
                str(tmp / f"{mode}-{rank}.json"), "--config", json.dumps(asdict(config))]

    launch_replicas(cmd, nproc, timeout_s=timeout_s, what=f"{mode} replica")
    r0 = json.loads((tmp / f"{mode}-0.json").read_text())
    mib = 2**20
    return {"mode": mode, "processes": nproc, "param_mib": r0["param_bytes"] / mib,
            "grad_mib": r0["grad_bytes"] / mib, "optimizer_mib": r0["optimizer_bytes"] / mib,
            "state_mib": (r0["param_bytes"] + r0["grad_bytes"] + r0["optimizer_bytes"]) / mib,
            "final_loss": r0["losses"][-1], "losses": r0["losses"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="one replica of labkit.course.memory.compare_sharding")
    p.add_argument("--mode", choices=("ddp", "fsdp"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--config", required=True, help="TrainConfig fields as JSON")
    args = p.parse_args(argv)
    _worker(replace(TrainConfig(), **json.loads(args.config)), args.mode, args.out)


if __name__ == "__main__":
    main()
