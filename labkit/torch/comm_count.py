"""Bytes this process sends through torch.distributed, counted from the collectives that run.

`CommCounter` is a `TorchDispatchMode`: every collective reaches the dispatcher as a `c10d` op
(`dist.all_reduce`, DDP communication hooks, ZeroRedundancyOptimizer's broadcasts, FSDP2's
all-gathers and reduce-scatters, pipelining's send/recv) or a functional `_c10d_functional` op
(DTensor redistributions: tensor parallelism). For each one it reads the tensors' bytes and the
group size N and books what this rank sends under the ring algorithms: all-reduce 2(N-1)/N of the
tensor, reduce-scatter (N-1)/N of its input, all-gather (N-1) times its input shard, broadcast
(N-1)/N of the tensor (the ring's average per rank), send the whole tensor, receive nothing. The
tensor bytes (payload) are kept per operation too, so a reader can check the model.

`StepComm` is what the trainer counts with: two steps of each run (counting slows a small step),
and for a pipeline the share of each step its stage sat idle.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.core.parallelism import pipeline_bubble

_c10d = torch.ops.c10d
_funcol = torch.ops._c10d_functional

# op -> (kind, index of the argument holding the tensor(s) whose bytes count)
_C10D_OPS = {
    # all-gathers count their input (this rank's shard): the second argument of the c10d ops
    _c10d.allreduce_.default: ("all_reduce", 0),
    _c10d.allreduce_coalesced_.default: ("all_reduce", 0),
    _c10d.broadcast_.default: ("broadcast", 0),
    _c10d._allgather_base_.default: ("all_gather", 1),
    _c10d.allgather_.default: ("all_gather", 1),
    _c10d.allgather_into_tensor_coalesced_.default: ("all_gather", 1),
    _c10d._reduce_scatter_base_.default: ("reduce_scatter", 1),
    _c10d.reduce_scatter_tensor_coalesced_.default: ("reduce_scatter", 1),
    _c10d.reduce_scatter_.default: ("reduce_scatter", 1),
    _c10d.send.default: ("send", 0),
    _c10d.recv_.default: ("recv", 0),
}
_FUNCOL_OPS = {
    _funcol.all_reduce.default: ("all_reduce", 0),
    _funcol.all_reduce_coalesced.default: ("all_reduce", 0),
    _funcol.all_gather_into_tensor.default: ("all_gather", 0),
    _funcol.all_gather_into_tensor_coalesced.default: ("all_gather", 0),
    _funcol.reduce_scatter_tensor.default: ("reduce_scatter", 0),
    _funcol.reduce_scatter_tensor_coalesced.default: ("reduce_scatter", 0),
    _funcol.broadcast.default: ("broadcast", 0),
}


def _tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _group_size(args, kwargs) -> int:
    """Size of the process group a c10d op runs on: its ProcessGroup reaches the dispatcher
    boxed as a ScriptObject (`ProcessGroup.unbox` opens it)."""
    for v in (*args, *kwargs.values()):
        if isinstance(v, dist.ProcessGroup):
            return v.size()
        if isinstance(v, torch.ScriptObject) and "ProcessGroup" in str(v._type()):
            return dist.ProcessGroup.unbox(v).size()
    return dist.get_world_size() if dist.is_initialized() else 1


def sent_bytes(kind: str, payload: int, n: int) -> float:
    """What one rank sends for one collective of `payload` tensor bytes in a group of `n`
    (ring algorithms; for all-gather `payload` is this rank's input shard)."""
    if n <= 1 and kind != "send":
        return 0.0
    return {"all_reduce": 2 * (n - 1) / n * payload, "reduce_scatter": (n - 1) / n * payload,
            "all_gather": (n - 1) * payload, "broadcast": (n - 1) / n * payload,
            "send": float(payload), "recv": 0.0}[kind]


@dataclass
class CommTally:
    """What a `CommCounter` saw: bytes sent by this rank (ring model), and per operation kind the
    number of calls and the tensor bytes they carried."""

    sent: float = 0.0
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    payload: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def as_dict(self) -> dict:
        return {"sent_bytes": self.sent, "calls": dict(self.calls), "payload_bytes": dict(self.payload)}


# Collectives that callbacks may start on another thread (a DDP hook's future chain: PowerSGD
# all-reduces its second factor when the first arrives, on the communication thread).
_OFF_THREAD = {"all_reduce": "all_reduce", "broadcast": "broadcast",
               "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


class CommCounter(TorchDispatchMode):
    """`with CommCounter() as c: ...` counts the collectives run inside: on this thread (and in
    the autograd backward it starts, which runs CPU work on the calling thread) through the
    dispatcher, and, while it is active, those that other threads start through
    `torch.distributed`'s functions (hook callbacks). `c.tally` holds the count."""

    def __init__(self) -> None:
        super().__init__()
        self.tally = CommTally()
        self._thread = None
        self._saved: dict[str, object] = {}

    def __enter__(self):
        self._thread = threading.get_ident()
        for name, kind in _OFF_THREAD.items():
            original = getattr(dist, name)
            self._saved[name] = original
            setattr(dist, name, self._off_thread(original, kind))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved.clear()
        return super().__exit__(*exc)

    def _off_thread(self, original, kind: str):
        def counted(*args, **kwargs):
            if threading.get_ident() != self._thread:
                tensor = args[1] if kind in ("all_gather", "reduce_scatter") else args[0]
                group = kwargs.get("group") or (args[2] if kind == "all_reduce" and len(args) > 2 else None)
                n = dist.get_world_size(group)
                payload = _tensor_bytes(tensor)
                self.tally.calls[kind] += 1
                self.tally.payload[kind] += payload
                self.tally.sent += sent_bytes(kind, payload, n)
            return original(*args, **kwargs)

        return counted

    def reset(self) -> CommTally:
        tally, self.tally = self.tally, CommTally()
        return tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        entry = _C10D_OPS.get(func) or _FUNCOL_OPS.get(func)
        if entry is not None:
            kind, index = entry
            payload = _tensor_bytes(args[index]) if len(args) > index else 0
            n = (_funcol_group_size(args) if func in _FUNCOL_OPS else _group_size(args, kwargs))
            self.tally.calls[kind] += 1
            self.tally.payload[kind] += payload
            self.tally.sent += sent_bytes(kind, payload, n)
        return func(*args, **kwargs)


def _funcol_group_size(args) -> int:
    # functional collectives: (..., group_size, group_name) or (..., reduce_op, group_name)
    from torch.distributed.distributed_c10d import _resolve_process_group

    for v in reversed(args):
        if isinstance(v, str):
            try:
                return _resolve_process_group(v).size()
            except (ValueError, RuntimeError, KeyError):
                continue
    return dist.get_world_size() if dist.is_initialized() else 1


class StepComm:
    """Bytes this rank sends per step (its collectives counted while the step runs and its loss
    is agreed), and for a pipeline the share of each step's schedule its stage sat idle.

    Counting sees every operation of the step in Python (a dispatch mode), which slows a small
    CPU step by a third or more: only steps `counted` (indices within this run, default the
    third and fourth, past warm-ups such as PowerSGD's) are counted, so the others keep their
    true step time."""

    def __init__(self, c: Any, run_steps: int, start: int = 0):
        # `c`: the run's `labkit.torch.engine.Components` (its info, strategy, layout, held bytes)
        self.c = c
        self.counter = CommCounter() if c.info.distributed else None
        self.counted = {min(2, run_steps - 1), min(3, run_steps - 1)}
        self.first_step = start
        self.calls = 0
        self.sent: list[float] = []
        self.ops: dict | None = None
        self.bubbles: list[float] = []
        self._pipeline = c.strategy if hasattr(c.strategy, "busy_s") else None
        self._before = (0.0, 0.0)

    def counting(self):
        """The context a step's collectives run in (the counter, on counted steps)."""
        counted = self.counter is not None and self.calls in self.counted
        return self.counter if counted else contextlib.nullcontext()

    def start(self):
        if self._pipeline is not None:
            self._before = (self._pipeline.busy_s, self._pipeline.schedule_s)
        return self.counting()

    def finish(self) -> None:
        if self.counter is not None and self.calls in self.counted:
            tally = self.counter.reset()
            self.sent.append(tally.sent)
            self.ops = tally.as_dict()
        self.calls += 1
        if self._pipeline is not None:
            busy = self._pipeline.busy_s - self._before[0]
            ran = self._pipeline.schedule_s - self._before[1]
            self.bubbles.append(1.0 - busy / ran if ran > 0 else 0.0)

    def run_info(self) -> dict:
        """The metrics `run` entries: rank 0's, and every rank's (gathered: all ranks call this)."""
        import statistics

        c = self.c
        if not c.info.distributed:
            return {}
        mine = {"memory": c.held, "comm_bytes_per_step": statistics.median(self.sent) if self.sent else None,
                "counted": sorted(self.first_step + i for i in self.counted if 0 <= i < self.calls),
                "comm_ops_last_step": self.ops,
                "bubble": statistics.median(self.bubbles[1:] or self.bubbles) if self.bubbles else None}
        everyone: list = [None] * c.info.world_size
        dist.all_gather_object(everyone, mine)
        out = {"memory_per_rank": mine["memory"], "comm_bytes_per_step": mine["comm_bytes_per_step"],
               "comm_ops_last_step": mine["comm_ops_last_step"],
               "comm_counted_steps": mine["counted"],
               "memory_by_rank": [e["memory"] for e in everyone],
               "comm_bytes_by_rank": [e["comm_bytes_per_step"] for e in everyone]}
        if c.layout.mode == "pp":
            out["pipeline_bubble"] = {"measured_by_rank": [e["bubble"] for e in everyone],
                                      "theory": pipeline_bubble(c.layout.pp, c.layout.microbatches)}
        return out
