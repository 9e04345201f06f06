"""Megatron-style tensor parallelism of a GPT with DTensor, launched by torchrun.

    torchrun --standalone --nproc-per-node 4 -m labkit.recipes.tensor_parallel --tp-degree 2 --model gpt --steps 20 --batch-size 32

Inside each block the processes of a tensor-parallel group split the matrices: attention's qkv
and the MLP's first linear by output features (column-parallel: each process owns some heads,
some hidden units), attention's output projection and the MLP's second linear by input features
(row-parallel: each multiplies its slice, an all-reduce sums the results). A block then costs
two all-reduces of the activations forward and two backward, and holds 1/t of its matrices.
The processes of a group read the same batch; with more processes than --tp-degree, the groups
are data-parallel replicas that average their gradients.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

if __package__:  # inside labkit: python -m labkit.recipes.tensor_parallel
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def heads_together(n_embd: int, n_head: int, t: int) -> torch.Tensor:
    """qkv's rows are [q heads | k heads | v heads]; reorder them to [q, k, v of group 0 | ...]
    so that a contiguous slice (what column sharding takes) holds whole heads."""
    hd, per = n_embd // n_head, n_head // t
    return torch.tensor([part * n_embd + h * hd + i for g in range(t) for part in range(3)
                         for h in range(g * per, (g + 1) * per) for i in range(hd)])


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--tp-degree", type=int, default=None, help="processes per group (default: all)")
    args = common.parse(p, argv)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "0")):
        os.environ.setdefault(name, value)
    device = common.device(args.device)  # cuda:LOCAL_RANK with a GPU per process, else the CPU
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world = dist.get_world_size()
    t = args.tp_degree or world
    if args.model != "gpt" or world % t or args.batch_size % (world // t):
        p.error("needs --model gpt, a --tp-degree that divides the processes, and a batch that "
                "divides by the replicas")
    mesh = init_device_mesh(device.type, (world // t, t), mesh_dim_names=("dp", "tp"))
    dp_rank, dp = mesh["dp"].get_local_rank(), world // t

    model = common.torch_model(args).to(device)
    for block in model.blocks:
        qkv = block.attn.qkv
        with torch.no_grad():
            qkv.weight.copy_(qkv.weight[heads_together(qkv.in_features, block.attn.n_head, t)])
        parallelize_module(block, mesh["tp"], {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                                               "fc": ColwiseParallel(), "out": RowwiseParallel()})
    optimizer, scheduler = common.adamw(model, args)  # sharded matrices are DTensors now

    data = common.batches(common.torch_dataset(args), args.batch_size // dp, args.seed,
                          rank=dp_rank, world_size=dp)
    log = common.StepLog("tensor_parallel", args, world_size=world, tp_degree=t, device=str(device))
    params = list(model.parameters())
    for step in range(args.steps):
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())
        loss.backward()
        grads = [g.to_local() if isinstance(g, DTensor) else g for g in (q.grad for q in params)]
        if dp > 1:  # replicas average their gradients: one all-reduce of them all
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=mesh["dp"].get_group())
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g) / dp)
                offset += g.numel()
        if args.grad_clip:  # sharded parts' squares summed over the group, replicated ones once
            sharded = sum(g.pow(2).sum() for q, g in zip(params, grads, strict=True) if isinstance(q, DTensor))
            sharded = torch.as_tensor(sharded, dtype=torch.float32, device=device)
            dist.all_reduce(sharded, group=mesh["tp"].get_group())
            norm = (sharded + sum(g.pow(2).sum() for q, g in zip(params, grads, strict=True)
                                  if not isinstance(q, DTensor))).sqrt()
            for g in grads:
                g.mul_((args.grad_clip / (norm + 1e-6)).clamp(max=1.0))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

        loss = loss.detach()  # the same on every process of a group
        dist.all_reduce(loss)
        if dist.get_rank() == 0:
            log.log(step, loss.item() / world, lr=lr)
    if dist.get_rank() == 0:
        log.write()
    dist.barrier()
    dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
