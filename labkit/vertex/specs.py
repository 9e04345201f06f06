"""Vertex AI CustomJob specs as plain dicts in the proto field names, validated offline.

A CustomJob runs up to four worker pools: 0 the primary replica (exactly one), 1 the workers,
2 parameter servers or the Reduction Server, 3 evaluators. A pool that is skipped is written as
``{}`` so the pools keep their positions. `custom_job_spec` assembles pools from `PoolConfig`s;
`notebook_job` (papermill on a notebook inside a container) and `training_job` (`labkit train`)
build the two kinds of job the course submits. Both run labkit's own image unless told otherwise
(`labkit.vertex.images`: no prebuilt image has a framework new enough); on a named prebuilt image
the container first pip-installs labkit from the bucket.

What a job asks for is checked before any money is spent: machines, accelerators, TPU topologies
and boot disks from Vertex's own tables (`labkit.vertex.machines`), the scheduling and cost
rules (`labkit.vertex.scheduling`: Spot, DWS flex-start, timeout, persistent resource,
reservation, labels, TensorBoard), the Reduction Server's size (`labkit.vertex.reduction`), an
Arm machine (A4X) refused for an amd64 image, a ``gs://`` output location (anything else would
be the container's own disk, lost at every restart), and for notebook jobs the notebook's
parameters (`labkit.core.notebook_params`). Jobs with GPUs pass ``--device cuda``, so a
container that cannot see the GPU fails at start instead of training on the CPU at GPU prices;
multi-node jobs on GPUDirect-RDMA machines (A3 Ultra, A4, A4X) first source Google's NCCL set-up
script, as the configure-compute page asks.

Every spec is checked by `check_spec` (framework-free) and, where google-cloud-aiplatform is
installed, by `validate`, which also builds `google.cloud.aiplatform_v1.types.CustomJobSpec(**spec)`
and round-trips it through `to_dict`. The builders return a `JobSpec`: the CustomJobSpec dict,
carrying the job's `labels` (a field of the CustomJob, not of its spec) to `submit`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from labkit.core.cluster import POOL2_ROLE_ENV, REDUCTION_SERVER_IMAGE, is_reduction_server_image
from labkit.core.config import ParameterError, check_bool, check_int, check_str
from labkit.core.frameworks import has_aiplatform, require
from labkit.core.gcs import GCS_MOUNT, fuse_path
from labkit.core.notebook_params import check_parameters, check_shared_domain
from labkit.core.train_config import TrainConfig, to_argv
from labkit.vertex.cloud_profile import PROFILER_REQUIREMENT, check_profiler_job, profiled
from labkit.vertex.fields import field_of
from labkit.vertex.images import check_image, check_image_gpu, default_image, image_arch, prebuilt
from labkit.vertex.machines import (
    A4X_ON_ARM,
    CONFIGURE_COMPUTE,
    boot_disk_type,
    check_boot_disk,
    check_machine,
    cite,
    is_tpu,
    machine_arch,
    needs_nccl_env_script,
    needs_reservation,
)
from labkit.vertex.nccl import gib_loader_path_step
from labkit.vertex.reduction import REDUCTION_SERVER_MACHINE_TYPE, check_reducers
from labkit.vertex.scheduling import (
    RESERVATIONS_PAGE,
    check_labels,
    check_scheduling,
    check_tensorboard,
    reservation_affinity,
    scheduling,
)

# argv[0] of the set-up wrapper (pip-installing labkit on a prebuilt image, sourcing the NCCL
# set-up on RDMA machines); the local emulator recognises and skips it (this machine has the
# packages already, and no RDMA network).
SETUP_MARKER = "labkit-setup"
DEFAULT_MACHINE_TYPE = "n1-standard-8"
DEFAULT_CELL_TIMEOUT_S = 1800
# The configure-compute page: "When using RDMA, add `source /usr/local/gib/scripts/set_nccl_env.sh`
# to the beginning of the training command".
NCCL_ENV_SCRIPT = "/usr/local/gib/scripts/set_nccl_env.sh"
# ``gs://bucket/path`` -> ``/gcs/bucket/path`` (the name this module always exported).
gcs_fuse_path = fuse_path


class JobSpec(dict):
    """A CustomJobSpec dict (``CustomJobSpec(**spec)`` accepts it) that also carries the job's
    `labels`, which belong to the CustomJob resource that `submit` creates around it."""

    def __init__(self, spec: Mapping[str, Any] = (), labels: Mapping[str, str] | None = None):
        super().__init__(spec)
        self.labels = dict(labels or {})


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


BUCKET_NAMING_PAGE = "https://docs.cloud.google.com/storage/docs/buckets#naming"
PLACEHOLDER = re.compile(r"YOUR_[A-Z0-9_]+")  # gs://YOUR_BUCKET, YOUR_PROJECT: the course's stand-ins


def bucket_problem(bucket: str) -> str | None:
    """Which of Cloud Storage's bucket naming rules `bucket` breaks (None: none), as
    `BUCKET_NAMING_PAGE` states them (read 2026-11-28)."""
    parts = bucket.split(".")
    if not re.fullmatch(r"[a-z0-9._-]+", bucket):
        return "may hold only lowercase letters, digits, dashes, underscores and dots"
    if not (bucket[0].isalnum() and bucket[-1].isalnum()):
        return "must start and end with a letter or a digit"
    if not 3 <= len(bucket) <= (222 if len(parts) > 1 else 63) or any(not 1 <= len(p) <= 63 for p in parts):
        return "must be 3 to 63 characters (up to 222 with dots, each part between dots 1 to 63)"
    if re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", bucket):
        return "cannot be an IP address"
    if bucket.startswith("goog") or re.search(r"g[o0]{2}g[l1]e", bucket):
        return "cannot begin with 'goog' or contain 'google' (or a close misspelling)"
    return None


def check_output_uri(uri: Any, name: str = "output_uri", *, placeholder_ok: bool = True) -> str:
    """A job's outputs must go to Cloud Storage: any other path is the container's own disk,
    lost at every restart (checkpoints included). The bucket must be one Cloud Storage could
    hold (`bucket_problem`); the course's placeholder ``gs://YOUR_BUCKET`` passes only where
    `placeholder_ok` (a spec shown, never one submitted: `refuse_placeholders`)."""
    check_str(name, uri)
    if not uri.startswith("gs://") or len(uri.rstrip("/")) <= len("gs://") or uri[5] == "/":
        raise ParameterError(name, uri, "must be a gs://BUCKET/path address: any other path is the "
                             "container's own disk, lost when the job restarts")
    bucket = uri[len("gs://"):].split("/", 1)[0]
    if PLACEHOLDER.fullmatch(bucket):
        if placeholder_ok:
            return uri
        raise ParameterError(name, uri, f"names the placeholder bucket {bucket}: set it to a bucket of yours")
    problem = bucket_problem(bucket)
    if problem:
        raise ParameterError(name, uri, f"names bucket {bucket!r}, which {problem} "
                             f"({BUCKET_NAMING_PAGE}, read 2026-11-28)")
    return uri


def with_bucket(spec: Mapping[str, Any], bucket: str) -> dict[str, Any]:
    """`spec` with the placeholder bucket (``gs://YOUR_BUCKET``, ``/gcs/YOUR_BUCKET``) replaced by
    `bucket` everywhere: for a local stand-in of the service, never for a real submission."""
    text = json.dumps(spec)
    for scheme in ("gs://", "/gcs/"):
        text = re.sub(re.escape(scheme) + PLACEHOLDER.pattern, scheme + bucket, text)
    out = json.loads(text)
    return JobSpec(out, labels=spec.labels) if isinstance(spec, JobSpec) else out


def refuse_placeholders(value: Any, where: str = "spec", *, skip: frozenset[str] = frozenset()) -> None:
    """ParameterError naming the first field of `value` (a spec: mappings, lists, text) that
    still holds a placeholder such as ``gs://YOUR_BUCKET`` or ``YOUR_PROJECT``: a job carrying
    one would fail on the service, after its machines were billed. Fields named in `skip` are
    not looked at."""
    if isinstance(value, str):
        found = PLACEHOLDER.search(value)
        if found:
            raise ParameterError(where, value, f"still holds the placeholder {found.group(0)}: replace it with "
                                 "your own before submitting (nothing was submitted)")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in skip:
                refuse_placeholders(item, f"{where}.{key}", skip=skip)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            refuse_placeholders(item, f"{where}[{i}]", skip=skip)


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(env: Any, name: str = "env") -> dict[str, str]:
    """A container's environment: a mapping of variable names to values (str, int, float or
    bool, sent as text), e.g. ``{"NCCL_DEBUG": "INFO"}`` (`labkit.vertex.nccl` lists the NCCL
    variables that matter on GPU jobs). Returns it with every value as text."""
    if not isinstance(env, Mapping):
        raise ParameterError(name, env, "must be a mapping of variable names to values, e.g. "
                             "{'NCCL_DEBUG': 'INFO'}")
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ParameterError(name, key, "has a key that is not an environment variable name "
                                 "(letters, digits and _, not starting with a digit)")
        if value is None or isinstance(value, Mapping | list | tuple | set):
            raise ParameterError(f"{name}[{key!r}]", value, "must be a str, int, float or bool")
        out[key] = str(value)
    return out


def _is_gpu(accelerator_type: str | None) -> bool:
    return bool(accelerator_type) and str(accelerator_type).startswith("NVIDIA_")


@dataclass
class PoolConfig:
    """One worker pool: machine, accelerators (or TPU topology), disk, replicas, the capacity it
    draws on and what the container runs."""

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
    tpu_topology: str | None = None  # TPU v5e / v6e / 7x VMs: e.g. "2x2"
    reservation: str | None = None  # "any" or projects/P/zones/Z/reservations/R

    def __post_init__(self) -> None:
        check_str("machine_type", self.machine_type)
        check_int("replica_count", self.replica_count, minimum=1)
        check_int("accelerator_count", self.accelerator_count, minimum=0)
        check_str("image_uri", self.image_uri)
        check_int("boot_disk_size_gb", self.boot_disk_size_gb)
        self.env = check_env(self.env)
        if self.accelerator_count and not self.accelerator_type:
            raise ParameterError("accelerator_type", self.accelerator_type,
                                 f"must be set when accelerator_count is {self.accelerator_count}")
        if self.accelerator_type and not self.accelerator_count:
            raise ParameterError("accelerator_count", self.accelerator_count,
                                 f"must be >= 1 with accelerator_type {self.accelerator_type!r}")
        if self.accelerator_type:
            _check_accelerator(self.accelerator_type)
        check_machine(self.machine_type, self.accelerator_type, self.accelerator_count,
                      tpu_topology=self.tpu_topology)
        if self.boot_disk_type is None:
            self.boot_disk_type = boot_disk_type(self.machine_type)
        check_boot_disk(self.machine_type, self.boot_disk_type, size_gb=self.boot_disk_size_gb)
        self._affinity = reservation_affinity(self.reservation)
        check_image(self.image_uri)

    def to_spec(self) -> dict[str, Any]:
        machine: dict[str, Any] = {"machine_type": self.machine_type}
        if self.accelerator_type:
            machine |= {"accelerator_type": self.accelerator_type,
                        "accelerator_count": self.accelerator_count}
        if self.tpu_topology:
            machine["tpu_topology"] = self.tpu_topology
        if self._affinity:
            machine["reservation_affinity"] = self._affinity
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
    does not change; NCCL's all-reduce goes through the reducers (the training image needs the
    google-reduction-server plugin, which labkit's image has)."""
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
    flex_start: bool = False,
    max_wait_s: int | None = None,
    restart_job_on_worker_restart: bool = False,
    timeout_s: int | None = None,
    service_account: str | None = None,
    persistent_resource_id: str | None = None,
    tensorboard: str | None = None,
    labels: Mapping[str, str] | None = None,
    enable_web_access: bool = False,
) -> JobSpec:
    """A CustomJobSpec dict. Skipped pools before the last used one are written as ``{}``.
    `enable_web_access`: an interactive shell into each node while the job runs, at the URIs
    the job then lists as ``web_access_uris`` (`labkit.vertex.cloud_profile`).
    `timeout_s` defaults to `labkit.vertex.scheduling.DEFAULT_TIMEOUT_S` (Vertex's own default
    is 7 days); `flex_start` asks for Dynamic Workload Scheduler capacity, waiting at most
    `max_wait_s` (Vertex's default: one day; 0: indefinitely)."""
    if primary.replica_count != 1:
        raise ParameterError("replica_count", primary.replica_count,
                             "of the primary pool (workerpool0) must be 1; put more replicas in workers")
    check_bool("spot", spot)
    check_bool("flex_start", flex_start)
    check_bool("restart_job_on_worker_restart", restart_job_on_worker_restart)
    check_bool("enable_web_access", enable_web_access)
    check_tensorboard(tensorboard, service_account)
    if pool2 is not None and is_reduction_server_image(pool2.image_uri):
        # A replica cannot tell from CLUSTER_SPEC.cluster alone that pool 2 reduces rather than
        # serves parameters: say so to every pool that runs the training code.
        role = {POOL2_ROLE_ENV: "reduction_server"}
        primary, workers, evaluators = (p and replace(p, env={**p.env, **role})
                                        for p in (primary, workers, evaluators))
    pools = [primary, workers, pool2, evaluators]
    while pools[-1] is None:
        pools.pop()
    spec = JobSpec({"worker_pool_specs": [p.to_spec() if p else {} for p in pools]},
                   labels=check_labels(labels))
    spec["scheduling"] = scheduling(spot=spot, flex_start=flex_start, timeout_s=timeout_s,
                                    max_wait_s=max_wait_s,
                                    restart_job_on_worker_restart=restart_job_on_worker_restart)
    if output_uri is not None:
        spec["base_output_directory"] = {"output_uri_prefix": check_output_uri(output_uri)}
    if service_account:
        check_str("service_account", service_account)
        spec["service_account"] = service_account
    if persistent_resource_id:
        check_str("persistent_resource_id", persistent_resource_id)
        spec["persistent_resource_id"] = persistent_resource_id
    if tensorboard:
        spec["tensorboard"] = tensorboard
    if enable_web_access:
        spec["enable_web_access"] = True
    if has_aiplatform():  # without the library the spec is still built and checked
        validate(spec)
    else:
        check_spec(spec)
    return spec


