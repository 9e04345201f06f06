"""Run a CustomJob spec on this machine the way Vertex AI would run it: one process per replica.

**What runs.** Each pool's ``container_spec`` (command and args; only args with the image's
ENTRYPOINT, which the caller gives as `Image`), or its ``python_package_spec`` (the packages
pip-installed into a folder of the job's own, then ``python -m MODULE``): see
`labkit.vertex.programs`. A spec the emulator cannot run is refused before any replica starts,
with a `ParameterError` naming the field. Each replica starts in its container's working
directory: a fresh copy of `Image.files` (the local folder standing in for what the image holds
there), else an empty folder, its container disk (`LocalJob.container`), new for every job
attempt: what a replica writes to a relative path such as ``Path("gs://b/x")`` (the local folder
``gs:/b/x``) stays there and is gone after a restart, as on Vertex.

**The environment Vertex gives it** (`replica_envs`): CLUSTER_SPEC, TF_CONFIG (multi-replica
jobs), MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK on training replicas, AIP_MODEL_DIR /
AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR under `base_output_directory` as the same ``gs://``
addresses Vertex gives, CLOUD_ML_JOB_ID and, in tuning trials, CLOUD_ML_TRIAL_ID; the spec's
``env`` on top, merged with what the emulator needs (PATH starts with this environment's
``bin``; a ``PYTHONPATH`` of the spec comes first, never instead). Addresses are loopback ports.

**Cloud Storage** is a folder, ``<workdir>/gcs`` (or `gcs_root`): bucket ``b`` is ``<folder>/b``,
and every route a replica can take reaches it and nothing else:

- ``gs://`` through google-cloud-storage, gcsfs, ``gcloud storage`` and TensorFlow's own file
  system (``tf.io.gfile``, ``model.save``, the Keras TensorBoard callback) reaches a real Cloud
  Storage server on loopback, `labkit.vertex.storage`, through each client's documented
  emulator or proxy setting: no library is patched;
- ``/gcs/b/...`` (Vertex's Cloud Storage FUSE mount), however the code builds the path: each
  replica runs in a container of Linux namespaces (`labkit.vertex.replica_container`) whose
  ``/gcs`` is the folder, and whose processes all end with it. Where this machine does not allow
  those namespaces, ``/gcs/`` inside the spec's args and env values (shell strings included) is
  rewritten to the folder instead, labkit's own code finds it through ``LABKIT_LOCAL_GCS``, and
  a job of other code whose own ``/gcs`` paths could reach this machine's own ``/gcs`` (this user
  can write there: a container running as root, or a Vertex job whose ``/gcs`` is the real
  bucket) is refused before it starts (`CannotEmulate`), saying why.

**Restarts** follow Vertex's documented rules by the cause of an exit (`labkit.hardware.facts`,
each rule with its page and read date). A replica that exits non-zero by itself has hit one of
the service's "common errors": a user-code exception (any exit status, such as 1 or 2) or an out
of memory kill is **permanent** and the job fails at once, with nothing restarted; SIGABRT and
SIGSEGV exits (6 or 134, 11 or 139) may be transient and restart the whole job, up to 3 times.
An injected fault (`labkit.vertex.faults.Fault`: at a step read from the output with a pattern,
after a time, or when a file appears) stands for the machine's side: on a Spot job a SIGTERM is
a preemption, which restarts the whole job (up to 6 times); otherwise a signalled replica had a
non-permanent error and is restarted on its own up to 5 times, after which the whole job is
retried up to 3 times (with ``restart_job_on_worker_restart`` each of those restarts restarts
the whole job). Exits that follow an injected fault in the same attempt (peers losing the
signalled replica) are put down to it. The job succeeds when the primary replica (workerpool0)
exits 0 ("At that point, Vertex AI shuts down all the other running workers",
https://cloud.google.com/vertex-ai/docs/training/understanding-training-service): workers get
`worker_grace_s` to finish, and one that exits non-zero then does not fail the job.

A spec that asks for GPUs passes ``--device cuda``; where this machine has no CUDA GPU for each
emulated node the emulator runs such replicas with ``--device cpu`` and says so in the job's
events. Each replica is a `labkit.core.launcher.Process`: a session of its own (a kill reaches
all it started), its output in its own log file. Nothing the job started outlives it: replicas,
their children and the storage server are stopped however the job ends.

Reduction Server replicas run Google's image, which cannot run here: they are emulated by an
idle process so the pool layout and environment stay those of the real job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core.cluster import free_ports, from_env
from labkit.core.config import ParameterError
from labkit.core.frameworks import has_aiplatform
from labkit.core.gcs import GCS_MOUNT, LOCAL_GCS_ENV
from labkit.core.hypertune import METRIC_FILE_ENV, TRIAL_ID_ENV
from labkit.core.launcher import Process, ProcessSpec, child_env
from labkit.core.progress import OFF_ENV, STYLE_ENV, progress
from labkit.hardware import facts
from labkit.vertex.faults import Fault, FaultTrigger, StepReader, parse_replica
from labkit.vertex.fields import field_of
from labkit.vertex.programs import (
    Image,
    Program,
    container_program,
    copy_image_files,
    package_program,
)
from labkit.vertex.scheduling import SERVICE_DEFAULT_TIMEOUT_S
from labkit.vertex.specs import check_spec, validate

SUCCEEDED, FAILED, CANCELLED = "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"
# A job whose spec sets no timeout runs as long as the service would let it (7 days): nothing
# here stops a user's run early unless the spec or the caller asks for a limit.
DEFAULT_TIMEOUT_S = float(SERVICE_DEFAULT_TIMEOUT_S)
# Vertex's documented restart rules (labkit.hardware.facts, each with its page and read date).
MAX_WORKER_RESTARTS = int(facts.WORKER_RESTARTS.value)  # per worker, non-permanent errors
JOB_RETRIES = int(facts.JOB_RETRIES_AFTER_WORKER_RESTARTS.value)  # then the whole job, this many times
MAX_PREEMPTION_RESTARTS = int(facts.SPOT_JOB_RESTARTS.value)  # a preempted Spot job
MAX_TRANSIENT_RESTARTS = int(facts.TRANSIENT_EXIT_RESTARTS.value)  # SIGABRT / SIGSEGV exits
# Exit statuses the service treats as possibly transient (a container reports 128 + signal; a
# process killed by the signal shows here as minus the signal).
TRANSIENT_EXITS = {6: "SIGABRT", 134: "SIGABRT", -6: "SIGABRT", 11: "SIGSEGV", 139: "SIGSEGV", -11: "SIGSEGV"}
REPLICA_CONTAINER = Path(__file__).with_name("replica_container.py")
# A bucket named in a spec: gs://NAME/... or /gcs/NAME/... anywhere in a value.
_BUCKET_IN = re.compile(r"(?:gs://|(?<![\w.~-])/gcs/)([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])(?=/|$|[\s'\";,)])")
_MOUNT_IN = re.compile(r"(?<![\w.~/-])/gcs(?=/)")


class CannotEmulate(RuntimeError):
    """This machine cannot run the job as Vertex would, and running it anyway could write to
    this machine's own files: the message says why and what to do instead."""


