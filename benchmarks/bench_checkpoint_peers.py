"""Async checkpoints: training time lost per save, labkit's background save against
`torch.distributed.checkpoint.async_save`, on the same model and state in the same run.

    python benchmarks/bench_checkpoint_peers.py                   # 278 MB and small state, 5 saves each
    python benchmarks/bench_checkpoint_peers.py --saves 7 --json benchmarks/results/DATE-cpu-checkpoint-peers.json

The peer is PyTorch's own asynchronous checkpoint (`torch.distributed.checkpoint`, DCP) with its
defaults: `async_save` stages the state dict to CPU memory (training waits for that copy), then a
thread writes it with a `FileSystemWriter` (one file per rank, fsync at the end). It runs in a
gloo process group of one, as a single-process job would. labkit's is the engine's own
`labkit.torch.state.Saver`: a host copy of the state (training waits for that), then
serialisation, CRC-32C, the writes and the commit marker in a background thread (no fsync: a
blob the machine lost is caught by its CRC-32C at load, and the previous step is taken). The peer
also runs with `FileSystemWriter(sync_files=False)`, its setting without fsync.

Both save the same state of one GPT-style model trained by `labkit.torch.trainer.train_step`:
weights, AdamW moments and step counts, LR schedule, loss scaler, next step and data position
(labkit adds its RNG states, a few KB). Sizes: `large` is bench_checkpoint.py's default (6
layers, width 512, vocab 8192: 23.1M parameters, a 278 MB state); `small` is 2 layers of width
128 (1.4M parameters, about 17 MB).

One save = one training step, then the save call, then training steps until the save has
finished (labkit: its writer thread has ended; DCP: its future is done), then `wait()` /
`result()`. Training time lost = that step's and every later step's excess over the median plain
step, measured again just before each save (the machine drifts). CPU time lost is the same sum in
CPU-seconds of this process (all threads): the writer's work plus what it made training do
twice, which a busy machine disturbs less than wall-clock time. labkit and the peer take turns,
save by save, the first save of each untimed. After every save both checkpoints are loaded back
and compared with a copy of the state taken at the save: every tensor must be identical and
every other value equal, or the benchmark fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

from labkit.core import checkpoint, devices  # noqa: E402
from labkit.core.models import GPTConfig  # noqa: E402
from labkit.core.train_config import TrainConfig  # noqa: E402
from labkit.torch import engine, state, trainer  # noqa: E402
from labkit.torch.data import DataPosition  # noqa: E402
from labkit.torch.distributed import DistInfo  # noqa: E402

SIZES = {"large": (6, 512), "small": (2, 128)}  # (layers, width); vocab 8192, block 128, 8 heads


# ---------------------------------------------------------------------------------------------
# The state and the two savers


def training_state(c: engine.Components, step: int, position: DataPosition) -> dict[str, Any]:
    """The state both savers write, as live objects: what labkit's checkpoint holds (less RNG)."""
    return {"model": c.model.state_dict(),
            "train": {"optimizer": c.optimizer.state_dict(), "scheduler": c.scheduler.state_dict(),
                      "scaler": c.scaler.state_dict(), "next_step": step + 1,
                      "data_position": {"epoch": position.epoch, "sample": position.sample}}}


class LabkitSaver:
    name = "labkit Saver (background)"

    def __init__(self, root: str):
        self.dir = f"{root}/labkit"
        self.saver = state.Saver(self.dir, DistInfo())

    def start(self, c: engine.Components, step: int, position: DataPosition) -> None:
        self.saver.save(c, step, position)

    def in_flight(self) -> bool:
        return self.saver.in_flight

    def wait(self) -> None:
        self.saver.wait()

    def load(self, step: int) -> dict[str, Any]:
        ckpt = checkpoint.load(self.dir, step)  # verifies every blob's CRC-32C against the marker
        return {"model": state.from_bytes(ckpt.files["model.pt"]), "train": state.from_bytes(ckpt.files["train.pt"])}


class DcpSaver:
    """The peer with its defaults, or (`fsync=False`) with its writer's `sync_files` off: labkit
    does not fsync, and the fsync at the end of each save is time the peer's thread spends waiting
    for the disk."""

    def __init__(self, root: str, fsync: bool = True):
        self.name = "torch.distributed.checkpoint.async_save" + ("" if fsync else ", sync_files=False")
        self.root = f"{root}/dcp{'' if fsync else '-no-fsync'}"
        self.fsync = fsync
        self.future = None

    def start(self, c: engine.Components, step: int, position: DataPosition) -> None:
        path = f"{self.root}/step-{step}"
        writer = None if self.fsync else dcp.FileSystemWriter(path, sync_files=False)
        self.future = dcp.async_save(training_state(c, step, position), checkpoint_id=path, storage_writer=writer)

    def in_flight(self) -> bool:
        return self.future is not None and not self.future.done()

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None

    def load(self, step: int, like: dict[str, Any]) -> dict[str, Any]:
        # DCP loads in place into a state dict of the same structure: nothing in it comes from the saved one
        target = tree_map(lambda v: torch.full_like(v, 7) if isinstance(v, torch.Tensor) else "not loaded", like)
        dcp.load(target, checkpoint_id=f"{self.root}/step-{step}")
        return target