def setup_command(steps: Sequence[str]) -> list[str]:
    """A command that runs the shell `steps` (set-up), then execs the container's args."""
    return ["bash", "-c", " && ".join([*steps, 'exec "$@"']), SETUP_MARKER]


def _install_step(requirements: Sequence[str], package_uri: str | None) -> str:
    """Prebuilt images lack labkit and papermill: install them first."""
    pkgs = [gcs_fuse_path(package_uri)] if package_uri else []
    pkgs += list(requirements)
    return "pip install --quiet " + " ".join(shlex.quote(p) for p in pkgs)


def labkit_container(framework: str, *, output_uri: str, image_uri: str | None = None,
                     package_uri: str | None = None, requirements: Sequence[str] = (),
                     nccl_env: bool = False, install: Sequence[str] = ()) -> dict[str, Any]:
    """``{"image_uri", "command"}`` of a container that can run ``python -m labkit...``.

    By default labkit's own image (`labkit.vertex.images.default_image`), which has labkit and
    its framework. On a Vertex prebuilt image, or when `package_uri` is given, the command first
    pip-installs labkit from `package_uri` (default ``<output_uri>/inputs/labkit.tar.gz``, which
    `submit` uploads) and `requirements`. A prebuilt image whose framework is older than labkit
    needs, or past its end of availability, is refused (`images.check_image`). `nccl_env`: first
    source Google's NCCL set-up (`NCCL_ENV_SCRIPT`) and put gIB's libraries on the loader path
    (`nccl.gib_loader_path_step`), for multi-node jobs on RDMA machines. `install`: packages the
    job needs on any image (the TensorBoard Profiler's), pip-installed last."""
    if framework not in ("torch", "tf"):
        raise ParameterError("framework", framework, "must be one of ['tf', 'torch']")
    image = image_uri or default_image(framework)
    check_image(image)
    steps = [f"source {NCCL_ENV_SCRIPT}", gib_loader_path_step()] if nccl_env else []
    if prebuilt(image) is not None or package_uri is not None:
        package_uri = package_uri or _join(output_uri, "inputs", "labkit.tar.gz")
        steps.append(_install_step(requirements, package_uri))
    if install:
        steps.append(_install_step(install, None))
    return {"image_uri": image, "command": setup_command(steps) if steps else []}


