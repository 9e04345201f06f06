"""Where this process sits in a (Vertex AI) training cluster, read from its environment.

This module is the one reader of the cluster variables; `labkit.torch.distributed` (DistInfo)
and `labkit.tf.strategy` (StrategyPlan) are views of the `ClusterInfo` it returns.

Vertex gives every replica of a custom job the same descriptions of the cluster:

* ``CLUSTER_SPEC``: ``{"cluster": {"workerpool0": [...], "workerpool1": [...], ...},
  "task": {"type": "workerpool1", "index": 0, "trial": ...}, "environment": "cloud",
  "job": {...the CustomJobSpec...}}``. Pool 0 is the primary replica (exactly one), pool 1 the
  workers, pool 2 parameter servers or a Reduction Server, pool 3 evaluators.
* ``TF_CONFIG`` (multi-replica jobs only): the same cluster with TensorFlow's names (``chief``
  or ``master``, ``worker``, ``ps``, ``evaluator``).
* The PyTorch variables ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK``, counted
  in nodes (one process per node).

torchrun (and labkit's own local launchers) also set ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``;
with ``LOCAL_WORLD_SIZE`` set, ``WORLD_SIZE`` and ``RANK`` count processes (nodes =
``WORLD_SIZE / LOCAL_WORLD_SIZE``; ``GROUP_RANK``, when present, is the node rank).

`from_env` reads CLUSTER_SPEC first, then TF_CONFIG, then the torch variables (none at all means
a single node) into one `ClusterInfo`. WORLD_SIZE / RANK that contradict CLUSTER_SPEC or
TF_CONFIG are refused. From a `ClusterInfo`, `tf_config()` writes a TF_CONFIG TensorFlow accepts
(``master`` renamed ``chief``) and `torch_env()` the torch variables. Anything malformed raises
`ValueError` naming the offending field, e.g. ``CLUSTER_SPEC.task.index``.

Whether pool 2 runs parameter servers or Vertex's Reduction Server is read from
``CLUSTER_SPEC.job`` (pool 2's image) or from ``LABKIT_WORKERPOOL2_ROLE``, which labkit's job
specs set on every pool that runs the training code.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ROLES = ("chief", "worker", "ps", "evaluator", "reduction_server", "single")
TRAINING_ROLES = ("chief", "worker", "single")
# Vertex's pool -> role. Pool 2 is "ps" unless it runs the Reduction Server (see `_pool2_role`).
POOL_ROLES = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
              "workerpool3": "evaluator"}
POOL2_ROLE_ENV = "LABKIT_WORKERPOOL2_ROLE"
REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
DEFAULT_MASTER_PORT = 29500
# Every variable that places a process in a cluster: a process started locally must not
# inherit them from an enclosing job (it would think it is that job's replica).
CLUSTER_VARIABLES = ("CLUSTER_SPEC", "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
                     "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", POOL2_ROLE_ENV)
_TF_TYPES = ("chief", "master", "worker", "ps", "evaluator")
_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the cluster.

    `rank` is the node rank among training nodes (workerpool0 -> 0, workerpool1[i] -> 1+i) and
    `world_size` the number of training nodes; both count nodes, not processes. Parameter-server,
    reduction-server and evaluator replicas are not training ranks: their `rank` is None.
    `local_rank` / `local_world_size` place the process on its node (several GPUs per node);
    `global_rank` / `global_world_size` count processes.
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
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(f"local_rank {self.local_rank} is out of range for "
                             f"local_world_size {self.local_world_size}")

    @property
    def is_chief(self) -> bool:
        """The one process that writes checkpoints, metrics and the exported model: local
        process 0 of training node 0."""
        return self.is_training and self.global_rank == 0

    @property
    def is_training(self) -> bool:
        return self.role in TRAINING_ROLES

    @property
    def is_distributed(self) -> bool:
        return self.global_world_size > 1

    @property
    def global_rank(self) -> int | None:
        """Process rank with several processes (GPUs) per node: RANK x gpus + local_rank."""
        if self.rank is None:
            return None
        return self.rank * self.local_world_size + self.local_rank

    @property
    def global_world_size(self) -> int:
        return self.world_size * self.local_world_size

    def tf_config(self, *, primary_name: str = "chief") -> dict[str, Any]:
        """A TF_CONFIG dict TensorFlow accepts: ``{"cluster": ..., "task": {"type", "index"}}``.
        Empty for a single node (TensorFlow's default). The evaluator is left out of `cluster`
        (TensorFlow's convention: it is not part of the training cluster) and named only as the
        task. `primary_name="master"` writes the primary as Vertex does, which TensorFlow
        rejects: only for emulating Vertex's own variable."""
        if primary_name not in ("chief", "master"):
            raise ValueError(f"primary_name must be 'chief' or 'master' (got {primary_name!r})")
        if self.role == "single" or not self.cluster:
            return {}
        if self.role == "reduction_server":
            raise ValueError("role: a reduction-server replica runs Google's reduction server "
                             "image, not TensorFlow, so it has no TF_CONFIG")
        rename = {"chief": primary_name}
        cluster = {rename.get(k, k): list(v) for k, v in self.cluster.items() if k != "evaluator" and v}
        return {"cluster": cluster, "task": {"type": rename.get(self.role, self.role), "index": self.index}}

    def torch_env(self) -> dict[str, str]:
        """The torch.distributed env:// variables of this process. With one process per node
        they are Vertex's (counted in nodes); with several, LOCAL_RANK and LOCAL_WORLD_SIZE are
        added and WORLD_SIZE / RANK count processes, as torchrun sets them."""
        if self.global_rank is None:
            raise ValueError(f"role: a {self.role} replica is not a training rank, so it has no "
                             "torch.distributed variables")
        env = {"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
               "WORLD_SIZE": str(self.global_world_size), "RANK": str(self.global_rank)}
        if self.local_world_size > 1:
            env |= {"LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_world_size)}
        return env


# ---------------------------------------------------------------- parsing helpers

def _json(value: Any, name: str) -> dict[str, Any]:
    try:
        value = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}: not valid JSON ({e})") from e
    if not isinstance(value, dict):
        raise ValueError(f"{name}: must be a JSON object (got {type(value).__name__})")
    return value


def _int(value: Any, name: str) -> int:
    # Integers, or strings of one (environment variables): 0.7, "0.7" and true are refused
    # rather than read as 0 or 1.
    if isinstance(value, bool) or not isinstance(value, (int, str)) or \
            (isinstance(value, str) and not _INTEGER.fullmatch(value)):
        raise ValueError(f"{name} must be an integer (got {value!r})")
    return int(value)


def _port(value: Any, name: str) -> int:
    """A TCP port number, 1..65535 (a larger one fails much later, inside the framework's
    rendezvous, with a message that does not say which variable held it)."""
    port = _int(value, name)
    if not 1 <= port <= 65535:
        raise ValueError(f"{name} must be a TCP port, 1 to 65535 (got {port})")
    return port


def _addresses(value: Any, name: str) -> list[str]:
    # Vertex leaves skipped pools out; tolerate null / empty list too.
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ValueError(f"{name} must be a list of 'host:port' strings (got {value!r})")
    return list(value)


def _host_port(address: str, name: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{name}: address {address!r} is not 'host:port'")
    return host, _port(port, f"{name} port")


def _task(spec: dict[str, Any], var: str, cluster: dict[str, list[str]],
          outside: tuple[str, ...] = ()) -> tuple[str, int]:
    """The task's (type, index); types in `outside` may be absent from the cluster."""
    task = spec.get("task")
    if not isinstance(task, dict):
        raise ValueError(f"{var}.task is missing or not an object")
    task_type = task.get("type")
    index = _int(task.get("index", 0), f"{var}.task.index")
    if task_type in outside and not cluster.get(task_type):
        if index < 0:
            raise ValueError(f"{var}.task.index must be >= 0 (got {index})")
        return task_type, index
    if not isinstance(task_type, str) or not cluster.get(task_type):
        known = ", ".join(k for k, v in cluster.items() if v)
        raise ValueError(f"{var}.task.type {task_type!r} is not a pool of {var}.cluster ({known})")
    if not 0 <= index < len(cluster[task_type]):
        raise ValueError(f"{var}.task.index {index} is out of range: {var}.cluster.{task_type} "
                         f"has {len(cluster[task_type])} replica(s)")
    return task_type, index


def _trial(spec: dict[str, Any]) -> str | None:
    trial = spec["task"].get("trial")
    return str(trial) if trial not in (None, "") else None


def _master(env: Mapping[str, str], chief_address: str, var: str) -> tuple[str, int]:
    host, port = _host_port(chief_address, var)
    # Vertex also sets MASTER_ADDR / MASTER_PORT for PyTorch; they win over the pool address.
    addr = env.get("MASTER_ADDR") or host
    if env.get("MASTER_PORT"):
        port = _port(env["MASTER_PORT"], "MASTER_PORT")
    return addr, port


def _local(env: Mapping[str, str]) -> tuple[int, int]:
    local_rank = _int(env.get("LOCAL_RANK") or 0, "LOCAL_RANK")
    local_world = _int(env.get("LOCAL_WORLD_SIZE") or 1, "LOCAL_WORLD_SIZE")
    if local_world < 1 or not 0 <= local_rank < local_world:
        raise ValueError(f"LOCAL_RANK {local_rank} is out of range for LOCAL_WORLD_SIZE {local_world}")
    return local_rank, local_world


def is_reduction_server_image(image_uri: Any) -> bool:
    """Whether `image_uri` is Vertex's Reduction Server image (any tag or digest)."""
    if not isinstance(image_uri, str):
        return False
    name = image_uri.split("@", 1)[0]
    head, sep, tag = name.rpartition(":")
    if sep and "/" not in tag:
        name = head
    return name == REDUCTION_SERVER_IMAGE.rpartition(":")[0]


def _field(obj: dict[str, Any], snake: str, camel: str) -> Any:
    """A field of a CustomJobSpec as the REST API (camelCase) or the proto (snake_case) names it."""
    return obj[camel] if camel in obj else obj.get(snake)


def _pool2_from_job(job: Any, name: str) -> str | None:
    """"reduction_server" or "ps" from the CustomJobSpec in CLUSTER_SPEC.job (an object, or a
    JSON string); None when the job does not say (no job, or no pool 2)."""
    if job is None or job == "":
        return None
    if isinstance(job, str):
        job = _json(job, name)
    if not isinstance(job, dict):
        raise ValueError(f"{name} must be an object (the CustomJobSpec; got {type(job).__name__})")
    pools = _field(job, "worker_pool_specs", "workerPoolSpecs")
    if pools is None:
        return None
    if not isinstance(pools, list):
        raise ValueError(f"{name}.workerPoolSpecs must be a list (got {type(pools).__name__})")
    if len(pools) < 3 or not pools[2]:
        return None
    pool = pools[2]
    if not isinstance(pool, dict):
        raise ValueError(f"{name}.workerPoolSpecs[2] must be an object (got {type(pool).__name__})")
    container = _field(pool, "container_spec", "containerSpec")
    if container is None:
        return "ps"  # a Python package: the training code, not Google's image
    if not isinstance(container, dict):
        raise ValueError(f"{name}.workerPoolSpecs[2].containerSpec must be an object")
    image = _field(container, "image_uri", "imageUri")
    return "reduction_server" if is_reduction_server_image(image) else "ps"


def _pool2_role(env: Mapping[str, str], spec: dict[str, Any], var: str) -> str:
    named = env.get(POOL2_ROLE_ENV) or None
    if named not in (None, "ps", "reduction_server"):
        raise ValueError(f"{POOL2_ROLE_ENV} must be 'ps' or 'reduction_server' (got {named!r})")
    from_job = _pool2_from_job(spec.get("job"), f"{var}.job")
    if named and from_job and named != from_job:
        image = "the Reduction Server image" if from_job == "reduction_server" else "another image"
        raise ValueError(f"{POOL2_ROLE_ENV}={named} contradicts {var}.job, whose workerpool2 "
                         f"runs {image}")
    return named or from_job or "ps"


# ---------------------------------------------------------------- the three sources

def _from_cluster_spec(env: Mapping[str, str]) -> ClusterInfo:
    var = "CLUSTER_SPEC"
    spec = _json(env[var], var)
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
    pool2 = _pool2_role(env, spec, var)
    role = pool2 if pool == "workerpool2" else POOL_ROLES[pool]
    rank = {"workerpool0": 0, "workerpool1": 1 + index}.get(pool)
    cluster = {"chief": pools["workerpool0"], "worker": pools.get("workerpool1", []),
               "ps": pools.get("workerpool2", []) if pool2 == "ps" else [],
               "evaluator": pools.get("workerpool3", [])}
    addr, port = _master(env, pools["workerpool0"][0], f"{var}.cluster.workerpool0")
    local_rank, local_world = _local(env)
    return ClusterInfo(role, index, rank, 1 + len(pools.get("workerpool1", [])), addr, port,
                       {k: v for k, v in cluster.items() if v}, var, _trial(spec), local_rank,
                       local_world)


def _from_tf_config(env: Mapping[str, str]) -> ClusterInfo | None:
    """None for an empty TF_CONFIG (``{}``: what a single node writes)."""
    var = "TF_CONFIG"
    spec = _json(env[var], var)
    if not spec:
        return None
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
    # TensorFlow's convention: the evaluator is not in the cluster, only the task names it.
    task_type, index = _task(spec, var, pools, outside=("evaluator",))
    role = "chief" if task_type == "master" else task_type
    rank = {"chief": 0, "worker": len(chiefs) + index}.get(role)
    cluster = {"chief": chiefs, "worker": workers, "ps": pools.get("ps", []),
               "evaluator": pools.get("evaluator", [])}
    first = chiefs[0] if chiefs else workers[0]
    addr, port = _master(env, first, f"{var}.cluster.{chief_key if chiefs else 'worker'}")
    local_rank, local_world = _local(env)
    return ClusterInfo(role, index, rank, len(chiefs) + len(workers), addr, port,
                       {k: v for k, v in cluster.items() if v}, var, _trial(spec), local_rank,
                       local_world)


def _from_torch(env: Mapping[str, str]) -> ClusterInfo:
    world = _int(env.get("WORLD_SIZE") or 1, "WORLD_SIZE")
    rank = _int(env.get("RANK") or 0, "RANK")
    if world < 1:
        raise ValueError(f"WORLD_SIZE must be >= 1 (got {world})")
    if not 0 <= rank < world:
        raise ValueError(f"RANK {rank} is out of range for WORLD_SIZE {world}")
    addr = env.get("MASTER_ADDR") or "127.0.0.1"
    port = _port(env.get("MASTER_PORT") or DEFAULT_MASTER_PORT, "MASTER_PORT")
    local_rank, local_world = _local(env)
    nodes, node = world, rank  # Vertex: one process per node, the variables count nodes
    if env.get("LOCAL_WORLD_SIZE"):  # torchrun: they count processes
        if world % local_world:
            raise ValueError(f"WORLD_SIZE {world} is not a multiple of LOCAL_WORLD_SIZE {local_world}")
        nodes, node = world // local_world, rank // local_world
        if rank % local_world != local_rank:
            raise ValueError(f"RANK {rank} contradicts LOCAL_RANK {local_rank} with LOCAL_WORLD_SIZE "
                             f"{local_world} (RANK = node x LOCAL_WORLD_SIZE + LOCAL_RANK)")
        if env.get("GROUP_RANK") and _int(env["GROUP_RANK"], "GROUP_RANK") != node:
            raise ValueError(f"GROUP_RANK {env['GROUP_RANK']} contradicts RANK {rank} with "
                             f"LOCAL_WORLD_SIZE {local_world} (node {node})")
    if nodes == 1:
        return ClusterInfo("single", 0, 0, 1, addr, port, {}, "torch", None, local_rank, local_world)
    role = "chief" if node == 0 else "worker"
    return ClusterInfo(role, 0 if node == 0 else node - 1, node, nodes, addr, port, {}, "torch",
                       None, local_rank, local_world)


def _check_torch_variables(info: ClusterInfo, env: Mapping[str, str]) -> None:
    """WORLD_SIZE / RANK / GROUP_RANK beside CLUSTER_SPEC or TF_CONFIG must say the same thing.
    On parameter-server, evaluator and reducer replicas Vertex does not document them: not
    checked there."""
    present = [n for n in ("WORLD_SIZE", "RANK", "GROUP_RANK") if env.get(n)]
    if not present or not info.is_training:
        return
    expected = {"WORLD_SIZE": info.global_world_size, "RANK": info.global_rank, "GROUP_RANK": info.rank}
    if all(_int(env[n], n) == expected[n] for n in present):
        return
    given = " ".join(f"{n}={env[n]}" for n in present)
    want = " ".join(f"{n}={expected[n]}" for n in present)
    local = (f" with LOCAL_WORLD_SIZE={info.local_world_size} (processes per node)"
             if env.get("LOCAL_WORLD_SIZE") else " (one process per node: they count nodes)")
    raise ValueError(f"{given} contradict {info.source}, which describes {info.world_size} training "
                     f"node(s) with this one node rank {info.rank}; expected {want}{local}")


def from_env(env: Mapping[str, str] | None = None) -> ClusterInfo:
    """This process's `ClusterInfo` from `env` (default `os.environ`): CLUSTER_SPEC if set, else
    TF_CONFIG, else the torch variables; with none of them, a single node. Torch variables
    beside CLUSTER_SPEC or TF_CONFIG must agree with them (ValueError naming both)."""
    env = os.environ if env is None else env
    info = None
    if env.get("CLUSTER_SPEC"):
        info = _from_cluster_spec(env)
    elif env.get("TF_CONFIG"):
        info = _from_tf_config(env)
    if info is not None:
        _check_torch_variables(info, env)
        return info
    if env.get("WORLD_SIZE") or env.get("RANK"):
        return _from_torch(env)
    local_rank, local_world = _local(env)
    return ClusterInfo(local_rank=local_rank, local_world_size=local_world)


# ---------------------------------------------------------------- clusters on this machine

def local_processes(nproc: int, master_port: int, master_addr: str = "127.0.0.1") -> list[ClusterInfo]:
    """The `nproc` processes of a one-node job on this machine (what ``torchrun --standalone``
    starts), local rank order; `torch_env()` of each is its environment."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1 (got {nproc})")
    return [ClusterInfo("single", 0, 0, 1, master_addr, master_port, {}, "none", None, r, nproc)
            for r in range(nproc)]


def local_tf_cluster(num_workers: int, num_ps: int = 0, *,
                     ports: Sequence[int] | None = None) -> list[ClusterInfo]:
    """Every task of a TensorFlow cluster on loopback: the chief, `num_workers - 1` workers, then
    `num_ps` parameter servers, each on its own port (free ones unless `ports` are given);
    `tf_config()` of each is its TF_CONFIG."""
    if num_workers < 1 or num_ps < 0:
        raise ValueError(f"num_workers must be >= 1 and num_ps >= 0 (got {num_workers}, {num_ps})")
    ports = list(ports) if ports is not None else free_ports(num_workers + num_ps)
    if len(ports) != num_workers + num_ps:
        raise ValueError(f"ports: {num_workers + num_ps} needed (got {len(ports)})")
    addresses = [f"127.0.0.1:{p}" for p in ports]
    cluster = {"chief": addresses[:1], "worker": addresses[1:num_workers],
               "ps": addresses[num_workers:]}
    cluster = {k: v for k, v in cluster.items() if v}
    tasks = [("chief", 0, 0)] + [("worker", i, 1 + i) for i in range(num_workers - 1)] + \
        [("ps", i, None) for i in range(num_ps)]
    return [ClusterInfo(role, index, rank, num_workers, "127.0.0.1", ports[0], cluster, "none")
            for role, index, rank in tasks]


# Where the OS takes the local port of every outgoing connection (Linux's default 32768-60999).
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
PICKED_FROM = 10000  # ports are picked from here up to just below the ephemeral range


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct loopback ports free now, for replicas started on this machine. Picked below
    the OS's ephemeral range where it is known: a port the OS hands out itself can be taken by
    any process's next outgoing connection in the moment between this pick and the replica's
    bind (TensorFlow then fails with "Could not start gRPC server")."""
    import random
    import socket

    top = _ephemeral_low() - 1
    # The OS's randomness, not `random`'s: a trainer seeds `random`, and two seeded pickers
    # would pick the same ports.
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        tries = 0
        while len(socks) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            tries += 1
            port = rng.randint(PICKED_FROM, top) if top > PICKED_FROM and tries <= 50 * n else 0
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use: try another
                socks.pop().close()
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _ephemeral_low() -> int:
    """The lowest port of the OS's ephemeral range, or 0 where it cannot be read."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
