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
TF_CONFIG handed to TensorFlow always says `chief`: `normalized_tf_config` is
`labkit.core.cluster.ClusterInfo.tf_config()`, the one reading of the cluster environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit.core.cluster import ClusterInfo, from_env

STRATEGY_KINDS = ("default", "mirrored", "multi_worker_mirrored", "parameter_server")


def normalized_tf_config(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """TF_CONFIG as TensorFlow accepts it (`master` -> `chief`), derived from this process's
    `ClusterInfo`; {} for a single process. Malformed input raises ValueError naming the field."""
    return from_env(env).tf_config()


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


def tf_strategy(info: ClusterInfo | None = None):
    """The tf.distribute strategy for `info`: MultiWorkerMirroredStrategy across nodes (TF_CONFIG
    rewritten so TensorFlow accepts it), MirroredStrategy for several local GPUs, else the
    default strategy. Create it before any other TensorFlow op, as TensorFlow requires."""
    import tensorflow as tf

    info = info or from_env()
    if info.world_size > 1:
        os.environ["TF_CONFIG"] = json.dumps(info.tf_config())
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()