@dataclass(frozen=True)
class Capacity:
    """What a job runs on and when, shared by the job builders: Spot or DWS flex-start, a
    timeout, a persistent resource, a reservation, labels, TensorBoard and its service account."""

    spot: bool = False
    flex_start: bool = False
    max_wait_s: int | None = None
    timeout_s: int | None = None
    persistent_resource_id: str | None = None
    reservation: str | None = None
    labels: Mapping[str, str] | None = None
    tensorboard: str | None = None
    service_account: str | None = None
    enable_web_access: bool = False

    def job_options(self) -> dict[str, Any]:
        return {"spot": self.spot, "flex_start": self.flex_start, "max_wait_s": self.max_wait_s,
                "timeout_s": self.timeout_s, "persistent_resource_id": self.persistent_resource_id,
                "tensorboard": self.tensorboard, "service_account": self.service_account,
                "labels": self.labels, "enable_web_access": self.enable_web_access}


def check_no_tpu(machine_type: str, accelerator_type: str | None, accelerator_count: int,
                 tpu_topology: str | None, framework: str) -> None:
    """Refuse a TPU machine for a job that runs labkit's own code (`labkit train`, a notebook).

    labkit's engines and notebooks run PyTorch on CUDA or TensorFlow with GPU strategies; neither
    has an XLA/TPU path here (no torch_xla, no TPUStrategy), and labkit's images are CUDA builds.
    On a TPU VM the job would train on the host's CPU and be billed at TPU prices. A valid TPU
    request is refused naming `machine_type` and the reason; an invalid one keeps the error that
    says what is wrong with it (`check_machine`)."""
    if not is_tpu(machine_type):
        return
    check_machine(machine_type, accelerator_type, accelerator_count, tpu_topology=tpu_topology)
    name = {"torch": "PyTorch", "tf": "TensorFlow"}.get(framework, framework)
    raise ParameterError("machine_type", machine_type,
                         f"is a TPU machine, and labkit's {name} training and notebooks have no TPU "
                         f"path (CUDA builds, no torch_xla or TPUStrategy): the job would run on the "
                         f"TPU host's CPU at TPU prices; choose a GPU machine type, or run your own "
                         f"TPU code in your own image with `labkit job --image`")


