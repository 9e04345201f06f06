"""Vertex AI CustomJob specs as plain dicts in the proto field names, validated offline.

A CustomJob runs up to four worker pools: 0 the primary replica (exactly one), 1 the workers,
2 parameter servers or the Reduction Server, 3 evaluators. A pool that is skipped is written as
``{}`` so the pools keep their positions. `custom_job_spec` assembles pools from `PoolConfig`s;
`notebook_job` (papermill on a notebook inside a container) and `training_job` (`labkit train`)
build the two kinds of job the course submits. Both run labkit's own image unless told otherwise
(`labkit.vertex.images`: no prebuilt image has a framework new enough); on a named prebuilt image
the container first pip-installs labkit from the bucket.

Every spec is checked by `check_spec` (framework-free: pools, replica counts, machine and
accelerator pairings from `labkit.vertex.machines`, boot disks) and, where google-cloud-aiplatform
is installed, by `validate`, which also builds `google.cloud.aiplatform_v1.types.CustomJobSpec(**spec)`
and round-trips it through `to_dict`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Any

from labkit.core.cluster import POOL2_ROLE_ENV, REDUCTION_SERVER_IMAGE, is_reduction_server_image
from labkit.core.config import ParameterError, check_bool, check_int, check_str
from labkit.core.frameworks import has_aiplatform, require
from labkit.core.gcs import fuse_path
from labkit.core.train_config import TrainConfig, to_argv
from labkit.vertex.images import check_image, default_image, prebuilt
from labkit.vertex.machines import boot_disk_type, check_boot_disk, check_machine

REDUCTION_SERVER_MACHINE_TYPE = "n1-highcpu-16"
# argv[0] of the setup wrapper on prebuilt images; the local emulator recognises and skips it
# (the local environment already has the packages the wrapper would pip-install).
SETUP_MARKER = "labkit-setup"
DEFAULT_MACHINE_TYPE = "n1-standard-8"
# ``gs://bucket/path`` -> ``/gcs/bucket/path`` (the name this module always exported).
gcs_fuse_path = fuse_path


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


@dataclass
class PoolConfig:
    """One worker pool: machine, accelerators, disk, replicas and what the container runs."""

    machine_type: str = DEFAULT_MACHINE_TYPE
    replica_count: int = 1
    accelerator_type: str | None = None
    accelerator_count: int = 0
    image_uri: str = field(default_factory=lambda: default_image("torch"))
    command: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    boot_disk_type: str | None = None  # None: the machine family's default (`machines.boot_disk_type`)
    boot_disk_size_gb: int = 100

    def __post_init__(self) -> None:
        check_str("machine_type", self.machine_type)
        check_int("replica_count", self.replica_count, minimum=1)
        check_int("accelerator_count", self.accelerator_count, minimum=0)
        check_str("image_uri", self.image_uri)
        check_int("boot_disk_size_gb", self.boot_disk_size_gb, minimum=10)
        if self.accelerator_count and not self.accelerator_type:
            raise ParameterError("accelerator_type", self.accelerator_type,
                                 f"must be set when accelerator_count is {self.accelerator_count}")
        if self.accelerator_type and not self.accelerator_count:
            raise ParameterError("accelerator_count", self.accelerator_count,
                                 f"must be >= 1 with accelerator_type {self.accelerator_type!r}")
        if self.accelerator_type:
            _check_accelerator(self.accelerator_type)
        check_machine(self.machine_type, self.accelerator_type, self.accelerator_count)
        if self.boot_disk_type is None:
            self.boot_disk_type = boot_disk_type(self.machine_type)
        check_boot_disk(self.machine_type, self.boot_disk_type)
        check_image(self.image_uri)

    def to_spec(self) -> dict[str, Any]:
        machine: dict[str, Any] = {"machine_type": self.machine_type}
        if self.accelerator_type:
            machine |= {"accelerator_type": self.accelerator_type,
                        "accelerator_count": self.accelerator_count}
        container: dict[str, Any] = {"image_uri": self.image_uri}
        if self.command:
            container["command"] = list(self.command)
        if self.args:
            container["args"] = list(self.args)
        if self.env:
            container["env"] = [{"name": k, "value": str(v)} for k, v in self.env.items()]
        return {"machine_spec": machine, "replica_count": self.replica_count,
                "disk_spec": {"boot_disk_type": self.boot_disk_type,
                              "boot_disk_size_gb": self.boot_disk_size_gb},
                "container_spec": container}


def _check_accelerator(name: str) -> None:
    try:
        from google.cloud.aiplatform_v1.types import AcceleratorType
    except ImportError:  # validated later by `validate` where the library exists
        return
    if name not in AcceleratorType.__members__:
        known = ", ".join(n for n in AcceleratorType.__members__ if n != "ACCELERATOR_TYPE_UNSPECIFIED")
        raise ParameterError("accelerator_type", name, f"is not a Vertex accelerator ({known})")


def reduction_server_pool(replica_count: int, machine_type: str = REDUCTION_SERVER_MACHINE_TYPE) -> PoolConfig:
    """Pool 2 as Vertex's Reduction Server: Google's image on CPU machines. The training code
    does not change; NCCL's all-reduce goes through the reducers."""
    return PoolConfig(machine_type=machine_type, replica_count=replica_count,
                      image_uri=REDUCTION_SERVER_IMAGE)


