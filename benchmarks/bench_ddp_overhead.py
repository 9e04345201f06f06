"""DDP overhead on CPU: 2 gloo processes (one thread each) against one single-thread process, at
equal per-process batch, through `labkit train` (target: within 1.3×).

    python benchmarks/bench_ddp_overhead.py [--model cnn] [--steps 30] [--per-process-batch 16]

Each configuration runs as real processes started by `labkit.torch.launch.run_local`; the step
time is the median over the steps after the first. A control runs two independent single
processes at once: DDP / control isolates communication from contention for the machine. The
ratio includes everything DDP adds: the gradient all-reduce (bucketed, overlapped with
backward) and the one small all-reduce after each step in which the replicas agree on the loss
and on stopping (`labkit.torch.trainer.agree`).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.core.train_config import TrainConfig  # noqa: E402
from labkit.torch.launch import run_local  # noqa: E402


def median_step_time(model: str, steps: int, per_process_batch: int, nproc: int) -> float:
    cfg = TrainConfig(model=model, steps=steps, batch_size=per_process_batch * nproc, progress=False,
                      device="cpu", grad_clip=None)
    log = run_local(cfg, nproc, threads_per_process=1)
    return log.to_dict()["summary"]["median_step_time_s"]


def concurrent_single_step_time(model: str, steps: int, per_process_batch: int) -> float:
    """Control: two independent single-thread processes at the same time, no communication. Its
    slowdown over one process is what the machine itself costs (shared cores, memory bandwidth)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        times = list(pool.map(lambda _: median_step_time(model, steps, per_process_batch, 1), range(2)))
    return max(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["cnn", "gpt"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--per-process-batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2, help="alternate single/DDP runs this many times")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    rows = []
    for model in args.models:
        single, pair, ddp = [], [], []
        for _ in range(args.repeats):  # alternate, so load changes on a shared machine hit all
            single.append(median_step_time(model, args.steps, args.per_process_batch, 1))
            pair.append(concurrent_single_step_time(model, args.steps, args.per_process_batch))
            ddp.append(median_step_time(model, args.steps, args.per_process_batch, 2))
        s, c, d = min(single), min(pair), min(ddp)
        rows.append({"model": model, "single_ms": 1000 * s, "two_independent_ms": 1000 * c,
                     "ddp2_ms": 1000 * d, "ratio": d / s, "ratio_vs_independent": d / c})
        print(f"{model}: single {1000 * s:.1f} ms/step, two independent at once {1000 * c:.1f}, "
              f"2-process DDP {1000 * d:.1f}: DDP/single {d / s:.2f}× (target <= 1.3×), "
              f"DDP/independent {d / c:.2f}×", flush=True)
    out = {"device": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d"),
           "per_process_batch": args.per_process_batch, "steps": args.steps, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
