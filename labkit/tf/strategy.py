"""Pick the tf.distribute strategy from the cluster environment.

| environment                                   | strategy                        |
|-----------------------------------------------|---------------------------------|
| a single node, at most one GPU                | default (one device)            |
| a single node, several local GPUs             | MirroredStrategy                |
| a cluster with chief/worker tasks only        | MultiWorkerMirroredStrategy     |
| a cluster with `ps` tasks                     | ParameterServerStrategy         |

With ParameterServerStrategy the chief coordinates (`labkit.tf.ps`), and the `worker` and `ps`
tasks only run a TF server (`run_server_if_needed`) until the job ends.

The plan is a view of `labkit.core.cluster.ClusterInfo` (`from_env` reads CLUSTER_SPEC,
TF_CONFIG and the torch variables). Vertex writes the primary replica as `master` in TF_CONFIG,
which TensorFlow rejects: the TF_CONFIG handed to TensorFlow is `ClusterInfo.tf_config()`, which
always says `chief`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from labkit.core.cluster import ClusterInfo, from_env


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


def plan_for(info: ClusterInfo, *, local_gpus: int = 0) -> StrategyPlan:
    """The strategy for `info` and this node's GPU count."""
    tf_config = info.tf_config()
    if tf_config:
        kind = "parameter_server" if tf_config["cluster"].get("ps") else "multi_worker_mirrored"
        return StrategyPlan(kind, tf_config, info.world_size, info.role, info.index)
    if info.world_size > 1:
        raise ValueError(f"{info.source}: {info.world_size} training nodes, but TensorFlow needs "
                         "TF_CONFIG or CLUSTER_SPEC to find them (WORLD_SIZE / RANK are torch's)")
    return StrategyPlan("mirrored" if local_gpus > 1 else "default")


def plan_strategy(env: Mapping[str, str] | None = None, *, local_gpus: int = 0) -> StrategyPlan:
    """The plan for this process's environment (`env`, default `os.environ`; Vertex-style
    CLUSTER_SPEC or TF_CONFIG allowed) and the local GPU count."""
    return plan_for(from_env(env), local_gpus=local_gpus)


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
    """The tf.distribute strategy for `info` (default: `from_env()`), as `plan_for` decides with
    this machine's GPUs. Create it before any other TensorFlow op, as TensorFlow requires."""
    import tensorflow as tf

    info = info or from_env()
    return make_strategy(plan_for(info, local_gpus=len(tf.config.list_physical_devices("GPU"))))
