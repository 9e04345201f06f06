"""What labkit's engine does beyond the recipes, and what it buys: measured in the run where this
machine can measure it, read from the benchmark results files (device, date, file named) where
it needs hardware the run may not have.

- The loss and stop agreement of DDP replicas rides with the gradient all-reduce
  (`labkit.torch.agreement`); the ddp recipe averages its loss with an all-reduce of its own.
  `allreduce_latency_ms` measures what that extra call costs here; `agreement_ab` reads the
  A/B of the two engine versions.
- Background checkpoint writes (`labkit.torch.state.Saver`); the preemptible recipe saves
  synchronously. `background_save` measures both here, taking turns, with repeats.
- CUDA graphs (`compile_mode="reduce-overhead"`) and the whole step as one CUDA graph
  (`cuda_graph_step`): GPU only. `cuda_graph_gains` reads the H100 results.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from labkit.core import stats

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
AGREEMENT_AB = "2026-11-22-cpu-ddp-overhead-agreement-ab.txt"
CHECKPOINT_STALL = "2026-11-22-cpu-checkpoint-stall.json"
RESNET_H100 = "2026-11-22-h100-bench-torch-resnet.json"
GPT_LEVERS_H100 = "2026-11-22-h100-gpt-levers-graphs.json"
NO_RESULTS = ("benchmarks/results/ is not beside this labkit (installed without its repository): "
              "the reference figures are in the course's repository")


def results_path(name: str) -> Path | None:
    """A benchmark results file of the course's repository, or None when it is not here."""
    path = RESULTS_DIR / name
    return path if path.is_file() else None


def _source(path: Path) -> str:
    return f"benchmarks/results/{path.name}"


# ---------------------------------------------------------------- DDP: one collective per step


def allreduce_latency_ms(world_size: int = 2) -> float:
    """Median time of one 8-byte all-reduce (two float32 numbers, the engine's loss and stop flag)
    between `world_size` local processes: what a collective of its own costs per step."""
    from labkit.hardware.allreduce import AllReduceConfig, allreduce_benchmark

    report = allreduce_benchmark(AllReduceConfig(sizes=[8], world_size=world_size, min_iters=50,
                                                 max_iters=200, target_s=0.3, warmup=10))
    return report.results[0].time_s * 1e3


def agreement_ab() -> dict[str, Any] | None:
    """The DDP step times (ms) of the engine before (its own all-reduce for loss and stop) and
    after (riding with the last gradient bucket), per model, from the A/B results file."""
    path = results_path(AGREEMENT_AB)
    if path is None:
        return None
    runs: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    version = None
    for line in path.read_text().splitlines():
        if m := re.match(r"== (old|new) \d+", line):
            version = m.group(1)
        elif version and (m := re.match(r"(\w+): .*2-process DDP ([\d.]+)", line)):
            runs[version].setdefault(m.group(1), []).append(float(m.group(2)))
    models = sorted(set(runs["old"]) & set(runs["new"]))
    return {"source": _source(path), "models": {
        model: {"before_ms": runs["old"][model], "after_ms": runs["new"][model]} for model in models}}


def agreement_conclusions(latency_ms: float, recipe_step_s: float, ab: dict[str, Any] | None) -> list[str]:
    """What the engine's agreement saves, from this run's latency and step time and the A/B file."""
    step_ms = recipe_step_s * 1e3
    out = [f"The recipe averages its loss over the processes with an all-reduce of its own after "
           f"every step: one more collective call per step. Here one 8-byte all-reduce between 2 "
           f"processes took {latency_ms:.2f} ms (median), {latency_ms / step_ms:.1%} of the recipe's "
           f"median step ({step_ms:.1f} ms). labkit's engine puts the loss and its stop flag in the "
           f"last gradient bucket (a DDP communication hook, labkit.torch.agreement), so a step "
           f"makes one collective call, not two; the stop flag is what lets every replica leave "
           f"at the same step when one of them gets SIGTERM (notebook 07)."]
    if ab is None:
        out.append(NO_RESULTS + ".")
        return out
    for model, r in ab["models"].items():
        comp = stats.compare(r["before_ms"], r["after_ms"], higher_is_better=False)
        out.append(f"A/B of the two engine versions, {model}, 2-process DDP step on a 2-core CPU "
                   f"({ab['source']}): " + comp.sentence("own all-reduce", "agreement in the bucket", "ms"))
    return out


# ---------------------------------------------------------------- background checkpoint writes


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
    from labkit.torch import engine, state
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
        engine.train_step(c, [batch], None)
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
    path = results_path(CHECKPOINT_STALL)
    if path is None:
        return None
    return {**json.loads(path.read_text()), "source": _source(path)}


