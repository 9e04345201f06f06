"""Start, watch and stop local processes: labkit's one process launcher.

Every multi-process run on this machine goes through here: the DDP replicas of `labkit train`
(`labkit.torch.launch`), TensorFlow workers and parameter servers (`labkit.tf.launch`), the
FSDP comparison, the all-reduce benchmark and the replicas of the Vertex emulator.

* `ProcessSpec`: what to start (argv, environment, where its output goes, a per-line callback,
  whether it is a server).
* `Process`: one started child, in a session of its own so that a stop or kill reaches every
  process it started, and (Linux) bound to this process's life: if the launcher dies, even by
  SIGKILL, the child gets SIGTERM from the kernel (`prctl(PR_SET_PDEATHSIG)`), so replicas never
  train on as orphans holding a checkpoint folder's lease. A reader thread tees its output
  (stdout and stderr together) to its log and hands each line to the callback. `send_signal`
  (optionally followed by SIGKILL of the group after a grace period), `kill`, `stop`, `wait`,
  `output` / `tail`.
* `run_group(specs, GroupConfig(...))`: start them all and wait for all, with no time limit
  unless one is given (training runs for hours). A process that fails (an exit code not in
  `ok_codes`) takes the others down at once, since peers left waiting in a collective would
  hang; servers are stopped once every other process has finished. SIGTERM or SIGINT (Ctrl-C)
  sent to the launcher is passed on to every process as SIGTERM, and the group is waited for,
  so labkit replicas checkpoint and exit 143 as a lone run would; a group past its timeout is
  stopped the same way (SIGTERM, SIGKILL `stop_grace_s` later). The `GroupResult` holds each
  exit code and output; `check()` raises `LaunchError` showing the failing process's output tail.

`child_env` is the environment a labkit child process starts from; `check_process_count` is
the rule for how many local processes a run may start.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.core.cluster import CLUSTER_VARIABLES
from labkit.core.config import ParameterError, check_float, check_int
from labkit.core.devices import usable_cpu_count

_LABKIT_ROOT = str(Path(__file__).resolve().parents[2])
# More local processes than this per usable core is refused: they would only take turns (and
# each holds a framework's memory), which no lesson or benchmark needs.
MAX_PROCESSES_PER_CORE = 4
_LINE_END = re.compile(rb"[\r\n]")  # tqdm redraws with \r: each redraw is a line


class LaunchError(RuntimeError):
    """A process of a group failed (the message shows its output tail). `summary` is the same
    on one line: which process, its exit code and the last line it printed."""

    summary: str = ""
    returncode: int | None = None


class LaunchTimeout(LaunchError, TimeoutError):
    """A group ran past its timeout and was stopped."""


class LaunchInterrupted(LaunchError):
    """The launcher was sent SIGTERM or SIGINT, passed it on, and a process did not end well."""


def child_env(overrides: Mapping[str, str] | None = None, *,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a labkit child process: `base` (default this process's) without the
    cluster variables of an enclosing job (the child would think it is that job's replica),
    with labkit's root first on PYTHONPATH (children import labkit from where this process
    did), then `overrides`."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in CLUSTER_VARIABLES}
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _LABKIT_ROOT]
    env["PYTHONPATH"] = os.pathsep.join([_LABKIT_ROOT, *paths])
    env.update(overrides or {})
    return env


def check_process_count(name: str, count: int, cores: int | None = None) -> str | None:
    """Refuse a count of local processes below 1 or above `MAX_PROCESSES_PER_CORE` per usable
    core (ParameterError naming `name`); return a warning when there are more processes than
    cores (they share them: slower, not faster), else None."""
    check_int(name, count, minimum=1)
    cores = usable_cpu_count() if cores is None else cores
    if count > MAX_PROCESSES_PER_CORE * cores:
        raise ParameterError(name, count, f"is more than {MAX_PROCESSES_PER_CORE} processes per usable "
                             f"CPU core ({cores} here): they would only take turns on the cores")
    if count > cores:
        return (f"{count} processes on {cores} usable CPU cores: they take turns on the cores "
                f"(slower per step, not faster)")
    return None


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start.

    `name` labels it in results and errors ("rank 1", "chief:0"). `env` is its whole
    environment (None: this process's; see `child_env`). Its output goes to `log_path`, or to
    a temporary file removed when the process is closed. `on_line(line)` is called with each
    line of output as it arrives, on the reader thread. A `server` only serves the others:
    `run_group` stops it once every non-server process has finished, and that is no failure.
    `cwd`: its working directory (None: this process's)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    log_path: str | os.PathLike | None = None
    on_line: Callable[[str], None] | None = None
    server: bool = False
    cwd: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ProcessSpec.name must be a non-empty string")
        if isinstance(self.argv, str) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise ValueError(f"ProcessSpec.argv of {self.name!r} must be a non-empty list of "
                             f"strings (got {self.argv!r})")


def _parent_death_signal() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGTERM when this process dies (Linux
    `prctl(PR_SET_PDEATHSIG)`), or None where that does not exist. Resolved here, in the
    parent, so the forked child only makes the one call. The signal follows the death of the
    thread that started the child: start and wait for a process from the same thread."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def bind() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the call: do not run as an orphan
            os.kill(os.getpid(), signal.SIGTERM)

    return bind


def _signum(sig: int | str) -> int:
    if isinstance(sig, str):
        try:
            return int(getattr(signal.Signals, sig))
        except AttributeError:
            raise ValueError(f"signal {sig!r} is not a signal name like 'SIGTERM'") from None
    return int(sig)


class Process:
    """A started child process: its own session (process group), output teed to a log."""

    def __init__(self, spec: ProcessSpec):
        self.spec = spec
        if spec.log_path is not None:
            path = Path(spec.log_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(path, "w+b")  # noqa: SIM115 - closed by close()
        else:
            self._log = tempfile.TemporaryFile()
        self.started = time.monotonic()
        self._ended: float | None = None
        self._killer: threading.Timer | None = None
        self._callback_error: BaseException | None = None
        try:
            self.popen = subprocess.Popen(list(spec.argv), env=None if spec.env is None else dict(spec.env),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          cwd=spec.cwd, start_new_session=True,
                                          preexec_fn=_parent_death_signal())
        except BaseException:
            self._log.close()
            raise
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"output of {spec.name}")
        self._reader.start()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    @property
    def seconds(self) -> float:
        return (self._ended or time.monotonic()) - self.started

    def _read(self) -> None:
        pending = b""
        for chunk in iter(lambda: self.popen.stdout.read1(65536), b""):
            self._log.write(chunk)
            self._log.flush()
            if self.spec.on_line is None:
                continue
            *lines, pending = _LINE_END.split(pending + chunk)
            self._lines(lines)
        if pending and self.spec.on_line is not None:
            self._lines([pending])
        self.popen.stdout.close()

    def _lines(self, lines: list[bytes]) -> None:
        for line in lines:
            if not line or self._callback_error is not None:
                continue
            try:
                self.spec.on_line(line.decode("utf-8", "replace"))
            except Exception as e:  # keep teeing the output; `wait` re-raises it
                self._callback_error = e

    def poll(self) -> int | None:
        code = self.popen.poll()
        if code is not None and self._ended is None:
            self._ended = time.monotonic()
        return code

    def wait(self, timeout: float | None = None) -> int:
        """The exit code once the process has ended (subprocess.TimeoutExpired after `timeout`
        seconds); its output is then all in the log. Re-raises an error of `on_line`."""
        code = self.popen.wait(timeout)
        self.poll()
        # A grandchild outside the group could hold the pipe open: do not wait on it forever.
        self._reader.join(timeout=5)
        if self._killer is not None:
            self._killer.cancel()
        if self._callback_error is not None:
            error, self._callback_error = self._callback_error, None
            raise error
        return code

    def send_signal(self, sig: int | str, *, kill_after_s: float | None = None) -> None:
        """Send `sig` (a number or a name like "SIGTERM") to the process itself, as a container
        runtime signals its main process; its handler decides what its children get. With
        `kill_after_s`, the whole group is killed if the process still runs that much later."""
        sig = _signum(sig)
        if self.poll() is not None:
            return
        try:
            self.popen.send_signal(sig)
        except ProcessLookupError:
            return
        if kill_after_s is not None:
            self._killer = threading.Timer(kill_after_s, self.kill)
            self._killer.daemon = True
            self._killer.start()

    def _signal_group(self, sig: int) -> None:
        # Only while the process is not reaped: until then its pid (the group's id) cannot
        # be reused by an unrelated process.
        if self.popen.returncode is None:
            try:
                os.killpg(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def terminate(self) -> None:
        """SIGTERM the process and every process of its group."""
        self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL the process and every process of its group."""
        self._signal_group(signal.SIGKILL)

    def stop(self, grace_s: float = 5.0, *, settle_s: float = 0.0) -> int:
        """End a process that is no longer needed and return its exit code: it may first finish
        on its own for `settle_s` seconds, then its group gets SIGTERM, and SIGKILL `grace_s`
        seconds later."""
        try:
            return self.wait(settle_s)
        except subprocess.TimeoutExpired:
            pass
        self.terminate()
        try:
            return self.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.wait()

    def output(self) -> str:
        """Everything it wrote so far (stdout and stderr interleaved)."""
        fd = self._log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    def close(self) -> None:
        """Kill it if still running, and release its log file (a temporary one is deleted)."""
        if self.poll() is None:
            self.kill()
            self.popen.wait()
        self._reader.join(timeout=5)
        if self._killer is not None:
            self._killer.cancel()
        self._log.close()


