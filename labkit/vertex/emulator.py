"""Run a CustomJob spec on this machine the way Vertex AI would run it: one process per replica.

Each replica gets the environment Vertex gives it: CLUSTER_SPEC, TF_CONFIG (multi-replica jobs),
MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK on training replicas, and AIP_MODEL_DIR /
AIP_CHECKPOINT_DIR / AIP_TENSORBOARD_LOG_DIR under `base_output_directory`, as the same
``gs://…/`` addresses Vertex gives. Addresses are loopback ports.

Cloud Storage is a local folder, ``<workdir>/gcs`` (or `gcs_root`): bucket ``b`` is
``<folder>/b``. Replicas reach it the two ways they reach it on Vertex: ``gs://`` through fsspec
(a sitecustomize the emulator puts first on PYTHONPATH registers `labkit.core.gcs`'s local
``gs`` file system while LABKIT_LOCAL_GCS names the folder), and the ``/gcs/`` mount (``/gcs/b/p``
in a container's args or env becomes ``<folder>/b/p``; `labkit.core.gcs.mount_path` maps
``gs://`` addresses there). Each replica runs in a folder of its own, its container's disk, new
for every job attempt: what a replica writes to a relative path such as
``Path("gs://b/x")`` (the local folder ``gs:/b/x``) stays there and is gone after a restart, as
on Vertex. Its ``CLOUD_ML_HP_METRIC_FILE`` (hyperparameter-tuning reports) is in that folder too.

Vertex's documented restart rules are applied by the cause of an exit (`labkit.hardware.facts`,
each rule with its page and read date). A replica that exits non-zero by itself has hit one of
the service's "common errors": a user-code exception (any exit status, such as 1 or 2) or an out
of memory kill is **permanent** and the job fails at once, with nothing restarted; SIGABRT and
SIGSEGV exits (6 or 134, 11 or 139) may be transient and restart the whole job, up to 3 times.
An injected fault stands for the machine's side: on a Spot job a SIGTERM is a preemption, which
restarts the whole job (up to 6 times); otherwise a signalled replica had a non-permanent error
and is restarted on its own up to 5 times, after which the whole job is retried up to 3 times
(with ``restart_job_on_worker_restart`` each of those restarts restarts the whole job). Exits
that follow an injected fault in the same attempt (peers losing the signalled replica) are put
down to it. The job succeeds when the primary replica (workerpool0) exits 0.

A spec that asks for GPUs passes ``--device cuda``; where this machine has no CUDA GPU the
emulator runs such replicas with ``--device cpu`` and says so in the job's events. `Fault` injects SIGTERM or SIGKILL into a chosen
replica once the job reports a chosen step (a ``step N`` line or a tqdm ``N/M`` counter in
any replica's output). Each replica is a `labkit.core.launcher.Process`: a session of its
own (a kill reaches all it started), its output in its own log file.

Reduction Server replicas run Google's image, which cannot run here: they are emulated by an
idle process so the pool layout and environment stay those of the real job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core.cluster import free_ports, from_env, is_reduction_server_image
from labkit.core.frameworks import has_aiplatform
from labkit.core.gcs import GCS_MOUNT, LOCAL_GCS_ENV
from labkit.core.hypertune import METRIC_FILE_ENV, TRIAL_ID_ENV
from labkit.core.launcher import Process, ProcessSpec, child_env
from labkit.core.progress import OFF_ENV, STYLE_ENV, progress
from labkit.hardware import facts
from labkit.vertex.specs import SETUP_MARKER, check_spec, validate

SUCCEEDED, FAILED, CANCELLED = "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"
# A job with no timeout of its own fails after this long. Emulated jobs are smoke-scale runs
# that finish in well under a minute; what runs longer is usually a hung replica (a DDP peer
# waits 30 minutes in a collective by default), and 10 minutes reports it before a notebook
# cell's own limit (900 s in `make test`) kills the kernel with no diagnosis. It is also the
# launcher's default for local process groups. Pass `timeout_s` for longer local runs.
DEFAULT_TIMEOUT_S = 600.0
# sitecustomize.py that registers the local gs:// file system in every replica.
SITE_DIR = Path(__file__).with_name("site")
# Vertex's documented restart rules (labkit.hardware.facts, each with its page and read date).
MAX_WORKER_RESTARTS = int(facts.WORKER_RESTARTS.value)  # per worker, non-permanent errors
JOB_RETRIES = int(facts.JOB_RETRIES_AFTER_WORKER_RESTARTS.value)  # then the whole job, this many times
MAX_PREEMPTION_RESTARTS = int(facts.SPOT_JOB_RESTARTS.value)  # a preempted Spot job
MAX_TRANSIENT_RESTARTS = int(facts.TRANSIENT_EXIT_RESTARTS.value)  # SIGABRT / SIGSEGV exits
# Exit statuses the service treats as possibly transient (a container reports 128 + signal; a
# process killed by the signal shows here as minus the signal).
TRANSIENT_EXITS = {6: "SIGABRT", 134: "SIGABRT", -6: "SIGABRT", 11: "SIGSEGV", 139: "SIGSEGV", -11: "SIGSEGV"}
_STEP_PATTERNS = (re.compile(r"\bstep[\s=:#]*(\d+)", re.I), re.compile(r"(\d+)/\d+\s*\["))
_IDLE = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True: time.sleep(0.2)"


@dataclass(frozen=True)
class Fault:
    """Send `signal` ("SIGTERM" or "SIGKILL") to `replica` ("workerpool1[0]", "workerpool0")
    once the job reports step `at_step` (in any replica's output), in job attempt `job_attempt` (0 = the first run) or later,
    `times` times in all (each time to a fresh run of the replica: a restart or a later attempt). After
    SIGTERM the replica has `grace_s` seconds before SIGKILL, like a Spot VM's shutdown (Vertex
    does not document the grace inside a container: labkit assumes the value in
    `labkit.hardware.facts.CONTAINER_SIGTERM_GRACE_S`)."""

    replica: str = "workerpool0"
    at_step: int = 1
    signal: str = "SIGTERM"
    job_attempt: int = 0
    grace_s: float = facts.CONTAINER_SIGTERM_GRACE_S.value
    times: int = 1

    def __post_init__(self) -> None:
        if self.signal not in ("SIGTERM", "SIGKILL"):
            raise ValueError(f"Fault.signal must be 'SIGTERM' or 'SIGKILL' (got {self.signal!r})")
        if isinstance(self.times, bool) or not isinstance(self.times, int) or self.times < 1:
            raise ValueError(f"Fault.times must be an integer >= 1 (got {self.times!r})")
        parse_replica(self.replica)

    @property
    def target(self) -> tuple[int, int]:
        return parse_replica(self.replica)


def parse_replica(name: str) -> tuple[int, int]:
    m = re.fullmatch(r"workerpool([0-3])(?:\[(\d+)\])?", name)
    if not m:
        raise ValueError(f"Fault.replica must look like 'workerpool1[0]' (got {name!r})")
    return int(m.group(1)), int(m.group(2) or 0)


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

    @property
    def succeeded(self) -> bool:
        return self.state == SUCCEEDED

    def local(self, uri: str) -> Path:
        """Where a gs:// or /gcs/ path of the job lives on this machine."""
        return Path(LocalPaths(self.workdir, self.gcs_root)(uri))

    def container(self, replica: str = "workerpool0", job_attempt: int = 0) -> Path:
        """The folder that was `replica`'s container disk (and working directory) in an attempt."""
        return container_dir(self.workdir, job_attempt, *parse_replica(replica))

    def final(self, replica: str = "workerpool0") -> ReplicaRun:
        pool, index = parse_replica(replica)
        return [r for r in self.runs if (r.pool, r.index) == (pool, index)][-1]

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
    reading a job's outputs from this machine); `mount` maps only ``/gcs/`` paths, which is what
    the bucket mount does for a replica (its ``gs://`` addresses stay addresses)."""

    def __init__(self, workdir: Path, root: str | os.PathLike | None = None):
        # Absolute: replicas run in folders of their own.
        self.root = (Path(root) if root is not None else Path(workdir) / "gcs").resolve()

    def __call__(self, value: str) -> str:
        for prefix in ("gs://", GCS_MOUNT + "/"):
            if value.startswith(prefix):
                return str(self.root / value[len(prefix):])
        return value

    def mount(self, value: str) -> str:
        if value.startswith(GCS_MOUNT + "/"):
            return str(self.root / value[len(GCS_MOUNT) + 1:])
        return value


def container_dir(workdir: str | os.PathLike, job_attempt: int, pool: int, index: int) -> Path:
    """The folder standing in for a replica's container disk in one job attempt."""
    return Path(workdir) / "containers" / f"attempt{job_attempt}" / f"workerpool{pool}-{index}"


def local_argv(container: Mapping[str, Any], paths: LocalPaths, where: str) -> list[str]:
    """The command a container would run, as a local command line."""
    command, args = list(container.get("command") or []), list(container.get("args") or [])
    if is_reduction_server_image(container.get("image_uri")):
        return [sys.executable, "-c", _IDLE]
    if len(command) == 4 and command[:2] == ["bash", "-c"] and command[3] == SETUP_MARKER:
        command = []  # the setup wrapper only pip-installs what this environment already has
    argv = command + args
    if not argv:
        raise ValueError(f"{where}.container_spec: no command or args; the image's ENTRYPOINT "
                         "cannot be run locally, so give the command explicitly")
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    elif argv[0] == "papermill":
        argv[:1] = [sys.executable, "-m", "papermill"]
    return [paths.mount(a) for a in argv]


def replica_envs(spec: Mapping[str, Any], paths: LocalPaths, trial: str = "") -> dict[tuple[int, int], dict[str, str]]:
    """The environment Vertex gives each replica of `spec`, with loopback addresses. The AIP_*
    folders are ``gs://`` addresses, as on Vertex; ``/gcs/`` values of the container's env are
    mapped to the local bucket folder (`LocalPaths.mount`). `trial` is the tuning trial's id."""
    check_spec(spec)
    pools = spec["worker_pool_specs"]
    counts = [int(p["replica_count"]) if p else 0 for p in pools]
    ports = iter(free_ports(sum(counts) + 1))
    master_port = next(ports)
    cluster = {f"workerpool{i}": [f"127.0.0.1:{next(ports)}" for _ in range(n)]
               for i, n in enumerate(counts) if n}
    base = (spec.get("base_output_directory") or {}).get("output_uri_prefix")
    out = {}
    for pool, n in enumerate(counts):
        container = (pools[pool].get("container_spec") or {}) if n else {}
        for index in range(n):
            # As Vertex documents it, CLUSTER_SPEC.job is the CustomJobSpec as an object; the
            # role of pool 2 (parameter servers or Reduction Server) is read from it.
            cs = {"cluster": cluster, "environment": "cloud",
                  "task": {"type": f"workerpool{pool}", "index": index, "trial": trial},
                  "job": dict(spec)}
            env = {"CLUSTER_SPEC": json.dumps(cs)}
            info = from_env(env)
            if sum(counts) > 1 and info.role != "reduction_server":
                env["TF_CONFIG"] = json.dumps({**info.tf_config(), "environment": "cloud"})
            if info.is_training:  # one process per node: WORLD_SIZE and RANK count nodes
                env |= replace(info, master_addr="127.0.0.1", master_port=master_port).torch_env()
            if base:
                base = base.rstrip("/")
                env |= {"AIP_MODEL_DIR": f"{base}/model/", "AIP_CHECKPOINT_DIR": f"{base}/checkpoints/",
                        "AIP_TENSORBOARD_LOG_DIR": f"{base}/logs/"}
            if trial:
                env[TRIAL_ID_ENV] = trial
            for item in container.get("env") or []:
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

    counts = [int(p["replica_count"]) if p else 0 for p in spec["worker_pool_specs"]]
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


class _FaultTrigger:
    """Fires a `Fault` once the job reaches its step, up to `Fault.times` times, each time at a
    run of the target that was not signalled yet. The step is read from any replica's output
    (often only the chief prints progress) and the signal goes to the fault's target."""

    def __init__(self, fault: Fault | None, events: list[str]):
        self.fault, self.events = fault, events
        self.remaining = fault.times if fault is not None else 0
        self.live: dict = {}
        self.attempt = 0
        self.fired_in: set[int] = set()  # attempts in which it fired
        self.signalled: set[int] = set()  # id() of the ReplicaRuns it signalled
        self.lock = threading.Lock()

    def start_attempt(self, attempt: int, live: dict) -> None:
        self.attempt, self.live = attempt, live

    @property
    def fired(self) -> bool:
        """Whether it fired in the current attempt."""
        return self.attempt in self.fired_in

    def __call__(self, step: int) -> None:
        fault = self.fault
        if fault is None or self.remaining <= 0 or self.attempt < fault.job_attempt or step < fault.at_step:
            return
        with self.lock:
            target = self.live.get(fault.target)
            if self.remaining <= 0 or target is None or id(target.run) in self.signalled:
                return
            self.remaining -= 1
            self.signalled.add(id(target.run))
            self.fired_in.add(self.attempt)
            target.send(fault.signal, fault.grace_s)
            self.events.append(f"attempt {target.run.job_attempt}: sent {fault.signal} to "
                               f"{target.run.name} at step {step}")


def _step_of(line: str) -> int | None:
    for pattern in _STEP_PATTERNS:
        m = pattern.search(line)
        if m:
            return int(m.group(1))
    return None


class _Replica:
    """A running replica: its `labkit.core.launcher.Process` (own session, output teed to the
    run's log) and its `ReplicaRun`, whose last step is tracked from the output."""

    def __init__(self, run: ReplicaRun, env: dict[str, str], on_step, cwd: Path):
        self.run, self.on_step = run, on_step
        self.process = Process(ProcessSpec(run.name, run.argv, env, log_path=run.log_path,
                                           on_line=self._saw, cwd=cwd))

    def _saw(self, line: str) -> None:
        step = _step_of(line)
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
) -> LocalJob:
    """Run every replica of `spec` as a local process and apply Vertex's restart rules.

    `env` adds variables to every replica (on top of this process's environment). `timeout_s`
    (default: the spec's scheduling.timeout, else `DEFAULT_TIMEOUT_S`) fails the job when
    exceeded. `snapshot`: files (gs://, /gcs/ or local paths) to copy when each attempt ends,
    e.g. a metrics file the next attempt will overwrite; see `LocalJob.snapshots`.
    `gcs_root`: the folder standing in for Cloud Storage (default ``<workdir>/gcs``; jobs that
    share a bucket, such as the trials of a study, share it). `trial`: a tuning trial's id
    (CLUSTER_SPEC.task.trial and CLOUD_ML_TRIAL_ID). `stop_when()` is polled while the job runs;
    when it returns True every replica is stopped and the job ends JOB_STATE_CANCELLED (how
    the tuning service stops a trial early). `show_progress`: a progress bar of the furthest
    step any replica reported (`labkit.core.progress`)."""
    if has_aiplatform():
        validate(spec)
    else:
        check_spec(spec)
    job = _EmulatedJob(spec, Path(workdir).resolve(), fault=fault, timeout_s=timeout_s, env=env,
                       worker_grace_s=worker_grace_s, snapshot=snapshot, gcs_root=gcs_root,
                       trial=trial, stop_when=stop_when)
    if not show_progress:
        return job.run()
    replicas = sum(int(p.get("replica_count", 1)) for p in spec["worker_pool_specs"] if p)
    lock = threading.Lock()  # replicas report from their own reader threads
    with progress(None, f"local job, {replicas} replica(s)", unit="step") as bar:
        def advance(step: int) -> None:
            with lock:
                if step > bar.n:
                    bar.update(step - bar.n)

        job.on_step = advance
        return job.run()