@dataclass
class ReplicaRun:
    """One process of one replica: which job attempt, which restart, how it ended."""

    pool: int
    index: int
    job_attempt: int
    restart: int
    argv: list[str]
    log_path: Path
    exit_code: int | None = None
    last_step: int | None = None
    signal_sent: str | None = None
    seconds: float = 0.0
    cwd: Path | None = None
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return f"workerpool{self.pool}[{self.index}]"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""


@dataclass
class LocalJob:
    """The outcome of an emulated job."""

    state: str
    runs: list[ReplicaRun]
    events: list[str]
    job_restarts: int
    worker_restarts: int
    seconds: float
    workdir: Path
    error: str = ""
    # job attempt -> {path as given in `snapshot`: the copy taken when that attempt ended}
    snapshots: dict[int, dict[str, Path]] = field(default_factory=dict)
    gcs_root: Path | None = None  # the folder standing in for Cloud Storage (default workdir/gcs)
    faults_sent: int = 0  # how many times the injected `Fault`'s signal was delivered
    job_id: str = ""

    @property
    def succeeded(self) -> bool:
        return self.state == SUCCEEDED

    def local(self, uri: str) -> Path:
        """Where a gs:// or /gcs/ path of the job lives on this machine."""
        return Path(LocalPaths(self.workdir, self.gcs_root)(uri))

    def container(self, replica: str = "workerpool0", job_attempt: int = 0) -> Path:
        """The folder that was `replica`'s container disk in an attempt (its working directory,
        or the folder that holds it when the image's files were copied in: `ReplicaRun.cwd`)."""
        return container_dir(self.workdir, job_attempt, *parse_replica(replica))

    def final(self, replica: str = "workerpool0") -> ReplicaRun:
        pool, index = parse_replica(replica)
        return [r for r in self.runs if (r.pool, r.index) == (pool, index)][-1]

    def failing(self) -> ReplicaRun | None:
        """The run whose exit decided a failed job (None when it succeeded)."""
        if self.succeeded:
            return None
        bad = [r for r in self.runs if r.exit_code not in (0, None)]
        return bad[-1] if bad else None

    def summary(self) -> str:
        lines = [f"{self.state} in {self.seconds:.1f}s: {self.job_restarts} job restart(s), "
                 f"{self.worker_restarts} replica restart(s)" + (f"; {self.error}" if self.error else "")]
        for r in self.runs:
            sig = f", got {r.signal_sent}" if r.signal_sent else ""
            lines.append(f"  attempt {r.job_attempt} {r.name} restart {r.restart}: exit {r.exit_code}, "
                         f"last step {r.last_step}{sig} ({r.seconds:.1f}s) log {r.log_path.name}")
        return "\n".join(lines)


class LocalPaths:
    """Cloud Storage as a local folder, `root` (default ``<workdir>/gcs``): bucket ``b`` is
    ``<root>/b``. Calling it maps a ``gs://`` address or a ``/gcs/`` path to the local file (for
    reading a job's outputs from this machine). `mount` is what the replicas see of a ``/gcs/``
    path in their args and env: unchanged where they run with ``/gcs`` mounted
    (`mounted=True`), else rewritten to the folder, wherever it appears in the value (a shell
    string holds several); their ``gs://`` addresses stay addresses."""

    def __init__(self, workdir: Path, root: str | os.PathLike | None = None, *, mounted: bool = False):
        # Absolute: replicas run in folders of their own.
        self.root = (Path(root) if root is not None else Path(workdir) / "gcs").resolve()
        self.mounted = mounted

    def __call__(self, value: str) -> str:
        for prefix in ("gs://", GCS_MOUNT + "/"):
            if value.startswith(prefix):
                return str(self.root / value[len(prefix):])
        return value

    def mount(self, value: str) -> str:
        if self.mounted:
            return value
        return _MOUNT_IN.sub(lambda _m: str(self.root), value)


def container_dir(workdir: str | os.PathLike, job_attempt: int, pool: int, index: int) -> Path:
    """The folder standing in for a replica's container disk in one job attempt."""
    return Path(workdir) / "containers" / f"attempt{job_attempt}" / f"workerpool{pool}-{index}"


def local_argv(container: Mapping[str, Any], paths: LocalPaths, where: str, image: Image | None = None) -> list[str]:
    """The command a container would run, as a local command line."""
    program = container_program(container, image or Image(), where)
    return [paths.mount(a) for a in program.argv]


