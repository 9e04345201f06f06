"""Your own training code as a Vertex AI job: what `labkit emulate` and `labkit job` do, as
functions a notebook can call too.

A `JobRequest` holds what the flags say (the command, or a spec file; the pools, machines and
capacity; how the image looks; a tuning study; for the emulator, its folder and an injected
fault). `build(request)` turns it into the job: a CustomJobSpec (`labkit.vertex.userjob`), or a
HyperparameterTuningJob whose trials run the command with ``--NAME=VALUE`` appended, plus what
the emulator must know of the image (`labkit.vertex.programs.Image`) and the files `labkit job`
uploads first (the code archive, packages). `emulate(request)` runs it here
(`labkit.vertex.emulator.run_local`, or `labkit.vertex.tuning.run_local_tuning` for a study) in
``<workdir>``: ``gcs/<bucket>/...`` is the emulated bucket (kept across runs in the same folder,
as a bucket is), ``jobs/<id>/`` the replicas' logs and container disks. `cli_line(request)` is
the command a learner would type for the same job.
"""

from __future__ import annotations

import re
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from labkit.core.config import ParameterError
from labkit.vertex.dockerfile import read_dockerfile
from labkit.vertex.emulator import LocalJob, run_local
from labkit.vertex.faults import Fault
from labkit.vertex.programs import JOB_MARKER, Image, check_image_files, split_command
from labkit.vertex.tuning import TrialRecord, run_local_tuning, user_tuning_job
from labkit.vertex.userjob import (
    code_archive,
    code_uri,
    is_prebuilt_training_image,
    load_spec,
    parse_env,
    user_job,
)


@dataclass
class JobRequest:
    """The job the flags of `labkit emulate` / `labkit job` describe (same names, ``-`` as ``_``)."""

    command: list[str] = field(default_factory=list)
    spec: str | None = None
    output: str | None = None
    workers: int = 0
    ps: int = 0
    reduction_server: int = 0
    evaluators: int = 0
    machine_type: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int = 0
    env: list[str] = field(default_factory=list)
    image: str | None = None
    entrypoint: str | None = None
    dockerfile: str | None = None
    container_workdir: str | None = None
    code: str | None = None
    requirements: str | None = None
    framework: str = "torch"
    python_module: str | None = None
    package: list[str] = field(default_factory=list)
    spot: bool = False
    flex_start: bool = False
    max_wait: float | None = None
    timeout: float | None = None
    restart_job_on_worker_restart: bool | None = None
    label: list[str] = field(default_factory=list)
    tensorboard: str | None = None
    service_account: str | None = None
    enable_web_access: bool = False
    tensorboard_profiler: bool = False
    display_name: str | None = None
    tune_metric: str | None = None
    goal: str = "minimize"
    param: list[str] = field(default_factory=list)
    trials: int = 4
    parallel_trials: int = 2
    algorithm: str = "bayesian"
    # running it here
    workdir: str | None = None
    upload: list[str] = field(default_factory=list)
    preempt_after: float | None = None
    preempt_at_step: int | None = None
    step_pattern: str | None = None
    preempt_when_file: str | None = None
    preempt_replica: str = "workerpool0"
    preempt_signal: str = "SIGTERM"
    preempt_times: int = 1
    gcs_mount: str = "auto"

    @classmethod
    def from_namespace(cls, namespace: Any) -> JobRequest:
        """From parsed flags (an argparse namespace with these names)."""
        values = {f.name: getattr(namespace, f.name) for f in fields(cls) if hasattr(namespace, f.name)}
        words = list(values.get("command") or [])
        values["command"] = words[1:] if words[:1] == ["--"] else words
        return cls(**values)


@dataclass
class Built:
    """A job the request describes: `spec` (a CustomJobSpec, or a tuning job when `tuning`),
    what the emulator needs to run it here (`image`), and the files `labkit job` uploads."""

    spec: dict[str, Any]
    tuning: bool
    display_name: str
    labels: dict[str, str]
    image: Image
    uploads: dict[str, bytes] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def job_spec(self) -> dict[str, Any]:
        """The CustomJobSpec (a study's trial job)."""
        return self.spec["trial_job_spec"] if self.tuning else self.spec

    @property
    def output_uri(self) -> str:
        return (self.job_spec.get("base_output_directory") or {}).get("output_uri_prefix", "")


def default_name(words: Sequence[str]) -> str:
    """A display name from the command: ``labkit-train`` for ``python train.py``."""
    words = list(words)
    stem = next((Path(w).stem for w in words if w.endswith(".py")), None)
    if stem is None and "-m" in words and words.index("-m") + 1 < len(words):
        stem = words[words.index("-m") + 1].split(".")[-1]
    return re.sub(r"[^a-z0-9-]+", "-", f"labkit-{stem or 'job'}".lower())[:100]