def _pools_for(
    args: list[str], *, output_uri: str, machine_type: str, accelerator_type: str | None,
    accelerator_count: int, replica_count: int, image_uri: str | None, framework: str,
    env: Mapping[str, str] | None, requirements: Sequence[str], package_uri: str | None, boot_disk_size_gb: int,
    reduction_server_count: int | str, reduction_server_machine_type: str, tpu_topology: str | None,
    reservation: str | None, install: Sequence[str] = (),
) -> tuple[PoolConfig, PoolConfig | None, PoolConfig | None]:
    check_int("replica_count", replica_count, minimum=1)
    if reduction_server_count != "auto":
        check_int("reduction_server_count", reduction_server_count, minimum=0)
    check_no_tpu(machine_type, accelerator_type, accelerator_count, tpu_topology, framework)
    image = image_uri or default_image(framework)
    check_image_gpu(image, accelerator_type, machine_type=machine_type, accelerator_count=accelerator_count)
    arch = image_arch(image)
    if machine_arch(machine_type) != "amd64" and arch not in (None, machine_arch(machine_type)):
        raise ParameterError("machine_type", machine_type,
                             f"runs on {machine_arch(machine_type)} (Arm) CPUs, and image {image} is "
                             f"built for {arch}; build an arm64 image and pass it as image_uri "
                             f"({A4X_ON_ARM})")
    if needs_reservation(machine_type, accelerator_type) and reservation is None:
        raise ParameterError("reservation", reservation,
                             f"is required on {machine_type}: GB200 capacity is obtained only through "
                             f"shared reservations ({cite(CONFIGURE_COMPUTE)}; {RESERVATIONS_PAGE})")
    nccl_env = replica_count > 1 and needs_nccl_env_script(machine_type)
    container = labkit_container(framework, output_uri=output_uri, image_uri=image_uri,
                                 package_uri=package_uri, requirements=requirements, nccl_env=nccl_env,
                                 install=install)
    pool = {"machine_type": machine_type, "accelerator_type": accelerator_type,
            "accelerator_count": accelerator_count, **container, "args": args,
            "env": check_env(env if env is not None else {}), "boot_disk_size_gb": boot_disk_size_gb,
            "tpu_topology": tpu_topology, "reservation": reservation}
    primary = PoolConfig(replica_count=1, **pool)
    workers = PoolConfig(replica_count=replica_count - 1, **pool) if replica_count > 1 else None
    reducers = None
    if reduction_server_count:  # a count of the user's own is kept; "auto" may propose none
        count = check_reducers(reduction_server_count, replica_count, machine_type, accelerator_type,
                               reduction_server_machine_type, accelerator_count)
        reducers = reduction_server_pool(count, reduction_server_machine_type) if count else None
    return primary, workers, reducers


