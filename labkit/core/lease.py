"""One writer per checkpoint folder: a lease file that names its holder.

Two runs saving into one folder overwrite each other's steps without a word, and a resume
then picks up a mixture. Before its first step a run that checkpoints takes the folder's lease:
it writes ``LEASE`` (JSON: owner, host, pid and its start time, when it was taken, a heartbeat,
the Vertex AI job identity where the environment gives one, and a random token), reads it back,
and keeps it fresh from a background thread. A second run finds the lease and is refused with
`LeaseHeld`, which names the holder. A lease is stale, and taken over with a `LeaseWarning`,
when its holder is gone:

- same host, and the process is gone (no such pid, a zombie that has exited but not been
  reaped yet, or a pid reused by a process that started later than the holder);
- another host, and the heartbeat is older than `STALE_AFTER_S` (a holder renews it every
  `HEARTBEAT_S`; a process on another machine cannot be asked whether it lives).

A replica of the same Vertex job (``CLOUD_ML_JOB_ID``, the same trial) takes over the lease of
an earlier attempt without a warning: that is the job restarting after a preemption, on a new VM.

The file goes through fsspec, so the same code serves a local folder, ``gs://`` and a ``/gcs/``
mount. Cloud Storage has no compare-and-swap through this interface, so two writers starting in
the same instant could both write the file; each reads it back after a short pause and only the
one whose token is there goes on (last writer wins on GCS and its mount), and a holder checks the
token again before each commit (`verify`), so a writer that lost its lease stops instead of
mixing steps. The lease is released (the file removed) when the run ends, preempted or not.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

LEASE_FILE = "LEASE"
HEARTBEAT_S = 30.0
# A holder on another host whose heartbeat is older than this is taken to be gone: ten missed
# heartbeats, long enough for a slow bucket and a busy host, short enough for a Spot restart.
STALE_AFTER_S = 300.0
JOB_ENV = ("CLOUD_ML_JOB_ID", "CLOUD_ML_TRIAL_ID")
SETTLE_S = 0.2  # pause before reading the lease back, so a writer racing ours has landed


class LeaseHeld(OSError):
    """Another live run holds the checkpoint folder's lease."""


class LeaseLost(OSError):
    """This run's lease was taken over (it was thought gone): it must not commit any more."""


class LeaseWarning(UserWarning):
    """A stale lease was taken over."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease; `since` and `heartbeat` are Unix times."""

    owner: str
    host: str
    pid: int
    pid_start: float | None
    since: float
    heartbeat: float
    job: str | None
    token: str

    @classmethod
    def me(cls, env: Mapping[str, str] | None = None) -> Holder:
        now = time.time()
        return cls(owner=_user(), host=socket.gethostname(), pid=os.getpid(),
                   pid_start=process_start_time(os.getpid()), since=now, heartbeat=now,
                   job=job_identity(env), token=uuid.uuid4().hex)

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        age = time.time() - self.heartbeat
        job = f", Vertex job {self.job}" if self.job else ""
        return f"pid {self.pid} on host {self.host} (user {self.owner}{job}), since {when}, " \
               f"heartbeat {age:.0f}s ago"


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def job_identity(env: Mapping[str, str] | None = None) -> str | None:
    """The Vertex AI job (and tuning trial) this process belongs to, None outside one."""
    env = os.environ if env is None else env
    job, trial = (env.get(name, "") for name in JOB_ENV)
    if not job:
        return None
    return f"{job}/{trial}" if trial else job


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (Linux), None when unknown or gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    parts = stat.rsplit(")", 1)
    return parts[1].split() if len(parts) == 2 else None


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (clock ticks since boot, Linux), None when unknown or gone;
    tells a reused pid from the holder."""
    stat = _stat_fields(pid)
    try:
        return float(stat[19]) if stat else None  # field 22, starttime
    except (IndexError, ValueError):
        return None


def _exited(pid: int) -> bool:
    """Process `pid` has ended but is not reaped yet (a zombie, state Z or X): it writes no more."""
    stat = _stat_fields(pid)
    return bool(stat) and stat[0] in ("Z", "X")


def _alive(holder: Holder) -> bool:
    """The holder's process still runs (asked on its own host only)."""
    try:
        os.kill(holder.pid, 0)  # succeeds for a zombie too: /proc tells
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    if _exited(holder.pid):
        return False
    started = process_start_time(holder.pid)
    return holder.pid_start is None or started is None or started == holder.pid_start


def stale_reason(holder: Holder, *, stale_after_s: float = STALE_AFTER_S,
                 now: float | None = None) -> str | None:
    """Why `holder` is taken to be gone, None when it may still be writing."""
    if holder.host == socket.gethostname():
        return None if _alive(holder) else f"pid {holder.pid} on this host is gone"
    age = (time.time() if now is None else now) - holder.heartbeat
    if age > stale_after_s:
        return f"its heartbeat is {age:.0f}s old (stale after {stale_after_s:.0f}s)"
    return None


def _fs(directory: str):
    import fsspec

    fs, root = fsspec.core.url_to_fs(str(directory))
    return fs, root.rstrip("/")


