"""Small, real distributed programs that show what each replica of a Vertex job does.

``python -m labkit.course.vertex_demo ddp``: PyTorch DDP (gloo on CPU, nccl on GPU) on a linear
regression whose data depend only on (seed, step), so a run's losses and weights are exactly
reproducible. Checkpoints (model, optimizer, losses, next step) go to AIP_CHECKPOINT_DIR through
`labkit.core.checkpoint` (committed by a marker); on SIGTERM every rank agrees (an all-reduced
flag) to stop after the current step, the chief checkpoints it and all exit 143, and a restarted
job resumes from the newest committed step. The chief writes ``result.json`` (per-step losses,
final weights) to AIP_MODEL_DIR.

On Vertex the AIP_* variables are ``gs://…/`` addresses, not folders: they are read through the
bucket's ``/gcs/`` mount (`labkit.core.gcs.mount_path`), so the job needs no gcsfs and a
restarted job finds its checkpoints in the bucket, not on the lost container disk.

``python -m labkit.course.vertex_demo tf``: the same regression with TensorFlow's
MultiWorkerMirroredStrategy built from TF_CONFIG (see `labkit.tf.strategy.tf_strategy`).

Each prints ``step N loss X`` lines, which the emulator watches for fault injection.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

from labkit.core import checkpoint
from labkit.core.cluster import from_env
from labkit.core.gcs import mount_path
from labkit.core.preemption import PreemptionGuard

PREEMPTED_EXIT_CODE = 143
FEATURES = 16


def _dirs(args) -> tuple[str, Path]:
    """The checkpoint folder (a path or URL for `labkit.core.checkpoint`) and the output folder,
    each from its flag, else from Vertex's gs:// address through the bucket mount."""
    ckpt = mount_path(args.checkpoint_dir or os.environ.get("AIP_CHECKPOINT_DIR") or "checkpoints")
    out = mount_path(args.output_dir or os.environ.get("AIP_MODEL_DIR") or "model")
    return ckpt, Path(out)


def _batch(seed: int, step: int, batch: int):
    """Features and targets of one global batch: a function of (seed, step) only."""
    import numpy as np

    rng = np.random.default_rng([seed, step])
    x = rng.standard_normal((batch, FEATURES)).astype("float32")
    w = np.linspace(-1.0, 1.0, FEATURES, dtype="float32")
    y = x @ w + 0.1 * rng.standard_normal(batch).astype("float32")
    return x, y[:, None]


def run_ddp(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from labkit.torch.distributed import init_process_group

    info = from_env()
    backend = init_process_group(info)
    rank, world = (dist.get_rank(), dist.get_world_size()) if backend else (0, 1)
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ckpt_dir, out_dir = _dirs(args)
    start, losses = 0, []
    last = checkpoint.load(ckpt_dir)
    if last is not None:
        state = torch.load(io.BytesIO(last.files["state.pt"]), weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, losses = state["next_step"], state["losses"]
        print(f"rank {rank}: resumed from {last.path}, next step {start}", flush=True)
    ddp = DistributedDataParallel(model) if backend else model

    def save(next_step: int) -> None:
        if rank == 0:
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "next_step": next_step, "losses": losses}, buf)
            checkpoint.save(ckpt_dir, next_step, {"state.pt": buf.getvalue()})  # marker written last
        if backend:
            dist.barrier()

    with PreemptionGuard() as guard:  # SIGTERM only sets a flag: the step finishes first
        for step in range(start, args.steps):
            x, y = (torch.from_numpy(a) for a in _batch(args.seed, step, args.batch_size))
            x, y = x[rank::world], y[rank::world]
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            # Global loss and the stop flag travel in one all-reduce: every rank stops at the same step.
            sync = torch.tensor([loss.item() / world, float(guard.requested)], dtype=torch.float64)
            if backend:
                dist.all_reduce(sync)
            losses.append(float(sync[0]))
            print(f"step {step + 1} loss {sync[0]:.6f}", flush=True)
            time.sleep(args.step_sleep)
            if sync[1] > 0:
                save(step + 1)
                print(f"rank {rank}: SIGTERM: checkpointed step {step + 1}, exiting", flush=True)
                return PREEMPTED_EXIT_CODE
            if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
                save(step + 1)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        weights = [float(v) for v in torch.cat([p.detach().flatten() for p in model.parameters()])]
        (out_dir / "result.json").write_text(json.dumps(
            {"framework": "torch", "world_size": world, "backend": backend, "losses": losses,
             "weights": weights}))
    if backend:
        dist.barrier()  # tearing gloo down while a peer still talks to it can abort the process
        dist.destroy_process_group()
    return 0