def _gpu_device(accelerator_type: str | None, accelerator_count: int) -> bool:
    """Whether the job asks for GPUs, and so passes ``--device cuda``."""
    return _is_gpu(accelerator_type) and accelerator_count > 0


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
    reduction_server_count: int | str = 0,
    reduction_server_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
    framework: str = "torch",
    env: Mapping[str, str] | None = None,
    package_uri: str | None = None,
    requirements: Sequence[str] = ("papermill", "ipykernel"),
    boot_disk_size_gb: int = 100,
    timeout_s: int | None = None,
    restart_job_on_worker_restart: bool | None = None,
    cell_timeout_s: int | None = DEFAULT_CELL_TIMEOUT_S,
    tpu_topology: str | None = None,
    flex_start: bool = False,
    max_wait_s: int | None = None,
    persistent_resource_id: str | None = None,
    reservation: str | None = None,
    labels: Mapping[str, str] | None = None,
    tensorboard: str | None = None,
    service_account: str | None = None,
    enable_web_access: bool = False,
) -> JobSpec:
    """CustomJobSpec that runs `notebook` with papermill and `parameters` in a container and
    writes the executed notebook, its kernel log (``<name>.log``) and the files it makes
    (``artifacts/``) under ``<output_uri>/notebooks/``. The notebook runs in a folder on the VM's
    disk and those files are copied there every minute, at each committed checkpoint and at the
    end (`labkit.vertex.entry`, `labkit.vertex.mirror`), so nothing is worked on through the
    ``/gcs/`` mount and nothing stays behind on the VM.

    `notebook` is a ``gs://`` URI, or a local path that `submit` uploads to
    ``<output_uri>/inputs/<name>`` first. A local notebook's `parameters` are checked against
    its parameters cell before anything is built, as `labkit run` checks them (names, types,
    and the values of shared parameters such as ``scale``); of a notebook not readable here
    (``gs://``) only the shared parameters can be checked. `cell_timeout_s` bounds each cell (None: no limit).
    The container is labkit's image for `framework` (`image_uri=None`; it has labkit, papermill
    and the framework) or `image_uri`; on a Vertex prebuilt image, or with `package_uri`, it
    first pip-installs `requirements` and labkit from `package_uri` (see `labkit_container`).
    Buckets are read and written through the ``/gcs/`` mount. The capacity options are
    `custom_job_spec`'s; `reservation` and `tpu_topology` go to the training pools.
    """
    check_str("notebook", notebook)
    check_output_uri(output_uri)
    params = dict(parameters or {})
    try:
        params_json = json.dumps(params, sort_keys=True)
    except TypeError as e:
        raise ParameterError("parameters", params, f"must be JSON values ({e})") from e
    if not notebook.startswith("gs://") and Path(notebook).is_file():
        check_parameters(notebook, params)
    else:  # not readable here (a gs:// notebook, or one `submit` will look for): what all share
        for name, value in params.items():
            check_shared_domain(name, value, PurePosixPath(notebook).name)
    check_int("cell_timeout_s", cell_timeout_s, minimum=1, allow_none=True)
    source = notebook if notebook.startswith("gs://") else _join(output_uri, "inputs", PurePosixPath(notebook).name)
    out_dir = _join(output_uri, "notebooks")
    stem = PurePosixPath(notebook).stem
    args = ["python", "-m", "labkit.vertex.entry", "notebook", gcs_fuse_path(source),
            gcs_fuse_path(out_dir), "--parameters", params_json,
            "--artifacts", gcs_fuse_path(_join(out_dir, "artifacts", stem)),
            "--cell-timeout", str(cell_timeout_s or 0)]
    if _gpu_device(accelerator_type, accelerator_count):
        args += ["--device", "cuda"]
    pools = _pools_for(args, output_uri=output_uri, machine_type=machine_type,
                       accelerator_type=accelerator_type,
                       accelerator_count=accelerator_count, replica_count=replica_count,
                       image_uri=image_uri, framework=framework, env=env, requirements=requirements,
                       package_uri=package_uri, boot_disk_size_gb=boot_disk_size_gb,
                       reduction_server_count=reduction_server_count,
                       reduction_server_machine_type=reduction_server_machine_type,
                       tpu_topology=tpu_topology, reservation=reservation)
    restart = replica_count > 1 if restart_job_on_worker_restart is None else restart_job_on_worker_restart
    capacity = Capacity(spot, flex_start, max_wait_s, timeout_s, persistent_resource_id, reservation,
                        {"labkit-job": "notebook", **dict(labels or {})}, tensorboard, service_account,
                        enable_web_access)
    return custom_job_spec(*pools, output_uri=output_uri, restart_job_on_worker_restart=restart,
                           **capacity.job_options())


