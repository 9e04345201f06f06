"""Local multi-process DDP: `run_local(config, nproc)` starts `nproc` `labkit train` processes on
loopback (gloo on CPU), one node's processes as torchrun would start them (each with the
`ClusterInfo.torch_env()` of its local rank), one thread each by default so they do not fight
over cores. `launch_replicas` starts any command that way (`labkit.core.launcher` does the
starting, watching and stopping)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from labkit.core.cluster import free_ports, local_processes
from labkit.core.config import check_int
from labkit.core.launcher import GroupConfig, GroupResult, ProcessSpec, child_env, run_group
from labkit.core.metrics import MetricsLog
from labkit.core.train_config import (
    PREEMPTED_EXIT_CODE,
    TrainConfig,
    finished_replicas_log,
    metrics_file,
    stop_reason,
    to_argv,
)


def local_replica_envs(nproc: int, *, threads: int | None = 1, port: int | None = None,
                       cpu_only: bool = False) -> list[dict[str, str]]:
    """The environment of each of `nproc` local replicas (local rank order): this process's,
    without an enclosing job's cluster variables, plus the replica's torch variables, progress
    bars on rank 0 only, and `threads` OpenMP threads (None: torch's default). `cpu_only` hides
    the GPUs: CPU replicas on a GPU machine then make no CUDA context and no CUDA call (torch's
    PowerSGD hook, for one, synchronizes CUDA on CPU gradients when it sees a GPU)."""
    if port is None:
        (port,) = free_ports(1)
    envs = []
    for info in local_processes(nproc, port):
        env = child_env({**info.torch_env(), "LABKIT_NO_PROGRESS": "" if info.is_chief else "1"})
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if cpu_only:
            env["CUDA_VISIBLE_DEVICES"] = ""
        envs.append(env)
    return envs


def launch_replicas(argv: Sequence[str] | Callable[[int], Sequence[str]], nproc: int, *,
                    threads: int | None = 1, timeout_s: float | None = None,
                    ok_codes: tuple[int, ...] = (0,), what: str = "DDP replica") -> GroupResult:
    """Run `argv` (a command, or a function of the rank giving each replica's) as `nproc` local
    replicas and wait for all (no time limit unless `timeout_s` is given: then the replicas get
    SIGTERM, checkpoint and stop); a replica that fails takes the others down. Raises
    `labkit.core.launcher.LaunchError` (a RuntimeError) naming the rank ("<what> rank R of N")
    with its output when one fails or the run times out."""
    check_int("nproc", nproc, minimum=1)
    specs = [ProcessSpec(f"rank {rank}", argv(rank) if callable(argv) else argv, env)
             for rank, env in enumerate(local_replica_envs(nproc, threads=threads))]
    return run_group(specs, GroupConfig(timeout_s=timeout_s, ok_codes=ok_codes)).check(what)


def run_local(config: TrainConfig, nproc: int = 2, *, threads_per_process: int | None = 1,
              timeout_s: float | None = None) -> MetricsLog:
    """Run `config` as an `nproc`-replica DDP job on this machine and return rank 0's metrics.
    Raises `Preempted` when the replicas exited 143 (checkpointed: SIGTERM or Ctrl-C to this
    process, or `timeout_s` reached), RuntimeError naming the rank and showing its output when
    a replica failed."""
    check_int("nproc", nproc, minimum=1)
    with metrics_file(config, "labkit-ddp-") as config:
        envs = local_replica_envs(nproc, threads=threads_per_process, cpu_only=config.device == "cpu")
        specs = [ProcessSpec(f"rank {rank}", [sys.executable, "-m", "labkit", "train", *to_argv(config)], env)
                 for rank, env in enumerate(envs)]
        result = run_group(specs, GroupConfig(timeout_s=timeout_s, ok_codes=(0, PREEMPTED_EXIT_CODE)))
        # Past the timeout, replicas that all checkpointed (exit 143) stopped cleanly: resumable.
        if not (result.timed_out and all(c == PREEMPTED_EXIT_CODE for c in result.returncodes)):
            result.check("DDP replica")
        return finished_replicas_log(config.metrics_out, result.returncodes,
                                     stop_reason(result.signal, result.timed_out, timeout_s))
