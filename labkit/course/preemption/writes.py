"""Notebook 07's background checkpoint writes (`labkit.torch.state.Saver`) against the
synchronous save the preemptible recipe makes: measured here, taking turns, with repeats
(`background_save`), as numbers and verdicts (`save_findings`), and the checkpoint benchmark's
figures beside them (`checkpoint_reference`, its results file named); the notebook writes the
sentences."""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.course import ladder, references

CHECKPOINT_STALL = "2026-11-22-cpu-checkpoint-stall.json"


def background_save(repeats: int = stats.MIN_REPEATS, *, steps_after: int = 5, n_layer: int = 2,
                    n_embd: int = 256, block_size: int = 32, directory: str | None = None) -> dict[str, Any]:
    """A GPT-style model trained by the torch engine, saved both ways, taking turns after one
    discarded warm-up of each: synchronously (the recipe's way: serialise, write, commit, then
    train on) and with the engine's `Saver` (copy the state to host memory, serialise, write and
    commit in a background thread). Each repeat times one save and the `steps_after` training
    steps after it, up to the end of the write, so both ways do the same work. In ms per repeat:
    `sync_ms` (the synchronous save: what training waits for), `stall_ms` (what `Saver.save`
    holds training: the host copy), `sync_total_ms` and `background_total_ms` (the save, the
    steps, and the wait for a background write still in flight after them, `waited_ms`).
    Short sequences (`block_size` tokens, batch 1) keep the steps short beside the full state."""
    import torch

    from labkit.core.models import GPTConfig
    from labkit.core.train_config import TrainConfig
    from labkit.torch import engine, state, trainer
    from labkit.torch.data import DataPosition
    from labkit.torch.distributed import DistInfo

    model_cfg = GPTConfig(vocab_size=8192, block_size=block_size, n_layer=n_layer, n_head=8, n_embd=n_embd)
    info, position, device = DistInfo(), DataPosition(), torch.device("cpu")
    c = engine.build(TrainConfig(model="gpt", batch_size=1, grad_clip=None, progress=False), info,
                     device, model_cfg)
    tokens = torch.randint(model_cfg.vocab_size, (1, model_cfg.block_size + 1),
                           generator=torch.Generator().manual_seed(0))
    batch = engine.to_device((tokens[:, :-1], tokens[:, 1:]), c, False)

    def step() -> float:
        t = time.perf_counter()
        trainer.train_step(c, [batch], None)
        return time.perf_counter() - t

    for _ in range(2):
        step()  # one-off costs; the optimizer state exists from here on
    step_s = statistics.median(step() for _ in range(3))
    root = Path(directory or tempfile.mkdtemp(prefix="labkit-save-"))
    state_bytes = sum(len(b) for b in state.serialize(c, info, 0, position).values())
    held: dict[str, list[float]] = {"sync": [], "background": [], "waited": []}

    def timed(kind: str) -> float:
        folder = root / kind
        saver = state.Saver(str(folder), info, asynchronous=kind == "background")
        t = time.perf_counter()
        saver.save(c, 0, position)  # the background save returns once the state is copied
        held[kind].append((time.perf_counter() - t) * 1e3)
        for _ in range(steps_after):
            step()
        t_wait = time.perf_counter()
        saver.wait()
        total = time.perf_counter() - t
        if kind == "background":
            held["waited"].append((time.perf_counter() - t_wait) * 1e3)
        shutil.rmtree(folder, ignore_errors=True)
        return total * 1e3

    try:
        sync_total, background_total = stats.interleave(lambda: timed("sync"), lambda: timed("background"),
                                                        repeats=repeats)
    finally:
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)
    sync_ms, stall_ms, waited = (held[k][1:] for k in ("sync", "background", "waited"))  # warm-up dropped
    return {"parameters": sum(p.numel() for p in c.model.parameters()), "state_mb": state_bytes / 1e6,
            "threads": torch.get_num_threads(), "step_ms": step_s * 1e3, "steps_after": steps_after,
            "sync_ms": sync_ms, "stall_ms": stall_ms, "waited_ms": waited,
            "sync_total_ms": sync_total, "background_total_ms": background_total,
            "stall_over_sync": statistics.median(stall_ms) / statistics.median(sync_ms),
            "total_over_sync_total": statistics.median(background_total) / statistics.median(sync_total)}


def checkpoint_reference() -> dict[str, Any] | None:
    """The checkpoint benchmark's figures on a 2-core CPU, with the file they come from."""
    path = references.results_path(CHECKPOINT_STALL)
    if path is None:
        return None
    return {**json.loads(path.read_text()), "source": references.source(path)}


def save_comparisons(measured: dict[str, Any]) -> tuple[stats.Comparison, stats.Comparison]:
    """(the background save's stall against the synchronous save, the background save's time
    until written, steps included, against the synchronous one's), in ms, lower is better."""
    m = measured
    return (stats.compare(m["sync_ms"], m["stall_ms"], higher_is_better=False),
            stats.compare(m["sync_total_ms"], m["background_total_ms"], higher_is_better=False))


# What the background save bought here (`SaveFindings.outcome`), from the two verdicts.
SHORTER_WAIT_ONLY = "a shorter wait, but not measurably less time in all"
NO_SHORTER_WAIT = "not even a measurably shorter wait"
LESS_IN_ALL = "less time in all, not only a shorter wait"


@dataclass(frozen=True)
class SaveFindings:
    """`background_save`'s measurement as numbers and verdicts: `stall` (what training waits for:
    the synchronous save as `a`, the background save's stall as `b`) and `total` (a save and the
    steps after it until written, each way), in ms, lower is better."""

    parameters: int
    state_mb: float
    step_ms: float
    threads: int
    steps_after: int
    stall: stats.Comparison
    total: stats.Comparison

    @property
    def stall_verdict(self) -> str:
        """The background save's stall against the synchronous save: "faster" (a shorter wait),
        "slower", or no measurable difference (`labkit.course.ladder.verdict`)."""
        return ladder.verdict(self.stall)

    @property
    def total_verdict(self) -> str:
        """The same for the time until written, the steps after the save included."""
        return ladder.verdict(self.total)

    @property
    def outcome(self) -> str:
        """`SHORTER_WAIT_ONLY`, `NO_SHORTER_WAIT` or `LESS_IN_ALL`."""
        if not self.stall.b_is_better:
            return NO_SHORTER_WAIT
        return LESS_IN_ALL if self.total.b_is_better else SHORTER_WAIT_ONLY


def save_findings(measured: dict[str, Any]) -> SaveFindings:
    """`background_save`'s result as `SaveFindings`."""
    m = measured
    stall, total = save_comparisons(m)
    return SaveFindings(int(m["parameters"]), m["state_mb"], m["step_ms"], m["threads"], m["steps_after"],
                        stall, total)
