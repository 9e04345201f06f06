"""A learner's own training code as a Vertex AI job: the spec built from a command line, or read
from the file a user passes to ``gcloud ai custom-jobs create --config``.

`user_job(command, output_uri=..., workers=1, ...)` is the CustomJobSpec for any command (a
script, ``python -m trainer.task``, ``torchrun ...``, a shell line): one primary replica, then
workers, parameter servers or a Reduction Server, and evaluators, as Vertex lays pools out. It
runs in the user's image (`image_uri`, with `entrypoint` when only args are given), or as a
``python_package_spec`` (`python_module` + `package_uris`), or, by default, in labkit's image
with the user's code folder shipped as an archive in the bucket (`code_archive`) that the
container unpacks and starts in, after pip-installing the folder's ``requirements.txt``.

`load_spec(path)` reads a spec file in JSON or YAML: a CustomJobSpec (what ``--config`` takes),
a whole CustomJob (``jobSpec`` with ``displayName`` and ``labels``, what
``aiplatform.CustomJob`` sends), or a HyperparameterTuningJob; field names in the REST form
(camelCase) or the proto form, as the API takes both. It returns the spec in the proto names
the rest of labkit reads, refusing an unknown field by its path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core.config import ParameterError, check_int
from labkit.core.frameworks import has_aiplatform
from labkit.core.gcs import fuse_path
from labkit.vertex.cloud_profile import (
    PROFILER_PAGE,
    PROFILER_REQUIREMENT,
    check_profiler_job,
    profiled,
)
from labkit.vertex.images import check_image_gpu, default_image
from labkit.vertex.programs import JOB_MARKER, SKIPPED_FOLDERS, check_image_files
from labkit.vertex.specs import (
    DEFAULT_MACHINE_TYPE,
    REDUCTION_SERVER_MACHINE_TYPE,
    JobSpec,
    PoolConfig,
    custom_job_spec,
    reduction_server_pool,
    setup_command,
    validate,
)

CODE_FOLDER = "/tmp/labkit-code"  # where the container unpacks the code archive


@dataclass
class LoadedSpec:
    """A spec file read: `kind` "custom_job" or "tuning_job", the spec in proto field names,
    and the display name and labels the file gave the job."""

    kind: str
    spec: dict[str, Any]
    display_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


_CAMEL = re.compile(r"(?<!^)([A-Z])")


def _snake(name: str) -> str:
    return _CAMEL.sub(lambda m: "_" + m.group(1).lower(), name)


def _snake_keys(value: Any, *, keep: bool = False) -> Any:
    """Proto names for every message key; map fields (labels) keep their keys."""
    if isinstance(value, Mapping):
        return {(k if keep else _snake(k)): _snake_keys(v, keep=_snake(k) == "labels" and not keep)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_snake_keys(v) for v in value]
    return value


def _parse(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        import yaml
    except ImportError:
        raise ParameterError("--spec", path, "is not JSON, and PyYAML (for YAML) is not installed") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise ParameterError("--spec", path, f"is neither JSON nor YAML{at}: {getattr(e, 'problem', e)}") from None


def _through_types(kind: str, data: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Parse with the API's own message type (the REST and the proto names are both accepted;
    an unknown field is refused by path), back to a dict in proto names."""
    from google.cloud.aiplatform_v1 import types
    from google.protobuf import json_format

    cls = {"custom_job": types.CustomJobSpec, "tuning_job": types.HyperparameterTuningJob}[kind]
    try:
        message = cls.from_json(json.dumps(data), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError) as e:
        raise ParameterError("--spec", path, f"is not a valid {cls.__name__}: {e}") from None
    out = cls.to_dict(message, use_integers_for_enums=False, preserving_proto_field_name=True)
    return _drop_empty(out)


_INTEGERS = ("replica_count", "accelerator_count", "boot_disk_size_gb", "max_trial_count",
             "parallel_trial_count", "max_failed_trial_count")