def read_holder(directory: str) -> Holder | None:
    """The lease of `directory`, None when there is none (or it is unreadable: a half-written
    lease of a writer that died mid-write holds nothing)."""
    fs, root = _fs(directory)
    try:
        with fs.open(f"{root}/{LEASE_FILE}", "r") as f:
            data = json.loads(f.read())
        holder = Holder(**{k: data.get(k) for k in Holder.__dataclass_fields__})
    except (FileNotFoundError, json.JSONDecodeError, TypeError, ValueError):
        return None
    numbers = (holder.pid, holder.since, holder.heartbeat)
    if not all(isinstance(n, (int, float)) for n in numbers) or not holder.token or not holder.host:
        return None
    return holder


def check_free(directory: str, env: Mapping[str, str] | None = None, *,
               stale_after_s: float = STALE_AFTER_S, name: str = "checkpoint_dir") -> None:
    """Raise LeaseHeld when a live run (not an earlier attempt of this job) holds `directory`
    (the output setting `name`)."""
    holder = read_holder(directory)
    if holder is not None and not _ours(holder, job_identity(env)) and \
            stale_reason(holder, stale_after_s=stale_after_s) is None:
        raise _held(directory, holder, stale_after_s, name)


def _ours(holder: Holder, job: str | None) -> bool:
    return holder.pid == os.getpid() and holder.host == socket.gethostname() or \
        (job is not None and holder.job == job)


def _held(directory: str, holder: Holder, stale_after_s: float = STALE_AFTER_S,
          name: str = "checkpoint_dir") -> LeaseHeld:
    if holder.host == socket.gethostname():  # the process can be asked directly: no heartbeat rule
        when = f"as soon as pid {holder.pid} has exited"
    else:
        when = f"once its heartbeat is {stale_after_s:.0f}s old"
    flag = name if name.startswith(("-", "OUT", "DEST")) else "--" + name.replace("_", "-")
    return LeaseHeld(f"{name} {directory} is being written by another run: "
                     f"{holder.describe()}; wait for it to finish, or give another "
                     f"{flag} (the lease is taken over automatically {when})")


class Lease:
    """The lease on one output folder (a checkpoint folder, a shard set's folder, a course
    run's folder: `name` is the setting that names it, for messages), as a context manager:
    `acquire` on entry (raises LeaseHeld), `release` on exit. `verify()` raises LeaseLost when
    another writer has taken it over."""

    def __init__(self, directory: str, *, env: Mapping[str, str] | None = None,
                 heartbeat_s: float = HEARTBEAT_S, stale_after_s: float = STALE_AFTER_S,
                 name: str = "checkpoint_dir"):
        self.directory = str(directory)
        self.name = name
        self.holder = Holder.me(env)
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.held = False

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    @property
    def path(self) -> str:
        fs, root = _fs(self.directory)
        return f"{root}/{LEASE_FILE}"

    def acquire(self) -> Lease:
        fs, root = _fs(self.directory)
        current = read_holder(self.directory)
        if current is not None and current.token != self.holder.token:
            reason = stale_reason(current, stale_after_s=self.stale_after_s)
            if current.job is not None and current.job == self.holder.job:
                pass  # an earlier attempt of this job (a restart after preemption): ours to take
            elif reason is None:
                raise _held(self.directory, current, self.stale_after_s, self.name)
            else:
                warnings.warn(f"{self.name} {self.directory}: taking over the lease of "
                              f"{current.describe()}: {reason}", LeaseWarning, stacklevel=2)
        fs.makedirs(root, exist_ok=True)
        self._write()
        time.sleep(SETTLE_S)
        landed = read_holder(self.directory)
        if landed is None or landed.token != self.holder.token:
            if landed is None:
                raise LeaseHeld(f"{self.name} {self.directory}: the lease could not be read "
                                "back after writing it")
            raise _held(self.directory, landed, self.stale_after_s, self.name)
        self.held = True
        self._thread = threading.Thread(target=self._beat, name="checkpoint-lease", daemon=True)
        self._thread.start()
        return self

    def _write(self) -> None:
        """Write the lease whole, through a file beside it and a rename: a reader (this run's
        `verify` before a commit, or another run checking the folder) must never find it empty
        while the heartbeat rewrites it. (A rename is atomic on a local disk; on Cloud Storage it
        is a copy, whose object appears complete, then a delete.)"""
        fs, _ = _fs(self.directory)
        partial = f"{self.path}.{self.holder.token}.partial"
        with self._lock:
            with fs.open(partial, "w") as f:
                f.write(json.dumps(asdict(self.holder), indent=1))
            fs.mv(partial, self.path)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.renew()
            except OSError:
                continue  # a failed heartbeat is retried; verify() is what stops a writer

    def renew(self) -> None:
        """Refresh the heartbeat, unless the lease was taken over (then only `verify` says so)."""
        current = read_holder(self.directory)
        if current is not None and current.token != self.holder.token:
            return
        self.holder = replace(self.holder, heartbeat=time.time())
        self._write()

    def verify(self) -> None:
        """Raise LeaseLost when the folder's lease is no longer this run's (call before a commit)."""
        current = read_holder(self.directory)
        if current is None or current.token != self.holder.token:
            who = current.describe() if current is not None else "nobody (the lease file is gone)"
            raise LeaseLost(f"{self.name} {self.directory}: this run's lease was taken over by "
                            f"{who}; stopping without saving so the two runs do not mix steps")

    def release(self) -> None:
        """Stop the heartbeat and remove the lease file if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self.held:
            return
        self.held = False
        current = read_holder(self.directory)
        if current is not None and current.token == self.holder.token:
            fs, _ = _fs(self.directory)
            try:
                fs.rm(self.path)
            except FileNotFoundError:
                pass