def vertex_variables(spec: Mapping[str, Any], *, job_id: str, trial: str = "") -> dict[str, str]:
    """What Vertex sets in every replica besides the cluster description (read 2026-11-28):

    - ``AIP_MODEL_DIR``, ``AIP_CHECKPOINT_DIR``, ``AIP_TENSORBOARD_LOG_DIR``: ``gs://`` folders
      with a trailing slash under ``base_output_directory``, when it is set (the
      ``baseOutputDirectory`` field of
      https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec; a tuning trial's
      job has ``<base>/<trial id>`` as its base, as the service makes it);
    - ``CLOUD_ML_PROJECT_ID``, "in every serverless training container", the project number
      (https://cloud.google.com/vertex-ai/docs/training/code-requirements); here ``0``, as no
      project stands behind an emulated job;
    - ``CLOUD_ML_JOB_ID`` and, in a tuning trial, ``CLOUD_ML_TRIAL_ID``, which Google's own
      libraries read (python-aiplatform's training_utils, cloudml-hypertune);
    - ``AIP_TENSORBOARD_RESOURCE_NAME`` when the job names a Vertex AI TensorBoard (read by
      python-aiplatform's training_utils).

    The managed-dataset variables (``AIP_DATA_FORMAT``, ``AIP_TRAINING_DATA_URI`` ...) belong to
    training pipelines with a Vertex dataset, which a CustomJob has not."""
    env = {"CLOUD_ML_JOB_ID": job_id, "CLOUD_ML_PROJECT_ID": "0"}
    base = (field_of(spec, "base_output_directory") or {})
    prefix = field_of(base, "output_uri_prefix") if base else None
    if prefix:
        prefix = prefix.rstrip("/")
        env |= {"AIP_MODEL_DIR": f"{prefix}/model/", "AIP_CHECKPOINT_DIR": f"{prefix}/checkpoints/",
                "AIP_TENSORBOARD_LOG_DIR": f"{prefix}/logs/"}
    if field_of(spec, "tensorboard"):
        env["AIP_TENSORBOARD_RESOURCE_NAME"] = str(field_of(spec, "tensorboard"))
    if trial:
        env[TRIAL_ID_ENV] = trial
    return env


def tf_config(info, spec: Mapping[str, Any], *, job_id: str, trial: str = "") -> dict[str, Any]:
    """TF_CONFIG as Vertex writes it on each replica of a distributed job
    (https://cloud.google.com/vertex-ai/docs/training/distributed-training): the cluster with
    ``chief``, ``worker`` and ``ps`` (evaluators only as their own task), ``environment``
    "cloud", ``job`` (the CustomJobSpec), and a task with ``cloud`` (an internal id) and, in a
    tuning trial only, ``trial``."""
    out = info.tf_config()
    task = {**out["task"], "cloud": f"emulated-{job_id}"}
    if trial:
        task["trial"] = trial
    return {**out, "task": task, "environment": "cloud", "job": dict(spec)}


def replica_envs(spec: Mapping[str, Any], paths: LocalPaths, trial: str = "",
                 job_id: str = "0") -> dict[tuple[int, int], dict[str, str]]:
    """The environment Vertex gives each replica of `spec`, with loopback addresses. The AIP_*
    folders are ``gs://`` addresses, as on Vertex; ``/gcs/`` values of the container's env go
    through `LocalPaths.mount`. `trial` is the tuning trial's id, `job_id` the job's."""
    check_spec(spec)
    pools = field_of(spec, "worker_pool_specs")
    counts = [int(field_of(p, "replica_count") or 0) if p else 0 for p in pools]
    ports = iter(free_ports(sum(counts) + 1))
    master_port = next(ports)
    cluster = {f"workerpool{i}": [f"127.0.0.1:{next(ports)}" for _ in range(n)]
               for i, n in enumerate(counts) if n}
    common = vertex_variables(spec, job_id=job_id, trial=trial)
    out = {}
    for pool, n in enumerate(counts):
        program_spec = (field_of(pools[pool], "container_spec") or field_of(pools[pool], "python_package_spec")
                        or {}) if n else {}
        for index in range(n):
            # As Vertex documents it, CLUSTER_SPEC.job is the CustomJobSpec as an object; the
            # role of pool 2 (parameter servers or Reduction Server) is read from it.
            cs = {"cluster": cluster, "environment": "cloud",
                  "task": {"type": f"workerpool{pool}", "index": index, "trial": trial},
                  "job": dict(spec)}
            env = {"CLUSTER_SPEC": json.dumps(cs)}
            info = from_env(env)
            if sum(counts) > 1 and info.role != "reduction_server":
                env["TF_CONFIG"] = json.dumps(tf_config(info, spec, job_id=job_id, trial=trial))
            if info.is_training:  # one process per node: WORLD_SIZE and RANK count nodes
                env |= replace(info, master_addr="127.0.0.1", master_port=master_port).torch_env()
            env |= common
            for item in field_of(program_spec, "env") or []:
                env[item["name"]] = paths.mount(str(item.get("value", "")))
            out[(pool, index)] = env
    _share_gpus(out, replica_placement(spec))
    return out


def replica_placement(spec: Mapping[str, Any]):
    """Where the emulated training replicas of `spec` run on this machine (every node here):
    one GPU each when there are enough, else all on the CPU (`labkit.core.placement`; NCCL
    refuses two ranks on one GPU). Its `reason` says which, for the notebook."""
    from labkit.core import devices
    from labkit.core.placement import place

    counts = [int(field_of(p, "replica_count") or 0) if p else 0 for p in field_of(spec, "worker_pool_specs")]
    nodes = sum(counts[:2])  # pools 0 and 1 train; 2 and 3 never get a GPU here
    gpus = len(devices.detect().gpus) if devices.cuda_available() else 0
    return place(max(1, nodes), gpus)


