"""Where this process sits in a (Vertex AI) training cluster, read from its environment.

Vertex gives every replica of a custom job the same three descriptions of the cluster:

* ``CLUSTER_SPEC``: ``{"cluster": {"workerpool0": [...], "workerpool1": [...], ...},
  "task": {"type": "workerpool1", "index": 0, "trial": ...}, "environment": "cloud", "job": ...}``.
  Pool 0 is the primary replica (exactly one), pool 1 the workers, pool 2 parameter servers or
  a reduction server, pool 3 evaluators.
* ``TF_CONFIG`` (multi-replica jobs only): the same cluster with TensorFlow's names (``chief``
  or ``master``, ``worker``, ``ps``, ``evaluator``).
* The PyTorch variables ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``, counted
  in nodes (``WORLD_SIZE`` is the number of training nodes, not processes).

`from_env` reads them (CLUSTER_SPEC first, then TF_CONFIG, then the torch variables; none at all
means a single node) into one `ClusterInfo`. From it `tf_config()` writes a TF_CONFIG that
TensorFlow accepts (``master`` renamed ``chief``); `labkit.torch.distributed.init_process_group`
and `labkit.tf.strategy.tf_strategy` build on it. Anything malformed raises
`ValueError` naming the offending field, e.g. ``CLUSTER_SPEC.task.index``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("chief", "worker", "ps", "evaluator", "reduction_server", "single")
TRAINING_ROLES = ("chief", "worker", "single")
# Vertex's pool index -> role. Pool 2 is "ps" unless the job runs a reduction server there,
# which a replica cannot see from CLUSTER_SPEC alone: the env var below says so.
POOL_ROLES = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
              "workerpool3": "evaluator"}
POOL2_ROLE_ENV = "LABKIT_WORKERPOOL2_ROLE"
DEFAULT_MASTER_PORT = 29500
_TF_TYPES = ("chief", "master", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class ClusterInfo:
    """This replica's place in the cluster.

    `rank` is the node rank among training nodes (workerpool0 -> 0, workerpool1[i] -> 1+i) and
    `world_size` the number of training nodes; both count nodes, not processes. Parameter-server,
    reduction-server and evaluator replicas are not training ranks: their `rank` is None.
    `cluster` maps TensorFlow task types (chief, worker, ps, evaluator) to ``host:port`` lists.
    """

    role: str = "single"
    index: int = 0
    rank: int | None = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT
    cluster: dict[str, list[str]] = field(default_factory=dict)
    source: str = "none"  # which variable described the cluster: CLUSTER_SPEC, TF_CONFIG, torch, none
    trial: str | None = None
    local_rank: int = 0
    local_world_size: int = 1

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES} (got {self.role!r})")

    @property
    def is_chief(self) -> bool:
        """The replica that writes checkpoints, metrics and the exported model."""
        return self.rank == 0 and self.role in TRAINING_ROLES

    @property
    def is_training(self) -> bool:
        return self.role in TRAINING_ROLES

    @property
    def is_distributed(self) -> bool:
        return self.world_size * self.local_world_size > 1

    @property
    def global_rank(self) -> int | None:
        """Process rank with several processes (GPUs) per node: RANK x gpus + local_rank."""
        if self.rank is None:
            return None
        return self.rank * self.local_world_size + self.local_rank

    @property
    def global_world_size(self) -> int:
        return self.world_size * self.local_world_size

    def tf_config(self) -> dict[str, Any]:
        """A TF_CONFIG dict TensorFlow accepts: ``{"cluster": ..., "task": {"type", "index"}}``
        with ``chief`` (never ``master``). Empty for a single node (TensorFlow's default)."""
        if self.role == "single" or not self.cluster:
            return {}
        if self.role == "reduction_server":
            raise ValueError("role: a reduction-server replica runs Google's reduction server "
                             "image, not TensorFlow, so it has no TF_CONFIG")
        # The evaluator is outside the training cluster: TF expects it only as the task type.
        cluster = {k: list(v) for k, v in self.cluster.items() if k != "evaluator" and v}
        return {"cluster": cluster, "task": {"type": self.role, "index": self.index}}

    def torch_env(self) -> dict[str, str]:
        """The torch.distributed env:// variables for this node (process rank with local_rank)."""
        return {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
                "WORLD_SIZE": str(self.global_world_size), "RANK": str(self.global_rank or 0)}


# ---------------------------------------------------------------- parsing helpers

def _json(env: Mapping[str, str], name: str) -> dict[str, Any]:
    try:
        value = json.loads(env[name])
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a JSON object (got {type(value).__name__})")
    return value


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    try:
        return int(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be an integer (got {value!r})") from e


def _addresses(value: Any, name: str) -> list[str]:
    # Vertex writes skipped pools as absent; tolerate null / empty list too.
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ValueError(f"{name} must be a list of 'host:port' strings (got {value!r})")
    return list(value)


def _host_port(address: str, name: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{name}: address {address!r} is not 'host:port'")
    return host, _int(port, f"{name} port")


def _task(spec: dict[str, Any], var: str, cluster: dict[str, list[str]]) -> tuple[str, int]:
    task = spec.get("task")
    if not isinstance(task, dict):
        raise ValueError(f"{var}.task is missing or not an object")
    task_type = task.get("type")
    if not isinstance(task_type, str) or task_type not in cluster or not cluster[task_type]:
        known = ", ".join(k for k, v in cluster.items() if v)
        raise ValueError(f"{var}.task.type {task_type!r} is not a pool of {var}.cluster ({known})")
    index = _int(task.get("index", 0), f"{var}.task.index")
    if not 0 <= index < len(cluster[task_type]):
        raise ValueError(f"{var}.task.index {index} is out of range: {var}.cluster.{task_type} "
                         f"has {len(cluster[task_type])} replica(s)")
    return task_type, index


def _master(env: Mapping[str, str], chief_address: str, var: str) -> tuple[str, int]:
    host, port = _host_port(chief_address, var)
    # Vertex also sets MASTER_ADDR / MASTER_PORT for PyTorch; they win over the pool address.
    addr = env.get("MASTER_ADDR") or host
    if env.get("MASTER_PORT"):
        port = _int(env["MASTER_PORT"], "MASTER_PORT")
    return addr, port


def _local(env: Mapping[str, str]) -> tuple[int, int]:
    local_rank = _int(env.get("LOCAL_RANK", 0), "LOCAL_RANK")
    local_world = _int(env.get("LOCAL_WORLD_SIZE", 1), "LOCAL_WORLD_SIZE")
    if local_world < 1 or not 0 <= local_rank < local_world:
        raise ValueError(f"LOCAL_RANK {local_rank} is out of range for LOCAL_WORLD_SIZE {local_world}")
    return local_rank, local_world


# ---------------------------------------------------------------- the three sources

def _from_cluster_spec(env: Mapping[str, str]) -> ClusterInfo:
    var = "CLUSTER_SPEC"
    spec = _json(env, var)
    raw = spec.get("cluster")
    if not isinstance(raw, dict):
        raise ValueError(f"{var}.cluster is missing or not an object")
    pools = {name: _addresses(addrs, f"{var}.cluster.{name}") for name, addrs in raw.items()}
    unknown = sorted(set(pools) - set(POOL_ROLES))
    if unknown:
        raise ValueError(f"{var}.cluster has unknown pool(s) {unknown}; Vertex pools are "
                         "workerpool0..workerpool3")
    if not pools.get("workerpool0"):
        raise ValueError(f"{var}.cluster.workerpool0 is missing: the primary pool must exist")
    if len(pools["workerpool0"]) != 1:
        raise ValueError(f"{var}.cluster.workerpool0 must have exactly one replica "
                         f"(got {len(pools['workerpool0'])})")
    pool, index = _task(spec, var, pools)
    pool2 = env.get(POOL2_ROLE_ENV, "ps")
    if pool2 not in ("ps", "reduction_server"):
        raise ValueError(f"{POOL2_ROLE_ENV} must be 'ps' or 'reduction_server' (got {pool2!r})")
    role = pool2 if pool == "workerpool2" else POOL_ROLES[pool]
    rank = {"workerpool0": 0, "workerpool1": 1 + index}.get(pool)
    cluster = {"chief": pools["workerpool0"], "worker": pools.get("workerpool1", [])}
    if pools.get("workerpool2") and pool2 == "ps":
        cluster["ps"] = pools["workerpool2"]
    if pools.get("workerpool3"):
        cluster["evaluator"] = pools["workerpool3"]
    cluster = {k: v for k, v in cluster.items() if v}
    addr, port = _master(env, pools["workerpool0"][0], f"{var}.cluster.workerpool0")
    task = spec.get("task") or {}
    trial = task.get("trial") or None
    local_rank, local_world = _local(env)
    return ClusterInfo(role, index, rank, 1 + len(pools.get("workerpool1", [])), addr, port,
                       cluster, var, trial, local_rank, local_world)


def _from_tf_config(env: Mapping[str, str]) -> ClusterInfo:
    var = "TF_CONFIG"
    spec = _json(env, var)
    raw = spec.get("cluster")
    if not isinstance(raw, dict):
        raise ValueError(f"{var}.cluster is missing or not an object")
    unknown = sorted(set(raw) - set(_TF_TYPES))
    if unknown:
        raise ValueError(f"{var}.cluster has unknown task type(s) {unknown}; expected {_TF_TYPES}")
    pools = {name: _addresses(addrs, f"{var}.cluster.{name}") for name, addrs in raw.items()}
    if pools.get("chief") and pools.get("master"):
        raise ValueError(f"{var}.cluster has both 'chief' and 'master'; Vertex sets only one")
    chief_key = "master" if pools.get("master") else "chief"
    chiefs = pools.get(chief_key, [])
    if len(chiefs) > 1:
        raise ValueError(f"{var}.cluster.{chief_key} must have exactly one replica (got {len(chiefs)})")
    workers = pools.get("worker", [])
    if not chiefs and not workers:
        raise ValueError(f"{var}.cluster has neither a chief nor workers")
    task_type, index = _task(spec, var, pools)
    role = "chief" if task_type == "master" else task_type
    offset = len(chiefs)
    rank = {"chief": 0, "worker": offset + index}.get(role)
    cluster = {"chief": chiefs, "worker": workers, "ps": pools.get("ps", []),
               "evaluator": pools.get("evaluator", [])}
    cluster = {k: v for k, v in cluster.items() if v}
    first = chiefs[0] if chiefs else workers[0]
    addr, port = _master(env, first, f"{var}.cluster.{chief_key if chiefs else 'worker'}")
    trial = (spec.get("task") or {}).get("trial") or None
    local_rank, local_world = _local(env)
    return ClusterInfo(role, index, rank, len(chiefs) + len(workers), addr, port, cluster, var,
                       trial, local_rank, local_world)


def _from_torch(env: Mapping[str, str]) -> ClusterInfo:
    world = _int(env.get("WORLD_SIZE", 1), "WORLD_SIZE")
    rank = _int(env.get("RANK", 0), "RANK")
    if world < 1:
        raise ValueError(f"WORLD_SIZE must be >= 1 (got {world})")
    if not 0 <= rank < world:
        raise ValueError(f"RANK {rank} is out of range for WORLD_SIZE {world}")
    addr = env.get("MASTER_ADDR") or "127.0.0.1"
    port = _int(env.get("MASTER_PORT", DEFAULT_MASTER_PORT), "MASTER_PORT")
    local_rank, local_world = _local(env)
    if world == 1:
        return ClusterInfo("single", 0, 0, 1, addr, port, {}, "torch", None, local_rank, local_world)
    role = "chief" if rank == 0 else "worker"
    return ClusterInfo(role, 0 if rank == 0 else rank - 1, rank, world, addr, port, {}, "torch",
                       None, local_rank, local_world)


def from_env(env: Mapping[str, str] | None = None) -> ClusterInfo:
    """This process's `ClusterInfo` from `env` (default `os.environ`): CLUSTER_SPEC if set, else
    TF_CONFIG, else the torch variables; with none of them, a single node."""
    env = os.environ if env is None else env
    if env.get("CLUSTER_SPEC"):
        return _from_cluster_spec(env)
    if env.get("TF_CONFIG"):
        return _from_tf_config(env)
    if env.get("WORLD_SIZE") or env.get("RANK"):
        return _from_torch(env)
    local_rank, local_world = _local(env)
    return ClusterInfo(local_rank=local_rank, local_world_size=local_world)


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct loopback ports the OS reports free now (held open together so they differ),
    for replicas started on this machine."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