def image_of(request: JobRequest, staging: Path, notes: list[str], *, code_default: bool = True,
             for_emulator: bool = True) -> Image:
    """What the emulator knows of the image: ENTRYPOINT, CMD, working directory and files
    (`code_default`: without --dockerfile or --container-workdir, the --code folder, default
    the current one, stands for what the image holds in its working directory). For the
    service (`for_emulator=False`) only the ENTRYPOINT matters."""
    entrypoint = tuple(split_command(request.entrypoint, "--entrypoint")) if request.entrypoint else ()
    if not for_emulator:
        if request.dockerfile:
            entrypoint = entrypoint or read_dockerfile(request.dockerfile, staging / "image").image.entrypoint
        return Image(entrypoint)
    if request.dockerfile:
        read = read_dockerfile(request.dockerfile, staging / "image")
        notes.extend(f"--dockerfile: {n}" for n in read.notes)
        image = read.image
        if entrypoint:
            image = Image(entrypoint, (), image.workdir, image.files, image.env, image.root)
        if request.container_workdir:
            local = Path(request.container_workdir)
            if local.is_dir() and not request.container_workdir.startswith("/"):
                image = Image(image.entrypoint, image.cmd, None,
                              check_image_files(local, "--container-workdir"), image.env)
            else:
                files = read.staging / request.container_workdir.lstrip("/")
                files.mkdir(parents=True, exist_ok=True)
                image = Image(image.entrypoint, image.cmd, request.container_workdir, files, image.env, image.root)
        return image
    if request.container_workdir:
        local = Path(request.container_workdir)
        if not local.is_dir():
            raise ParameterError("--container-workdir", request.container_workdir,
                                 "is not a folder here: give the local folder that holds what the image "
                                 "has in its working directory (your code and small data), or --dockerfile")
        return Image(entrypoint, files=check_image_files(local, "--container-workdir"))
    if not code_default:
        return Image(entrypoint)
    code = Path(request.code) if request.code else Path.cwd()
    return Image(entrypoint, files=check_image_files(code, "--code" if request.code else
                                                     "the current folder (--code)"))


def _requirements(request: JobRequest, code: Path) -> str | None:
    if request.requirements:
        path = Path(request.requirements)
        inside = None
        try:
            inside = (path.resolve() if path.is_absolute() else (code / path).resolve()).relative_to(code.resolve())
        except ValueError:
            pass
        if inside is None or not (code / inside).is_file():
            raise ParameterError("--requirements", request.requirements,
                                 f"must be a file inside the code folder {code} (it travels with the code)")
        return inside.as_posix()
    return "requirements.txt" if (code / "requirements.txt").is_file() else None


def parse_param(text: str) -> tuple[str, Any]:
    """NAME=log:LOW:HIGH | NAME=linear:LOW:HIGH | NAME=V1,V2,... -> (name, value)."""
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise ParameterError("--param", text, "must be NAME=log:LOW:HIGH, NAME=linear:LOW:HIGH or NAME=V1,V2,...")

    def number(word: str) -> int | float:
        try:
            return int(word)
        except ValueError:
            return float(word)

    head, _, rest = spec.partition(":")
    if head in ("log", "linear"):
        bounds = rest.split(":")
        if len(bounds) != 2:
            raise ParameterError("--param", text, f"a {head} range is {head}:LOW:HIGH")
        try:
            return name, (head, number(bounds[0]), number(bounds[1]))
        except ValueError:
            raise ParameterError("--param", text, "range bounds must be numbers") from None
    values = [v for v in spec.split(",") if v]
    try:
        return name, [number(v) for v in values]
    except ValueError:
        return name, values


