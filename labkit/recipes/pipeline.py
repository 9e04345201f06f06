"""Pipeline parallelism of a GPT with torch.distributed.pipelining, launched by torchrun.

    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.pipeline --model gpt --microbatches 4 --schedule 1f1b --steps 20 --batch-size 32

The blocks are cut into one stage per process (the first stage also holds the embeddings, the
last the final norm and the output head). Each batch is split into --microbatches pieces that
flow through the stages: a stage sends its activations to the next one and, in the backward
pass, their gradients back. GPipe runs every forward, then every backward; 1F1B alternates once
the pipeline is full, so at most one micro-batch per stage keeps its activations. Either way a
stage idles while the pipeline fills and drains: (p-1)/(m+p-1) of the step with p equal stages
and m micro-batches, the "bubble" that more micro-batches shrink.

The output head shares its weight with the token embedding; on different stages each keeps a
copy, and the two add their gradients after backward so they stay equal.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

if __package__:  # inside labkit: python -m labkit.recipes.pipeline
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


class Stage(nn.Module):
    """Blocks [first, last) of the GPT, with the embeddings on stage 0 and the head on the last."""

    def __init__(self, gpt: nn.Module, stage: int, stages: int):
        super().__init__()
        per, extra = divmod(len(gpt.blocks), stages)
        start = stage * per + min(stage, extra)
        self.blocks = nn.ModuleList(gpt.blocks[start:start + per + (stage < extra)])
        self.first, self.last = stage == 0, stage == stages - 1
        if self.first:
            self.wte, self.wpe = gpt.wte, gpt.wpe
        if self.last:
            self.ln_f = gpt.ln_f
            self.head = nn.Linear(gpt.cfg.n_embd, gpt.cfg.vocab_size, bias=False)
            self.head.weight = nn.Parameter(gpt.wte.weight.detach().clone())  # the tied table's copy
            if self.first:
                self.head.weight = self.wte.weight  # a single stage: still one tensor

    def forward(self, x):
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x


def loss_fn(logits, targets):
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per batch")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    args = common.parse(p, argv)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "0")):
        os.environ.setdefault(name, value)
    device = common.device(args.device)  # cuda:LOCAL_RANK with a GPU per process, else the CPU
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, stages = dist.get_rank(), dist.get_world_size()
    if args.model != "gpt" or args.batch_size % args.microbatches:
        p.error("needs --model gpt and --microbatches dividing --batch-size")

    stage = Stage(common.torch_model(args), rank, stages).to(device)
    optimizer, scheduler = common.adamw(stage, args)
    kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    # the schedule splits the batch, runs forward and backward, and divides the gradients by m
    schedule = kind(PipelineStage(stage, rank, stages, device), args.microbatches,
                    loss_fn=loss_fn)
    tied = dist.new_group([0, stages - 1]) if stages > 1 else None

    data = common.batches(common.torch_dataset(args), args.batch_size, args.seed)  # all read it
    log = common.StepLog("pipeline", args, world_size=stages, schedule=args.schedule, device=str(device))
    for step in range(args.steps):
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        losses = []
        if stage.first and stage.last:
            schedule.step(x, target=y, losses=losses)
        elif stage.first:
            schedule.step(x)  # sends activations on, receives their gradients
        elif stage.last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        if tied is not None and (stage.first or stage.last):
            weight = stage.wte.weight if stage.first else stage.head.weight
            dist.all_reduce(weight.grad, group=tied)  # embedding + head: one weight's gradient
        if args.grad_clip:  # the whole model's norm, each gradient counted once
            own = [q.grad for q in stage.parameters()
                   if not (stage.last and not stage.first and q is stage.head.weight)]
            sq = sum(g.pow(2).sum() for g in own)
            dist.all_reduce(sq)
            scale = (args.grad_clip / (sq.sqrt() + 1e-6)).clamp(max=1.0)
            for q in stage.parameters():
                q.grad.mul_(scale)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=device)
        dist.all_reduce(loss)  # only the last stage has it: the sum is its value
        if rank == 0:
            log.log(step, loss.item(), lr=lr)
    if rank == 0:
        log.write()
    dist.barrier()
    dist.destroy_process_group()
    return log


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
