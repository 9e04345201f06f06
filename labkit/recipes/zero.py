"""ZeRO stages 1, 2 and 3 in plain PyTorch, launched by torchrun.

    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.zero --stage 2 --model gpt --steps 20 --batch-size 32

DDP keeps on every process the weights (P), their gradients (P) and AdamW's two moments (2P).
ZeRO (Rajbhandari et al., 2020) stops repeating what one process can own:

- stage 1 shards the optimizer state: torch's ZeroRedundancyOptimizer gives each process the
  AdamW state of its share of the parameters; each updates its share and broadcasts it;
- stage 2 shards the gradients too: after backward the gradients are reduce-scattered (each
  process receives the mean of its slice only), each updates its slice of the weights, and an
  all-gather puts the whole weights back on every process. Written out below on flat buffers;
- stage 3 shards the weights as well: FSDP2's fully_shard gathers a block's weights just before
  it computes (--reshard-after-forward frees them again after the forward pass).

Every stage applies exactly DDP's update: the losses are DDP's, at a fraction of the memory.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

if __package__:  # inside labkit: python -m labkit.recipes.zero
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=1, help="ZeRO stage")
    p.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                   help="stage 3: free a block's gathered weights after its forward")
    args = common.parse(p, argv)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "0")):
        os.environ.setdefault(name, value)  # without torchrun: a group of one
    device = common.device(args.device)  # cuda:LOCAL_RANK with a GPU per process, else the CPU
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        p.error(f"--batch-size {args.batch_size} must divide by the {world} processes")

    model = common.torch_model(args).to(device)  # same seed: the same weights on every process
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]

    if args.stage == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # all-reduce as usual
        optimizer = ZeroRedundancyOptimizer(decay, optimizer_class=torch.optim.AdamW, lr=args.lr,
                                            betas=(0.9, 0.95), weight_decay=0.1)
        optimizer.add_param_group(groups[1])  # each process keeps state for its share only
    elif args.stage == 2:
        net = model
        shards = []  # per group: (params, flat buffer of all their weights, this rank's slice)
        for group in groups:
            params = group["params"]
            size = -(-sum(p.numel() for p in params) // world)  # slice length (buffer padded)
            flat = torch.zeros(size * world, device=device)
            offset = 0
            for p in params:  # the weights become views into one flat buffer
                flat[offset:offset + p.numel()] = p.detach().reshape(-1)
                p.data = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            mine = torch.nn.Parameter(flat[rank * size:(rank + 1) * size])  # a view: updates land in flat
            shards.append((params, flat, mine))
        optimizer = torch.optim.AdamW(
            [{"params": [s[2]], "weight_decay": g["weight_decay"]} for s, g in zip(shards, groups, strict=True)],
            lr=args.lr, betas=(0.9, 0.95))
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))  # where the shards live (FSDP assumes CUDA otherwise)
        for block in getattr(model, "blocks", []):
            fully_shard(block, mesh=mesh, reshard_after_forward=args.reshard_after_forward)
        fully_shard(model, mesh=mesh, reshard_after_forward=args.reshard_after_forward)
        net = model
        decay = [p for p in model.parameters() if p.dim() >= 2]  # now DTensors: this rank's shards
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=args.lr, betas=(0.9, 0.95))
    warmup = args.warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0)

    data = common.batches(common.torch_dataset(args), args.batch_size // world, args.seed,
                          rank=rank, world_size=world)
    log = common.StepLog("zero", args, world_size=world, stage=args.stage, device=str(device))
    for step in range(args.steps):
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(net(x).flatten(0, -2).float(), y.flatten())
        loss.backward()
        if args.stage == 2:
            for params, flat, mine in shards:
                full = torch.cat([p.grad.reshape(-1) for p in params])
                full = F.pad(full, (0, flat.numel() - full.numel()))
                for p in params:
                    p.grad = None  # the full gradients go
                mine.grad = torch.empty_like(mine)
                dist.reduce_scatter_tensor(mine.grad, full)  # sum of my slice over processes
                mine.grad /= world
            if args.grad_clip:  # the norm of the whole gradient: slices' squares summed everywhere
                sq = sum(s[2].grad.pow(2).sum() for s in shards)
                dist.all_reduce(sq)
                scale = (args.grad_clip / (sq.sqrt() + 1e-6)).clamp(max=1.0)
                for s in shards:
                    s[2].grad.mul_(scale)
        elif args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()  # stage 1: updates my share, then broadcasts it to the others
        if args.stage == 2:
            for _, flat, mine in shards:
                dist.all_gather_into_tensor(flat, mine.detach().clone())  # whole weights again
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

        loss = loss.detach()
        dist.all_reduce(loss)
        if rank == 0:
            log.log(step, loss.item() / world, lr=lr)
    if rank == 0:
        log.write()
    dist.barrier()
    dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