def build(request: JobRequest, *, for_emulator: bool, staging: Path) -> Built:
    """The job the request describes; ParameterError names a bad flag or field."""
    notes: list[str] = []
    words = list(request.command)
    labels = parse_env(request.label, "--label")
    if request.spec:
        if words:
            raise ParameterError("--spec", request.spec, "replaces the command: give one or the other")
        loaded = load_spec(request.spec)
        spec = loaded.spec
        job = spec["trial_job_spec"] if loaded.kind == "tuning_job" else spec
        containers = any(p and p.get("container_spec") for p in job.get("worker_pool_specs", []))
        image = image_of(request, staging, notes, code_default=containers, for_emulator=for_emulator)
        if request.output:
            job["base_output_directory"] = {"output_uri_prefix": request.output}
        if request.enable_web_access:
            job["enable_web_access"] = True
        if request.tensorboard_profiler:
            raise ParameterError("--tensorboard-profiler", True, "applies to a job built from a command; "
                                 "in a spec file, start your command under `python -m "
                                 "labkit.vertex.with_profiler --` or call cloud_profiler.init() in it")
        return Built(spec, loaded.kind == "tuning_job", request.display_name or loaded.display_name
                     or "labkit-job", {**loaded.labels, **labels}, image, {}, notes)
    if not request.output:
        raise ParameterError("--output", None, "is required: the gs://BUCKET/PATH the job writes under")
    if for_emulator and request.enable_web_access:
        notes.append("--enable-web-access: Vertex's interactive shell is not emulated; each replica's "
                     "output and files are in the work folder")
    image = image_of(request, staging, notes, code_default=not request.python_module, for_emulator=for_emulator)
    uploads: dict[str, bytes] = {}
    options: dict[str, Any] = dict(
        output_uri=request.output, workers=request.workers, parameter_servers=request.ps,
        reduction_servers=request.reduction_server, evaluators=request.evaluators,
        accelerator_type=request.accelerator_type, accelerator_count=request.accelerator_count,
        env=parse_env(request.env), spot=request.spot, flex_start=request.flex_start,
        max_wait_s=None if request.max_wait is None else int(request.max_wait),
        timeout_s=None if request.timeout is None else int(request.timeout),
        restart_job_on_worker_restart=request.restart_job_on_worker_restart, labels=labels,
        tensorboard=request.tensorboard, service_account=request.service_account, framework=request.framework,
        enable_web_access=request.enable_web_access, tensorboard_profiler=request.tensorboard_profiler)
    if request.machine_type:
        options["machine_type"] = request.machine_type
    if request.python_module:
        packages = [p if p.startswith(("gs://", "/gcs/")) or for_emulator else _upload(p, request.output, uploads)
                    for p in request.package]
        spec = user_job(words, python_module=request.python_module, package_uris=packages,
                        image_uri=request.image, **options)
    elif (request.image or request.dockerfile) and not is_prebuilt_training_image(request.image or ""):
        if not request.image and not for_emulator:
            raise ParameterError("--image", None, "is required with --dockerfile: build and push the "
                                 "image (e.g. gcloud builds submit --tag REGION-docker.pkg.dev/P/R/NAME) "
                                 "and name it")
        uri = request.image or f"local/{Path(request.dockerfile).resolve().parent.name.lower() or 'image'}:dockerfile"
        # With an ENTRYPOINT known (--entrypoint, or the Dockerfile's), the words are its args,
        # as `docker run IMAGE ARGS` and CustomContainerTrainingJob pass them; words that start
        # with a flag are args too (the service runs the image's own ENTRYPOINT with them).
        args_only = bool(image.entrypoint) or bool(words and words[0].startswith("-"))
        spec = user_job(words, image_uri=uri, args_only=args_only, **options)
    else:
        code = Path(request.code) if request.code else Path.cwd()
        archive = code_archive(code, skip=[staging])
        uri = code_uri(request.output, archive)
        uploads[uri] = archive
        spec = user_job(words, code=uri, requirements=_requirements(request, code), image_uri=request.image,
                        **options)
    name = request.display_name or default_name(words or [request.python_module or "job"])
    if request.tune_metric or request.param:
        if not request.tune_metric or not request.param:
            raise ParameterError("--tune-metric" if not request.tune_metric else "--param", None,
                                 "a tuning study needs both --tune-metric and at least one --param")
        algorithm = {"bayesian": None, "grid": "GRID_SEARCH", "random": "RANDOM_SEARCH"}[request.algorithm]
        study = user_tuning_job(spec, metric=request.tune_metric, goal=request.goal,
                                parameters=dict(parse_param(p) for p in request.param),
                                max_trial_count=request.trials, parallel_trial_count=request.parallel_trials,
                                algorithm=algorithm, display_name=name, labels=labels)
        return Built(study, True, name, study["labels"], image, uploads, notes)
    return Built(dict(spec), False, name, dict(spec.labels), image, uploads, notes)


def _upload(path: str, output: str, uploads: dict[str, bytes]) -> str:
    local = Path(path)
    if not local.is_file():
        raise ParameterError("--package", path, "must be an sdist or wheel file here, or a gs:// address")
    uri = f"{output.rstrip('/')}/inputs/{local.name}"
    uploads[uri] = local.read_bytes()
    return uri


