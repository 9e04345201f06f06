"""Ceilings of this machine: matmul TFLOP/s per dtype, memory-copy bandwidth, host↔device.

    python benchmarks/bench_hardware.py                      # CPU here, CUDA when present
    python benchmarks/bench_hardware.py --size 8192 --copy-mb 1024 --json out.json

Prints a Markdown table for benchmarks/RESULTS.md with the device, software versions, date and
the command, and, on a GPU the GPU table knows (`labkit.hardware.gpus`), the ratio to its
datasheet rate in each format.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.core.devices import detect  # noqa: E402
from labkit.core.placement import DEVICES, place_here  # noqa: E402
from labkit.hardware import BenchConfig, measure_ceilings  # noqa: E402
from labkit.hardware.gpus import for_gpu  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--size", type=int, default=0, help="matmul n (default 8192 on GPU, 1024 on CPU)")
    p.add_argument("--copy-mb", type=int, default=0, help="copy buffer MiB (default 1024 GPU, 256 CPU)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = default)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    gpu = place_here(device=args.device).on_gpu
    cfg = BenchConfig(device=args.device, matmul_size=args.size or (8192 if gpu else 1024),
                      copy_mb=args.copy_mb or (1024 if gpu else 256), repeats=args.repeats, warmup=3,
                      threads=args.threads)
    c = measure_ceilings(cfg)
    sheet = for_gpu(detect().gpus[0]) if c.device == "cuda" else None  # a GPU the table lacks: no rates
    print(f"### Ceilings: {c.device_name}\n")
    print(f"{dt.date.today().isoformat()}, torch {torch.__version__}, Python {platform.python_version()}, "
          f"{torch.get_num_threads()} torch thread(s); command: `python benchmarks/bench_hardware.py "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print("| ceiling | measured | datasheet | ratio |\n|---|---|---|---|")
    for d, v in c.matmul_tflops.items():
        ref = sheet.peak(d) if sheet is not None else None
        ratio = f"{v / ref:.0%}" if ref else ""
        print(f"| matmul {d} {cfg.matmul_size}³ | {v:,.3g} TFLOP/s | {f'{ref:,.0f}' if ref else ''} | {ratio} |")
    ref_bw = sheet.memory_bw_gbs if sheet is not None else None
    ratio = f"{c.copy_gbs / ref_bw:.0%}" if ref_bw else ""
    print(f"| copy {cfg.copy_mb} MiB (read+write) | {c.copy_gbs:,.1f} GB/s | {f'{ref_bw:,.0f}' if ref_bw else ''} | {ratio} |")
    for name, v in (("host→device pinned", c.h2d_pinned_gbs), ("device→host pinned", c.d2h_pinned_gbs),
                    ("host→device pageable", c.h2d_pageable_gbs)):
        if v is not None:
            print(f"| {name} | {v:,.1f} GB/s | | |")
    for n in c.notes:
        print(f"\n{n}")
    if args.json:
        Path(args.json).write_text(json.dumps({**c.__dict__, "date": dt.date.today().isoformat(),
                                               "torch": torch.__version__, "matmul_size": cfg.matmul_size}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
