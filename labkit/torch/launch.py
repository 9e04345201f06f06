"""Local multi-process DDP: `run_local(config, nproc)` starts `nproc` `labkit train` processes on
loopback (gloo on CPU), each with the torchrun-style variables RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT, one thread each by default so they do not fight over cores."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from labkit.core.cluster import free_ports
from labkit.core.config import check_int
from labkit.core.metrics import MetricsLog
from labkit.core.train_config import (
    PREEMPTED_EXIT_CODE,
    TrainConfig,
    finished_replicas_log,
    to_argv,
)


def replica_env(rank: int, nproc: int, port: int, threads: int | None,
                base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LABKIT_NO_PROGRESS="" if rank == 0 else "1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def run_local(config: TrainConfig, nproc: int = 2, *, threads_per_process: int | None = 1,
              timeout_s: float = 600.0) -> MetricsLog:
    """Run `config` as an `nproc`-replica DDP job on this machine and return rank 0's metrics.
    Raises `Preempted` when the replicas exited 143 (checkpointed), RuntimeError naming the rank
    and showing its output when a replica failed."""
    check_int("nproc", nproc, minimum=1)
    tmp = None
    if config.metrics_out is None:
        tmp = tempfile.mkdtemp(prefix="labkit-ddp-")
        config = replace(config, metrics_out=str(Path(tmp) / "metrics.json"))
    (port,) = free_ports(1)
    cmd = [sys.executable, "-m", "labkit", "train", *to_argv(config)]
    procs = []
    for rank in range(nproc):
        log = tempfile.TemporaryFile()
        env = replica_env(rank, nproc, port, threads_per_process)
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + timeout_s
    failed = None
    while any(p.poll() is None for p, _ in procs):
        if time.monotonic() > deadline:
            failed = failed or "timeout"
            break
        bad = [(r, p.returncode) for r, (p, _) in enumerate(procs)
               if p.returncode not in (None, 0, PREEMPTED_EXIT_CODE)]
        if bad:
            failed = bad[0]
            break
        time.sleep(0.05)
    if failed:
        for p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p, _ in procs]
    outputs = []
    for _, log in procs:
        log.seek(0)
        outputs.append(log.read().decode(errors="replace"))
        log.close()
    if failed or any(code not in (0, PREEMPTED_EXIT_CODE) for code in codes):
        rank = failed[0] if isinstance(failed, tuple) else next(
            (r for r, code in enumerate(codes) if code != 0), 0)
        raise RuntimeError(f"DDP replica rank {rank} of {nproc} failed (exit codes {codes}"
                           f"{', timed out' if failed == 'timeout' else ''}):\n{outputs[rank][-3000:]}")
    return finished_replicas_log(config.metrics_out, codes)