def _drop_empty(value: Any) -> Any:
    """to_dict writes every field; keep what the file said (empty values and unspecified enums
    are the defaults), with int64 counts as numbers again."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k in _INTEGERS and isinstance(v, str) and v.isdigit():
                v = int(v)
            if v in (None, "", [], {}, 0, False) or isinstance(v, str) and v.endswith("_UNSPECIFIED"):
                continue
            out[k] = _drop_empty(v)
        return out
    if isinstance(value, list):
        return [_drop_empty(v) for v in value]
    return value


def load_spec(path: str | os.PathLike) -> LoadedSpec:
    """Read a CustomJobSpec, CustomJob or HyperparameterTuningJob file (see the module
    docstring). A ParameterError names the file and the problem."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ParameterError("--spec", name, f"cannot be read ({e.strerror or e})") from None
    data = _parse(text, name)
    if not isinstance(data, Mapping):
        raise ParameterError("--spec", name, "must hold a mapping (a CustomJobSpec, CustomJob or "
                             "HyperparameterTuningJob)")
    keys = set(data)
    display = data.get("displayName") or data.get("display_name")
    labels = {str(k): str(v) for k, v in (data.get("labels") or {}).items()}
    if keys & {"trialJobSpec", "trial_job_spec", "studySpec", "study_spec"}:
        kind, body = "tuning_job", dict(data)
    elif keys & {"jobSpec", "job_spec"}:
        kind, body = "custom_job", dict(data.get("jobSpec") or data.get("job_spec") or {})
        extra = keys - {"jobSpec", "job_spec", "displayName", "display_name", "labels", "encryptionSpec",
                        "encryption_spec"}
        if extra:
            raise ParameterError("--spec", name, f"has fields a CustomJob does not: {sorted(extra)}")
    elif keys & {"workerPoolSpecs", "worker_pool_specs"}:
        kind = "custom_job"
        body = {k: v for k, v in data.items() if k not in ("displayName", "display_name", "labels")}
    else:
        raise ParameterError("--spec", name, "has no workerPoolSpecs (a CustomJobSpec), jobSpec (a "
                             "CustomJob) or trialJobSpec (a HyperparameterTuningJob)")
    spec = _through_types(kind, body, name) if has_aiplatform() else _snake_keys(body)
    return LoadedSpec(kind, spec, display, labels)


# ---------------------------------------------------------------- a job from a command line

def is_prebuilt_training_image(image_uri: str) -> bool:
    """Whether `image_uri` is one of Vertex's prebuilt training images (which hold a framework,
    not your code: the code is shipped to them)."""
    return "-docker.pkg.dev/vertex-ai/training/" in image_uri or "gcr.io/cloud-aiplatform/training/" in image_uri


def parse_env(pairs: Sequence[str], name: str = "--env") -> dict[str, str]:
    """``KEY=VALUE`` words as a mapping."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ParameterError(name, pair, "must be KEY=VALUE")
        out[key] = value
    return out


def code_archive(folder: str | os.PathLike, skip: Sequence[Path] = ()) -> bytes:
    """A reproducible tar.gz of the user's code folder (what an image built from it would
    hold; caches, environments and labkit's emulated-job folders left out)."""
    root = check_image_files(Path(folder), "--code")
    skipped = {Path(s).resolve() for s in skip}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        full = (root / info.name).resolve() if info.name != "." else root
        if any(p in SKIPPED_FOLDERS for p in parts) or full in skipped or (
                full.is_dir() and (full / JOB_MARKER).exists()):
            return None
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name, filter=keep)
    return buf.getvalue()


def code_uri(output_uri: str, archive: bytes) -> str:
    """Where the code archive goes: ``<output>/inputs/code-<digest>.tar.gz``."""
    return f"{output_uri.rstrip('/')}/inputs/code-{hashlib.sha256(archive).hexdigest()[:12]}.tar.gz"