@dataclass(frozen=True)
class GroupConfig:
    """How `run_group` waits for a group of processes.

    `timeout_s`: for the whole group (None, the default: no limit); past it every process gets
    SIGTERM (labkit replicas checkpoint) and SIGKILL `timeout_grace_s` later. `ok_codes`: exit
    codes that are not failures (labkit's replicas exit 143 after a checkpointed preemption).
    `stop_grace_s`: between SIGTERM and SIGKILL when servers are stopped. `forward_signals`:
    SIGTERM and SIGINT sent to this process (main thread only) go to every process as SIGTERM
    and the group is waited for. `poll_s`: how often exits are checked. `tail_chars`: how much
    of the failing process's output an error shows."""

    timeout_s: float | None = None
    ok_codes: tuple[int, ...] = (0,)
    stop_grace_s: float = 5.0
    # Long enough for replicas to write a checkpoint, as a Spot VM's 30 s notice is.
    timeout_grace_s: float = 30.0
    forward_signals: bool = True
    poll_s: float = 0.05
    tail_chars: int = 3000

    def __post_init__(self) -> None:
        check_float("timeout_s", self.timeout_s, minimum=0.0, allow_none=True)
        check_float("stop_grace_s", self.stop_grace_s, minimum=0.0)
        check_float("timeout_grace_s", self.timeout_grace_s, minimum=0.0)
        check_float("poll_s", self.poll_s, minimum=0.001)
        check_int("tail_chars", self.tail_chars, minimum=0)
        if not isinstance(self.ok_codes, tuple) or not all(
                isinstance(c, int) and not isinstance(c, bool) for c in self.ok_codes):
            raise ValueError(f"ok_codes must be a tuple of exit codes (got {self.ok_codes!r})")


