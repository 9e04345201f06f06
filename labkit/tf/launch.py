"""Run a multi-worker TensorFlow job on this machine: one `labkit train --framework tf` process
per task, each with the TF_CONFIG Vertex would give it (`ClusterInfo.tf_config()` of a loopback
cluster), on free loopback ports.

This is how the course runs MultiWorkerMirroredStrategy without a cluster (and how CI tests it):
the processes, the gRPC collectives and the TF_CONFIG parsing are all real. `vertex_names=True`
writes the primary replica as `master`, as Vertex does, which labkit maps to `chief`.
Workers run on the CPU (GPUs hidden) unless `cpu_only=False`. `labkit.core.launcher` starts,
watches and stops the processes.

CLI: `labkit launch-tf --workers 2 -- --model cnn --steps 10 --metrics-out m.json`
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace

from labkit.core.cluster import local_tf_cluster
from labkit.core.config import check_bool, check_float, check_int
from labkit.core.launcher import (
    GroupConfig,
    GroupResult,
    ProcessResult,
    ProcessSpec,
    child_env,
    run_group,
)
from labkit.core.metrics import MetricsLog
from labkit.core.train_config import (
    PREEMPTED_EXIT_CODE,
    TrainConfig,
    finished_replicas_log,
    metrics_file,
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
    timeout_s: float | None = None  # no limit: training may run for hours

    def __post_init__(self) -> None:
        check_int("num_workers", self.num_workers, minimum=1)
        check_int("num_ps", self.num_ps, minimum=0)
        if self.num_ps and self.num_workers < 2:
            raise ValueError("num_workers must be >= 2 with parameter servers (a chief that "
                             "coordinates and at least one worker that computes)")
        check_bool("vertex_names", self.vertex_names)
        check_bool("cpu_only", self.cpu_only)
        check_int("threads_per_worker", self.threads_per_worker, minimum=1)
        check_float("timeout_s", self.timeout_s, minimum=0.0, allow_none=True)


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
    primary = "master" if vertex_names else "chief"
    return [info.tf_config(primary_name=primary)
            for info in local_tf_cluster(num_workers, num_ps, ports=ports)]


def worker_env(tf_config: dict, config: LaunchConfig) -> dict[str, str]:
    threads = str(config.threads_per_worker)
    env = child_env({"TF_CONFIG": json.dumps(tf_config), "OMP_NUM_THREADS": threads,
                     "TF_NUM_INTRAOP_THREADS": threads})
    # The parameter-server coordinator dispatches remote steps on inter-op threads: one
    # thread deadlocks it. Synchronous workers are fine with one.
    env["TF_NUM_INTEROP_THREADS"] = threads if not config.num_ps else str(max(4, int(threads)))
    if config.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""  # TF must not grab a GPU torch may be using
    return env


def _run(config: LaunchConfig) -> tuple[GroupResult, list[dict]]:
    configs = tf_configs(config.num_workers, num_ps=config.num_ps, vertex_names=config.vertex_names)
    cmd = [sys.executable, "-m", "labkit", "train", "--framework", "tf", *config.train_args]
    specs = [ProcessSpec(f"{tfc['task']['type']}:{tfc['task']['index']}", cmd, worker_env(tfc, config),
                         server=bool(config.num_ps) and i > 0)
             for i, tfc in enumerate(configs)]
    return run_group(specs, GroupConfig(timeout_s=config.timeout_s,
                                        ok_codes=(0, PREEMPTED_EXIT_CODE))), configs


def _code(result: ProcessResult) -> int:
    return 0 if result.ended_by == "stopped" else result.returncode  # a server, done serving


def launch(config: LaunchConfig) -> list[WorkerResult]:
    """Start all tasks, wait for all, return their exit codes and output (chief first).
    A task that fails takes the others down (their collectives would hang otherwise). With
    parameter servers, the workers and ps tasks only serve: they are stopped once the chief has
    finished, and then count as exit 0."""
    group, configs = _run(config)
    return [WorkerResult(r.name, _code(r), r.output, tfc)
            for r, tfc in zip(group.results, configs, strict=True)]


def run_local(config: TrainConfig, num_workers: int = 2, *, num_ps: int = 0,
              vertex_names: bool = False, threads_per_worker: int = 1,
              timeout_s: float | None = None) -> MetricsLog:
    """Run `config` as a `num_workers`-worker MultiWorkerMirrored job on this machine and return
    the chief's metrics (the twin of `labkit.torch.launch.run_local`). Raises `Preempted` when
    the workers checkpointed and exited 143, RuntimeError showing the failing worker's output."""
    check_int("num_workers", num_workers, minimum=1)
    config = replace(config, framework="tf")
    with metrics_file(config, "labkit-tf-") as config:
        group, _ = _run(LaunchConfig(num_workers=num_workers, train_args=tuple(to_argv(config)),
                                     num_ps=num_ps, vertex_names=vertex_names, timeout_s=timeout_s,
                                     threads_per_worker=threads_per_worker))
        group.check("TF worker")
        return finished_replicas_log(config.metrics_out, [_code(r) for r in group.results])