class _EmulatedJob:
    """The state of one emulated job across its attempts: the replicas of the current attempt,
    the restart counters Vertex keeps, and the events and runs reported in the `LocalJob`."""

    def __init__(self, spec: Mapping[str, Any], workdir: Path, *, fault: Fault | None,
                 timeout_s: float | None, env: Mapping[str, str] | None, worker_grace_s: float,
                 snapshot: Sequence[str], gcs_root: str | os.PathLike | None, trial: str,
                 stop_when: Callable[[], bool] | None):
        self.spec, self.workdir, self.fault, self.trial = spec, workdir, fault, trial
        self.worker_grace_s, self.snapshot_files, self.stop_when = worker_grace_s, snapshot, stop_when
        workdir.mkdir(parents=True, exist_ok=True)
        self.paths = LocalPaths(workdir, gcs_root)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        sched = spec.get("scheduling") or {}
        self.restart_job = bool(sched.get("restart_job_on_worker_restart"))
        self.spot = sched.get("strategy") == "SPOT"
        self.timeout_s = (float(str(sched.get("timeout", f"{DEFAULT_TIMEOUT_S}s")).rstrip("s"))
                          if timeout_s is None else timeout_s)
        self.argvs = {i: local_argv(p["container_spec"], self.paths, f"worker_pool_specs[{i}]")
                      for i, p in enumerate(spec["worker_pool_specs"]) if p}
        self.events: list[str] = []
        self._run_cuda_jobs_here()
        # An enclosing Vertex job's AIP_* folders and trial must not leak into the emulated one.
        base = {k: v for k, v in child_env().items() if not k.startswith(("AIP_", "CLOUD_ML_"))}
        base |= {"PYTHONUNBUFFERED": "1", "LABKIT_EMULATED_VERTEX": "1", LOCAL_GCS_ENV: str(self.paths.root)}
        base["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), base["PYTHONPATH"]])
        base.setdefault("OMP_NUM_THREADS", "1")  # replicas share this machine's cores
        # A replica's step is read from its progress bar (see _step_of): a fault's trigger, the
        # job's progress and each run's last step need it, whatever this process's own setting.
        base[STYLE_ENV] = "terminal"
        base.pop(OFF_ENV, None)
        self.base_env = base | dict(env or {})
        self.runs: list[ReplicaRun] = []
        self.on_step: Callable[[int], None] = lambda step: None  # the furthest step seen so far
        self.snapshots: dict[int, dict[str, Path]] = {}
        self.job_restarts = self.worker_restarts = self.preemptions = self.job_retries = 0
        self.transient_restarts = 0
        # Non-permanent failures per replica, kept across restart_job_on_worker_restart
        # restarts and cleared when the whole job is retried.
        self.failures: dict[tuple[int, int], int] = {}
        self.trigger = _FaultTrigger(fault, self.events)
        self.start = time.monotonic()

    def _run_cuda_jobs_here(self) -> None:
        """Pools that ask for CUDA (``--device cuda``, as every job with GPUs does) run on the
        CPU where this machine has no GPU for each emulated node (`replica_placement`: none at
        all, or fewer GPUs than nodes); the events say so."""
        asking = [i for i, argv in self.argvs.items() if _device_flag(argv) == "cuda"]
        if not asking:
            return
        where = replica_placement(self.spec)
        if where.on_gpu:
            return
        for i in asking:
            argv = self.argvs[i]
            argv[argv.index("--device") + 1] = "cpu"
            self.events.append(f"workerpool{i} asks for --device cuda; {where.reason}, so it runs with "
                               "--device cpu here")

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
                        self.paths.root, len(self.trigger.signalled))

    def _attempt(self, attempt: int) -> tuple[str, str]:
        """Run one attempt of the whole job; ("succeeded" | "failed" | "cancelled" |
        "restart_job", error)."""
        envs = replica_envs(self.spec, self.paths, trial=self.trial)
        live: dict[tuple[int, int], _Replica] = {}
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
        for replica in live.values():
            replica.finish(replica.process.stop(grace_s=5.0, settle_s=settle_s))
        return outcome, error

    def _launch(self, key: tuple[int, int], attempt: int, restart: int, env: dict[str, str],
                trigger: _FaultTrigger) -> _Replica:
        pool, index = key
        log = self.workdir / "logs" / f"attempt{attempt}" / f"workerpool{pool}-{index}.restart{restart}.log"
        run = ReplicaRun(pool, index, attempt, restart, self.argvs[pool], log)
        self.runs.append(run)
        disk = container_dir(self.workdir, attempt, pool, index)
        (disk / "tmp").mkdir(parents=True, exist_ok=True)
        replica_env = {METRIC_FILE_ENV: str(disk / "tmp" / "hypertune" / "output.metrics")}

        def saw(step: int) -> None:
            trigger(step)
            self.on_step(step)

        return _Replica(run, replica_env | self.base_env | env, saw, disk)

    def _watch(self, attempt: int, live: dict[tuple[int, int], _Replica], envs: dict,
               restarts: dict[tuple[int, int], int], trigger: _FaultTrigger) -> tuple[str, str]:
        """Poll the attempt's replicas until the job's outcome is decided."""
        chief_done_at = None
        while True:
            time.sleep(0.05)
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
                decided = self._after_failure(attempt, key, replica.run, restarts, trigger)
                if decided is not None:
                    return decided
                live[key] = self._launch(key, attempt, restarts[key], envs[key], trigger)

    def _after_failure(self, attempt: int, key: tuple[int, int], run: ReplicaRun,
                       restarts: dict[tuple[int, int], int], trigger: _FaultTrigger) -> tuple[str, str] | None:
        """Vertex's rules for a replica that exited non-zero, by cause: the job's outcome, or
        None when the replica is restarted on its own (its restart count is incremented)."""
        name, code = run.name, run.exit_code
        if trigger.fired:  # the machine's side: a preemption, or a non-permanent error
            if self.spot and trigger.fault.signal == "SIGTERM":
                self.preemptions += 1
                if self.preemptions > MAX_PREEMPTION_RESTARTS:
                    return "failed", (f"preempted more than {MAX_PREEMPTION_RESTARTS} times "
                                      f"({facts.SPOT_JOB_RESTARTS.cite()})")
                self.events.append(f"attempt {attempt}: {name} was preempted (Spot): job restarts")
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
