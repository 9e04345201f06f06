"""One all-reduce per DDP step: the replicas' loss and "stop" flag ride on the gradients.

Every replica must log the same (mean) loss and stop at the same step when one of them is
preempted, so they must exchange two numbers per step. A collective of their own costs a full
round trip every step: about 2 ms with gloo on a 2-core machine, a tenth of a small model's
step. Instead, `StepAgreement.hook`, a DDP communication hook, appends the two numbers to the
last gradient bucket, which is all-reduced anyway. The gradients are reduced exactly as by DDP's
default hook (divided by the world size, then summed).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class StepAgreement:
    """`offer(loss, stop)` before the backward pass that all-reduces the gradients; `take()`
    after it returns (mean loss over replicas, whether any replica asked to stop), or None when
    nothing was exchanged (no gradient bucket, or non-fp32 gradients: the caller then agrees
    with a collective of its own)."""

    def __init__(self) -> None:
        self._offer: torch.Tensor | None = None
        self._result: torch.Tensor | None = None
        self._world = 1

    def offer(self, loss: torch.Tensor, stop: bool) -> None:
        self._offer = torch.stack([loss.detach().float().reshape(()),
                                   torch.tensor(float(stop), device=loss.device)])
        self._result = None

    def take(self) -> tuple[float, bool] | None:
        result, self._result, self._offer = self._result, None, None
        if result is None:
            return None
        loss, stop = result.tolist()
        return loss / self._world, stop > 0

    def hook(self, process_group, bucket):
        """The DDP communication hook (`ddp.register_comm_hook(None, agreement.hook)`). Not
        annotated: DDP compares the annotations with its own types, and this module's are strings."""
        group = process_group if process_group is not None else dist.group.WORLD
        self._world = dist.get_world_size(group)
        grads = bucket.buffer()
        extra = self._offer if bucket.is_last() and grads.dtype == torch.float32 else None
        if extra is None:
            fut = dist.all_reduce(grads.div_(self._world), group=group, async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])
        self._offer = None
        n = grads.numel()
        payload = torch.cat([grads.div_(self._world).reshape(-1), extra.to(grads.device)])
        fut = dist.all_reduce(payload, group=group, async_op=True).get_future()

        def unpack(f: torch.futures.Future) -> torch.Tensor:
            out = f.value()[0]
            self._result = out[n:]
            return out[:n].view_as(grads)

        return fut.then(unpack)

    def around(self, inner):
        """A hook that reduces the gradients with `inner` (a compression hook, called with the
        state registered beside this hook) and, on the last bucket, all-reduces the offered loss
        and stop flag in fp32 once the inner hook's collectives are done: a compressed bucket
        cannot carry them exactly, and a hook such as PowerSGD starts its later collectives from
        callbacks, so only a collective started after them is issued in the same order on
        every replica."""

        def hook(state, bucket):
            fut = inner(state, bucket)
            extra = self._offer if bucket.is_last() else None
            if extra is None:
                return fut
            self._offer = None
            group = getattr(state, "process_group", None) or dist.group.WORLD
            self._world = dist.get_world_size(group)

            def agree(f: torch.futures.Future) -> torch.Tensor:
                grads = f.value()
                dist.all_reduce(extra, group=group)
                self._result = extra
                return grads

            return fut.then(agree)

        return hook