# What a training job writes that must outlive its VM: a Spot or failed-replica restart starts
# on a fresh VM, so a checkpoint on the old one's disk is gone and the run starts from step 0.
LASTING_OUTPUTS = ("checkpoint_dir", "metrics_out", "tensorboard_dir")


def lasting_outputs(cfg: TrainConfig) -> dict[str, str]:
    """The job's output settings in the form the container reads (``gs://`` as its ``/gcs/``
    path); a local path is refused, naming the setting and what to give instead."""
    out = {}
    for name in LASTING_OUTPUTS:
        value = getattr(cfg, name)
        if value is None:
            continue
        if str(value).startswith("gs://"):
            out[name] = gcs_fuse_path(str(value))
        elif not (str(value) == GCS_MOUNT or str(value).startswith(GCS_MOUNT + "/")):
            raise ParameterError(name, value, "is a path on the job's VM, and a restart (Spot, a failed "
                                 "replica) starts on a fresh one without it: give gs://BUCKET/PATH or "
                                 "/gcs/BUCKET/PATH, or leave it unset for the job's output folder")
    return out


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
    reduction_server_count: int | str = 0,
    reduction_server_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
    env: Mapping[str, str] | None = None,
    package_uri: str | None = None,
    requirements: Sequence[str] = (),
    boot_disk_size_gb: int = 100,
    timeout_s: int | None = None,
    restart_job_on_worker_restart: bool | None = None,
    processes_per_node: int | None = None,
    command: Sequence[str] | None = None,
    tpu_topology: str | None = None,
    flex_start: bool = False,
    max_wait_s: int | None = None,
    persistent_resource_id: str | None = None,
    reservation: str | None = None,
    labels: Mapping[str, str] | None = None,
    tensorboard: str | None = None,
    service_account: str | None = None,
    enable_web_access: bool = False,
    tensorboard_profiler: bool = False,
) -> JobSpec:
    """CustomJobSpec running ``python -m labkit train`` on every training replica.

    `command`: another program that takes the `labkit train` flags after its own (a tuning
    trial runs ``python -m labkit.vertex.trial ...``); it then gets no default output
    locations, and `processes_per_node` is its business.

    With several GPUs per node (torch), each node runs `processes_per_node` processes (default:
    `accelerator_count`) through torchrun, so the global rank is RANK x gpus + local rank. A job
    with GPUs trains with ``--device cuda`` (``device="cpu"`` with GPUs is refused).

    Unless `config` names them, checkpoints go to ``<output_uri>/checkpoints`` (what Vertex
    also exports as AIP_CHECKPOINT_DIR) and metrics to ``<output_uri>/metrics.json``, through
    the ``/gcs/`` mount; TensorBoard logs go where Vertex points AIP_TENSORBOARD_LOG_DIR (the
    engines read it at start), which is what Vertex AI TensorBoard (`tensorboard`) uploads.
    The container is chosen as in `notebook_job` (`labkit_container`). Multi-replica jobs
    restart as a whole when one replica fails (DDP and MultiWorkerMirrored cannot lose a
    member), unless told otherwise. The capacity options are `custom_job_spec`'s.

    `enable_web_access`: an interactive shell into each node while it runs. `tensorboard_profiler`
    (TensorFlow, with a `tensorboard`): the Vertex AI TensorBoard Profiler captures traces from
    the running job; the image gets the SDK's profiler and training starts under it
    (`labkit.vertex.cloud_profile`).
    """
    check_output_uri(output_uri)
    check_bool("tensorboard_profiler", tensorboard_profiler)
    cfg = train_config(config)
    if tensorboard_profiler:
        check_profiler_job(cfg.framework, tensorboard)
    updates: dict[str, Any] = lasting_outputs(cfg)
    if command is None:
        if cfg.checkpoint_dir is None:
            updates["checkpoint_dir"] = gcs_fuse_path(_join(output_uri, "checkpoints"))
        if cfg.metrics_out is None:
            updates["metrics_out"] = gcs_fuse_path(_join(output_uri, "metrics.json"))
    if _gpu_device(accelerator_type, accelerator_count):
        if cfg.device == "cpu":
            raise ParameterError("device", cfg.device, f"must be 'cuda' or 'auto' in a job that asks for "
                                 f"{accelerator_count} x {accelerator_type} (it would pay for GPUs it "
                                 "does not use)")
        updates["device"] = "cuda"
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
    if tensorboard_profiler:
        args = profiled(args)
    pools = _pools_for(args, output_uri=output_uri, machine_type=machine_type,
                       accelerator_type=accelerator_type,
                       accelerator_count=accelerator_count, replica_count=replica_count,
                       image_uri=image_uri, framework=cfg.framework, env=env,
                       requirements=requirements, package_uri=package_uri,
                       boot_disk_size_gb=boot_disk_size_gb,
                       reduction_server_count=reduction_server_count,
                       reduction_server_machine_type=reduction_server_machine_type,
                       tpu_topology=tpu_topology, reservation=reservation,
                       install=[PROFILER_REQUIREMENT] if tensorboard_profiler else [])
    restart = replica_count > 1 if restart_job_on_worker_restart is None else restart_job_on_worker_restart
    kind = "tuning-trial" if command is not None else "training"
    capacity = Capacity(spot, flex_start, max_wait_s, timeout_s, persistent_resource_id, reservation,
                        {"labkit-job": kind, **dict(labels or {})}, tensorboard, service_account,
                        enable_web_access)
    return custom_job_spec(*pools, output_uri=output_uri, restart_job_on_worker_restart=restart,
                           **capacity.job_options())


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