def custom_job_spec(
    primary: PoolConfig,
    workers: PoolConfig | None = None,
    pool2: PoolConfig | None = None,
    evaluators: PoolConfig | None = None,
    *,
    output_uri: str | None = None,
    spot: bool = False,
    restart_job_on_worker_restart: bool = False,
    timeout_s: int | None = None,
    service_account: str | None = None,
) -> dict[str, Any]:
    """A CustomJobSpec dict. Skipped pools before the last used one are written as ``{}``."""
    if primary.replica_count != 1:
        raise ParameterError("replica_count", primary.replica_count,
                             "of the primary pool (workerpool0) must be 1; put more replicas in workers")
    check_bool("spot", spot)
    check_bool("restart_job_on_worker_restart", restart_job_on_worker_restart)
    check_int("timeout_s", timeout_s, minimum=1, allow_none=True)
    if pool2 is not None and is_reduction_server_image(pool2.image_uri):
        # A replica cannot tell from CLUSTER_SPEC.cluster alone that pool 2 reduces rather than
        # serves parameters: say so to every pool that runs the training code.
        role = {POOL2_ROLE_ENV: "reduction_server"}
        primary, workers, evaluators = (p and replace(p, env={**p.env, **role})
                                        for p in (primary, workers, evaluators))
    pools = [primary, workers, pool2, evaluators]
    while pools[-1] is None:
        pools.pop()
    spec: dict[str, Any] = {"worker_pool_specs": [p.to_spec() if p else {} for p in pools]}
    scheduling: dict[str, Any] = {}
    if timeout_s:
        scheduling["timeout"] = f"{timeout_s}s"
    if restart_job_on_worker_restart:
        scheduling["restart_job_on_worker_restart"] = True
    if spot:
        scheduling["strategy"] = "SPOT"
    if scheduling:
        spec["scheduling"] = scheduling
    if output_uri:
        check_str("output_uri", output_uri)
        spec["base_output_directory"] = {"output_uri_prefix": output_uri}
    if service_account:
        spec["service_account"] = service_account
    if has_aiplatform():  # without the library the spec is still built and checked
        validate(spec)
    else:
        check_spec(spec)
    return spec


def _setup_command(requirements: Sequence[str], package_uri: str | None) -> list[str]:
    """Prebuilt images lack labkit and papermill: install them, then exec the real command."""
    pkgs = [gcs_fuse_path(package_uri)] if package_uri else []
    pkgs += list(requirements)
    script = "pip install --quiet " + " ".join(shlex.quote(p) for p in pkgs) + ' && exec "$@"'
    return ["bash", "-c", script, SETUP_MARKER]


def labkit_container(framework: str, *, output_uri: str, image_uri: str | None = None,
                     package_uri: str | None = None, requirements: Sequence[str] = ()) -> dict[str, Any]:
    """``{"image_uri", "command"}`` of a container that can run ``python -m labkit...``.

    By default labkit's own image (`labkit.vertex.images.default_image`), which has labkit and
    its framework. On a Vertex prebuilt image, or when `package_uri` is given, the command first
    pip-installs labkit from `package_uri` (default ``<output_uri>/inputs/labkit.tar.gz``, which
    `submit` uploads) and `requirements`. A prebuilt image whose framework is older than labkit
    needs, or past its end of availability, is refused (`images.check_image`)."""
    if framework not in ("torch", "tf"):
        raise ParameterError("framework", framework, "must be one of ['tf', 'torch']")
    image = image_uri or default_image(framework)
    check_image(image)
    if prebuilt(image) is None and package_uri is None:
        return {"image_uri": image, "command": []}
    package_uri = package_uri or _join(output_uri, "inputs", "labkit.tar.gz")
    return {"image_uri": image, "command": _setup_command(requirements, package_uri)}


