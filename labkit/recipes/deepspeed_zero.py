"""ZeRO stages 1-3 with DeepSpeed, launched by torchrun (NCCL on GPUs; gloo on the CPU, no compiled ops).

    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.deepspeed_zero --stage 3 --model gpt --steps 20 --batch-size 32

DeepSpeed takes the model, a torch optimizer and a config dict; `zero_optimization.stage`
chooses what is sharded (1: optimizer state, 2: + gradients, 3: + weights). The returned
engine runs forward, `engine.backward(loss)` (reducing the gradients the stage's way) and
`engine.step()` (clipping to `gradient_clipping`, updating, gathering). The same losses as DDP
and as torch's own ZeRO (labkit.recipes.zero). Needs `pip install deepspeed`.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.recipes import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=1, help="ZeRO stage")
    args = common.parse(p, argv)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "0"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)
    device = common.device(args.device)  # cuda:LOCAL_RANK with a GPU per process, else the CPU
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("DS_ACCELERATOR", device.type)  # DeepSpeed's choice must match ours
    import deepspeed

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = common.torch_model(args).to(device)
    optimizer, scheduler = common.adamw(model, args)
    config = {
        "train_batch_size": args.batch_size,  # global: micro-batch x processes x accumulation
        "train_micro_batch_size_per_gpu": args.batch_size // world,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage},
        "gradient_clipping": args.grad_clip or 0.0,
        "steps_per_print": 1 << 30,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           dist_init_required=False)

    data = common.batches(common.torch_dataset(args), args.batch_size // world, args.seed,
                          rank=rank, world_size=world)
    log = common.StepLog("deepspeed_zero", args, world_size=world, stage=args.stage, device=str(device))
    for step in range(args.steps):
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(engine(x).flatten(0, -2).float(), y.flatten())
        engine.backward(loss)
        engine.step()  # clip, update, zero the gradients
        scheduler.step()  # the warm-up acts on the wrapped optimizer's learning rate

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
