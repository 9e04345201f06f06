"""Data parallelism with DistributedDataParallel, launched by torchrun.

    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.ddp --model gpt --steps 20 --batch-size 32

Every process holds the whole model and trains on its own slice of each global batch; during
backward DDP all-reduces the gradients (their mean over processes), so every replica applies
the same update and the weights stay identical. torchrun starts one process per GPU (or CPU
slot) and gives each RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Run without
torchrun, it is one process and the same maths.

--batch-size is the GLOBAL batch: each process takes batch / (processes x grad-accum) samples
per micro-step, so the loss curve does not change with the process count.

`--mistake per-process-batch` trains with a common mistake instead: a one-process script's
batch kept in every process, so each takes --batch-size and the global batch is processes x
larger (see `micro_batch` in `main`).
"""

from __future__ import annotations

import contextlib
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

if __package__:  # inside labkit: python -m labkit.recipes.ddp
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-steps per optimizer step; gradients are all-reduced on the last")
    p.add_argument("--mistake", choices=["per-process-batch"], default=None,
                   help="per-process-batch: every process takes --batch-size (the mistake)")
    args = common.parse(p, argv)

    # torchrun's variables; without torchrun this is a world of one process.
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    device = common.device(args.device)  # cuda:LOCAL_RANK with a GPU per process, else the CPU
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32
    if world_size > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")  # env:// rendezvous
    if args.batch_size % (world_size * args.grad_accum):
        p.error(f"--batch-size {args.batch_size} must divide by processes x --grad-accum "
                f"= {world_size} x {args.grad_accum}")
    if args.mistake == "per-process-batch":  # the one-process script's line, kept
        micro_batch = args.batch_size // args.grad_accum
    else:
        micro_batch = args.batch_size // (world_size * args.grad_accum)

    # Same seed on every rank: same initial weights (DDP also broadcasts rank 0's at start).
    model = common.torch_model(args).to(device)
    ddp_model = model  # what forward and backward go through
    if world_size > 1:
        ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer, scheduler = common.adamw(model, args)

    # Each rank reads a disjoint slice of one seeded shuffle of the dataset. set_epoch reseeds
    # the shuffle every epoch; without it every epoch repeats the first one's order.
    dataset = common.torch_dataset(args)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True)

    def micro_batches():
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from loader

    data = micro_batches()
    log = common.StepLog("ddp", args, world_size=world_size, micro_batch=micro_batch,
                         device=str(device))

    for step in range(args.steps):
        lr = scheduler.get_last_lr()[0]
        total = torch.zeros((), device=device)
        for k in range(args.grad_accum):
            x, y = common.to_device(next(data), device)
            # no_sync: the micro-steps before the last only add into .grad; the all-reduce runs
            # once, during the last backward, over the accumulated gradients.
            last = k == args.grad_accum - 1
            sync = contextlib.nullcontext() if last or world_size == 1 else ddp_model.no_sync()
            with sync:
                logits = ddp_model(x)
                loss = F.cross_entropy(logits.flatten(0, -2).float(), y.flatten()) / args.grad_accum
                loss.backward()
            total += loss.detach()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

        # Each rank saw different samples: the step's loss is the mean over ranks.
        if world_size > 1:
            dist.all_reduce(total)
            total /= world_size
        if rank == 0:  # one process logs and writes files; the others would only repeat it
            log.log(step, total.item(), lr=lr)
            if step % 10 == 0 or step == args.steps - 1:
                print(f"step {step} loss {total.item():.4f}", flush=True)

    if rank == 0:
        log.write()
    if world_size > 1:
        dist.barrier()  # nobody tears down the group while a peer still uses it
        dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