_get = field_of


def check_spec(spec: Mapping[str, Any]) -> None:
    """Framework-free checks of a CustomJobSpec dict (proto or REST names), each error naming
    the field: a primary pool with exactly one replica, no used pool with fewer than one
    replica (Vertex's default replica_count is 0), machines, accelerators, TPU topologies and
    boot disks from `labkit.vertex.machines`, a TPU job in one pool of one replica, the
    scheduling and capacity rules of `labkit.vertex.scheduling`, a ``gs://`` base output
    directory, and no prebuilt image too old for labkit."""
    pools = _get(spec, "worker_pool_specs")
    if not isinstance(pools, list) or not pools or not pools[0]:
        raise ValueError("spec.worker_pool_specs[0]: the primary pool is required")
    used = [(i, pool) for i, pool in enumerate(pools) if pool]
    for i, pool in used:
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
                          where + "machine_spec.", tpu_topology=_get(machine, "tpu_topology") or None)
            if is_tpu(machine_type) and (len(used) > 1 or count != 1):
                raise ParameterError(where + "machine_spec.machine_type", machine_type,
                                     "is a TPU VM: a TPU job uses a single worker pool of one replica "
                                     f"({cite(CONFIGURE_COMPUTE)})")
            disk = _get(pool, "disk_spec") or {}
            size = _get(disk, "boot_disk_size_gb")
            check_boot_disk(machine_type, _get(disk, "boot_disk_type") or boot_disk_type(machine_type),
                            where + "disk_spec.", None if size in (None, "", 0, "0") else int(size))
        image = _get(_get(pool, "container_spec") or {}, "image_uri")
        if image:
            check_image(image)
    base = (_get(spec, "base_output_directory") or {})
    prefix = _get(base, "output_uri_prefix") if base else None
    if prefix:
        check_output_uri(prefix, "base_output_directory.output_uri_prefix")
    check_scheduling(spec, pools)


