"""Pipeline parallelism (`--parallel pp`) of labkit's GPT with `torch.distributed.pipelining`.

The blocks are cut into p consecutive stages, one per rank of a pipeline group (the first holds
the embeddings, the last the final norm, the output head and the loss). A replica's batch is
split into m micro-batches; the schedule (GPipe: all forwards, then all backwards; 1F1B: one
forward, one backward once the pipeline is full, so at most p micro-batches of activations are
alive) sends each micro-batch's activations to the next stage and their gradients back. A stage
waits while the pipeline fills and drains: with equal stages the idle share of a step is
(p-1)/(m+p-1), the bubble. The schedule scales the gradients by 1/m, so a step's update is the
one of the whole batch.

GPT ties the output head to the token embedding. Here the first and last stages each hold a
copy; after backward they sum their gradients (one all-reduce between the two), so both copies
take the same update, as the single tied weight would.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.core.parallelism import Layout
from labkit.torch.parallel.base import Strategy, all_reduce_mean, clip_grad_norm


def stage_blocks(n_layer: int, stages: int, stage: int) -> range:
    """The blocks of `stage`: consecutive, the first stages taking one more when uneven."""
    base, extra = divmod(n_layer, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


class GPTStage(nn.Module):
    """One stage of a GPT: (embeddings) + its blocks + (final norm, head)."""

    def __init__(self, gpt: nn.Module, stage: int, stages: int):
        super().__init__()
        self.first, self.last = stage == 0, stage == stages - 1
        if self.first:
            self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in stage_blocks(len(gpt.blocks), stages, stage))
        if self.last:
            self.ln_f = gpt.ln_f
            self.lm_head = nn.Linear(gpt.lm_head.in_features, gpt.lm_head.out_features, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(gpt.lm_head.weight)  # the tied table's copy
            if self.first:
                self.lm_head.weight = self.wte.weight  # one stage: still tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for b in self.blocks:
            x = b(x)
        if self.last:
            x = self.lm_head(self.ln_f(x))
        return x


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


class Pipeline(Strategy):
    """pp stages per replica (consecutive ranks), dp replicas. Counts the seconds the schedule ran
    (`schedule_s`) and, inside it, the seconds this stage computed (`busy_s`): the rest is the
    bubble (waiting for a neighbour) and the sends."""

    name = "pp"
    reduces_gradients = True
    owns_forward_backward = True  # the schedule runs the stages' forward and backward

    def __init__(self, layout: Layout, rank: int, model: nn.Module, device: torch.device,
                 schedule: str):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.mesh = init_device_mesh(device.type, (layout.dp, layout.pp), mesh_dim_names=("dp", "pp"))
        self.stage_index = layout.mp_rank(rank)
        stage = GPTStage(model, self.stage_index, layout.pp).to(device)
        super().__init__(layout, rank, stage)
        # first and last stage of each replica: where the tied table's two copies live
        self.tie_group = None
        for d in range(layout.dp):
            ranks = sorted({d * layout.pp, d * layout.pp + layout.pp - 1})
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                self.tie_group = group
        self.stage = PipelineStage(stage, self.stage_index, layout.pp, device,
                                   group=self.mesh["pp"].get_group())
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        self.schedule = kind(self.stage, layout.microbatches, loss_fn=_loss)
        self.busy_s = 0.0
        self.schedule_s = 0.0
        self._time_stage_work()

    def _time_stage_work(self) -> None:
        """Count the seconds this stage computes (forward and backward of its micro-batches, and
        on the last stage the loss, which the schedule computes between them); the rest of a
        step it waits for its neighbours or sends."""
        targets = [(self.stage, "forward_one_chunk"), (self.stage, "backward_one_chunk"),
                   (self.schedule, "_maybe_compute_loss")]
        for owner, name in targets:
            work = getattr(owner, name, None)
            if work is None:  # a torch without this step: it counts as waiting
                continue

            def timed(*args, _work=work, **kwargs):
                t = time.perf_counter()
                try:
                    return _work(*args, **kwargs)
                finally:
                    self.busy_s += time.perf_counter() - t

            setattr(owner, name, timed)

    def param_groups(self) -> list[dict[str, Any]]:
        params = list(self.model.parameters())
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    def loss_divisor(self) -> int:
        return self.layout.dp  # only the last stage of each replica has a loss

    def forward_backward(self, micro_batches, autocast) -> torch.Tensor:
        (x, y), = micro_batches
        losses: list[torch.Tensor] = []
        started = time.perf_counter()
        with autocast():
            if self.model.first and self.model.last:
                self.schedule.step(x, target=y, losses=losses)
            elif self.model.first:
                self.schedule.step(x)
            elif self.model.last:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
        self.schedule_s += time.perf_counter() - started
        return torch.stack(losses).mean().detach() if losses else torch.zeros((), device=self.stage.device)

    def reduce_gradients(self) -> None:
        """Sum the tied embedding's two copies, then average over the dp replicas."""
        if self.tie_group is not None:
            tied = self.model.wte.weight if self.model.first else self.model.lm_head.weight
            dist.all_reduce(tied.grad, group=self.tie_group)  # the two copies' gradients, summed
        all_reduce_mean([p.grad for p in self.model.parameters() if p.grad is not None],
                        self.mesh["dp"].get_group(), self.layout.dp)

    def clip(self, max_norm: float) -> None:
        # every gradient counted once over the stages: not the last stage's tied copy
        params = [p for p in self.model.parameters() if p.grad is not None]
        skip = self.model.lm_head.weight if (self.model.last and not self.model.first) else None
        group = self.mesh["pp"].get_group() if self.layout.pp > 1 else None
        norm = clip_grad_norm([(p.grad, group) for p in params if p is not skip], max_norm)
        if skip is not None:
            skip.grad.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