# A job that pays for GPUs stops at once, on one line, when its container sees none (a driver
# not mounted, an image without CUDA), rather than training on the CPU at GPU prices.
_NO_GPU = "sys.exit('this job asked for GPUs and its container sees no CUDA GPU')"
GPU_GUARD = {"torch": f"python -c \"import sys, torch; torch.cuda.is_available() or {_NO_GPU}\"",
             "tf": f"python -c \"import sys, tensorflow as tf; tf.config.list_physical_devices('GPU') or {_NO_GPU}\""}


def _unpack_steps(archive_uri: str, requirements: str | None, gpu: bool, framework: str) -> list[str]:
    steps = [f"mkdir -p {CODE_FOLDER}", f"tar -xzf {shlex.quote(fuse_path(archive_uri))} -C {CODE_FOLDER}",
             f"cd {CODE_FOLDER}"]
    if requirements:
        steps.append(f"pip install --quiet --disable-pip-version-check -r {shlex.quote(requirements)}")
    if gpu:
        steps.append(GPU_GUARD[framework])
    return steps


def user_job(
    command: Sequence[str],
    *,
    output_uri: str,
    workers: int = 0,
    parameter_servers: int = 0,
    reduction_servers: int = 0,
    evaluators: int = 0,
    machine_type: str = DEFAULT_MACHINE_TYPE,
    accelerator_type: str | None = None,
    accelerator_count: int = 0,
    image_uri: str | None = None,
    args_only: bool = False,
    env: Mapping[str, str] | None = None,
    python_module: str | None = None,
    package_uris: Sequence[str] = (),
    code: str | None = None,
    requirements: str | None = None,
    framework: str = "torch",
    spot: bool = False,
    flex_start: bool = False,
    max_wait_s: int | None = None,
    timeout_s: int | None = None,
    restart_job_on_worker_restart: bool | None = None,
    labels: Mapping[str, str] | None = None,
    tensorboard: str | None = None,
    service_account: str | None = None,
    reduction_server_machine_type: str = REDUCTION_SERVER_MACHINE_TYPE,
    boot_disk_size_gb: int = 100,
    enable_web_access: bool = False,
    tensorboard_profiler: bool = False,
) -> JobSpec:
    """The CustomJobSpec that runs `command` on every training replica (see the module
    docstring). `code`: the ``gs://`` address of the code archive the container (labkit's
    image, or a Vertex prebuilt training image named as `image_uri`) unpacks and starts in
    (`code_archive`, `code_uri`); `requirements`: a file in it to pip-install first.
    `args_only`: `command` is the args of `image_uri`'s own ENTRYPOINT. Multi-replica jobs
    restart as a whole when a replica restarts (DDP and MultiWorkerMirrored cannot lose a
    member) unless told otherwise. `enable_web_access`: an interactive shell into each node;
    `tensorboard_profiler` (TensorFlow code in labkit's image or a prebuilt one, with a
    `tensorboard`): the command starts under the Vertex AI TensorBoard Profiler
    (`labkit.vertex.cloud_profile`)."""
    for name, value in (("workers", workers), ("parameter_servers", parameter_servers),
                        ("reduction_servers", reduction_servers), ("evaluators", evaluators)):
        check_int(name, value, minimum=0)
    if parameter_servers and reduction_servers:
        raise ParameterError("reduction_servers", reduction_servers,
                             "cannot be combined with parameter servers: both use workerpool2")
    if reduction_servers and not workers:
        raise ParameterError("reduction_servers", reduction_servers,
                             "needs workers: a Reduction Server serves several nodes")
    words = [str(w) for w in command]
    if not words and not python_module and not args_only:
        raise ParameterError("command", words, "is empty: give the command after --")
    if tensorboard_profiler:
        check_profiler_job(framework, tensorboard)
        if code is None:
            raise ParameterError("tensorboard_profiler", True,
                                 "starts the profiler around a command run from your code folder; with "
                                 "your own image or a Python package, call cloud_profiler.init() in the "
                                 "training code and install google-cloud-aiplatform[cloud_profiler] "
                                 f"({PROFILER_PAGE})")
        words = profiled(words)
    pool: dict[str, Any] = {"machine_type": machine_type, "accelerator_type": accelerator_type,
                            "accelerator_count": accelerator_count, "env": dict(env or {}),
                            "boot_disk_size_gb": boot_disk_size_gb}
    if python_module:
        pool |= {"image_uri": image_uri or default_image(framework), "args": words}
    elif code is not None:
        gpu = bool(accelerator_type) and str(accelerator_type).startswith("NVIDIA_") and accelerator_count > 0
        steps = _unpack_steps(code, requirements, gpu, framework)
        if tensorboard_profiler:
            steps.append(f"pip install --quiet --disable-pip-version-check {shlex.quote(PROFILER_REQUIREMENT)}")
        pool |= {"image_uri": image_uri or default_image(framework), "command": setup_command(steps),
                 "args": words}
    elif image_uri:
        pool |= {"image_uri": image_uri, **({"args": words} if args_only else {"command": words})}
    else:
        raise ParameterError("code", code, "is required without an image: the archive of the code to run")
    # labkit's image on a GPU its framework build has no kernels for (user images are theirs)
    check_image_gpu(pool["image_uri"], accelerator_type, machine_type=machine_type,
                    accelerator_count=accelerator_count)
    primary = PoolConfig(replica_count=1, **pool)
    more = {"workers": workers, "parameter_servers": parameter_servers, "evaluators": evaluators}
    made = {k: PoolConfig(replica_count=n, **pool) if n else None for k, n in more.items()}
    pool2 = made["parameter_servers"]
    if reduction_servers:
        pool2 = reduction_server_pool(reduction_servers, reduction_server_machine_type)
    nodes = 1 + workers
    restart = nodes > 1 if restart_job_on_worker_restart is None else restart_job_on_worker_restart
    spec = custom_job_spec(primary, made["workers"], pool2, made["evaluators"], output_uri=output_uri,
                           spot=spot, flex_start=flex_start, max_wait_s=max_wait_s, timeout_s=timeout_s,
                           restart_job_on_worker_restart=restart,
                           labels={"labkit-job": "user", **dict(labels or {})},
                           tensorboard=tensorboard, service_account=service_account,
                           enable_web_access=enable_web_access)
    if python_module:
        _as_package(spec, python_module, package_uris)
    return spec


