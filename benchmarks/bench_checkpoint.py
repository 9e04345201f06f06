"""Checkpoint stall: how long a save holds training up, against the time to write the state.

    python benchmarks/bench_checkpoint.py [--dir DIR] [--layers 6] [--width 512] [--saves 5]

The target: saving does not stall training by more than the write time of the state. The torch engine's single-process `Saver` copies the state to host memory (the part
training must wait for), then serialises, writes and commits it from a background thread.
Measured on one GPT-style model trained by `labkit.torch.trainer.train_step` (CPU unless
--device cuda):

- step: the median plain training step, measured again before every save (the machine drifts);
- snapshot: the host copy alone (`labkit.torch.state.snapshot`);
- serialise: `torch.save` of the live state to bytes (`labkit.torch.state.serialize`), what a
  save that serialised before handing off to the writer would stall for;
- write: a synchronous save (`labkit.torch.state.save`: serialise, write every blob, commit);
- stall: the saving step's excess over a plain step (the pause training sees);
- lost: everything one background save cost the training loop: the stall plus every later
  step's excess until the write has finished (the writer thread competes for the same cores,
  disk and interpreter; on a GPU machine the training thread mostly waits for the GPU instead).

`--dir` may be a local folder, a `/gcs/` mount or a `gs://` URL (anything fsspec opens).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from labkit.core.models import GPTConfig  # noqa: E402
from labkit.core.train_config import TrainConfig  # noqa: E402
from labkit.torch import engine, state, trainer  # noqa: E402
from labkit.torch.data import DataPosition  # noqa: E402
from labkit.torch.distributed import DistInfo  # noqa: E402


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _measure(c, step, root: str, saves: int, plain_steps: int) -> dict:
    info, position = DistInfo(), DataPosition()
    state_bytes = sum(len(b) for b in state.serialize(c, info, 0, position).values())
    snapshot = [_timed(lambda: state.snapshot(c, info, 0, position)) for _ in range(saves)]
    serialise = [_timed(lambda: state.serialize(c, info, 0, position)) for _ in range(saves)]
    write = [_timed(lambda i=i: state.save(f"{root}/sync", c, info, i, position)) for i in range(saves)]
    saver = state.Saver(f"{root}/async", info)
    plain, stall, lost, overlapped = [], [], [], []
    for i in range(saves):
        t_plain = statistics.median(_timed(step) for _ in range(plain_steps))
        t_first = _timed(lambda i=i: (step(), saver.save(c, i, position)))
        extra, n = t_first - t_plain, 1
        stall.append(extra)
        while saver.in_flight:
            extra += _timed(step) - t_plain
            n += 1
        saver.wait()
        plain.append(t_plain)
        lost.append(extra)
        overlapped.append(n)
    params = sum(p.numel() for p in c.model.parameters())
    row = {"parameters": params, "state_mb": state_bytes / 1e6, "step_ms": 1000 * statistics.median(plain),
           "snapshot_ms": 1000 * statistics.median(snapshot),
           "serialise_ms": 1000 * statistics.median(serialise), "write_ms": 1000 * statistics.median(write),
           "stall_ms": 1000 * statistics.median(stall), "lost_ms": 1000 * statistics.median(lost),
           "lost_each_ms": [round(1000 * x, 1) for x in lost], "steps_overlapped": overlapped}
    row["stall_over_write"] = row["stall_ms"] / row["write_ms"]
    row["lost_over_write"] = row["lost_ms"] / row["write_ms"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", help="where checkpoints go (default: a temporary local folder)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--saves", type=int, default=5)
    p.add_argument("--plain-steps", type=int, default=5, help="plain steps timed before each save")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    model_cfg = GPTConfig(vocab_size=8192, block_size=128, n_layer=args.layers, n_head=8, n_embd=args.width)
    c = engine.build(TrainConfig(model="gpt", batch_size=args.batch, grad_clip=None, progress=False),
                     DistInfo(), device, model_cfg)
    tokens = torch.randint(model_cfg.vocab_size, (args.batch, model_cfg.block_size + 1))
    batch = engine.to_device((tokens[:, :-1], tokens[:, 1:]), c, False)

    def step() -> None:
        trainer.train_step(c, [batch], None)
        sync()

    for _ in range(3):
        step()  # warm-up, and the optimizer state exists from here on
    root = args.dir or tempfile.mkdtemp(prefix="labkit-bench-ckpt-")
    try:
        row = _measure(c, step, root, args.saves, args.plain_steps)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)  # 2 × saves × the state: gigabytes
    params = row["parameters"]
    print(f"{params / 1e6:.1f}M parameters, state {row['state_mb']:.0f} MB, to {args.dir or 'a temporary local folder'}")
    print(f"plain step {row['step_ms']:.0f} ms; host snapshot {row['snapshot_ms']:.0f} ms; torch.save to bytes "
          f"{row['serialise_ms']:.0f} ms; synchronous save {row['write_ms']:.0f} ms")
    print(f"background save: stall {row['stall_ms']:.0f} ms = {row['stall_over_write']:.2f}× the synchronous save "
          f"(target <= 1); training lost {row['lost_ms']:.0f} ms in all until written = "
          f"{row['lost_over_write']:.2f}× (each: {row['lost_each_ms']}; steps: {row['steps_overlapped']})")
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
           or platform.machine(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "threads": torch.get_num_threads(), "dir": args.dir or "a temporary local folder", **row}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
