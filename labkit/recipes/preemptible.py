"""Training that survives preemption: a SIGTERM handler, full-state checkpoints written through
fsspec with a commit marker last, and a resume that continues with exactly the next step.

    python -m labkit.recipes.preemptible --model cnn --steps 40 --checkpoint-dir gs://BUCKET/run1/ckpt --checkpoint-every 10
    python -m labkit.recipes.preemptible ... --preempt-at 15   # drill: SIGTERM to itself in step 15

When Vertex AI reclaims a Spot VM (or moves a job for maintenance) the container gets SIGTERM,
and Compute Engine gives a preempted Spot VM 30 seconds before it stops. The handler only sets a
flag: the step finishes, the state is saved, the process exits 143 (128 + SIGTERM), and the
restarted job resumes from the newest committed checkpoint. Saving every --checkpoint-every
steps as well bounds the work lost when the notice is too short.

fsspec opens one path string on a local disk, on gs://bucket/... (gcsfs) or on Vertex's
/gcs/bucket/... mount; `torch.save("gs://...")` would write a local folder named "gs:". A step
counts only once its COMMITTED marker exists: Cloud Storage cannot rename a folder atomically,
so a half-written checkpoint must never look like a finished one.

`--mistake save-to-url` saves with a common mistake instead (see `save`): the gs://... address
handed to `torch.save` as a path, which writes a local folder named "gs:" and nothing to the
bucket, so the restarted job finds no checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import fsspec
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

if __package__:  # inside labkit: python -m labkit.recipes.preemptible
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common

PREEMPTED_EXIT_CODE = 143  # what a process killed by SIGTERM reports; Vertex restarts the job


def save(fs, root: str, step: int, state: dict, mistake: str | None = None) -> None:
    """`state` as step `step`'s checkpoint under `root` of `fs`, its marker last.
    `mistake="save-to-url"` runs the common mistake instead, so it can be measured beside the fix."""
    folder = f"{root}/step-{step:08d}"
    if mistake == "save-to-url":
        address = fs.unstrip_protocol(folder)  # the address as given: gs://bucket/.../step-...
        os.makedirs(address, exist_ok=True)
        torch.save(state, f"{address}/state.pt")  # a path to torch.save: a local folder named "gs:"
        return
    fs.makedirs(folder, exist_ok=True)
    with fs.open(f"{folder}/state.pt", "wb") as f:
        torch.save(state, f)
    with fs.open(f"{folder}/COMMITTED", "w") as f:  # last: from now on this step counts
        f.write(json.dumps({"step": step}))


def newest_committed(fs, root: str) -> str | None:
    """The newest step folder with a marker; zero-padded names sort in step order."""
    markers = sorted(fs.glob(f"{root}/step-*/COMMITTED"))
    return markers[-1].rsplit("/", 1)[0] if markers else None


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--checkpoint-dir", required=True, help="local path, gs://... or /gcs/...")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also save every K steps")
    p.add_argument("--preempt-at", type=int, default=None, help="drill: SIGTERM during this step")
    p.add_argument("--mistake", choices=["save-to-url"], default=None,
                   help="save-to-url: torch.save to the checkpoint's address string (the mistake)")
    args = common.parse(p, argv)
    device = common.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32

    model = common.torch_model(args).to(device)
    optimizer, scheduler = common.adamw(model, args)

    # Resume: everything that decides the next step comes back, so it is the step an
    # uninterrupted run would take. weights_only: loading runs no pickled code.
    fs, root = fsspec.core.url_to_fs(args.checkpoint_dir)
    start = 0
    folder = newest_committed(fs, root)
    if folder is not None:
        with fs.open(f"{folder}/state.pt", "rb") as f:
            state = torch.load(f, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        # map_location moved the RNG states to the device too; torch takes them back only as
        # CPU byte tensors.
        torch.set_rng_state(state["rng"]["cpu"].cpu())
        if "cuda" in state["rng"]:
            torch.cuda.set_rng_state(state["rng"]["cuda"].cpu(), device)
        start = state["step"] + 1
        print(f"resumed from {folder}: continuing with step {start}", flush=True)

    # The data position is the step (one batch per step): skip the batches already trained on
    # by slicing the epoch's index lists, without loading them.
    dataset = common.torch_dataset(args)
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=args.seed,
                                 drop_last=True)
    per_epoch = len(sampler) // args.batch_size

    def batches(first_step: int):
        epoch, skip = divmod(first_step, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            index_lists = list(BatchSampler(sampler, args.batch_size, drop_last=True))[skip:]
            yield from DataLoader(dataset, batch_sampler=index_lists)
            epoch, skip = epoch + 1, 0

    data = batches(start)
    log = common.StepLog("preemptible", args, device=str(device),
                         resumed_from_step=start - 1 if start else None)

    # SIGTERM only sets a flag: the step in flight finishes, then the loop saves and leaves.
    preempted = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: preempted.set())

    for step in range(start, args.steps):
        if step == args.preempt_at:
            os.kill(os.getpid(), signal.SIGTERM)  # the drill: what Vertex sends
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        log.log(step, loss.item(), lr=lr)

        due = args.checkpoint_every and (step + 1) % args.checkpoint_every == 0
        if due or preempted.is_set() or step + 1 == args.steps:
            rng = {"cpu": torch.get_rng_state()}
            if device.type == "cuda":
                rng["cuda"] = torch.cuda.get_rng_state(device)
            save(fs, root, step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                  "scheduler": scheduler.state_dict(), "rng": rng, "step": step}, args.mistake)
        if preempted.is_set():
            log.write()
            print(f"SIGTERM: saved step {step}, exiting {PREEMPTED_EXIT_CODE}", flush=True)
            sys.exit(PREEMPTED_EXIT_CODE)

    log.write()
    return log


if __name__ == "__main__":
    main()