def _share_gpus(envs: dict[tuple[int, int], dict[str, str]], where) -> None:
    """Give each emulated node its own GPU through CUDA_VISIBLE_DEVICES (each sees it as GPU 0,
    as a one-GPU Vertex node would), or hide the GPUs from all of them when `where` (the
    replicas' placement) put them on the CPU; replicas that do not train never see one."""
    if not where.gpus:
        return
    training = sorted(k for k in envs if k[0] in (0, 1))
    parent = os.environ.get("CUDA_VISIBLE_DEVICES")
    for key, env in envs.items():
        env["CUDA_VISIBLE_DEVICES"] = (where.visible_devices(training.index(key), parent)
                                       if key in training else "")


def describe_environments(spec: Mapping[str, Any], workdir: str | os.PathLike = "/tmp/labkit-job") -> str:
    """A table of what each replica of `spec` would see: role, ranks, the TF_CONFIG task and
    the torch variables (addresses are the emulator's loopback ports)."""
    envs = replica_envs(spec, LocalPaths(Path(workdir)))
    lines = [f"{'replica':<16} {'role':<17} {'rank':>4} {'WORLD':>5} {'TF_CONFIG task':<22} MASTER"]
    reducers = sorted(index for (pool, index), env in envs.items() if from_env(env).role == "reduction_server")
    for (pool, index), env in sorted(envs.items()):
        info = from_env(env)
        if info.role == "reduction_server" and len(reducers) > 2:  # one line for a pool of reducers
            if index == reducers[0]:
                lines.append(f"{f'workerpool{pool}[0..{reducers[-1]}]':<16} {info.role:<17} {'-':>4} "
                             f"{'-':>5} {'-':<22} - ({len(reducers)} replicas)")
            continue
        task = json.loads(env["TF_CONFIG"])["task"] if "TF_CONFIG" in env else None
        task_s = f"{task['type']}:{task['index']}" if task else "-"
        master = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}" if "MASTER_ADDR" in env else "-"
        lines.append(f"{f'workerpool{pool}[{index}]':<16} {info.role:<17} "
                     f"{'-' if info.rank is None else info.rank:>4} {env.get('WORLD_SIZE', '-'):>5} "
                     f"{task_s:<22} {master}")
    return "\n".join(lines)


# ---------------------------------------------------------------- containers and storage here

_container_support: dict[int, str | None] = {}


def container_support(scratch: Path) -> str | None:
    """None when replicas can run in containers of Linux namespaces here (checked once per
    process with a real replica), else why not."""
    uid = os.geteuid()
    if uid not in _container_support:
        gcs, mounts = scratch / "probe-gcs", scratch / "probe-mounts"
        gcs.mkdir(parents=True, exist_ok=True)
        mounts.mkdir(parents=True, exist_ok=True)
        try:
            out = subprocess.run([sys.executable, str(REPLICA_CONTAINER), "--probe", str(gcs), str(mounts)],
                                 capture_output=True, text=True, timeout=60)
            reason = None if out.returncode == 0 else (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired) as e:
            reason = str(e)
        shutil.rmtree(gcs, ignore_errors=True)
        _remove_empty_tree(mounts)
        _container_support[uid] = reason
    return _container_support[uid]


def _remove_empty_tree(folder: Path) -> None:
    """Remove `folder` if it holds only empty folders (mount points left by replicas)."""
    if not folder.is_dir():
        return
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            sub.rmdir()
        except OSError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass


def _host_gcs_writable() -> bool:
    """Whether this process could write under this machine's own ``/gcs`` (or create it)."""
    if os.path.lexists(GCS_MOUNT):
        return os.access(GCS_MOUNT, os.W_OK)
    return os.access("/", os.W_OK)


def buckets_named(spec: Mapping[str, Any], extra: Iterable[str] = ()) -> set[str]:
    """Every bucket a spec names (output folder, args, env, packages), so the emulated bucket
    exists before a replica writes to it, as the real one would."""
    text = json.dumps(dict(spec)) + " " + " ".join(extra)
    return set(_BUCKET_IN.findall(text))


# ---------------------------------------------------------------- running a job