def assert_identical(saved: Any, loaded: Any, who: str) -> int:
    """Every tensor of `loaded` equals `saved`'s bit for bit (dtype and shape too), every other
    leaf compares equal; returns the number of tensors compared."""
    a, spec_a = tree_flatten(saved)
    b, spec_b = tree_flatten(loaded)
    if spec_a != spec_b:
        raise AssertionError(f"{who}: the loaded state has another structure than the saved one")
    tensors = 0
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
                raise AssertionError(f"{who}: a loaded tensor differs from the saved one")
            tensors += 1
        elif x != y:
            raise AssertionError(f"{who}: loaded {y!r} where {x!r} was saved")
    return tensors


# ---------------------------------------------------------------------------------------------
# Measuring


def _timed(fn) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def one_save(saver, c, step_fn, save_step: int, plain_steps: int, verify: bool) -> dict:
    plain = [_timed(step_fn) for _ in range(plain_steps)]
    t_plain = statistics.median(w for w, _ in plain)
    c_plain = statistics.median(p for _, p in plain)
    position = DataPosition(0, save_step)
    w_step, p_step = _timed(step_fn)
    reference = state.snapshot(c, DistInfo(), save_step, position) if verify else None  # untimed
    w_save, p_save = _timed(lambda: saver.start(c, save_step, position))
    lost, cpu_lost, steps = w_step + w_save - t_plain, p_step + p_save - c_plain, 1
    stall = lost
    while saver.in_flight():
        w, p = _timed(step_fn)
        lost += w - t_plain
        cpu_lost += p - c_plain
        steps += 1
    w_wait, p_wait = _timed(saver.wait)  # ~0: the save had finished
    lost += w_wait
    cpu_lost += p_wait
    tensors = 0
    if verify:
        expected = {"model": reference["model.pt"], "train": reference["train.pt"]}
        loaded = saver.load(save_step) if isinstance(saver, LabkitSaver) else saver.load(save_step, expected)
        tensors = assert_identical(expected, loaded, saver.name)
    return {"plain_step_ms": 1000 * t_plain, "plain_step_cpu_ms": 1000 * c_plain, "stall_ms": 1000 * stall,
            "lost_ms": 1000 * lost, "cpu_lost_ms": 1000 * cpu_lost, "steps_until_written": steps,
            "tensors_verified": tensors}


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "each": [round(v, 2) for v in values]}


def bench_size(size: str, root: str, a: argparse.Namespace) -> dict:
    layers, width = SIZES[size]
    model_cfg = GPTConfig(vocab_size=8192, block_size=128, n_layer=layers, n_head=8, n_embd=width)
    c = engine.build(TrainConfig(model="gpt", batch_size=a.batch, grad_clip=None, progress=False),
                     DistInfo(), torch.device("cpu"), model_cfg)
    tokens = torch.randint(model_cfg.vocab_size, (a.batch, model_cfg.block_size + 1), generator=torch.Generator().manual_seed(0))
    batch = engine.to_device((tokens[:, :-1], tokens[:, 1:]), c, False)

    def step_fn() -> None:
        trainer.train_step(c, [batch], None)

    for _ in range(3):
        step_fn()  # warm-up; the optimizer state exists from here on
    state_mb = sum(len(b) for b in state.serialize(c, DistInfo(), 0, DataPosition()).values()) / 1e6
    savers = [LabkitSaver(f"{root}/{size}"), DcpSaver(f"{root}/{size}")]
    if not a.no_unsynced_peer:
        savers.append(DcpSaver(f"{root}/{size}", fsync=False))
    rows: dict[str, list[dict]] = {s.name: [] for s in savers}
    save_step = 0
    for i in range(a.saves + 1):  # the first round is a warm-up (imports, first writes), not counted
        for saver in savers[i % len(savers):] + savers[:i % len(savers)]:
            r = one_save(saver, c, step_fn, save_step, a.plain_steps, verify=True)
            save_step += 1
            if i:
                rows[saver.name].append(r)
        if i:
            print(f"{size}: save {i}/{a.saves}: " + "; ".join(
                f"{n} lost {rs[-1]['lost_ms']:.0f} ms ({rs[-1]['cpu_lost_ms']:.0f} CPU-ms, stall "
                f"{rs[-1]['stall_ms']:.0f} ms, {rs[-1]['steps_until_written']} steps)" for n, rs in rows.items()),
                flush=True)
        shutil.rmtree(f"{root}/{size}", ignore_errors=True)  # a few saves of each at most on disk
    out = {"parameters": sum(p.numel() for p in c.model.parameters()), "state_mb": state_mb, "savers": {}}
    for name, rs in rows.items():
        out["savers"][name] = {k: _summary([r[k] for r in rs]) for k in
                               ("lost_ms", "cpu_lost_ms", "stall_ms", "plain_step_ms", "plain_step_cpu_ms",
                                "steps_until_written")}
        out["savers"][name]["tensors_verified_per_save"] = rs[0]["tensors_verified"]
    ours = rows[savers[0].name]
    out["labkit_over_peer"] = {}
    for peer in savers[1:]:
        theirs = rows[peer.name]
        out["labkit_over_peer"][peer.name] = {
            k: {"of_medians": out["savers"][savers[0].name][k]["median"] / out["savers"][peer.name][k]["median"],
                # each round's saves ran back to back: paired ratios cancel slow drift
                "paired_median": statistics.median(x[k] / y[k] for x, y in zip(ours, theirs, strict=True))}
            for k in ("lost_ms", "cpu_lost_ms", "stall_ms")}
    return out