def fault_of(request: JobRequest) -> Fault | None:
    """The fault the --preempt-* flags ask for (one trigger at most)."""
    triggers = [t for t in (request.preempt_after, request.preempt_at_step, request.preempt_when_file)
                if t is not None]
    if len(triggers) > 1:
        raise ParameterError("--preempt-at-step", request.preempt_at_step,
                             "give one of --preempt-after, --preempt-at-step, --preempt-when-file")
    if not triggers:
        return None
    try:
        return Fault(request.preempt_replica, at_step=request.preempt_at_step, signal=request.preempt_signal,
                     times=request.preempt_times, after_s=request.preempt_after,
                     when_file=request.preempt_when_file, step_pattern=request.step_pattern)
    except ValueError as e:
        text = str(e)
        for key, flag in (("replica", "--preempt-replica"), ("step_pattern", "--step-pattern"),
                          ("times", "--preempt-times")):
            text = text.replace(f"Fault.{key}", flag)
        raise ParameterError(text.split()[0], None, text) from None


def stage_uploads(pairs: Sequence[str], gcs_root: Path) -> list[str]:
    """Copy ``LOCAL=gs://BUCKET/PATH`` files or folders into the emulated bucket."""
    done = []
    for pair in pairs:
        local, sep, uri = pair.partition("=")
        if not sep or not uri.startswith("gs://") or len(uri) <= 5:
            raise ParameterError("--upload", pair, "must be LOCAL=gs://BUCKET/PATH")
        src = Path(local)
        if not src.exists():
            raise ParameterError("--upload", local, "does not exist")
        dest = gcs_root / uri[5:].strip("/")
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
        done.append(f"{local} -> {uri}")
    return done


@dataclass
class Emulated:
    """A request run here: the job (or a study's trials), where it left everything, and notes."""

    built: Built
    workdir: Path
    jobdir: Path
    job: LocalJob | None = None
    trials: list[TrialRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def bucket_folder(self) -> Path:
        """The local folder of the job's base output directory (``gs://...``)."""
        return self.workdir / "gcs" / self.built.output_uri[len("gs://"):].strip("/")

    def outputs(self) -> list[str]:
        """Every file the job left under its base output directory."""
        folder = self.bucket_folder
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def prepare(request: JobRequest) -> tuple[Built, Fault | None, Path, Path, list[str]]:
    """Everything checked and written before a replica starts: (job, fault, workdir, the job's
    own folder, notes). ParameterError or OSError names what is wrong."""
    workdir = Path(request.workdir).resolve() if request.workdir else \
        (Path("runs") / "emulate" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    job_id = str(int(time.time() * 1000))
    jobdir = workdir / "jobs" / job_id
    built = build(request, for_emulator=True, staging=jobdir)
    fault = fault_of(request)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / JOB_MARKER).write_text(f'{{"last_job": "{job_id}"}}\n')
    notes = [*built.notes, *(f"uploaded {u}" for u in stage_uploads(request.upload, workdir / "gcs"))]
    return built, fault, workdir, jobdir, notes


def emulate(request: JobRequest, *, on_output: Callable[[str, str], None] | None = None,
            show_progress: bool = False) -> Emulated:
    """Run the request's job (or study) here; see the module docstring. Raises ParameterError
    or `labkit.vertex.emulator.CannotEmulate` before any replica starts when it cannot run."""
    built, fault, workdir, jobdir, notes = prepare(request)
    out = Emulated(built, workdir, jobdir, notes=notes)
    if built.tuning:
        out.trials = run_local_tuning(built.spec, jobdir, image=built.image, gcs_root=workdir / "gcs")
        return out
    out.job = run_local(built.spec, jobdir, fault=fault, gcs_root=workdir / "gcs", image=built.image,
                        job_id=jobdir.name, step_pattern=request.step_pattern, gcs_mount=request.gcs_mount,
                        show_progress=show_progress, on_output=on_output)
    return out


def cli_line(request: JobRequest, verb: str = "emulate") -> str:
    """The `labkit` command line for the same request (defaults left out)."""
    defaults = JobRequest()
    words = ["labkit", verb]
    for f in fields(JobRequest):
        if f.name == "command":
            continue
        value, default = getattr(request, f.name), getattr(defaults, f.name)
        if value == default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value is False and f.name == "restart_job_on_worker_restart":
            words.append("--no-restart-job-on-worker-restart")
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        else:
            words += [flag, f"{value:g}s" if f.name in ("max_wait", "timeout", "preempt_after") else str(value)]
    if request.command:
        words += ["--", *request.command]
    return shlex.join(words)