def run_local(
    spec: Mapping[str, Any],
    workdir: str | os.PathLike,
    *,
    fault: Fault | None = None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    worker_grace_s: float = 60.0,
    snapshot: Sequence[str] = (),
    gcs_root: str | os.PathLike | None = None,
    trial: str = "",
    stop_when: Callable[[], bool] | None = None,
    show_progress: bool = True,
    image: Image | None = None,
    job_id: str | None = None,
    step_pattern: str | None = None,
    gcs_mount: str = "auto",
    on_output: Callable[[str, str], None] | None = None,
) -> LocalJob:
    """Run every replica of `spec` as a local process and apply Vertex's restart rules.

    `env` adds variables to every replica (on top of this process's environment). `timeout_s`
    (default: the spec's scheduling.timeout, else Vertex's own default of 7 days) fails the job
    when exceeded. `snapshot`: files (gs://, /gcs/ or local paths) to copy when each attempt
    ends, e.g. a metrics file the next attempt will overwrite; see `LocalJob.snapshots`.
    `gcs_root`: the folder standing in for Cloud Storage (default ``<workdir>/gcs``; jobs that
    share a bucket, such as the trials of a study, share it). `trial`: a tuning trial's id
    (CLUSTER_SPEC.task.trial and CLOUD_ML_TRIAL_ID); `job_id`: CLOUD_ML_JOB_ID (default: a
    number made from the time). `stop_when()` is polled while the job runs; when it returns
    True every replica is stopped and the job ends JOB_STATE_CANCELLED (how the tuning service
    stops a trial early). `show_progress`: a progress bar of the furthest step any replica
    reported, read with `step_pattern` (a regular expression whose first group is the step;
    default: labkit's progress lines; a `Fault`'s own pattern wins). `image`: the image's
    ENTRYPOINT, CMD, working directory and local files (`labkit.vertex.programs.Image`).
    `gcs_mount`: "auto" (a namespace container per replica where the machine allows it, else
    ``/gcs/`` rewritten in args and env, refused where the job could write to this machine's
    own ``/gcs``), "namespace" (required) or "rewrite" (args and env only, accepted as is).
    `on_output(replica, line)` is called with every line a replica prints (its log has them all).

    Raises `ParameterError` naming the field for a spec it cannot run and `CannotEmulate` when
    this machine cannot keep the job's ``/gcs`` paths off its own disk, both before any replica
    starts."""
    if has_aiplatform():
        validate(spec)
    else:
        check_spec(spec)
    if gcs_mount not in ("auto", "namespace", "rewrite"):
        raise ParameterError("gcs_mount", gcs_mount, "must be 'auto', 'namespace' or 'rewrite'")
    job = _EmulatedJob(spec, Path(workdir).resolve(), fault=fault, timeout_s=timeout_s, env=env,
                       worker_grace_s=worker_grace_s, snapshot=snapshot, gcs_root=gcs_root,
                       trial=trial, stop_when=stop_when, image=image or Image(),
                       job_id=job_id or str(int(time.time() * 1000)),
                       step_pattern=fault.step_pattern if fault and fault.step_pattern else step_pattern,
                       gcs_mount=gcs_mount, on_output=on_output)
    try:
        if not show_progress:
            return job.run()
        lock = threading.Lock()  # replicas report from their own reader threads
        replicas = sum(int(field_of(p, "replica_count") or 0) for p in field_of(spec, "worker_pool_specs") if p)
        with progress(None, f"local job, {replicas} replica(s)", unit="step") as bar:
            def advance(step: int) -> None:
                with lock:
                    if step > bar.n:
                        bar.update(step - bar.n)

            job.on_step = advance
            return job.run()
    finally:
        job.close()


