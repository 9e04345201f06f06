"""Sharded checkpoints: FSDP2 `fully_shard` saved and resumed with `torch.distributed.checkpoint`
(DCP), on any number of processes, launched by torchrun.

    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.sharded_checkpoint --model gpt --steps 20 --batch-size 32 --checkpoint-dir gs://BUCKET/run1/ckpt --checkpoint-every 10
    torchrun --standalone --nproc-per-node 1 -m labkit.recipes.sharded_checkpoint --model gpt --steps 40 --batch-size 32 --checkpoint-dir gs://BUCKET/run1/ckpt

Under FSDP each process holds 1/N of the weights and of AdamW's state. `torch.save` of the
whole state would first gather it into one process; instead every process writes its own shards
with `dcp.save`, in parallel, and DCP's `.metadata` file records which piece of which tensor
went where. `dcp.load` fills whatever shards the loading processes hold, so the second command
above continues the first run's 2-process checkpoint on one process (the same global batch, the
same samples). `get_state_dict` / `set_state_dict` name every tensor of the model and of the
optimizer by its parameter's name, the key that stays the same when the layout changes.

A step counts once its COMMITTED marker exists; rank 0 writes it after `dcp.save` has returned,
which it does only once every process has written its files. The path may be a local folder,
/gcs/... (Vertex AI's mount) or gs://... (through fsspec: DCP picks its writer from the path).
Without --checkpoint-dir the checkpoints go to a temporary folder, deleted at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

if __package__:  # inside labkit: python -m labkit.recipes.sharded_checkpoint
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def newest_committed(fs, root: str) -> str | None:
    """The name of the newest step folder with a marker; zero-padded names sort in step order."""
    markers = sorted(fs.glob(f"{root}/step-*/COMMITTED"))
    return markers[-1].rsplit("/", 2)[-2] if markers else None


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--checkpoint-dir", default=None, help="local path, gs://... or /gcs/... "
                   "(default: a temporary folder)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="also save every K steps")
    args = common.parse(p, argv)

    # Without torchrun: a process group of one (port 0 lets the rendezvous pick a free one).
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "0")):
        os.environ.setdefault(name, value)
    device = common.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world_size:
        p.error(f"--batch-size {args.batch_size} must divide by the {world_size} processes")
    ckpt_dir = [args.checkpoint_dir or (tempfile.mkdtemp(prefix="sharded-ckpt-") if rank == 0 else None)]
    dist.broadcast_object_list(ckpt_dir)  # one folder for all processes of this machine
    base = ckpt_dir[0].rstrip("/")
    fs, root = fsspec.core.url_to_fs(base)

    model = common.torch_model(args).to(device)
    mesh = init_device_mesh(device.type, (world_size,))  # the device the shards live on
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer, scheduler = common.adamw(model, args)

    # Resume: the state to fill is this run's own (its shards); DCP reads into it in place,
    # taking from each saved file the pieces that overlap this process's shards.
    start = 0
    newest = newest_committed(fs, root)
    if newest is not None:
        folder = f"{base}/{newest}"
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state,
                 "progress": {"step": -1, "scheduler": scheduler.state_dict()}}  # what to read
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scheduler.load_state_dict(state["progress"]["scheduler"])
        start = state["progress"]["step"] + 1
        if rank == 0:
            print(f"resumed from {folder} on {world_size} process(es): continuing with step {start}", flush=True)

    # Data: every process skips the micro-batches already trained on. Step s takes samples
    # s*B .. (s+1)*B-1 of the epoch's order whatever the number of processes, so a resumed run
    # of another size continues with the same samples.
    dataset = common.torch_dataset(args)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    micro = args.batch_size // world_size
    per_epoch = len(sampler) // micro

    def batches(first_step: int):
        epoch, skip = divmod(first_step, per_epoch)
        while True:
            sampler.set_epoch(epoch)
            yield from DataLoader(dataset, batch_sampler=list(BatchSampler(sampler, micro, drop_last=True))[skip:])
            epoch, skip = epoch + 1, 0

    data = batches(start)
    log = common.StepLog("sharded_checkpoint", args, world_size=world_size, device=str(device),
                         resumed_from_step=start - 1 if start else None)
    for step in range(start, args.steps):
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        loss = loss.detach()
        dist.all_reduce(loss)
        if rank == 0:
            log.log(step, loss.item() / world_size, lr=lr)

        if (args.checkpoint_every and (step + 1) % args.checkpoint_every == 0) or step + 1 == args.steps:
            # Each process writes only its shards (no gather); non-tensor values are saved once.
            folder = f"{base}/step-{step:08d}"
            model_state, optim_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optim": optim_state,
                      "progress": {"step": step, "scheduler": scheduler.state_dict()}},
                     checkpoint_id=folder)
            if rank == 0:  # dcp.save returned: every process's files and the .metadata are written
                with fs.open(f"{folder}/COMMITTED", "w") as f:
                    f.write(json.dumps({"step": step, "world_size": world_size}))
                print(f"step {step} loss {loss.item() / world_size:.4f}, saved {folder}", flush=True)

    if rank == 0:
        log.write()
        if args.checkpoint_dir is None:
            shutil.rmtree(ckpt_dir[0], ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