def _as_package(spec: JobSpec, module: str, package_uris: Sequence[str]) -> None:
    """Turn the training pools' containers into python_package_specs."""
    if not package_uris:
        raise ParameterError("package_uris", list(package_uris),
                             "is required with a python module: the sdist or wheel that holds it")
    for pool in spec["worker_pool_specs"]:
        container = pool.get("container_spec") if pool else None
        if not container or "reductionserver" in container.get("image_uri", ""):
            continue
        package = {"executor_image_uri": container["image_uri"], "package_uris": list(package_uris),
                   "python_module": module, "args": list(container.get("args", []))}
        if container.get("env"):
            package["env"] = container["env"]
        pool["python_package_spec"] = package
        del pool["container_spec"]
    if has_aiplatform():
        validate(spec)


def gcloud_command(spec: Mapping[str, Any], *, display_name: str, region: str,
                   labels: Mapping[str, str] | None = None, config_name: str = "labkit-job.yaml") -> str:
    """The ``gcloud ai custom-jobs create`` lines that submit `spec`: the config file written
    by a heredoc, then the command."""
    rest = json.loads(rest_json(spec))
    try:
        import yaml

        body = yaml.safe_dump(rest, sort_keys=False, width=100)
    except ImportError:
        body = json.dumps(rest, indent=2)
    label_flag = ""
    if labels:
        label_flag = " --labels=" + shlex.quote(",".join(f"{k}={v}" for k, v in labels.items()))
    return (f"cat > {config_name} <<'EOF'\n{body.rstrip()}\nEOF\n"
            f"gcloud ai custom-jobs create --region={shlex.quote(region)} "
            f"--display-name={shlex.quote(display_name)}{label_flag} --config={config_name}")


def rest_json(spec: Mapping[str, Any]) -> str:
    from labkit.vertex.specs import to_rest_json

    return to_rest_json(spec)