# ---------------------------------------------------------------------------------------------


def _version(dist_name: str) -> str | None:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return (r.stdout.strip()[:80] if r.returncode == 0 else "") or REPO.name


def report(results: dict) -> str:
    lines = []
    for size, r in results["sizes"].items():
        lines.append(f"\n{size}: {r['parameters'] / 1e6:.1f}M parameters, state {r['state_mb']:.1f} MB "
                     f"(labkit's blobs)")
        lines.append("| saver | training lost per save, ms | CPU-ms lost | stall, ms | steps until written | "
                     "plain step, ms |")
        lines.append("|---|---|---|---|---|---|")
        for name, s in r["savers"].items():
            cells = [f"{s[k]['median']:.0f} ({s[k]['min']:.0f}-{s[k]['max']:.0f})"
                     for k in ("lost_ms", "cpu_lost_ms", "stall_ms")]
            lines.append(f"| {name} | {' | '.join(cells)} | {s['steps_until_written']['median']:.0f} | "
                         f"{s['plain_step_ms']['median']:.0f} |")
        for peer, ratios in r["labkit_over_peer"].items():
            lines.append(f"labkit / {peer}: " + "; ".join(
                f"{k} {v['of_medians']:.2f} (paired {v['paired_median']:.2f})" for k, v in ratios.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--saves", type=int, default=5, help="timed saves of each saver per size (alternating)")
    p.add_argument("--plain-steps", type=int, default=5, help="plain steps timed before each save")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--dir", help="where checkpoints go (default: a temporary local folder)")
    p.add_argument("--no-unsynced-peer", action="store_true",
                   help="leave out the peer with sync_files=False (its defaults only)")
    p.add_argument("--json", help="write the results file here")
    a = p.parse_args(argv)
    if a.saves < 1:
        p.error("--saves must be >= 1")
    if a.threads:
        torch.set_num_threads(a.threads)
    root = a.dir or tempfile.mkdtemp(prefix="labkit-bench-ckpt-peers-")
    results = {
        "command": "python benchmarks/bench_checkpoint_peers.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": {"cpu": devices.cpu_model(), "cores": os.cpu_count(), "kernel": platform.release(),
                   "checkpoint_dir": a.dir or "a temporary local folder"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "crc32c": _version("crc32c"),
                     "fsspec": _version("fsspec")},
        "this_checkout": _commit(), "threads": torch.get_num_threads(), "saves": a.saves,
        "plain_steps": a.plain_steps, "batch": a.batch, "load_before": os.getloadavg(), "sizes": {},
    }
    # A process group of one, as a single-process job has: DCP plans through it.
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp(prefix='labkit-pg-')}/rendezvous",
                            rank=0, world_size=1)
    try:
        for size in a.sizes:
            results["sizes"][size] = bench_size(size, root, a)
    finally:
        dist.destroy_process_group()
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    print(f"{results['device']['cpu']}, {results['device']['cores']} cores, {results['threads']} torch threads; "
          f"load average {results['load_before'][0]:.1f} before / {results['load_after'][0]:.1f} after; "
          f"{results['date']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v))
    print(report(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
