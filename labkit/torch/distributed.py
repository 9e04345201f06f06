"""torch.distributed for this process: its rank layout and the one way to join a process group.

`DistInfo` is the torch engine's view of `labkit.core.cluster.ClusterInfo` (process-level: the
global rank and world size, torchrun's, or Vertex's one process per node); `info_from_env` reads
it through `from_env`, the one reader of the cluster variables. `init_process_group` joins
torch.distributed for a `ClusterInfo` (gloo on CPU, nccl on CUDA); `init` is the engine's
idempotent call of it. `exit_if_replica` ends a process that joined a group.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from labkit.core import placement
from labkit.core.cluster import ClusterInfo, from_env

_joined_process_group = False  # set by `init_process_group`: this process has been a replica


@dataclass(frozen=True)
class DistInfo:
    """This process's place among the training processes: `rank` and `world_size` count
    processes (global), `local_rank` is its index on the node (its GPU) among the
    `local_world_size` processes there. `cluster` is the `ClusterInfo` it was derived from (None
    when built by hand)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    cluster: ClusterInfo | None = field(default=None, compare=False, repr=False)
    # processes of this run on this machine (they share its GPUs); derived from the environment
    # like `cluster`, so not part of what makes two DistInfo the same place
    local_world_size: int = field(default=1, compare=False)

    @classmethod
    def of(cls, info: ClusterInfo) -> DistInfo:
        if info.global_rank is None:
            raise ValueError(f"role: a {info.role} replica is not a training rank")
        return cls(info.global_rank, info.global_world_size, info.local_rank, info,
                   info.local_world_size)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def info_from_env(env: Mapping[str, str] | None = None) -> DistInfo:
    """`DistInfo` of `from_env(env)` (default `os.environ`); ValueError naming the variable when
    the environment is malformed or contradicts itself."""
    return DistInfo.of(from_env(env))


def init_process_group(info: ClusterInfo | None = None, *, backend: str = "auto",
                       init_method: str = "env", timeout_s: float | None = 300.0):
    """Join torch.distributed for `info` (default: `from_env()`); returns the backend used, or
    None for a single process. `backend="auto"` is nccl when this machine has a GPU for each of its
    processes, else gloo (`labkit.core.placement`).
    `init_method="env"` uses env:// with the variables set from `info`; `"tcp"` passes
    ``tcp://MASTER_ADDR:MASTER_PORT`` and the ranks explicitly. `timeout_s=None` keeps
    torch's default collective timeout."""
    info = info or from_env()
    if not info.is_training:
        raise ValueError(f"role: a {info.role} replica is not a training rank")
    if info.global_world_size == 1:
        return None
    if init_method not in ("env", "tcp"):
        raise ValueError(f"init_method must be 'env' or 'tcp' (got {init_method!r})")
    if backend == "auto":  # the placement rule: NCCL only with a GPU for each process here
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        backend = placement.place(info.local_world_size, gpus).backend or "gloo"
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    if init_method == "env":
        os.environ.update(info.torch_env())
        dist.init_process_group(backend, init_method="env://", **timeout)
    else:
        url = f"tcp://{info.master_addr}:{info.master_port}"
        dist.init_process_group(backend, init_method=url, rank=info.global_rank,
                                world_size=info.global_world_size, **timeout)
    global _joined_process_group
    _joined_process_group = True
    return backend


def init(device_type: str, info: DistInfo | None = None) -> DistInfo:
    """Join the process group when there are several processes (idempotent), with nccl for
    `device_type` "cuda", else gloo; returns the rank layout."""
    info = info or info_from_env()
    if info.distributed and not dist.is_initialized():
        cluster = info.cluster or from_env()
        if (cluster.global_rank, cluster.global_world_size) != (info.rank, info.world_size):
            raise ValueError(f"rank {info.rank} of {info.world_size} does not match this process's "
                             f"environment (rank {cluster.global_rank} of {cluster.global_world_size})")
        if cluster.source == "torch":
            # torchrun sets both; without them env:// would guess this machine's loopback.
            for var in ("MASTER_ADDR", "MASTER_PORT"):
                if not os.environ.get(var):
                    raise ValueError(f"WORLD_SIZE={info.world_size} but environment variable "
                                     f"{var} is not set")
        init_process_group(cluster, backend="nccl" if device_type == "cuda" else "gloo",
                           timeout_s=None)
    return info


def shutdown(*, clean: bool = True) -> None:
    """Leave the process group. On a clean exit every rank first meets at a barrier: a rank
    that tears gloo down while a peer still talks to it can abort the process."""
    if dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def exit_if_replica(code: int) -> None:
    """End a process that joined a process group with `code`, without finalizing Python.

    After DDP or FSDP, torch keeps the gloo worker threads alive past `destroy_process_group`.
    One that drops its last reference to a finished collective while Python is finalizing must
    take the GIL to free it, which a finalizing interpreter refuses by ending the thread, and
    the process aborts ("terminate called without an active exception", exit -6) after a
    successful run. Called once the command's work is done and written: output is flushed,
    then the process leaves. Does nothing in a process that never joined a group."""
    if not _joined_process_group:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