def save_conclusions(measured: dict[str, Any], reference: dict[str, Any] | None) -> list[str]:
    """What the engine's background writes buy here, from the measurement and the results file."""
    m = measured
    stall = stats.compare(m["sync_ms"], m["stall_ms"], higher_is_better=False)
    total = stats.compare(m["sync_total_ms"], m["background_total_ms"], higher_is_better=False)
    out = [f"A {m['parameters'] / 1e6:.1f}M-parameter model, {m['state_mb']:.0f} MB of full state, "
           f"plain step {m['step_ms']:.0f} ms, {m['threads']} torch thread(s).",
           "What training waits for: " + stall.sentence("synchronous save", "background save's stall", "ms") + ".",
           f"A save and the {m['steps_after']} training steps after it, up to the end of the write: "
           + total.sentence("synchronous save", "background save", "ms") + "."]
    if stall.winner == "b" and total.winner != "b":
        out.append("So here the background thread shortened the wait, but not measurably the total: "
                   "the writer's serialisation and writes run on the cores training already keeps busy. "
                   "It pays where the training thread mostly waits for a GPU, leaving the host's "
                   "cores to the writer.")
    elif stall.winner != "b":
        out.append("Here not even the wait was measurably shorter: with every core busy (training "
                   "and whatever else runs on this machine), the host copy and the writer thread "
                   "compete with training for the same cores.")
    else:
        out.append("Here the background write cost training less time in all, not only a shorter "
                   "wait: the cores had room for the writer beside training.")
    if reference is None:
        out.append(NO_RESULTS + ".")
    else:
        r = reference
        out.append(f"The checkpoint benchmark ({r['source']}, {r['device']}, {r['threads']} threads, "
                   f"{r['date']}): {r['parameters'] / 1e6:.1f}M parameters, {r['state_mb']:.0f} MB; "
                   f"synchronous save {r['write_ms']:.0f} ms, background stall {r['stall_ms']:.0f} ms "
                   f"({r['stall_over_write']:.2f}×), training lost until written {r['lost_ms']:.0f} ms "
                   f"({r['lost_over_write']:.2f}×). Not measured on a GPU machine yet.")
    return out


# ---------------------------------------------------------------- CUDA graphs (GPU only)


def cuda_graph_gains() -> list[dict[str, Any]]:
    """Throughput with and without CUDA graphs on an H100, from the results files (empty when
    they are not here)."""
    rows = []
    resnet, gpt = results_path(RESNET_H100), results_path(GPT_LEVERS_H100)
    if resnet is not None:
        data = json.loads(resnet.read_text())
        rate = {r["variant"]: r["rate"] for r in data["rows"]}
        base = "labkit bf16 + channels_last + compile"
        rows.append(_gain("ResNet-50, batch 256", base, rate[base], rate[base + " (reduce-overhead)"],
                          "images/s", data, resnet))
    if gpt is not None:
        data = json.loads(gpt.read_text())
        rate = {r["lever"]: r["tokens_per_s"] for r in data["rows"]}
        rows.append(_gain(f"GPT-2 small, batch {data['batch']}", "bf16 + compile", rate["base"],
                          rate["graphs"], "tokens/s", data, gpt))
        rows.append(_gain(f"GPT-2 small, batch {data['batch']}", "bf16 + compile + fp8 head",
                          rate["fp8-head"], rate["fp8-head+graphs"], "tokens/s", data, gpt))
    return rows


def _gain(workload: str, base: str, without: float, with_graphs: float, unit: str,
          data: dict[str, Any], path: Path) -> dict[str, Any]:
    return {"workload": workload, "configuration": base, "without graphs": without,
            "with CUDA graphs": with_graphs, "unit": unit, "gain": with_graphs / without,
            "device": data["device"], "date": data["date"], "source": _source(path)}


def cuda_graph_conclusions(rows: list[dict[str, Any]], device: str) -> list[str]:
    """What CUDA graphs bought on the reference GPU, and what this run can say about them."""
    if not rows:
        return [NO_RESULTS + "."]
    out = [f"{r['workload']}, {r['configuration']}: CUDA graphs took {r['without graphs']:,.0f} to "
           f"{r['with CUDA graphs']:,.0f} {r['unit']} ({r['gain']:.3f}×) on {r['device']} "
           f"({r['source']}, {r['date']}; one run each)." for r in rows]
    out.append("The whole step as one CUDA graph (labkit train --cuda-graph-step: forward, backward, "
               "clipping and the fused AdamW update replayed in one launch) has no measurement in "
               "the results files yet.")
    if not device.startswith("cuda"):
        out.append(f"This run is on {device}: CUDA graphs need a CUDA GPU, so none of this is "
                   f"measured here.")
    return out
