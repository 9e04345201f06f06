"""ZeRO stages 1-3 with DeepSpeed, launched by torchrun (NCCL on GPUs; gloo on the CPU, no compiled ops).

    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.deepspeed_zero --stage 3 --model gpt --steps 20 --batch-size 32
    torchrun --standalone --nproc-per-node 2 -m labkit.recipes.deepspeed_zero --stage 2 --offload-optimizer cpu

DeepSpeed takes the model, a torch optimizer and a config dict; `zero_optimization.stage`
chooses what is sharded (1: optimizer state, 2: + gradients, 3: + weights). The returned
engine runs forward, `engine.backward(loss)` (reducing the gradients the stage's way) and
`engine.step()` (clipping to `gradient_clipping`, updating, gathering). The same losses as DDP
and as torch's own ZeRO (labkit.recipes.zero). Needs `pip install deepspeed`.

ZeRO-Offload (`--offload-optimizer cpu`): `zero_optimization.offload_optimizer.device = "cpu"`
keeps each rank's optimizer partition (fp32 master weights and AdamW's two moments, 12 bytes
per parameter of the partition) in host memory and runs the update there; the GPU sends its
gradient partition to the host and gets the updated weights back over PCIe every step. Stage 3
can also keep the weights' partitions on the host (`--offload-param cpu`, `offload_param`), fetched
layer by layer. `pin_memory` (page-locked host buffers: faster copies) only means something with
a GPU. DeepSpeed asks for its own C++ `DeepSpeedCPUAdam` (compiled at first use) and refuses a
torch optimizer unless `"zero_force_ds_cpu_optimizer": false`; this recipe keeps torch's AdamW,
so the offloaded run computes the same update, only slower on large models.
Config keys: https://www.deepspeed.ai/docs/config-json/#optimizer-offloading and
https://www.deepspeed.ai/tutorials/zero-offload/ (read 2026-11-26); defaults in DeepSpeed's
deepspeed/runtime/zero/offload_config.py (pin_memory defaults to true) and the
zero_force_ds_cpu_optimizer check in deepspeed/runtime/engine.py (DeepSpeed 0.19).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

if __package__:  # inside labkit: python -m labkit.recipes.deepspeed_zero
    from labkit.recipes import common
else:  # a copy, run as a script: common.py, plain.py and samples.py beside it
    import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=1, help="ZeRO stage")
    p.add_argument("--offload-optimizer", choices=("none", "cpu"), default="none",
                   help="keep the optimizer partition (master weights, moments) and its update on the host")
    p.add_argument("--offload-param", choices=("none", "cpu"), default="none",
                   help="stage 3 only: keep the weights' partitions on the host")
    args = common.parse(p, argv)
    if args.offload_param != "none" and args.stage != 3:
        p.error(f"--offload-param: {args.offload_param!r} needs --stage 3 (stages 1-2 keep whole weights on the GPU)")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "0"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(name, value)
    device = common.device(args.device)  # cuda:LOCAL_RANK with a GPU per process, else the CPU
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32
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
    pinned = device.type == "cuda"  # page-locked host buffers for the PCIe copies; no GPU, no copies
    if args.offload_optimizer == "cpu":
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": pinned}
        config["zero_force_ds_cpu_optimizer"] = False  # run torch's AdamW on the host, not DeepSpeedCPUAdam
    if args.offload_param == "cpu":
        config["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": pinned}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config,
                                           dist_init_required=False)

    data = common.batches(common.torch_dataset(args), args.batch_size // world, args.seed,
                          rank=rank, world_size=world)
    log = common.StepLog("deepspeed_zero", args, world_size=world, stage=args.stage, device=str(device),
                         offload={"optimizer": args.offload_optimizer, "param": args.offload_param})
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
    held = [None] * world  # where each rank's optimizer state lives: {"cpu": bytes, "cuda": bytes}
    dist.all_gather_object(held, optimizer_bytes_by_device(engine.optimizer))
    if rank == 0:
        log.metrics.run["optimizer_bytes_by_device"] = held
        log.write()
    dist.barrier()
    dist.destroy_process_group()
    return log


def optimizer_bytes_by_device(zero_optimizer) -> dict[str, int]:
    """Bytes of this rank's optimizer state (AdamW's moments and DeepSpeed's fp32 master
    partitions) by the device holding them: offloaded, the GPU's share drops to ~0."""
    base = zero_optimizer.optimizer  # the torch AdamW DeepSpeed drives, holding the partitions
    tensors = {id(p): p for g in base.param_groups for p in g["params"]}
    # stage 3 empties the groups between steps: its fp32 partitions are listed here
    tensors.update({id(p): p for p in getattr(zero_optimizer, "fp32_partitioned_groups_flat", [])})
    tensors.update({id(v): v for s in base.state.values() for v in s.values()
                    if isinstance(v, torch.Tensor) and v.dim() > 0})
    held: dict[str, int] = {}
    for t in tensors.values():
        held[t.device.type] = held.get(t.device.type, 0) + t.numel() * t.element_size()
    return held


if __name__ == "__main__":
    main()
    common.leave_worker()  # gloo's threads can outlive the group: see its docstring