def run_tf(args) -> int:
    import tensorflow as tf

    from labkit.tf.strategy import tf_strategy

    info = from_env()
    strategy = tf_strategy(info)  # must come before any other TensorFlow op
    workers = max(1, info.world_size)
    per_worker = args.batch_size // workers
    with strategy.scope():
        w = tf.Variable(tf.zeros((FEATURES, 1)), aggregation=tf.VariableAggregation.MEAN)
        b = tf.Variable(tf.zeros((1,)), aggregation=tf.VariableAggregation.MEAN)

    @tf.function
    def train_step(x, y):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(x @ w + b - y)) / args.batch_size
            grads = tape.gradient(loss, [w, b])
            ctx = tf.distribute.get_replica_context()
            grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
            for var, g in zip([w, b], grads, strict=True):
                var.assign_sub(args.lr * g)
            return loss
        per_replica = strategy.run(step_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    rank = info.rank or 0
    losses = []
    for step in range(args.steps):
        x, y = _batch(args.seed, step, args.batch_size)
        xs, ys = x[rank * per_worker:(rank + 1) * per_worker], y[rank * per_worker:(rank + 1) * per_worker]
        loss = float(train_step(tf.constant(xs), tf.constant(ys)))
        losses.append(loss)
        print(f"step {step + 1} loss {loss:.6f}", flush=True)
    if info.is_chief:
        _, out_dir = _dirs(args)
        out_dir.mkdir(parents=True, exist_ok=True)
        weights = [float(v) for v in tf.concat([tf.reshape(w, [-1]), b], 0).numpy()]
        (out_dir / "result.json").write_text(json.dumps(
            {"framework": "tf", "world_size": info.world_size, "losses": losses, "weights": weights,
             "strategy": type(strategy).__name__}))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.course.vertex_demo")
    p.add_argument("framework", choices=("ddp", "tf"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=64, help="global batch per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--output-dir")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to pause after each step (to leave time for fault injection)")
    args = p.parse_args(argv)
    return run_ddp(args) if args.framework == "ddp" else run_tf(args)


if __name__ == "__main__":
    sys.exit(main())


def demo_job(framework: str = "ddp", *, replica_count: int = 2, steps: int = 20,
             batch_size: int = 64, checkpoint_every: int = 0, step_sleep: float = 0.0,
             output_uri: str = "gs://labkit-demo/job", spot: bool = False,
             restart_job_on_worker_restart: bool = True, machine_type: str = "n1-standard-4",
             image_uri: str | None = None, package_uri: str | None = None):
    """A CustomJob spec whose replicas run this module, in a container that has labkit: labkit's
    image by default, or `image_uri` (a prebuilt one first pip-installs labkit from the bucket,
    see `labkit.vertex.labkit_container`)."""
    from labkit.vertex.specs import PoolConfig, custom_job_spec, labkit_container

    if framework not in ("ddp", "tf"):
        raise ValueError(f"framework must be 'ddp' or 'tf' (got {framework!r})")
    args = ["python", "-m", "labkit.course.vertex_demo", framework, "--steps", str(steps),
            "--batch-size", str(batch_size), "--checkpoint-every", str(checkpoint_every),
            "--step-sleep", str(step_sleep)]
    container = labkit_container("torch" if framework == "ddp" else "tf", output_uri=output_uri,
                                 image_uri=image_uri, package_uri=package_uri)
    pool = {"machine_type": machine_type, **container, "args": args}
    workers = PoolConfig(replica_count=replica_count - 1, **pool) if replica_count > 1 else None
    return custom_job_spec(PoolConfig(**pool), workers, output_uri=output_uri, spot=spot,
                           restart_job_on_worker_restart=restart_job_on_worker_restart)
