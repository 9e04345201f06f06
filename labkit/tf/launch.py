"""Run a multi-worker TensorFlow job on this machine: one `labkit train --framework tf` process
per worker, each with the TF_CONFIG Vertex would give it, on free loopback ports.

This is how the course runs MultiWorkerMirroredStrategy without a cluster (and how CI tests it):
the processes, the gRPC collectives and the TF_CONFIG parsing are all real. `vertex_names=True`
writes the primary replica as `master`, as Vertex does, which labkit maps to `chief`.
Workers run on the CPU (GPUs hidden) unless `cpu_only=False`.

CLI: `labkit launch-tf --workers 2 -- --model cnn --steps 10 --metrics-out m.json`
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from labkit.core.cluster import free_ports
from labkit.core.config import check_bool, check_int
from labkit.core.metrics import MetricsLog
from labkit.core.train_config import (
    PREEMPTED_EXIT_CODE,
    TrainConfig,
    finished_replicas_log,
    to_argv,
)


@dataclass(frozen=True)
class LaunchConfig:
    """`num_workers` processes (the first is the chief); `train_args` are `labkit train` flags."""

    num_workers: int = 2
    train_args: tuple[str, ...] = ()
    # Parameter servers: with any, the job uses ParameterServerStrategy; the chief coordinates
    # and the workers and ps tasks serve until the chief is done (then they are stopped).
    num_ps: int = 0
    vertex_names: bool = False
    cpu_only: bool = True
    threads_per_worker: int = 1
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_int("num_workers", self.num_workers, minimum=1)
        check_int("num_ps", self.num_ps, minimum=0)
        if self.num_ps and self.num_workers < 2:
            raise ValueError("num_workers must be >= 2 with parameter servers (a chief that "
                             "coordinates and at least one worker that computes)")
        check_bool("vertex_names", self.vertex_names)
        check_bool("cpu_only", self.cpu_only)
        check_int("threads_per_worker", self.threads_per_worker, minimum=1)


@dataclass
class WorkerResult:
    task: str
    returncode: int
    output: str
    tf_config: dict = field(default_factory=dict)




def tf_configs(num_workers: int, *, num_ps: int = 0, vertex_names: bool = False,
               ports: list[int] | None = None) -> list[dict]:
    """One TF_CONFIG per task: a chief (or Vertex's `master`), `num_workers - 1` workers and
    `num_ps` parameter servers."""
    ports = ports or free_ports(num_workers + num_ps)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    chief = "master" if vertex_names else "chief"
    cluster = {chief: addresses[:1]}
    if num_workers > 1:
        cluster["worker"] = addresses[1:num_workers]
    if num_ps:
        cluster["ps"] = addresses[num_workers:num_workers + num_ps]
    tasks = [(chief, 0)] + [("worker", i) for i in range(num_workers - 1)] + \
        [("ps", i) for i in range(num_ps)]
    return [{"cluster": cluster, "task": {"type": t, "index": i}} for t, i in tasks]


def worker_env(tf_config: dict, config: LaunchConfig) -> dict[str, str]:
    env = dict(os.environ)
    env["TF_CONFIG"] = json.dumps(tf_config)
    threads = str(config.threads_per_worker)
    env.update(OMP_NUM_THREADS=threads, TF_NUM_INTRAOP_THREADS=threads)
    # The parameter-server coordinator dispatches remote steps on inter-op threads: one
    # thread deadlocks it. Synchronous workers are fine with one.
    env["TF_NUM_INTEROP_THREADS"] = threads if not config.num_ps else str(max(4, int(threads)))
    if config.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""  # TF must not grab a GPU torch may be using
    # Cluster variables of an enclosing job must not leak into the local one.
    for name in ("CLUSTER_SPEC", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        env.pop(name, None)
    # The children import labkit from where this process did.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def launch(config: LaunchConfig) -> list[WorkerResult]:
    """Start all workers, wait for all, return their exit codes and output (chief first).
    A worker that fails takes the others down (their collectives would hang otherwise)."""
    configs = tf_configs(config.num_workers, num_ps=config.num_ps,
                         vertex_names=config.vertex_names)
    cmd = [sys.executable, "-m", "labkit", "train", "--framework", "tf", *config.train_args]
    procs = []
    logs = []
    for tfc in configs:
        log = _tempfile()
        logs.append(log)
        procs.append(subprocess.Popen(cmd, env=worker_env(tfc, config), stdout=log,
                                      stderr=subprocess.STDOUT))
    deadline = time.monotonic() + config.timeout_s
    servers = set(range(1, len(procs))) if config.num_ps else set()  # serve until chief is done
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.returncode not in (None, 0)]
            chief_done = config.num_ps and procs[0].poll() is not None
            if failed or chief_done or time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                break
            time.sleep(0.2)
        for p in procs:
            p.wait()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    results = []
    for tfc, p, log in zip(configs, procs, logs, strict=True):
        log.seek(0)
        task = f"{tfc['task']['type']}:{tfc['task']['index']}"
        code = p.returncode
        if servers and procs.index(p) in servers and procs[0].returncode == 0:
            code = 0  # a server stopped because the job finished
        results.append(WorkerResult(task, code, log.read().decode(errors="replace"), tfc))
        log.close()
    return results


def run_local(config: TrainConfig, num_workers: int = 2, *, num_ps: int = 0,
              vertex_names: bool = False, threads_per_worker: int = 1,
              timeout_s: float = 600.0) -> MetricsLog:
    """Run `config` as a `num_workers`-worker MultiWorkerMirrored job on this machine and return
    the chief's metrics (the twin of `labkit.torch.launch.run_local`). Raises `Preempted` when
    the workers checkpointed and exited 143, RuntimeError showing the failing worker's output."""
    check_int("num_workers", num_workers, minimum=1)
    config = replace(config, framework="tf")
    if config.metrics_out is None:
        tmp = tempfile.mkdtemp(prefix="labkit-tf-")
        config = replace(config, metrics_out=str(Path(tmp) / "metrics.json"))
    results = launch(LaunchConfig(num_workers=num_workers, train_args=tuple(to_argv(config)),
                                  num_ps=num_ps, vertex_names=vertex_names, timeout_s=timeout_s,
                                  threads_per_worker=threads_per_worker))
    codes = [r.returncode for r in results]
    bad = [r for r in results if r.returncode not in (0, PREEMPTED_EXIT_CODE)]
    if bad:
        raise RuntimeError(f"TF worker {bad[0].task} of {num_workers} failed (exit codes {codes}):"
                           f"\n{bad[0].output[-3000:]}")
    return finished_replicas_log(config.metrics_out, codes)


def _tempfile():
    return tempfile.TemporaryFile()
