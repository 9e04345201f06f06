"""Fully sharded data parallelism (FSDP2, `fully_shard`), launched by torchrun.

    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.fsdp --model gpt --steps 20 --batch-size 32

DDP keeps a whole copy of the weights, gradients and optimizer state on every GPU. FSDP keeps
1/N of each per process: a layer's weights are all-gathered just before its forward (and again
before its backward), and its gradients are reduce-scattered so each process updates only its
own shard. Same maths as DDP, same losses; memory per GPU for the model state falls about N-fold,
at the price of more communication. Run without torchrun, it is a group of one.
"""

from __future__ import annotations

import itertools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

if __package__:  # inside labkit: python -m labkit.recipes.fsdp
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    args = common.parse(p, argv)

    # Without torchrun: a process group of one (fully_shard always needs a group; port 0 lets
    # the rendezvous pick a free one).
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

    model = common.torch_model(args).to(device)
    # Shard every repeated block on its own (its weights are gathered only while it computes),
    # then the root for what is left (embeddings, head). Parameters become DTensors holding
    # this rank's shard.
    # The mesh says which device the shards live on: left out, FSDP assumes CUDA whenever the
    # machine has a GPU, even for processes training on the CPU.
    mesh = init_device_mesh(device.type, (world_size,))
    blocks = getattr(model, "blocks", [])
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer, scheduler = common.adamw(model, args)  # built on the shards: 1/N of the state

    dataset = common.torch_dataset(args)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size // world_size, sampler=sampler,
                        drop_last=True)

    def batches():
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from loader

    data = batches()
    log = common.StepLog("fsdp", args, world_size=world_size, device=str(device))
    for step in range(args.steps):
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())
        loss.backward()  # gradients arrive reduce-scattered: each rank holds its shard's mean
        if args.grad_clip:
            # The norm of the sharded gradients is all-reduced across ranks: the global norm.
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

        loss = loss.detach()
        dist.all_reduce(loss)
        if rank == 0:
            log.log(step, loss.item() / world_size, lr=lr)
            if step % 10 == 0 or step == args.steps - 1:
                print(f"step {step} loss {loss.item() / world_size:.4f}", flush=True)

    if rank == 0:
        log.write()
    dist.barrier()
    dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