def _pools_for(
    args: list[str], *, output_uri: str, machine_type: str, accelerator_type: str | None,
    accelerator_count: int, replica_count: int, image_uri: str | None, framework: str,
    env: Mapping[str, str] | None, requirements: Sequence[str], package_uri: str | None, boot_disk_size_gb: int,
    reduction_server_count: int, reduction_server_machine_type: str,
) -> tuple[PoolConfig, PoolConfig | None, PoolConfig | None]:
    check_int("replica_count", replica_count, minimum=1)
    check_int("reduction_server_count", reduction_server_count, minimum=0)
    container = labkit_container(framework, output_uri=output_uri, image_uri=image_uri,
                                 package_uri=package_uri, requirements=requirements)
    pool = {"machine_type": machine_type, "accelerator_type": accelerator_type,
            "accelerator_count": accelerator_count, **container, "args": args,
            "env": dict(env or {}), "boot_disk_size_gb": boot_disk_size_gb}
    primary = PoolConfig(replica_count=1, **pool)
    workers = PoolConfig(replica_count=replica_count - 1, **pool) if replica_count > 1 else None
    reducers = (reduction_server_pool(reduction_server_count, reduction_server_machine_type)
                if reduction_server_count else None)
    if reducers and not workers:
        raise ParameterError("reduction_server_count", reduction_server_count,
                             "needs replica_count >= 2: a Reduction Server serves several nodes")
    return primary, workers, reducers


def notebook_job(
    notebook: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    output_uri: str,
    machine_type: str = DEFAULT_MACHINE_TYPE,
    accelerator_type: str | None = None,
    accelerator_count: int = 0,
    replica_count: int = 1,
    spot: bool = False,
    image_uri: str | None = None,
    reduction_server_count: int = 0,
    reduction_server_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
    framework: str = "torch",
    env: Mapping[str, str] | None = None,
    package_uri: str | None = None,
    requirements: Sequence[str] = ("papermill", "ipykernel"),
    boot_disk_size_gb: int = 100,
    timeout_s: int | None = None,
    restart_job_on_worker_restart: bool | None = None,
) -> dict[str, Any]:
    """CustomJobSpec that runs `notebook` with papermill and `parameters` in a container and
    writes the executed notebook under ``<output_uri>/notebooks/``.

    `notebook` is a ``gs://`` URI, or a local path that `submit` uploads to
    ``<output_uri>/inputs/<name>`` first. The container is labkit's image for `framework`
    (`image_uri=None`; it has labkit, papermill and the framework) or `image_uri`; on a Vertex
    prebuilt image, or with `package_uri`, it first pip-installs `requirements` and labkit from
    `package_uri` (default ``<output_uri>/inputs/labkit.tar.gz``, also uploaded by `submit`)
    (see `labkit_container`). Buckets are read and written through the ``/gcs/`` mount.
    """
    check_str("notebook", notebook)
    check_str("output_uri", output_uri)
    params = dict(parameters or {})
    try:
        params_json = json.dumps(params, sort_keys=True)
    except TypeError as e:
        raise ParameterError("parameters", params, f"must be JSON values ({e})") from e
    source = notebook if notebook.startswith("gs://") else _join(output_uri, "inputs", PurePosixPath(notebook).name)
    args = ["python", "-m", "labkit.vertex.entry", "notebook", gcs_fuse_path(source),
            gcs_fuse_path(_join(output_uri, "notebooks")), "--parameters", params_json]
    pools = _pools_for(args, output_uri=output_uri, machine_type=machine_type,
                       accelerator_type=accelerator_type,
                       accelerator_count=accelerator_count, replica_count=replica_count,
                       image_uri=image_uri, framework=framework, env=env, requirements=requirements,
                       package_uri=package_uri, boot_disk_size_gb=boot_disk_size_gb,
                       reduction_server_count=reduction_server_count,
                       reduction_server_machine_type=reduction_server_machine_type)
    restart = replica_count > 1 if restart_job_on_worker_restart is None else restart_job_on_worker_restart
    return custom_job_spec(*pools, output_uri=output_uri, spot=spot,
                           restart_job_on_worker_restart=restart, timeout_s=timeout_s)


