"""Vertex AI's own notebook executor: a NotebookExecutionJob, beside labkit's CustomJob path.

`labkit.vertex.notebook_job` runs papermill inside labkit's image as a CustomJob. Vertex also
runs notebooks itself: a NotebookExecutionJob (``projects.locations.notebookExecutionJobs``,
what the Workbench executor and Colab Enterprise executions create) runs an ``.ipynb`` from
Cloud Storage on one VM and writes the executed notebook to Cloud Storage. This module builds
that job as a plain dict in the proto field names, checks it offline and describes it:

* `notebook_execution_job(...)` -> `NotebookExecutionSpec` (a dict that
  ``aiplatform_v1.types.NotebookExecutionJob(**spec)`` accepts, carrying the local notebook and
  its parameters to `labkit.vertex.submit_notebook_execution`);
* `check_notebook_execution(spec)` (framework-free) and `validate_notebook_execution(spec)` (the
  aiplatform types, no field silently dropped);
* `notebook_content(notebook, parameters)`: the notebook as uploaded, parameters written in;
* `execution_rest_json(spec)`, `gcloud_command(spec, region)` and `gcloud_gaps(spec)` for a dry run.

What the protos of google-cloud-aiplatform 2.7.0 offer (``aiplatform_v1`` and ``aiplatform_v1beta1``
have the same fields): a notebook source (``gcs_notebook_source`` {uri, generation},
``direct_notebook_source`` {content}, ``dataform_repository_source``), compute from
``custom_environment_spec`` {machine_spec, persistent_disk_spec, network_spec} or a Colab
``notebook_runtime_template_resource_name``, ``workbench_runtime`` {} (a Workbench execution),
``kernel_name``, ``gcs_output_uri``, ``service_account`` or ``execution_user`` ("Only supported by
Colab runtimes"), ``execution_timeout`` (default 86400 s), ``labels``, ``encryption_spec``. Neither
version has a parameters field, a container image, or any scheduling (no Spot, no flex-start,
no reservation, one VM: no replicas, no Reduction Server).

**Parameters.** The service passes none: it runs the notebook it reads as it is. labkit checks
the values against the notebook's ``parameters`` cell (`check_parameters`, as `notebook_job`
does) and writes them in the way papermill does, as an ``injected-parameters`` cell after that
cell, in the copy `submit_notebook_execution` uploads to ``<output_uri>/inputs/<name>``. A
``gs://`` notebook is not changed here, so it takes no parameters.

**Image and kernel.** The executor runs the notebook in the Workbench runtime's own image with
the kernel `kernel_name` (default ``python3``), not in labkit's image: labkit, papermill and a
training framework are there only if the notebook installs them (a first ``%pip install ...``
cell, e.g. of a labkit wheel in your bucket) or `kernel_name` names a kernel that has them.
`imports_without_install` says when a notebook imports labkit and installs nothing.

Sources (read 2026-11-29): the REST reference of the resource (`REST_PAGE`); ``gcloud workbench
executions create`` (`GCLOUD_PAGE`): a Workbench execution is ``custom_environment_spec`` +
``workbench_runtime`` + ``kernel_name`` (default ``python3``) + a required ``--service-account``,
``--machine-type`` default ``e2-standard-4``, disk types PD_STANDARD, PD_SSD, PD_BALANCED,
PD_EXTREME, disk size 10 to 65,536 GB, internet access on unless ``--no-enable-internet-access``
(the API's own default is off); the Cloud SDK's flag definitions
(``googlecloudsdk/command_lib/colab_enterprise/flags.py``, release 528.0.0) list the GPUs its
``--accelerator-type`` takes (`GCLOUD_ACCELERATORS`). The executor's own list of machine types
is not published on those pages: machines and GPU counts are checked against Vertex's training
table (`labkit.vertex.machines.check_machine`), and TPUs are refused.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from labkit.core.config import ParameterError, check_bool, check_int, check_str
from labkit.core.frameworks import has_aiplatform, require
from labkit.core.notebook_params import check_parameters, check_shared_domain
from labkit.vertex.fields import field_of
from labkit.vertex.machines import check_machine, is_tpu
from labkit.vertex.scheduling import DEFAULT_TIMEOUT_S, check_labels, seconds
from labkit.vertex.specs import DEFAULT_MACHINE_TYPE, check_output_uri, through_types

READ_ON = "2026-11-29"
REST_PAGE = "https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.notebookExecutionJobs"
GCLOUD_PAGE = "https://docs.cloud.google.com/sdk/gcloud/reference/workbench/executions/create"
DEFAULT_KERNEL = "python3"
SERVICE_DEFAULT_TIMEOUT_S = 86400  # REST_PAGE: executionTimeout "default 86400s / 24 hrs"
# PersistentDiskSpec.disk_type (its proto comment), as gcloud's --disk-type choices lower-cased.
DISK_TYPES = ("pd-standard", "pd-ssd", "pd-balanced", "pd-extreme")
DISK_GB = (10, 65_536)  # --disk-size-gb's help (GCLOUD_PAGE): "The minimum size is 10GB and the maximum is 65536GB"
# The GPUs `gcloud workbench executions create --accelerator-type` takes (Cloud SDK 528.0.0).
GCLOUD_ACCELERATORS = ("NVIDIA_TESLA_V100", "NVIDIA_TESLA_T4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB",
                       "NVIDIA_L4")
SOURCES = ("gcs_notebook_source", "direct_notebook_source", "dataform_repository_source")
ENVIRONMENTS = ("custom_environment_spec", "notebook_runtime_template_resource_name")


def cite(url: str) -> str:
    return f"{url}, read {READ_ON}"


class NotebookExecutionSpec(dict):
    """A NotebookExecutionJob dict (``NotebookExecutionJob(**spec)`` accepts it) that also carries
    the local `notebook` it was built from (None for a ``gs://`` one) and the `parameters` that
    `submit_notebook_execution` writes into the copy it uploads."""

    def __init__(self, spec: Mapping[str, Any] = (), *, notebook: str | None = None,
                 parameters: Mapping[str, Any] | None = None):
        super().__init__(spec)
        self.notebook = notebook
        self.parameters = dict(parameters or {})


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *[p.strip("/") for p in parts]])


def _check_parameters(notebook: str, params: dict[str, Any]) -> None:
    """Names, kinds and shared domains against the notebook's parameters cell (a local notebook);
    a ``gs://`` notebook cannot be given values at all (nothing here may change it)."""
    try:
        json.dumps(params)
    except TypeError as e:
        raise ParameterError("parameters", params, f"must be JSON values ({e})") from e
    if notebook.startswith("gs://"):
        if params:
            raise ParameterError("parameters", params, "cannot be given to a gs:// notebook: a "
                                 "NotebookExecutionJob has no parameters field, so labkit writes them "
                                 "into a local notebook before uploading it; pass the local file")
        return
    if Path(notebook).is_file():
        check_parameters(notebook, params)
    else:  # `submit_notebook_execution` looks for it, and checks it then
        for name, value in params.items():
            check_shared_domain(name, value, PurePosixPath(notebook).name)


def _machine_spec(machine_type: str, accelerator_type: str | None, accelerator_count: int) -> dict[str, Any]:
    check_str("machine_type", machine_type)
    check_int("accelerator_count", accelerator_count, minimum=0)
    if accelerator_count and not accelerator_type:
        raise ParameterError("accelerator_type", accelerator_type,
                             f"must be set when accelerator_count is {accelerator_count}")
    if accelerator_type and not accelerator_count:
        raise ParameterError("accelerator_count", accelerator_count,
                             f"must be >= 1 with accelerator_type {accelerator_type!r}")
    _check_executor_machine(machine_type, accelerator_type, accelerator_count)
    machine: dict[str, Any] = {"machine_type": machine_type}
    if accelerator_type:
        machine |= {"accelerator_type": accelerator_type, "accelerator_count": accelerator_count}
    return machine


def _check_executor_machine(machine_type: str, accelerator_type: str | None, accelerator_count: int,
                            where: str = "") -> None:
    """A GPU or CPU machine as Vertex's training table allows it; no TPU (the executor runs one
    kernel on one VM, and gcloud offers it GPUs only)."""
    if is_tpu(machine_type) or str(accelerator_type or "").startswith("TPU_"):
        field_name, value = ("machine_type", machine_type) if is_tpu(machine_type) else \
            ("accelerator_type", accelerator_type)
        raise ParameterError(f"{where}{field_name}", value,
                             "is a TPU: the notebook executor runs one kernel on one VM with GPUs or none "
                             f"(gcloud offers it {', '.join(GCLOUD_ACCELERATORS)}; {cite(GCLOUD_PAGE)}); "
                             "use the CustomJob path (without --executor) for TPUs")
    if accelerator_type and has_aiplatform():
        from google.cloud.aiplatform_v1.types import AcceleratorType

        if accelerator_type not in AcceleratorType.__members__:
            known = ", ".join(n for n in AcceleratorType.__members__ if n.startswith("NVIDIA_"))
            raise ParameterError(f"{where}accelerator_type", accelerator_type,
                                 f"is not a Vertex accelerator ({known})")
    check_machine(machine_type, accelerator_type, accelerator_count, where)


def _disk(disk_type: str, disk_size_gb: int, where: str = "") -> dict[str, Any]:
    if disk_type not in DISK_TYPES:
        raise ParameterError(f"{where}disk_type", disk_type,
                             f"must be one of {', '.join(DISK_TYPES)} ({cite(GCLOUD_PAGE)})")
    check_int(f"{where}disk_size_gb", disk_size_gb, minimum=DISK_GB[0], maximum=DISK_GB[1])
    return {"disk_type": disk_type, "disk_size_gb": disk_size_gb}


def notebook_execution_job(
    notebook: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    output_uri: str,
    machine_type: str = DEFAULT_MACHINE_TYPE,
    accelerator_type: str | None = None,
    accelerator_count: int = 0,
    kernel_name: str = DEFAULT_KERNEL,
    display_name: str | None = None,
    service_account: str | None = None,
    timeout_s: int | None = None,
    labels: Mapping[str, str] | None = None,
    disk_type: str = "pd-standard",
    disk_size_gb: int = 100,
    internet_access: bool = True,
    network: str | None = None,
    subnetwork: str | None = None,
    kms_key_name: str | None = None,
    generation: str | None = None,
) -> NotebookExecutionSpec:
    """The NotebookExecutionJob that runs `notebook` on the Workbench executor, as a dict in
    the proto field names (``aiplatform_v1.types.NotebookExecutionJob(**spec)`` keeps every field).

    `notebook`: a ``gs://`` URI (run as it is; no `parameters`), or a local path that
    `submit_notebook_execution` uploads, with `parameters` written in, to
    ``<output_uri>/inputs/<name>``; a local notebook's parameters are checked against its
    parameters cell now. The executed notebook goes under ``<output_uri>/notebooks/``
    (``gcs_output_uri``). `output_uri` is checked as for every labkit job (a ``gs://`` bucket
    Cloud Storage could hold; the placeholder ``gs://YOUR_BUCKET`` is refused at submit).

    The VM: `machine_type` with `accelerator_count` x `accelerator_type` (GPU counts per
    machine from Vertex's table; no TPU), a `disk_type` / `disk_size_gb` persistent disk, and
    public internet access unless `internet_access` is False (the notebook usually pip-installs
    what it imports; the API's own default is no access). The kernel `kernel_name` runs in the
    Workbench runtime's image, not labkit's (see the module's note). `service_account`: the
    identity it runs as (gcloud requires one for Workbench executions; `submit_notebook_execution`
    does too). `timeout_s` bounds the whole run (``execution_timeout``; default
    `labkit.vertex.scheduling.DEFAULT_TIMEOUT_S`). `labels` join ``labkit-job: notebook-executor``.
    `kms_key_name`: a customer-managed key (``encryption_spec``). `generation`: a fixed version
    of a ``gs://`` notebook.
    """
    check_str("notebook", notebook)
    check_output_uri(output_uri)
    params = dict(parameters or {})
    _check_parameters(notebook, params)
    check_str("kernel_name", kernel_name)
    check_bool("internet_access", internet_access)
    name = PurePosixPath(notebook).name
    display_name = f"labkit-{PurePosixPath(notebook).stem}" if display_name is None else display_name
    check_str("display_name", display_name)
    if len(display_name) > 128:  # REST_PAGE: "can be up to 128 characters long"
        raise ParameterError("display_name", display_name, f"must be at most 128 characters ({cite(REST_PAGE)})")
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    check_int("timeout_s", timeout_s, minimum=1)
    source: dict[str, Any] = {"uri": notebook if notebook.startswith("gs://") else _join(output_uri, "inputs", name)}
    if generation is not None:
        if not notebook.startswith("gs://"):
            raise ParameterError("generation", generation, "applies to a gs:// notebook (the object's version); "
                                 "a local notebook is uploaded anew")
        source["generation"] = check_str("generation", str(generation))
    network_spec: dict[str, Any] = {"enable_internet_access": internet_access}
    network_spec |= {k: check_str(k, v) for k, v in (("network", network), ("subnetwork", subnetwork)) if v}
    spec: dict[str, Any] = {
        "display_name": display_name,
        "gcs_notebook_source": source,
        "custom_environment_spec": {
            "machine_spec": _machine_spec(machine_type, accelerator_type, accelerator_count),
            "persistent_disk_spec": _disk(disk_type, disk_size_gb),
            "network_spec": network_spec,
        },
        "workbench_runtime": {},
        "kernel_name": kernel_name,
        "gcs_output_uri": _join(output_uri, "notebooks"),
        "execution_timeout": f"{timeout_s}s",
        "labels": check_labels({"labkit-job": "notebook-executor", **dict(labels or {})}),
    }
    if service_account is not None:
        check_str("service_account", service_account)
        if "@" not in service_account:
            raise ParameterError("service_account", service_account,
                                 "must be a service account's email, NAME@PROJECT.iam.gserviceaccount.com")
        spec["service_account"] = service_account
    if kms_key_name:
        spec["encryption_spec"] = {"kms_key_name": check_str("kms_key_name", kms_key_name)}
    return NotebookExecutionSpec(spec, notebook=None if notebook.startswith("gs://") else notebook,
                                 parameters=params)


def notebook_content(notebook: str | Path, parameters: Mapping[str, Any] | None = None) -> bytes:
    """The notebook as the executor should run it: the file itself without `parameters`, else
    with them written in as papermill writes them (an ``injected-parameters`` cell after the
    cell tagged ``parameters``), checked against that cell first."""
    params = dict(parameters or {})
    path = Path(notebook)
    if not path.is_file():
        raise FileNotFoundError(f"notebook: no notebook at {path}")
    if not params:
        return path.read_bytes()
    check_parameters(path, params)
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nb = load_notebook_node(str(path))
    language = (nb.metadata.get("kernelspec") or {}).get("language") or "python"
    nb = parameterize_notebook(nb, params, language=language)
    return nbformat.writes(nb).encode("utf-8")


_IMPORTS_LABKIT = re.compile(r"^\s*(import|from)\s+labkit\b", re.MULTILINE)
_INSTALLS = re.compile(r"(%pip|!pip|pip3?\s+install|python -m pip)\b")


def imports_without_install(notebook: str | Path) -> bool:
    """Whether the notebook imports labkit but no cell installs anything: it would fail on the
    executor's runtime image, which has no labkit."""
    import nbformat

    code = "\n".join(c.source for c in nbformat.read(str(notebook), as_version=4).cells if c.cell_type == "code")
    return bool(_IMPORTS_LABKIT.search(code)) and not _INSTALLS.search(code)


# ---------------------------------------------------------------- checks

def _one_of(spec: Mapping[str, Any], names: tuple[str, ...], what: str) -> str:
    present = [n for n in names if field_of(spec, n) not in (None, "")]
    if len(present) != 1:
        raise ParameterError(what, present or None, f"needs exactly one of {', '.join(names)} "
                             f"({cite(REST_PAGE)})")
    return present[0]


def check_notebook_execution(spec: Mapping[str, Any]) -> None:
    """Framework-free checks of a NotebookExecutionJob dict (proto or REST names), each error
    naming the field: a display name, one notebook source (a ``gs://`` URI), one compute
    environment whose machine, GPUs and disk labkit's tables allow, a ``gs://`` output location,
    a positive timeout and labels the service accepts."""
    if not field_of(spec, "display_name"):
        raise ParameterError("display_name", field_of(spec, "display_name"), "is required")
    if _one_of(spec, SOURCES, "notebook_source") == "gcs_notebook_source":
        uri = field_of(field_of(spec, "gcs_notebook_source") or {}, "uri")
        if not str(uri or "").startswith("gs://"):
            raise ParameterError("gcs_notebook_source.uri", uri, "must be a gs://BUCKET/PATH.ipynb address")
    if _one_of(spec, ENVIRONMENTS, "environment_spec") == "custom_environment_spec":
        env = field_of(spec, "custom_environment_spec") or {}
        machine = field_of(env, "machine_spec") or {}
        machine_type = field_of(machine, "machine_type")
        if not machine_type:
            raise ParameterError("custom_environment_spec.machine_spec.machine_type", machine_type, "is required")
        accelerator = field_of(machine, "accelerator_type")
        accelerator = None if accelerator in (None, "", "ACCELERATOR_TYPE_UNSPECIFIED") else accelerator
        _check_executor_machine(machine_type, accelerator, int(field_of(machine, "accelerator_count") or 0),
                                "custom_environment_spec.machine_spec.")
        disk = field_of(env, "persistent_disk_spec") or {}
        if disk:
            _disk(field_of(disk, "disk_type") or DISK_TYPES[0], int(field_of(disk, "disk_size_gb") or 100),
                  "custom_environment_spec.persistent_disk_spec.")
    out = field_of(spec, "gcs_output_uri")
    if not out:
        raise ParameterError("gcs_output_uri", out, "is required: where the executed notebook is written")
    check_output_uri(out, "gcs_output_uri")
    timeout = seconds(field_of(spec, "execution_timeout"))
    if timeout is not None and timeout <= 0:
        raise ParameterError("execution_timeout", field_of(spec, "execution_timeout"), "must be positive")
    check_labels(field_of(spec, "labels"))


def _types(version: str):
    require("google.cloud.aiplatform")
    if version == "v1":
        from google.cloud.aiplatform_v1 import types
    elif version == "v1beta1":
        from google.cloud.aiplatform_v1beta1 import types
    else:
        raise ValueError(f"version must be 'v1' or 'v1beta1' (got {version!r})")
    return types


def validate_notebook_execution(spec: Mapping[str, Any], version: str = "v1"):
    """Check `spec` with `check_notebook_execution` and against the aiplatform `version` types;
    returns the NotebookExecutionJob message. Raises ValueError naming the field when a name or
    value is not accepted, or does not survive the round trip through `to_dict` (a field
    silently dropped, e.g. a second member of a oneof)."""
    message = through_types(_types(version).NotebookExecutionJob, spec)
    check_notebook_execution(spec)
    return message


# ---------------------------------------------------------------- describing it

def execution_rest_json(spec: Mapping[str, Any]) -> str:
    """The job as the REST API shows it (camelCase, enum names, unset fields left out)."""
    if not has_aiplatform():
        return json.dumps(spec, indent=2)
    from google.cloud.aiplatform_v1.types import NotebookExecutionJob

    return NotebookExecutionJob.to_json(NotebookExecutionJob(**spec), always_print_fields_with_no_presence=False,
                                        use_integers_for_enums=False, indent=2)


def _is_workbench(spec: Mapping[str, Any]) -> bool:
    return field_of(spec, "workbench_runtime") is not None and bool(field_of(spec, "custom_environment_spec"))


def gcloud_gaps(spec: Mapping[str, Any]) -> list[str]:
    """What of `spec` ``gcloud workbench executions create`` cannot say (empty: all of it)."""
    if not _is_workbench(spec) or not field_of(spec, "gcs_notebook_source"):
        return ["the gcloud command takes a Workbench execution of a gs:// notebook only"]
    gaps = []
    if field_of(spec, "labels"):
        gaps.append("labels (the command has no --labels flag)")
    machine = field_of(field_of(spec, "custom_environment_spec"), "machine_spec") or {}
    accelerator = field_of(machine, "accelerator_type")
    if accelerator and accelerator not in GCLOUD_ACCELERATORS:
        gaps.append(f"--accelerator-type {accelerator} (gcloud takes {', '.join(GCLOUD_ACCELERATORS)})")
    return gaps


def gcloud_command(spec: Mapping[str, Any], region: str) -> str | None:
    """The ``gcloud workbench executions create`` command for a Workbench execution of a
    ``gs://`` notebook (None for any other kind of NotebookExecutionJob), flags as
    `GCLOUD_PAGE` lists them; what it cannot carry is in `gcloud_gaps`. (Cloud SDK 528.0.0
    has the command in its beta track only: ``gcloud beta workbench executions create``.)"""
    if not _is_workbench(spec) or not field_of(spec, "gcs_notebook_source"):
        return None
    env = field_of(spec, "custom_environment_spec")
    machine = field_of(env, "machine_spec") or {}
    disk = field_of(env, "persistent_disk_spec") or {}
    network = field_of(env, "network_spec") or {}
    source = field_of(spec, "gcs_notebook_source")
    flags = [f"--region={region}", f"--display-name={field_of(spec, 'display_name')}",
             f"--gcs-notebook-uri={field_of(source, 'uri')}"]
    if field_of(source, "generation"):
        flags.append(f"--generation={field_of(source, 'generation')}")
    flags += [f"--gcs-output-uri={field_of(spec, 'gcs_output_uri')}",
              f"--service-account={field_of(spec, 'service_account') or 'YOUR_SERVICE_ACCOUNT'}",
              f"--kernel-name={field_of(spec, 'kernel_name') or DEFAULT_KERNEL}",
              f"--machine-type={field_of(machine, 'machine_type')}"]
    if field_of(machine, "accelerator_type"):
        flags += [f"--accelerator-type={field_of(machine, 'accelerator_type')}",
                  f"--accelerator-count={field_of(machine, 'accelerator_count')}"]
    if disk:  # gcloud asks for the type whenever the size is given, in its enum spelling
        flags += [f"--disk-type={str(field_of(disk, 'disk_type') or DISK_TYPES[0]).upper().replace('-', '_')}",
                  f"--disk-size-gb={field_of(disk, 'disk_size_gb') or 100}"]
    if not field_of(network, "enable_internet_access"):
        flags.append("--no-enable-internet-access")
    flags += [f"--{k}={field_of(network, k)}" for k in ("network", "subnetwork") if field_of(network, k)]
    kms = field_of(field_of(spec, "encryption_spec") or {}, "kms_key_name")
    if kms:
        flags.append(f"--kms-key={kms}")
    if field_of(spec, "execution_timeout"):
        flags.append(f"--execution-timeout={field_of(spec, 'execution_timeout')}")
    return "gcloud workbench executions create \\\n    " + " \\\n    ".join(shlex.quote(f) for f in flags)