@dataclass
class ProcessResult:
    """How one process of a group ended. `ended_by`: "exit" (on its own), "stopped" (a server
    stopped once the others were done), "killed" (taken down by another's failure or by the
    timeout)."""

    name: str
    returncode: int
    output: str
    seconds: float
    ended_by: str = "exit"


@dataclass
class GroupResult:
    """Every process of a group (in the order given), the first that failed, and whether the
    group timed out."""

    results: list[ProcessResult]
    failed: ProcessResult | None = None
    timed_out: bool = False
    timeout_s: float | None = None
    tail_chars: int = 3000
    seconds: float = 0.0
    signal: int | None = None  # SIGTERM or SIGINT this launcher received and passed on

    @property
    def ok(self) -> bool:
        return self.failed is None and not self.timed_out

    @property
    def returncodes(self) -> list[int]:
        return [r.returncode for r in self.results]

    def check(self, what: str = "process") -> GroupResult:
        """Self when every process ended well; else raise `LaunchError` (`LaunchTimeout` for a
        timeout) naming the process (as "<what> <name> of <n>") with its output tail."""
        if self.ok:
            return self
        n, codes = len(self.results), self.returncodes
        if self.failed is not None and self.signal is not None:
            name = signal.Signals(self.signal).name
            error: LaunchError = LaunchInterrupted(f"stopped by {name}: {what} {self.failed.name} of {n} "
                                                   f"exited {self.failed.returncode} (exit codes {codes})")
            error.summary, error.returncode = str(error), self.failed.returncode
            raise error
        if self.failed is not None:
            r = self.failed
            error = LaunchError(f"{what} {r.name} of {n} failed (exit codes {codes}):\n"
                                             f"{r.output[-self.tail_chars:]}")
            error.summary = f"{what} {r.name} of {n} failed with exit code {r.returncode}" + \
                (f": {last_line(r.output)}" if last_line(r.output) else "")
            error.returncode = r.returncode
            raise error
        r = next((x for x in self.results if x.ended_by == "killed"), self.results[0])
        error = LaunchTimeout(f"timed out after {self.timeout_s:g}s: {what} {r.name} of {n} was still "
                              f"running (exit codes {codes}):\n{r.output[-self.tail_chars:]}")
        error.summary = f"timed out after {self.timeout_s:g}s: {what} {r.name} of {n} was still running"
        raise error


