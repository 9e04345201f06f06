"""Pick the tf.distribute strategy from the cluster environment.

| environment                                   | strategy                        |
|-----------------------------------------------|---------------------------------|
| no TF_CONFIG, at most one GPU                 | default (one device)            |
| no TF_CONFIG, several local GPUs              | MirroredStrategy                |
| TF_CONFIG with chief/worker tasks only        | MultiWorkerMirroredStrategy     |
| TF_CONFIG with `ps` tasks                     | ParameterServerStrategy         |

With ParameterServerStrategy the chief coordinates (`labkit.tf.ps`), and the `worker` and `ps`
tasks only run a TF server (`run_server_if_needed`) until the job ends.

Vertex writes the primary replica as `master` in TF_CONFIG, which TensorFlow rejects; the
TF_CONFIG handed to TensorFlow always says `chief` (see `normalized_tf_config`). When
`labkit.cluster` is available its `ClusterInfo.tf_config()` is the source of truth.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STRATEGY_KINDS = ("default", "mirrored", "multi_worker_mirrored", "parameter_server")


def normalized_tf_config(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """TF_CONFIG as TensorFlow accepts it (`master` -> `chief`, only cluster/task kept), or {}
    for a single process. Malformed input raises ValueError naming the field."""
    env = os.environ if env is None else env
    try:
        from labkit.cluster import from_env
    except ImportError:
        return _parse_tf_config(env)
    return from_env(env).tf_config()


def _parse_tf_config(env: Mapping[str, str]) -> dict[str, Any]:
    raw = env.get("TF_CONFIG")
    if not raw:
        return {}
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG: not valid JSON ({e})") from e
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError("TF_CONFIG.cluster is missing or empty")
    task = spec.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("type"), str):
        raise ValueError("TF_CONFIG.task.type is missing")
    rename = {"master": "chief"}
    out_cluster: dict[str, list[str]] = {}
    for kind, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ValueError(f"TF_CONFIG.cluster.{kind} must be a list of 'host:port' strings")
        if kind != "evaluator" and addresses:
            out_cluster[rename.get(kind, kind)] = list(addresses)
    task_type = rename.get(task["type"], task["type"])
    index = task.get("index", 0)
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"TF_CONFIG.task.index must be a non-negative integer (got {index!r})")
    if task_type != "evaluator" and index >= len(out_cluster.get(task_type, [])):
        raise ValueError(f"TF_CONFIG.task: {task_type}[{index}] is not in the cluster")
    return {"cluster": out_cluster, "task": {"type": task_type, "index": index}}


@dataclass(frozen=True)
class StrategyPlan:
    """Which strategy this process will build and why (printable before TF starts)."""

    kind: str
    tf_config: dict[str, Any] = field(default_factory=dict)
    num_workers: int = 1
    task_type: str = "single"
    task_index: int = 0

    @property
    def is_chief(self) -> bool:
        """Writes metrics and the real checkpoint; with MWMS the chief, else worker 0."""
        if self.task_type in ("single", "chief"):
            return True
        return self.task_type == "worker" and self.task_index == 0 and \
            "chief" not in self.tf_config.get("cluster", {})


def plan_strategy(env: Mapping[str, str] | None = None, *, local_gpus: int = 0) -> StrategyPlan:
    """Decide from TF_CONFIG (Vertex-style allowed) and the local GPU count."""
    tf_config = normalized_tf_config(env)
    if tf_config:
        cluster = tf_config["cluster"]
        task = tf_config["task"]
        workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
        kind = "parameter_server" if cluster.get("ps") else "multi_worker_mirrored"
        return StrategyPlan(kind, tf_config, workers, task["type"], task["index"])
    return StrategyPlan("mirrored" if local_gpus > 1 else "default")


def make_strategy(plan: StrategyPlan):
    """Build the strategy. Must run before any other TF op in the process (MWMS requirement)."""
    import tensorflow as tf

    if plan.kind in ("multi_worker_mirrored", "parameter_server"):
        # TensorFlow reads TF_CONFIG from the environment; hand it the normalized one.
        os.environ["TF_CONFIG"] = json.dumps(plan.tf_config)
    if plan.kind == "default":
        return tf.distribute.get_strategy()
    if plan.kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    if plan.kind == "multi_worker_mirrored":
        gpus = tf.config.get_visible_devices("GPU")
        impl = (tf.distribute.experimental.CommunicationImplementation.NCCL if gpus
                else tf.distribute.experimental.CommunicationImplementation.RING)
        options = tf.distribute.experimental.CommunicationOptions(implementation=impl)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(resolver)


def run_server_if_needed(plan: StrategyPlan) -> bool:
    """Parameter-server jobs: `ps` and `worker` tasks only serve the coordinator (the chief).
    Starts the server and blocks; returns False when this process should train itself."""
    if plan.kind != "parameter_server" or plan.task_type not in ("ps", "worker"):
        return False
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=plan.task_type,
                                  task_index=plan.task_index, protocol="grpc", start=True)
    server.join()
    return True