class _EmulatedJob:
    """The state of one emulated job across its attempts: the replicas of the current attempt,
    the restart counters Vertex keeps, and the events and runs reported in the `LocalJob`."""

    def __init__(self, spec: Mapping[str, Any], workdir: Path, *, fault: Fault | None,
                 timeout_s: float | None, env: Mapping[str, str] | None, worker_grace_s: float,
                 snapshot: Sequence[str], gcs_root: str | os.PathLike | None, trial: str,
                 stop_when: Callable[[], bool] | None, image: Image, job_id: str,
                 step_pattern: str | None, gcs_mount: str,
                 on_output: Callable[[str, str], None] | None = None):
        self.spec, self.workdir, self.fault, self.trial, self.job_id = spec, workdir, fault, trial, job_id
        self.worker_grace_s, self.snapshot_files, self.stop_when = worker_grace_s, snapshot, stop_when
        self.storage = None
        self.on_output = on_output
        self.live: dict[tuple[int, int], _Replica] = {}
        self.events: list[str] = []
        workdir.mkdir(parents=True, exist_ok=True)
        self.mounts = workdir / ".mounts"
        self.paths = LocalPaths(workdir, gcs_root)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        sched = field_of(spec, "scheduling") or {}
        self.restart_job = bool(field_of(sched, "restart_job_on_worker_restart"))
        self.spot = field_of(sched, "strategy") == "SPOT"
        self.timeout_s = (float(str(field_of(sched, "timeout") or f"{DEFAULT_TIMEOUT_S}s").rstrip("s"))
                          if timeout_s is None else timeout_s)
        self.programs = self._programs(image)
        self.namespaces = self.paths.mounted = self._choose_mount(gcs_mount)
        for program in self.programs.values():
            program.argv = [self.paths.mount(a) for a in program.argv]
            program.env = {k: self.paths.mount(v) for k, v in program.env.items()}
        if fault is not None and fault.target[0] not in self.programs:
            raise ParameterError("fault.replica", fault.replica, "names a pool this job does not have")
        self._run_cuda_jobs_here()
        self.base_env = self._base_env(env)
        self._check_commands()
        self.read_step = StepReader(step_pattern)
        self.runs: list[ReplicaRun] = []
        self.on_step: Callable[[int], None] = lambda step: None  # the furthest step seen so far
        self.snapshots: dict[int, dict[str, Path]] = {}
        self.job_restarts = self.worker_restarts = self.preemptions = self.job_retries = 0
        self.transient_restarts = 0
        # Non-permanent failures per replica, kept across restart_job_on_worker_restart
        # restarts and cleared when the whole job is retried.
        self.failures: dict[tuple[int, int], int] = {}
        self.trigger = FaultTrigger(fault, self.events, self.paths)
        for bucket in sorted(buckets_named(spec, [*snapshot, *([fault.when_file] if fault and fault.when_file
                                                                else [])])):
            (self.paths.root / bucket).mkdir(exist_ok=True)
        from labkit.vertex.storage import LocalStorage

        self.storage = LocalStorage(self.paths.root, workdir / "storage")
        self.base_env |= self.storage.client_env(self.base_env)
        if not self.storage.intercepts_tensorflow:
            self.events.append("TensorFlow's gs:// is refused here (no certificate could be made for the "
                               "local Cloud Storage: install `cryptography`); other clients reach it")
        self.start = time.monotonic()

    # ------------------------------------------------------------ set-up, before any replica

    def _choose_mount(self, mode: str) -> bool:
        """Whether replicas run in namespace containers (True) or get ``/gcs`` rewritten."""
        if mode == "rewrite":
            return False
        reason = container_support(self.workdir / ".probe")
        if reason is None:
            return True
        if mode == "namespace":
            raise CannotEmulate(f"replicas cannot get their own /gcs here ({reason})")
        if _host_gcs_writable() and not all(_is_labkit(p.argv) for p in self.programs.values() if not p.idle):
            raise CannotEmulate(
                f"this machine cannot give the replicas their own /gcs ({reason}), and this user can "
                f"write to the machine's own {GCS_MOUNT}: a path the code builds under /gcs would land "
                "there. Allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                "or kernel.apparmor_restrict_unprivileged_userns=0), or accept that only /gcs paths in "
                "args and env are redirected (gcs_mount='rewrite', --gcs-mount rewrite)")
        self.events.append(f"replicas run without their own /gcs here ({reason}): /gcs/ in args and env "
                           "is redirected to the emulated bucket; other /gcs paths fail")
        return False

    def _programs(self, image: Image) -> dict[int, Program]:
        programs = {}
        install_dir = self.workdir / "python"
        for i, pool in enumerate(field_of(self.spec, "worker_pool_specs")):
            if not pool:
                continue
            where = f"worker_pool_specs[{i}]"
            container = field_of(pool, "container_spec")
            package = field_of(pool, "python_package_spec")
            if container:
                program = container_program(container, image, where + ".container_spec")
            elif package:
                program = package_program(package, where + ".python_package_spec", self.paths, install_dir)
            else:
                raise ParameterError(where, None, "has neither a container_spec nor a python_package_spec")
            self.events.extend(f"{where}: {note}" for note in program.notes)
            programs[i] = program
        return programs

    def _base_env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        # An enclosing Vertex job's AIP_* folders and trial must not leak into the emulated one.
        base = {k: v for k, v in child_env().items() if not k.startswith(("AIP_", "CLOUD_ML_"))}
        base |= {"PYTHONUNBUFFERED": "1", "LABKIT_EMULATED_VERTEX": "1"}
        base["PATH"] = os.pathsep.join(dict.fromkeys([str(Path(sys.executable).parent),
                                                      *base.get("PATH", os.defpath).split(os.pathsep)]))
        if not self.namespaces:
            base[LOCAL_GCS_ENV] = str(self.paths.root)
        base.setdefault("OMP_NUM_THREADS", "1")  # replicas share this machine's cores
        # A replica's step is read from its output (see StepReader): labkit's progress bars
        # print it, whatever this process's own setting.
        base[STYLE_ENV] = "terminal"
        base.pop(OFF_ENV, None)
        return base | dict(extra or {})

    def _check_commands(self) -> None:
        """Refuse a command that is not there before any replica starts."""
        for i, program in self.programs.items():
            exe = program.argv[0]
            if "/" in exe:
                found = Path(exe).is_file() or (program.files is not None and (program.files / exe).is_file())
            else:
                path = self._env_for(program, {})["PATH"]
                found = shutil.which(exe, path=path) is not None
            if not found:
                raise ParameterError(f"worker_pool_specs[{i}] command", exe,
                                     "is not a program here (not on PATH, nor a file in the image's "
                                     "working directory)")

    def _run_cuda_jobs_here(self) -> None:
        """Pools that ask for CUDA (``--device cuda``, as every job with GPUs does) run on the
        CPU where this machine has no GPU for each emulated node (`replica_placement`: none at
        all, or fewer GPUs than nodes); the events say so."""
        asking = [i for i, p in self.programs.items() if _device_flag(p.argv) == "cuda"]
        if not asking:
            return
        where = replica_placement(self.spec)
        if where.on_gpu:
            return
        for i in asking:
            argv = self.programs[i].argv
            argv[argv.index("--device") + 1] = "cpu"
            self.events.append(f"workerpool{i} asks for --device cuda; {where.reason}, so it runs with "
                               "--device cpu here")

    def _env_for(self, program: Program, vertex_env: Mapping[str, str]) -> dict[str, str]:
        """A replica's whole environment: ours, Vertex's, then the spec's (PATH and PYTHONPATH
        merged, the spec's entries first)."""
        env = self.base_env | dict(vertex_env)
        spec_env = dict(program.env)
        for name in ("PATH", "PYTHONPATH"):
            ours = [p for p in env.get(name, "").split(os.pathsep) if p]
            theirs = [p for p in spec_env.pop(name, "").split(os.pathsep) if p]
            extra = program.pythonpath if name == "PYTHONPATH" else []
            first = [str(Path(sys.executable).parent)] if name == "PATH" else []
            env[name] = os.pathsep.join(dict.fromkeys([*first, *extra, *theirs, *ours]))
        return env | {k: v for k, v in spec_env.items() if k not in ("PATH", "PYTHONPATH")}

    # ------------------------------------------------------------ the job's attempts

    def run(self) -> LocalJob:
        attempt = 0
        while True:
            outcome, error = self._attempt(attempt)
            self.snapshots[attempt] = _snapshot(self.snapshot_files, self.paths,
                                                self.workdir / "snapshots" / f"attempt{attempt}")
            if outcome != "restart_job":
                break
            self.job_restarts += 1
            attempt += 1
        state = {"succeeded": SUCCEEDED, "cancelled": CANCELLED}.get(outcome, FAILED)
        self.events.append(f"job {state}" + (f": {error}" if error else ""))
        return LocalJob(state, self.runs, self.events, self.job_restarts, self.worker_restarts,
                        time.monotonic() - self.start, self.workdir, error, self.snapshots,
                        self.paths.root, len(self.trigger.signalled), self.job_id)

    def close(self) -> None:
        """Stop whatever still runs (a job stopped by an exception, Ctrl-C included)."""
        for replica in list(self.live.values()):
            replica.finish(replica.process.stop(grace_s=5.0))
        self.live.clear()
        if self.storage is not None:
            self.storage.close()
            self.storage = None
        _remove_empty_tree(self.mounts)

    def _attempt(self, attempt: int) -> tuple[str, str]:
        """Run one attempt of the whole job; ("succeeded" | "failed" | "cancelled" |
        "restart_job", error)."""
        envs = replica_envs(self.spec, self.paths, trial=self.trial, job_id=self.job_id)
        self.live_keys = sorted(envs)
        live = self.live
        restarts = dict.fromkeys(envs, 0)
        trigger = self.trigger
        trigger.start_attempt(attempt, live)
        for key in envs:
            live[key] = self._launch(key, attempt, 0, envs[key], trigger)
        self.events.append(f"attempt {attempt}: started {len(envs)} replica(s)")
        outcome, error = self._watch(attempt, live, envs, restarts, trigger)
        # The job no longer needs the rest: they may end on their own for 2 s (peers of a
        # replica that left usually do), then get SIGTERM, and SIGKILL 5 s later. A job stopped
        # from outside (a trial stopped early) is stopped at once.
        settle_s = 0.0 if outcome == "cancelled" else 2.0
        for key, replica in list(live.items()):
            replica.finish(replica.process.stop(grace_s=5.0, settle_s=settle_s))
            del live[key]
        return outcome, error

    def _launch(self, key: tuple[int, int], attempt: int, restart: int, env: dict[str, str],
                trigger: FaultTrigger) -> _Replica:
        pool, index = key
        program = self.programs[pool]
        log = self.workdir / "logs" / f"attempt{attempt}" / f"workerpool{pool}-{index}.restart{restart}.log"
        disk = container_dir(self.workdir, attempt, pool, index)
        (disk / "tmp").mkdir(parents=True, exist_ok=True)
        cwd, binds, inside = disk, [], None
        if program.files is not None and not program.idle:
            copy = disk / "image"
            if restart == 0 or not copy.exists():
                copy_image_files(program.files, copy, skip=[self.workdir])
            cwd = copy / program.start_in if program.start_in else copy
            binds, inside = _image_binds(program, copy, cwd) if self.namespaces else ([], None)
        argv = program.argv
        if self.namespaces:
            config = {"gcs_root": str(self.paths.root), "mounts": str(self.mounts), "binds": binds,
                      "cwd": inside or str(cwd), "hostname": self._hostname(pool, index),
                      "hosts": [self._hostname(p, i) for p, i in self.live_keys]}
            self.mounts.mkdir(exist_ok=True)
            argv = [sys.executable, str(REPLICA_CONTAINER), json.dumps(config), "--", *argv]
        run = ReplicaRun(pool, index, attempt, restart, program.argv, log, cwd=cwd)
        self.runs.append(run)
        replica_env = {METRIC_FILE_ENV: str(disk / "tmp" / "hypertune" / "output.metrics")}

        def saw(step: int) -> None:
            trigger(step)
            self.on_step(step)

        return _Replica(run, argv, replica_env | self._env_for(program, env), saw, cwd, self.read_step,
                        self.on_output)

    def _hostname(self, pool: int, index: int) -> str:
        """A replica's host name, in the form Vertex's replicas have."""
        return f"cmle-training-workerpool{pool}-{self.job_id[-6:]}-{index}"

    def _watch(self, attempt: int, live: dict[tuple[int, int], _Replica], envs: dict,
               restarts: dict[tuple[int, int], int], trigger: FaultTrigger) -> tuple[str, str]:
        """Poll the attempt's replicas until the job's outcome is decided."""
        chief_done_at = None
        while True:
            time.sleep(0.05)
            trigger.poll()
            if time.monotonic() - self.start > self.timeout_s:
                return "failed", f"timeout after {self.timeout_s:.0f}s"
            if self.stop_when is not None and self.stop_when():
                self.events.append(f"attempt {attempt}: stopped early")
                return "cancelled", "stopped early"
            # The job succeeds once the primary replica exited 0 and the workers finished too
            # (or did not within `worker_grace_s`); other pools are then stopped.
            if chief_done_at is not None and (
                    not any(k[0] == 1 for k in live) or time.monotonic() - chief_done_at > self.worker_grace_s):
                return "succeeded", ""
            for key, replica in list(live.items()):
                if replica.process.poll() is None:
                    continue
                code = replica.finish()
                del live[key]
                self.events.append(f"attempt {attempt}: {replica.run.name} exited {code}")
                if code == 0:
                    chief_done_at = time.monotonic() if key == (0, 0) else chief_done_at
                    continue
                if chief_done_at is not None:  # the job has succeeded; Vertex stops the rest now
                    self.events.append(f"attempt {attempt}: {replica.run.name} exited {code} after the "
                                       "primary replica succeeded: the job has succeeded")
                    continue
                decided = self._after_failure(attempt, key, replica.run, restarts, trigger)
                if decided is not None:
                    return decided
                live[key] = self._launch(key, attempt, restarts[key], envs[key], trigger)

    def _after_failure(self, attempt: int, key: tuple[int, int], run: ReplicaRun,
                       restarts: dict[tuple[int, int], int], trigger: FaultTrigger) -> tuple[str, str] | None:
        """Vertex's rules for a replica that exited non-zero, by cause: the job's outcome, or
        None when the replica is restarted on its own (its restart count is incremented)."""
        name, code = run.name, run.exit_code
        if trigger.fired:  # the machine's side: a preemption, or a non-permanent error
            if self.spot and trigger.fault.signal == "SIGTERM":
                self.preemptions += 1
                if self.preemptions > MAX_PREEMPTION_RESTARTS:
                    return "failed", (f"preempted more than {MAX_PREEMPTION_RESTARTS} times "
                                      f"({facts.SPOT_JOB_RESTARTS.cite()})")
                self.events.append(f"attempt {attempt}: {trigger.fault.replica} was preempted (Spot): "
                                   f"job restarts ({name} exited {code})")
                return "restart_job", ""
            return self._non_permanent(attempt, key, name, restarts)
        if code in TRANSIENT_EXITS:
            if self.transient_restarts >= MAX_TRANSIENT_RESTARTS:
                return "failed", (f"{name} exited {code} ({TRANSIENT_EXITS[code]}) after "
                                  f"{self.transient_restarts} job restarts ({facts.TRANSIENT_EXIT_RESTARTS.cite()})")
            self.transient_restarts += 1
            self.events.append(f"attempt {attempt}: {name} exited {code} ({TRANSIENT_EXITS[code]}, "
                               f"possibly transient): job restart {self.transient_restarts} of "
                               f"{MAX_TRANSIENT_RESTARTS}")
            return "restart_job", ""
        last = _last_line(run.log())
        return "failed", (f"{name} exited {code}: an error in the code is permanent, the job is not "
                          f"restarted ({facts.PERMANENT_ERROR_RESTARTS.cite()})"
                          + (f"; its last words: {last}" if last else ""))

    def _non_permanent(self, attempt: int, key: tuple[int, int], name: str,
                       restarts: dict[tuple[int, int], int]) -> tuple[str, str] | None:
        """A worker restart (alone, or of the whole job with restart_job_on_worker_restart), up
        to `MAX_WORKER_RESTARTS`; then a retry of the whole job, up to `JOB_RETRIES`."""
        failures = self.failures.get(key, 0)
        if failures < MAX_WORKER_RESTARTS:
            self.failures[key] = failures + 1
            if self.restart_job:
                self.events.append(f"attempt {attempt}: {name} restarts (restart {failures + 1} of "
                                   f"{MAX_WORKER_RESTARTS}); restart_job_on_worker_restart: job restarts")
                return "restart_job", ""
            restarts[key] += 1
            self.worker_restarts += 1
            self.events.append(f"attempt {attempt}: restarting {name} (restart {failures + 1} of "
                               f"{MAX_WORKER_RESTARTS})")
            return None
        if self.job_retries >= JOB_RETRIES:
            return "failed", (f"{name} failed after {failures} restarts, and the job after "
                              f"{self.job_retries} retries ({facts.JOB_RETRIES_AFTER_WORKER_RESTARTS.cite()})")
        self.job_retries += 1
        self.failures.clear()
        self.events.append(f"attempt {attempt}: {name} failed after {failures} restarts: "
                           f"job retry {self.job_retries} of {JOB_RETRIES}")
        return "restart_job", ""


