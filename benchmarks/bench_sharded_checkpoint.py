"""Sharded checkpoints of a ZeRO-3 run: time lost per save and bytes per rank, DCP against the
full-state save (and labkit's per-rank torch.save files), on local gloo processes.

    python benchmarks/bench_sharded_checkpoint.py                                  # small and large, 2 processes
    python benchmarks/bench_sharded_checkpoint.py --saves 7 --json benchmarks/results/DATE-cpu-sharded-checkpoint.json

The measurement is `labkit.course.sharded_checkpoints.measure` (notebook 10 runs the same at its
own scale): `nproc` processes build the engine's `--parallel zero3` run (FSDP2 `fully_shard`) of a
GPT, train two steps, then save the same state again and again, the three formats taking turns
after one discarded save of each:

- `full state`: gathered to rank 0 (`get_state_dict(full_state_dict=True, cpu_offload=True)`),
  written by rank 0 as labkit's full checkpoint (model.pt, train.pt);
- `rank files`: labkit's `ShardedSaver`, one torch.save file per rank (same layout to resume);
- `dcp`: labkit's `DcpSaver` (`--checkpoint-format dcp`), each rank's shards through
  `torch.distributed.checkpoint`, CRC-32C taken while they are written, committed by rank 0.

Every format is synchronous and collective under ZeRO-3, so the training time a save costs is
its wall time, taken on the slowest rank from a barrier until the save returned. Bytes per rank
are the sizes the commit markers list, each file counted for the rank that wrote it. After the
timed saves the DCP checkpoint is loaded back (weights and moments zeroed first) and must give
the gathered state bit for bit, or the benchmark fails. Sizes: `small` is 2 layers of width 128,
`large` 6 layers of width 512 (vocab 8192, block 128, 8 heads: bench_checkpoint.py's model).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from labkit.core import devices  # noqa: E402
from labkit.core.models import GPTConfig  # noqa: E402
from labkit.core.train_config import TrainConfig  # noqa: E402
from labkit.course import sharded_checkpoints as sc  # noqa: E402

SIZES = {"small": (2, 128), "large": (6, 512)}  # (layers, width); vocab 8192, block 128, 8 heads


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return (r.stdout.strip()[:80] if r.returncode == 0 else "") or REPO.name


def bench_size(size: str, a: argparse.Namespace) -> dict:
    layers, width = SIZES[size]
    model = GPTConfig(vocab_size=8192, block_size=128, n_layer=layers, n_head=8, n_embd=width)
    config = TrainConfig(model="gpt", steps=2, batch_size=a.batch, device="cpu", progress=False, eval_samples=0)
    r = sc.measure(config, nproc=a.nproc, saves=a.saves, model_config=model, workdir=a.dir)
    comparisons = {}
    for against in ("full state", "rank files"):
        cmp = sc.time_comparison(r, against)
        comparisons[against] = {"dcp_over": cmp.ratio, "verdict": cmp.winner or "none",
                                "sentence": cmp.sentence(against, "dcp", "ms")}
    return r | {"rows": sc.rows(r), "time_dcp_vs": comparisons, "bytes_busiest_rank_dcp_over_full": sc.bytes_ratio(r)}


def report(results: dict) -> str:
    lines = []
    for size, r in results["sizes"].items():
        state_mb = sum(r["bytes_by_rank"]["full state"]) / 1e6
        lines.append(f"\n{size}: {r['parameters'] / 1e6:.1f}M parameters, full state {state_mb:.1f} MB, "
                     f"{r['world_size']} processes")
        ranks = [k for k in r["rows"][0] if k.startswith("MB rank")]
        lines.append("| format | ms per save, median (min–max) | " + " | ".join(ranks) + " | resumable on |")
        lines.append("|---|---|" + "---|" * len(ranks) + "---|")
        for row in r["rows"]:
            lines.append(f"| {row['format']} | {row['ms per save']:.0f} ({row['range ms']}) | "
                         + " | ".join(f"{row[k]:.1f}" for k in ranks) + f" | {row['resumable on']} |")
        for c in r["time_dcp_vs"].values():
            lines.append(f"- time per save, {c['sentence']}")
        lines.append(f"- busiest rank's bytes, dcp over full state: {r['bytes_busiest_rank_dcp_over_full']:.2f}×; "
                     f"DCP reload bit for bit: {r['dcp_reload_identical']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--nproc", type=int, default=2, help="gloo processes (ZeRO-3 ranks)")
    p.add_argument("--saves", type=int, default=5, help="timed saves of each format per size (taking turns)")
    p.add_argument("--batch", type=int, default=4, help="global batch of the two training steps")
    p.add_argument("--dir", help="where checkpoints go (default: a temporary local folder)")
    p.add_argument("--json", help="write the results file here")
    a = p.parse_args(argv)
    results = {
        "command": "python benchmarks/bench_sharded_checkpoint.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": {"cpu": devices.cpu_model(), "cores": os.cpu_count(), "kernel": platform.release(),
                   "backend": "gloo", "checkpoint_dir": a.dir or "a temporary local folder"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "crc32c": _version("crc32c"),
                     "fsspec": _version("fsspec")},
        "this_checkout": _commit(), "nproc": a.nproc, "saves": a.saves, "warmup_saves": sc.WARMUP_SAVES,
        "batch": a.batch, "load_before": os.getloadavg(), "sizes": {},
    }
    for size in a.sizes:
        results["sizes"][size] = bench_size(size, a)
    results["load_after"] = os.getloadavg()
    print(f"{results['device']['cpu']}, {results['device']['cores']} cores, {a.nproc} gloo processes; load "
          f"average {results['load_before'][0]:.1f} before / {results['load_after'][0]:.1f} after; {results['date']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v))
    print(report(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