def validate(spec: Mapping[str, Any]):
    """Check `spec` with `check_spec` and against the aiplatform_v1 types; returns the
    CustomJobSpec message.

    Raises ValueError naming the field when a name or value is not accepted, or when a value
    does not survive the round trip through `to_dict` (a silently dropped field)."""
    require("google.cloud.aiplatform")
    from google.cloud.aiplatform_v1.types import CustomJobSpec

    message = through_types(CustomJobSpec, spec)
    check_spec(spec)
    return message


def through_types(message_type: Any, spec: Mapping[str, Any]):
    """`spec` as a `message_type` (an aiplatform proto class) message, refusing what the types
    reject and any field that does not survive the round trip through `to_dict` (a silently
    dropped value, a second member of a oneof): ValueError naming the type and the field."""
    name = message_type.__name__
    try:
        message = message_type(**spec)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{name} rejected the spec: {type(e).__name__}: {e}") from e
    as_dict = message_type.to_dict(message, use_integers_for_enums=False)
    if message_type(**as_dict) != message:
        raise ValueError(f"{name}: the spec does not round-trip through to_dict")
    bad = first_mismatch(dict(spec), as_dict, "spec")
    if bad:
        raise ValueError(f"{name}: field {bad} did not survive the round trip through to_dict")
    return message


def to_rest_json(spec: Mapping[str, Any]) -> str:
    """The spec as the REST API shows it (camelCase, enum names), for printing."""
    if not has_aiplatform():
        return json.dumps(spec, indent=2)  # proto field names; the library would camelCase them
    from google.cloud.aiplatform_v1.types import CustomJobSpec

    return CustomJobSpec.to_json(CustomJobSpec(**spec), always_print_fields_with_no_presence=False,
                                 use_integers_for_enums=False, indent=2)