def train_config(config: Any) -> TrainConfig:
    """A TrainConfig from a TrainConfig or a dict of its fields (validated)."""
    return config if isinstance(config, TrainConfig) else TrainConfig(**dict(config))


def train_args(config: Any) -> list[str]:
    """`labkit train` flags for a TrainConfig (or a dict of its fields), defaults left out."""
    return to_argv(train_config(config), changed_only=True)


def training_job(
    config: Any,
    *,
    output_uri: str,
    machine_type: str = DEFAULT_MACHINE_TYPE,
    accelerator_type: str | None = None,
    accelerator_count: int = 0,
    replica_count: int = 1,
    spot: bool = False,
    image_uri: str | None = None,
    reduction_server_count: int = 0,
    reduction_server_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
    env: Mapping[str, str] | None = None,
    package_uri: str | None = None,
    requirements: Sequence[str] = (),
    boot_disk_size_gb: int = 100,
    timeout_s: int | None = None,
    restart_job_on_worker_restart: bool | None = None,
    processes_per_node: int | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """CustomJobSpec running ``python -m labkit train`` on every training replica.

    `command`: another program that takes the `labkit train` flags after its own (a tuning
    trial runs ``python -m labkit.vertex.trial ...``); it then gets no default output
    locations, and `processes_per_node` is its business.

    With several GPUs per node (torch), each node runs `processes_per_node` processes (default:
    `accelerator_count`) through torchrun, so the global rank is RANK x gpus + local rank.

    Unless `config` names them, checkpoints go to ``<output_uri>/checkpoints`` (what Vertex
    also exports as AIP_CHECKPOINT_DIR), TensorBoard logs to ``<output_uri>/logs``
    (AIP_TENSORBOARD_LOG_DIR) and metrics to ``<output_uri>/metrics.json``, all through the
    ``/gcs/`` mount, so no gcsfs or TensorFlow file system is needed in the image. The container
    is chosen as in `notebook_job` (`labkit_container`). Multi-replica jobs restart as a whole
    when one replica fails (DDP and MultiWorkerMirrored cannot lose a member), unless told
    otherwise.
    """
    cfg = train_config(config)
    updates = {}
    if command is None:
        if cfg.checkpoint_dir is None:
            updates["checkpoint_dir"] = gcs_fuse_path(_join(output_uri, "checkpoints"))
        if cfg.tensorboard_dir is None:
            updates["tensorboard_dir"] = gcs_fuse_path(_join(output_uri, "logs"))
        if cfg.metrics_out is None:
            updates["metrics_out"] = gcs_fuse_path(_join(output_uri, "metrics.json"))
    cfg = replace(cfg, **updates)
    if processes_per_node is None:
        processes_per_node = accelerator_count if cfg.framework == "torch" and accelerator_count > 1 else 1
    check_int("processes_per_node", processes_per_node, minimum=1)
    if command is not None:
        args = [*command, *train_args(cfg)]
    elif processes_per_node > 1:
        args = ["python", "-m", "labkit.vertex.entry", "torchrun", "--nproc-per-node",
                str(processes_per_node), "--", "train", *train_args(cfg)]
    else:
        args = ["python", "-m", "labkit", "train", *train_args(cfg)]
    pools = _pools_for(args, output_uri=output_uri, machine_type=machine_type,
                       accelerator_type=accelerator_type,
                       accelerator_count=accelerator_count, replica_count=replica_count,
                       image_uri=image_uri, framework=cfg.framework, env=env,
                       requirements=requirements, package_uri=package_uri,
                       boot_disk_size_gb=boot_disk_size_gb,
                       reduction_server_count=reduction_server_count,
                       reduction_server_machine_type=reduction_server_machine_type)
    restart = replica_count > 1 if restart_job_on_worker_restart is None else restart_job_on_worker_restart
    return custom_job_spec(*pools, output_uri=output_uri, spot=spot,
                           restart_job_on_worker_restart=restart, timeout_s=timeout_s)


# ---------------------------------------------------------------- validation

def first_mismatch(ours: Any, theirs: Any, path: str) -> str | None:
    """The first field path where `ours` is not reproduced in `theirs` (a to_dict output of
    the message built from `ours`), or None: a field the types silently dropped or changed."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return path
        for k, v in ours.items():
            bad = first_mismatch(v, theirs.get(k), f"{path}.{k}")
            if bad:
                return bad
        return None
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return path
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            bad = first_mismatch(a, b, f"{path}[{i}]")
            if bad:
                return bad
        return None
    return None if str(ours) == str(theirs) else path  # int64 fields come back as strings


def _get(obj: Mapping[str, Any], snake: str) -> Any:
    """A field under its proto name or its REST (camelCase) name."""
    head, *rest = snake.split("_")
    camel = head + "".join(w.title() for w in rest)
    return obj.get(snake, obj.get(camel))


def check_spec(spec: Mapping[str, Any]) -> None:
    """Framework-free checks of a CustomJobSpec dict (proto or REST names), each error naming
    the field: a primary pool with exactly one replica, no used pool with fewer than one
    replica (Vertex's default replica_count is 0), machine/accelerator pairings and boot disks
    from `labkit.vertex.machines`, and no prebuilt image too old for labkit."""
    pools = _get(spec, "worker_pool_specs")
    if not isinstance(pools, list) or not pools or not pools[0]:
        raise ValueError("spec.worker_pool_specs[0]: the primary pool is required")
    for i, pool in enumerate(pools):
        if not pool:
            continue  # a skipped pool keeps the positions of the others
        where = f"worker_pool_specs[{i}]."
        count = _get(pool, "replica_count")
        try:
            count = int(count if count is not None else 0)
        except (TypeError, ValueError):
            raise ParameterError(where + "replica_count", count, "must be an integer") from None
        if i == 0 and count != 1:
            raise ParameterError(where + "replica_count", count,
                                 "must be 1 (the primary replica); put more replicas in workerpool1")
        if count < 1:
            raise ParameterError(where + "replica_count", count,
                                 "must be >= 1 in a pool that is used (write a skipped pool as {})")
        machine = _get(pool, "machine_spec") or {}
        machine_type = _get(machine, "machine_type")
        if machine_type:
            accelerator = _get(machine, "accelerator_type")
            accelerator = None if accelerator in (None, "", "ACCELERATOR_TYPE_UNSPECIFIED") else accelerator
            check_machine(machine_type, accelerator, int(_get(machine, "accelerator_count") or 0),
                          where + "machine_spec.")
            disk = _get(_get(pool, "disk_spec") or {}, "boot_disk_type")
            if disk:
                check_boot_disk(machine_type, disk, where + "disk_spec.")
        image = _get(_get(pool, "container_spec") or {}, "image_uri")
        if image:
            check_image(image)


def validate(spec: Mapping[str, Any]):
    """Check `spec` with `check_spec` and against the aiplatform_v1 types; returns the
    CustomJobSpec message.

    Raises ValueError naming the field when a name or value is not accepted, or when a value
    does not survive the round trip through `to_dict` (a silently dropped field)."""
    require("google.cloud.aiplatform")
    from google.cloud.aiplatform_v1.types import CustomJobSpec

    try:
        message = CustomJobSpec(**spec)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"CustomJobSpec rejected the spec: {type(e).__name__}: {e}") from e
    as_dict = CustomJobSpec.to_dict(message, use_integers_for_enums=False)
    if CustomJobSpec(**as_dict) != message:
        raise ValueError("CustomJobSpec: the spec does not round-trip through to_dict")
    bad = first_mismatch(dict(spec), as_dict, "spec")
    if bad:
        raise ValueError(f"CustomJobSpec: field {bad} did not survive the round trip through to_dict")
    check_spec(spec)
    return message


def to_rest_json(spec: Mapping[str, Any]) -> str:
    """The spec as the REST API shows it (camelCase, enum names), for printing."""
    if not has_aiplatform():
        return json.dumps(spec, indent=2)  # proto field names; the library would camelCase them
    from google.cloud.aiplatform_v1.types import CustomJobSpec

    return CustomJobSpec.to_json(CustomJobSpec(**spec), always_print_fields_with_no_presence=False,
                                 use_integers_for_enums=False, indent=2)
