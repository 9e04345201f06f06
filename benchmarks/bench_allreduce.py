"""All-reduce bandwidth on this machine: gloo across CPU processes, or nccl across its GPUs.

    python benchmarks/bench_allreduce.py                     # CPU: 2 processes, 4 KB .. 64 MB
    python benchmarks/bench_allreduce.py --max-mb 512        # GPU: one process per GPU, to 512 MB

Prints the table (size, iterations, median time, algorithm and bus bandwidth), and writes
allreduce.json and allreduce.png into --out. A published nccl-tests range for 8 x H100 with
NVLink, with its source, is `labkit.course.distribution.H100_NVLINK_ALLREDUCE_BUSBW_GBS`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.course.multinode import allreduce_title, plot_allreduce_bandwidth
from labkit.course.tables import table
from labkit.hardware import allreduce as c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world-size", type=int, default=0, help="processes (default: GPUs, else 2)")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--min-kb", type=int, default=4)
    p.add_argument("--max-mb", type=int, default=64)
    p.add_argument("--target-s", type=float, default=0.5)
    p.add_argument("--out", default="benchmarks/out")
    args = p.parse_args()
    from labkit.core.devices import detect

    gpus = len(detect().gpus)
    world = args.world_size or (gpus if gpus >= 2 else 2)
    cfg = c.AllReduceConfig(sizes=c.size_ladder(args.min_kb * c.KB, args.max_mb * c.MB),
                            world_size=world, backend=args.backend, target_s=args.target_s)
    report = c.allreduce_benchmark(cfg)
    print(f"{datetime.date.today()} {platform.node()} {platform.processor() or platform.machine()}")
    print(table(report.results, title=allreduce_title(report)))
    print(f"peak bus bandwidth: {report.peak_busbw_gbps:.2f} GB/s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "allreduce.json").write_text(json.dumps(report.to_dict(), indent=1))
    plot_allreduce_bandwidth(report, out / "allreduce.png")


if __name__ == "__main__":
    main()