class _Replica:
    """A running replica: its `labkit.core.launcher.Process` (own session, output teed to the
    run's log) and its `ReplicaRun`, whose last step is tracked from the output."""

    def __init__(self, run: ReplicaRun, argv: list[str], env: dict[str, str], on_step, cwd: Path,
                 read_step: StepReader, on_output: Callable[[str, str], None] | None = None):
        self.run, self.on_step, self.read_step, self.on_output = run, on_step, read_step, on_output
        run.started, run.started_wall = time.monotonic(), time.time()
        self.process = Process(ProcessSpec(run.name, argv, env, log_path=run.log_path,
                                           on_line=self._saw, cwd=cwd))

    def _saw(self, line: str) -> None:
        if self.on_output is not None:
            self.on_output(self.run.name, line)
        step = self.read_step(line)
        if step is not None:
            self.run.last_step = step
            self.on_step(step)

    def send(self, name: str, grace_s: float) -> None:
        """`name` to the replica's process; after SIGTERM, SIGKILL of its group `grace_s`
        later, like a Spot VM's shutdown."""
        self.run.signal_sent = self.run.signal_sent or name
        self.process.send_signal(name, kill_after_s=grace_s if name == "SIGTERM" else None)

    def finish(self, code: int | None = None) -> int:
        code = self.process.wait() if code is None else code
        self.run.exit_code = code
        self.run.seconds = self.process.seconds
        self.process.close()
        return code


