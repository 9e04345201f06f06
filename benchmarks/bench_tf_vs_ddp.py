"""Distributed overhead, both frameworks: N local processes vs 1, same model and data.

    python benchmarks/bench_tf_vs_ddp.py                       # CPU: cnn, 1 and 2 processes
    python benchmarks/bench_tf_vs_ddp.py --model resnet --steps 30 --processes 1 2

Two scalings are measured per framework (torch DDP over gloo, TF MultiWorkerMirrored over gRPC):
- weak: the per-process batch is fixed (`--per-process-batch`), so N processes train a global
  batch N times larger; overhead = step time(N) / step time(1) (target on CPU: <= 1.3x);
- strong: the global batch is fixed; efficiency = (t1 / tN) / N.
Every process gets one thread so cores are not shared between replicas. Median step times
after the first step. Prints a table and writes bench_tf_vs_ddp.json into --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.core.train_config import TrainConfig  # noqa: E402
from labkit.course import distribution as dist
from labkit.course.tables import table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="cnn")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--per-process-batch", type=int, default=32)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--frameworks", nargs="+", default=["torch", "tf"])
    p.add_argument("--out", default="benchmarks/out")
    args = p.parse_args()
    rows = []
    for fw in args.frameworks:
        if not dist.available(fw):
            print(dist.frameworks.missing_reason(dist.FRAMEWORK_MODULES[fw]))
            continue
        times = {}
        for mode in ("weak", "strong"):
            for n in args.processes:
                batch = args.per_process_batch * (n if mode == "weak" else max(args.processes))
                cfg = TrainConfig(model=args.model, steps=args.steps, batch_size=batch,
                                  num_samples=max(1024, 4 * batch), device="cpu")
                run = dist.run_job(cfg, fw, n)
                times[(mode, n)] = run.median_step_s
                base = times[(mode, args.processes[0])]
                ratio = run.median_step_s / base
                rows.append({"framework": fw, "scaling": mode, "processes": n,
                             "global batch": batch, "median step (ms)": 1000 * run.median_step_s,
                             "vs 1 process": ratio,
                             "efficiency": (1 / ratio if mode == "weak" else 1 / ratio / n)})
    print(f"{datetime.date.today()} {platform.node()} {platform.processor() or platform.machine()}")
    print(table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_tf_vs_ddp.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
