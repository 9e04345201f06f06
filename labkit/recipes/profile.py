"""Profiling a training loop with torch.profiler: a schedule, labelled regions, a trace for
TensorBoard and Perfetto.

    python -m labkit.recipes.profile --model gpt --steps 20 --batch-size 32 --trace-dir runs/profile
    tensorboard --logdir runs/profile      # or open the .pt.trace.json file in ui.perfetto.dev

The schedule skips `wait` steps, traces `warmup` steps and throws them away (the first steps pay
one-off costs: allocator growth, cuDNN autotuning, compilation), then records `active` steps.
Profiling does not change what the step computes: the losses are the unprofiled run's.

Copied out of labkit, save this file under another name (profile_recipe.py): a profile.py in the
script's folder comes first on the import path and hides Python's own `profile` module, which
cProfile imports.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import (
    ProfilerActivity,
    profile,
    record_function,
    schedule,
    tensorboard_trace_handler,
)

if __package__:  # inside labkit: python -m labkit.recipes.profile
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--trace-dir", default="runs/profile", help="TensorBoard profiler logs")
    p.add_argument("--wait", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--active", type=int, default=3)
    args = common.parse(p, argv)
    device = common.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32

    model = common.torch_model(args).to(device)
    optimizer, scheduler = common.adamw(model, args)
    data = common.batches(common.torch_dataset(args), args.batch_size, args.seed)
    log = common.StepLog("profile", args, device=str(device), trace_dir=args.trace_dir)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities,
                 schedule=schedule(wait=args.wait, warmup=args.warmup, active=args.active, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(args.trace_dir),
                 record_shapes=True) as prof:
        for step in range(args.steps):
            lr = scheduler.get_last_lr()[0]
            # Named regions show up as spans in the trace, around the kernels they launch.
            with record_function("data"):
                x, y = common.to_device(next(data), device)
            with record_function("forward"):
                loss = F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                if args.grad_clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
            log.log(step, loss.item(), lr=lr)
            prof.step()  # tell the schedule a step ended

    # The hottest operators of the recorded steps, by time spent in them (not in their children).
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=10))
    log.write()
    return log


if __name__ == "__main__":
    main()
