"""Process-group set-up from torchrun-style environment variables.

RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, as torchrun, `labkit.torch.launch`
and Vertex AI (one process per node: its per-node RANK/WORLD_SIZE are then the global ones) set
them. gloo on CPU, nccl on CUDA.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from labkit.core.cluster import ClusterInfo, from_env

_joined_process_group = False  # set by `init`: this process has been a replica


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def info_from_env(env: Mapping[str, str] | None = None) -> DistInfo:
    env = os.environ if env is None else env
    world = _env_int(env, "WORLD_SIZE", 1)
    rank = _env_int(env, "RANK", 0)
    local = _env_int(env, "LOCAL_RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must lie in [0, WORLD_SIZE={world})")
    return DistInfo(rank, world, local)


def init(device_type: str, info: DistInfo | None = None) -> DistInfo:
    """Join the process group when WORLD_SIZE > 1 (idempotent); returns the rank layout."""
    info = info or info_from_env()
    if info.distributed and not dist.is_initialized():
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(var):
                raise ValueError(f"WORLD_SIZE={info.world_size} but environment variable {var} is not set")
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend, rank=info.rank, world_size=info.world_size)
    if info.distributed:
        global _joined_process_group
        _joined_process_group = True
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

    After DDP, torch keeps the gloo worker threads alive past `destroy_process_group`. One that
    drops its last reference to a finished collective while Python is finalizing must take the
    GIL to free it, which a finalizing interpreter refuses by ending the thread, and the process
    aborts ("terminate called without an active exception", exit -6) after a successful run.
    Called once the command's work is done and written: output is flushed, then the process
    leaves. Does nothing in a process that never joined a group."""
    if not _joined_process_group:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def init_process_group(info: ClusterInfo | None = None, *, backend: str = "auto",
                       init_method: str = "env", timeout_s: float = 300.0):
    """Join torch.distributed for `info` (default: `from_env()`); returns the backend used, or
    None for a single process. `init_method="env"` uses env:// with the variables set from
    `info`; `"tcp"` passes ``tcp://MASTER_ADDR:MASTER_PORT`` and the ranks explicitly."""
    import datetime

    info = info or from_env()
    if not info.is_training:
        raise ValueError(f"role: a {info.role} replica is not a training rank")
    if info.global_world_size == 1:
        return None
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    rank, world = info.global_rank, info.global_world_size
    if init_method == "env":
        os.environ.update(info.torch_env())
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    elif init_method == "tcp":
        url = f"tcp://{info.master_addr}:{info.master_port}"
        dist.init_process_group(backend, init_method=url, rank=rank, world_size=world, timeout=timeout)
    else:
        raise ValueError(f"init_method must be 'env' or 'tcp' (got {init_method!r})")
    return backend
