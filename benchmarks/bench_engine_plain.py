"""Engine against the plain loop a tutorial writes: per-step time, one process, in one run.

    python benchmarks/bench_engine_plain.py                      # cnn and gpt, 5 rounds each
    python benchmarks/bench_engine_plain.py --rounds 9 --json benchmarks/results/DATE-cpu-engine-plain.json

The plain loop is the one a PyTorch tutorial writes, with the batch already in memory:

    logits = model(x); loss = cross_entropy(logits, y)
    optimizer.zero_grad(); loss.backward(); clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step(); losses.append(loss.item())

on the same model (labkit's, same seed), the same AdamW (labkit train's groups, betas and
multi-tensor kernel) and the same clipping. The engine is `labkit.torch.trainer.fit` with
`labkit train`'s defaults for that model (batch 32, clipping at 1.0, no progress bar, no
checkpoints), its input from `ResumableLoader`. The plain loop's step is timed around the lines
above. Both run at smoke size on the CPU with one torch thread (`--threads`).

The two take turns step by step in one process: the engine's `on_step` callback runs one plain
step, so an engine step is timed from the end of one callback to the start of the next (its
input, the step, the loss read back, the LR, the metrics row), and adjacent steps of the two
see the same machine. After an untimed warm-up round, each round builds both afresh and runs
`--steps` pairs; its ratio is the median over its steps past the first `--skip` of engine step
over the plain step beside it. Reported per model, each as the median over rounds with the
spread (min-max): that ratio in wall-clock time, in CPU time (this process's, which a busy
machine disturbs less), and with the engine's input time (`data_time_s`: generating and
placing the batch, which the plain loop holds in memory) taken out; each side's ms per step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


class PlainLoop:
    """The tutorial loop, one step per `step()` call, the batch in memory."""

    def __init__(self, model_name: str, batch_size: int):
        import torch

        from labkit.recipes import common

        args = common.parse(common.parser("plain"), ["--model", model_name, "--batch-size", str(batch_size)])
        self.model = common.torch_model(args)
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=args.lr, betas=(0.9, 0.95), foreach=True)  # as labkit train on a CPU
        self.x, self.y = common.to_device(
            next(common.batches(common.torch_dataset(args), batch_size, args.seed)), torch.device("cpu"))
        self.losses: list[float] = []

    def step(self) -> tuple[float, float]:
        """One step; returns its (wall-clock, CPU) seconds."""
        import torch
        import torch.nn.functional as F

        t, cpu = time.perf_counter(), time.process_time()
        logits = self.model(self.x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), self.y.reshape(-1))
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.losses.append(loss.item())
        return time.perf_counter() - t, time.process_time() - cpu


def one_round(model_name: str, steps: int, batch_size: int) -> dict[str, list[float]]:
    """Seconds per step of the engine and of the plain loop, taking turns step by step: the
    engine's `on_step` callback runs one plain step, so an engine step is the time from the end
    of one callback to the start of the next. Wall-clock and CPU seconds of each, and the
    engine's input time (`data_time_s` of its metrics)."""
    from labkit.core.train_config import TrainConfig
    from labkit.torch import trainer

    plain = PlainLoop(model_name, batch_size)
    out: dict[str, list[float]] = {k: [] for k in ("engine", "plain", "engine_cpu", "plain_cpu", "engine_input")}
    mark: list[tuple[float, float]] = []

    def on_step(step: int, row: dict) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        wall_s, cpu_s = plain.step()
        if mark:  # the first step holds the engine's start-up
            out["engine"].append(now - mark[-1][0])
            out["engine_cpu"].append(cpu - mark[-1][1])
            out["engine_input"].append(row["data_time_s"])
            out["plain"].append(wall_s)
            out["plain_cpu"].append(cpu_s)
        mark.append((time.perf_counter(), time.process_time()))

    config = TrainConfig(model=model_name, steps=steps + 1, batch_size=batch_size, device="cpu",
                         progress=False)
    trainer.fit(config, on_step=on_step)
    return out


def _spread(values: list[float], digits: int) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "each": [round(v, digits) for v in values]}


def _paired(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def bench_model(model: str, a: argparse.Namespace) -> dict:
    one_round(model, a.skip + 2, a.batch_size)  # warm-up: first-call costs of both, untimed
    rounds: dict[str, list[float]] = {k: [] for k in (
        "ratio", "ratio_cpu", "ratio_without_input", "engine_ms", "plain_ms", "engine_input_ms")}
    for r in range(a.rounds):
        got = {k: v[a.skip:] for k, v in one_round(model, a.steps, a.batch_size).items()}
        rounds["ratio"].append(_paired(got["engine"], got["plain"]))
        rounds["ratio_cpu"].append(_paired(got["engine_cpu"], got["plain_cpu"]))
        rounds["ratio_without_input"].append(
            _paired([e - d for e, d in zip(got["engine"], got["engine_input"], strict=True)], got["plain"]))
        rounds["engine_ms"].append(statistics.median(got["engine"]) * 1e3)
        rounds["plain_ms"].append(statistics.median(got["plain"]) * 1e3)
        rounds["engine_input_ms"].append(statistics.median(got["engine_input"]) * 1e3)
        print(f"  {model} round {r + 1}/{a.rounds}: engine {rounds['engine_ms'][-1]:.2f} ms "
              f"(input {rounds['engine_input_ms'][-1]:.2f}), plain {rounds['plain_ms'][-1]:.2f} ms; "
              f"ratio {rounds['ratio'][-1]:.3f} wall, {rounds['ratio_cpu'][-1]:.3f} CPU, "
              f"{rounds['ratio_without_input'][-1]:.3f} without the engine's input", flush=True)
    return {k: _spread(v, 4 if k.startswith("ratio") else 3) for k, v in rounds.items()}


def _commit() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return r.stdout.strip()[:80] if r.returncode == 0 else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["cnn", "gpt"], choices=["cnn", "gpt"])
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per model (after a warm-up round)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps of each side per round")
    p.add_argument("--skip", type=int, default=5, help="leading steps of each side left out")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (labkit train's default)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--json", help="write the results file here")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.steps <= a.skip + 1:
        p.error("--rounds must be >= 1 and --steps larger than --skip + 1")
    os.environ["LABKIT_NO_PROGRESS"] = "1"
    import torch

    from labkit.core import devices

    torch.set_num_threads(a.threads)
    results = {
        "command": "python benchmarks/bench_engine_plain.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": {"cpu": devices.cpu_model(), "cores": os.cpu_count(), "kernel": platform.release()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "this_checkout": _commit(), "rounds": a.rounds, "steps": a.steps, "skip": a.skip,
        "batch_size": a.batch_size, "threads": a.threads, "load_before": os.getloadavg(), "models": {},
    }
    for model in a.models:
        results["models"][model] = bench_model(model, a)
    results["load_after"] = os.getloadavg()
    print(f"{results['device']['cpu']}, {results['device']['cores']} cores; load average "
          f"{results['load_before'][0]:.1f} before / {results['load_after'][0]:.1f} after; {results['date']}")
    for model, r in results["models"].items():
        print(f"{model}: engine/plain {r['ratio']['median']:.3f}x wall (rounds {r['ratio']['min']:.3f}-"
              f"{r['ratio']['max']:.3f}), {r['ratio_cpu']['median']:.3f}x CPU, "
              f"{r['ratio_without_input']['median']:.3f}x without the engine's input; engine "
              f"{r['engine_ms']['median']:.2f} ms (input {r['engine_input_ms']['median']:.2f}), "
              f"plain {r['plain_ms']['median']:.2f} ms per step")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