def last_line(output: str) -> str:
    """The last non-empty line a process printed (what a one-line error quotes)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _stop_all(procs: list[Process], grace_s: float) -> None:
    """SIGTERM every group at once, then SIGKILL those still running `grace_s` later."""
    for p in procs:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


class _Forwarded:
    """SIGTERM and SIGINT received while a group runs: recorded (the loop passes them on as
    SIGTERM), instead of ending the launcher and leaving the group without its checkpoint."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self.pending = False

    def __call__(self, signum, frame) -> None:
        self.received, self.pending = signum, True


@contextlib.contextmanager
def _forwarding(enabled: bool) -> Iterator[_Forwarded]:
    forwarded = _Forwarded()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield forwarded
        return
    previous = {sig: signal.signal(sig, forwarded) for sig in _Forwarded.SIGNALS}
    try:
        yield forwarded
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_group(specs: Sequence[ProcessSpec], config: GroupConfig = GroupConfig()) -> GroupResult:
    """Start every process of `specs` and wait until all have ended (see `GroupConfig`).

    A process that exits with a code outside `config.ok_codes` takes the others down at once
    (SIGKILL of their groups). Once every non-server has ended well, the servers are stopped.
    SIGTERM or SIGINT sent to this process goes to every process as SIGTERM (the group is then
    waited for: labkit replicas checkpoint and exit 143); a second one kills the group. Past
    `config.timeout_s` everything still running gets SIGTERM, and SIGKILL
    `config.timeout_grace_s` later. Nothing is left running when this returns or raises
    (KeyboardInterrupt included), nor when this process dies (see `Process`)."""
    specs = list(specs)
    if not specs or all(s.server for s in specs):
        raise ValueError("specs: at least one process that is not a server is needed")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"specs: process names must differ (got {names})")
    start = time.monotonic()
    deadline = None if config.timeout_s is None else start + config.timeout_s
    procs: list[Process] = []
    ended_by: dict[str, str] = {}
    failed: Process | None = None
    timed_out = False
    stopping_since: float | None = None  # SIGTERM sent to the group (a signal, or the timeout)
    with contextlib.ExitStack() as stack:
        forwarded = stack.enter_context(_forwarding(config.forward_signals))
        stack.callback(lambda: [p.close() for p in procs])
        for spec in specs:
            procs.append(Process(spec))
        while True:
            if forwarded.pending:
                forwarded.pending = False
                if stopping_since is None:  # passed on, as a container runtime would
                    stopping_since = time.monotonic()
                    for p in procs:  # the process itself: its handler decides about its children
                        p.send_signal(signal.SIGTERM)
                else:  # asked twice: stop waiting for a checkpoint
                    for p in procs:
                        p.kill()
            codes = [p.poll() for p in procs]
            running = [p for p, c in zip(procs, codes, strict=True) if c is None]
            if stopping_since is None:
                failed = next((p for p, c in zip(procs, codes, strict=True)
                               if c is not None and c not in config.ok_codes), None)
                if failed is not None:
                    for p in running:
                        ended_by[p.name] = "killed"
                        p.kill()
                    break
            if not any(not p.spec.server for p in running):
                for p in running:  # only servers are left: the work is done
                    ended_by[p.name] = "stopped"
                _stop_all(running, config.stop_grace_s)
                if stopping_since is not None and not timed_out:  # stopped by a signal
                    failed = next((p for p, c in zip(procs, codes, strict=True)
                                   if c is not None and c not in config.ok_codes), None)
                break
            if deadline is not None and time.monotonic() > deadline and stopping_since is None:
                timed_out = True
                stopping_since = time.monotonic()
                for p in running:
                    ended_by[p.name] = "killed"
                    p.send_signal(signal.SIGTERM)  # labkit replicas checkpoint on SIGTERM
            if stopping_since is not None and time.monotonic() - stopping_since > config.timeout_grace_s:
                for p in running:
                    ended_by.setdefault(p.name, "killed")
                    p.kill()
            time.sleep(config.poll_s)
        results = []
        for p in procs:
            code = p.wait()
            results.append(ProcessResult(p.name, code, p.output(), p.seconds, ended_by.get(p.name, "exit")))
    by_name = {r.name: r for r in results}
    return GroupResult(results, by_name[failed.name] if failed is not None else None, timed_out,
                       config.timeout_s, config.tail_chars, time.monotonic() - start,
                       forwarded.received)