def _is_labkit(argv: Sequence[str]) -> bool:
    """Whether a command runs labkit's own code (``python -m labkit...``), which reaches the
    bucket only through its flags and ``LABKIT_LOCAL_GCS``, so rewriting them is enough."""
    return len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and \
        (argv[2] == "labkit" or argv[2].startswith("labkit."))


def _image_binds(program: Program, copy: Path, cwd: Path) -> tuple[list[list[str]], str | None]:
    """Where a replica's copy of the image's files appears inside its container: at their own
    paths when those are free on this machine (a top-level folder it lacks, such as ``/app``),
    and the path to start in there (None: start in the copy itself)."""
    binds: list[list[str]] = []
    if program.as_root:
        binds = [[str(entry), "/" + entry.name] for entry in sorted(copy.iterdir())
                 if entry.is_dir() and not os.path.lexists("/" + entry.name)]
    elif program.container_workdir and program.container_workdir.startswith("/") \
            and not os.path.lexists("/" + program.container_workdir.strip("/").split("/")[0]):
        binds = [[str(cwd), program.container_workdir]]
    inside = program.container_workdir
    bound = {b[1] for b in binds}
    if inside and inside != "/" and any(inside == b or inside.startswith(b + "/") for b in bound):
        return binds, inside
    return binds, None


def _device_flag(argv: Sequence[str]) -> str | None:
    """The value of a ``--device VALUE`` flag in a command line (the form `to_argv` writes)."""
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def _last_line(log: str, width: int = 300) -> str:
    """The last line a replica printed that says something (for a failed job's error)."""
    for line in reversed(log.splitlines()):
        line = line.strip()
        if line and not line.startswith(("[", "launching:")) and "%|" not in line:
            return line[-width:]
    return ""


def _snapshot(files: Sequence[str], paths: LocalPaths, dest: Path) -> dict[str, Path]:
    out = {}
    for name in files:
        src = Path(paths(name))
        if src.is_file():
            dest.mkdir(parents=True, exist_ok=True)
            out[name] = Path(shutil.copy2(src, dest / src.name))
    return out
