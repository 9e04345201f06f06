"""Fault-tolerant DDP: torchrun restarts the worker group after a failure, and every worker
resumes from the newest snapshot.

    torchrun --standalone --nproc-per-node 2 --max-restarts 3 -m labkit.recipes.elastic_ddp --model cnn --steps 8 --batch-size 16 --snapshot /tmp/run1/snapshot.pt
    torchrun ... --max-restarts 3 -m labkit.recipes.elastic_ddp ... --fail-at-step 5   # drill: rank 1 dies in step 5, once

A DDP process group cannot lose a member: when one worker exits (a crash, the OOM killer), its
peers would wait in the next all-reduce forever. torchrun watches its workers; when one fails it
stops all of them and starts the whole group again, up to --max-restarts times, with
TORCHELASTIC_RESTART_COUNT set to the attempt number. A restarted worker is a new process: all it
knows is what it reads from disk. So rank 0 saves a snapshot every --snapshot-every steps
(model, optimizer, LR schedule, the next step and the data position), and every worker, on every
start, loads it if it exists. The work since the last snapshot is trained again.

The snapshot is written to a temporary file and renamed over the old one (os.replace is atomic
on a local or POSIX shared filesystem), so a worker killed mid-write leaves the previous snapshot
whole, never a torn one. On Vertex's /gcs mount a rename is not atomic: there, use the commit
marker of labkit.recipes.preemptible. With several nodes the snapshot must be on storage every
node reads. Rank 0 writes; a barrier after it keeps the others from running ahead.
The approach follows PyTorch's tutorial "Fault-tolerant Distributed Training with torchrun"
(https://docs.pytorch.org/tutorials/beginner/ddp_series_fault_tolerance.html, read 2026-11-26).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

if __package__:  # inside labkit: python -m labkit.recipes.elastic_ddp
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def save_snapshot(path: str, state: dict) -> None:
    """Write `state` beside `path`, then rename it over `path`: a reader sees the old snapshot or
    the new one, whole."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the rename makes them the snapshot
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--snapshot", required=True, help="snapshot file, e.g. /tmp/run1/snapshot.pt")
    p.add_argument("--snapshot-every", type=int, default=1, help="save a snapshot every K steps")
    p.add_argument("--fail-at-step", type=int, default=None,
                   help="drill: rank 1 exits abruptly at the start of this step, first attempt only")
    args = common.parse(p, argv)
    if args.snapshot_every < 1:
        p.error(f"--snapshot-every {args.snapshot_every} must be >= 1")
    if args.fail_at_step is not None and not 0 <= args.fail_at_step < args.steps:
        p.error(f"--fail-at-step {args.fail_at_step} must be a step of the run, 0 to {args.steps - 1}")

    # torchrun's variables; TORCHELASTIC_RESTART_COUNT is 0 on the first attempt, 1 after the
    # first restart of the group, and so on.
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    device = common.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32
    if world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # torchrun's agent keeps one key-value store for all attempts, and the ranks publish
        # their addresses in it: a key per attempt keeps a restarted rank from reading the address
        # of a peer that died in the previous attempt (connection refused, then a hang). Seen
        # with torch 2.13, whose env:// rendezvous adds no such prefix; the same symptom with NCCL:
        # https://github.com/pytorch/pytorch/issues/167288 (read 2026-11-26).
        store = dist.PrefixStore(f"attempt-{restart_count}", dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
            is_master=rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                                rank=rank, world_size=world_size)
    if args.batch_size % world_size:
        p.error(f"--batch-size {args.batch_size} must divide by the {world_size} processes")
    micro_batch = args.batch_size // world_size

    model = common.torch_model(args).to(device)
    optimizer, scheduler = common.adamw(model, args)

    # Every worker, on every start: load the snapshot if there is one. Before DDP wraps the
    # model, so all ranks start from the same weights (DDP's constructor is also a collective
    # every rank reaches only after loading). weights_only: loading runs no pickled code.
    start = 0
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, map_location=device, weights_only=True)
        model.load_state_dict(snap["model"])
        optimizer.load_state_dict(snap["optimizer"])
        scheduler.load_state_dict(snap["scheduler"])
        # map_location moved the RNG states to the device too; torch takes them back only as
        # CPU byte tensors.
        torch.set_rng_state(snap["rng"]["cpu"].cpu())
        if "cuda" in snap["rng"]:
            torch.cuda.set_rng_state(snap["rng"]["cuda"].cpu(), device)
        start = snap["next_step"]
        if rank == 0:
            print(f"attempt {restart_count}: resumed from {args.snapshot} at step {start}", flush=True)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if world_size > 1 else model

    # The data position: the order is a function of (seed, epoch), so the epoch and the batches
    # already trained in it say which batch comes next. Skip those by slicing the epoch's index
    # lists, without loading them.
    dataset = common.torch_dataset(args)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    per_epoch = len(sampler) // micro_batch

    def batches(first_step: int):
        epoch, skip = divmod(first_step, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            index_lists = list(BatchSampler(sampler, micro_batch, drop_last=True))[skip:]
            yield from DataLoader(dataset, batch_sampler=index_lists)
            epoch, skip = epoch + 1, 0

    data = batches(start)
    log = common.StepLog("elastic_ddp", args, world_size=world_size, micro_batch=micro_batch,
                         device=str(device), restart_count=restart_count,
                         resumed_at_step=start if start else None)
    if rank == 0:  # the steps before the snapshot, as the earlier attempt wrote them
        log.metrics.continue_from(args.metrics_out, start)

    for step in range(start, args.steps):
        if step == args.fail_at_step and rank == 1 and restart_count == 0:
            print(f"rank 1: exiting abruptly at step {step} (attempt {restart_count})", flush=True)
            os._exit(1)  # the drill: no cleanup, no goodbye, as a crashed worker
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(ddp_model(x).flatten(0, -2).float(), y.flatten())
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

        total = loss.detach()
        if world_size > 1:
            dist.all_reduce(total)
            total /= world_size
        if rank == 0:
            log.log(step, total.item(), lr=lr)
            print(f"step {step} loss {total.item():.4f}", flush=True)

        if (step + 1) % args.snapshot_every == 0 or step + 1 == args.steps:
            if rank == 0:
                rng = {"cpu": torch.get_rng_state()}
                if device.type == "cuda":
                    rng["cuda"] = torch.cuda.get_rng_state(device)
                # Metrics first, then the snapshot: the file never lacks a step the snapshot
                # skips (a resume drops the file's steps from the snapshot's step on).
                log.write()
                save_snapshot(args.snapshot, {
                    "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "rng": rng,
                    "next_step": step + 1})
            if world_size > 1:
                dist.barrier()  # nobody trains on while the snapshot is being written

    if rank == 0:
        log.write()
    if world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
