"""Run one replica of an emulated job the way a container runs it: its own view of ``/gcs``,
its own process tree, its image's working directory. Linux namespaces, no container runtime.

    python replica_container.py CONFIG_JSON -- COMMAND ARGS...
    python replica_container.py --probe GCS_ROOT MOUNTS_DIR    # exit 0 when this works here

CONFIG_JSON: ``{"gcs_root": DIR, "mounts": DIR, "cwd": DIR, "binds": [[LOCAL, CONTAINER_PATH]],
"hostname": NAME, "hosts": [NAMES]}``.
The command runs with this process's environment, in a mount namespace where ``/gcs`` is
`gcs_root` (Vertex mounts every bucket there with Cloud Storage FUSE), so a ``/gcs/b/x`` path
reaches the emulated bucket however the code builds it: an argument, a ``--flag=/gcs/...``
value, a path inside a shell string, one computed from ``AIP_MODEL_DIR``. Where the host has
no ``/gcs`` the replica gets a root of its own: every top-level entry of the host's, bound in
place, plus ``/gcs`` and any `binds` (the image's own folders, such as ``/app``) whose
top-level folder the host lacks. Nothing is written to the host outside `mounts` (the empty
mount point of that root).

It gets a host name of its own (`hostname`; each of `hosts` resolves to loopback), as every
Vertex replica is a machine of its own. It also runs in a PID namespace: the command is
process 1's only child, and when the command
ends, or this wrapper is killed, or the process that started it dies, every process the command
started dies too, as a container's do. SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent
to this wrapper reach the command, as a container runtime signals its main process. The exit
status is the command's (a death by signal is reproduced).

As root it needs no user namespace; as another user it makes one mapping only that user, which
Linux allows unless the administrator turned unprivileged user namespaces off (then
``--probe`` fails and the emulator says so). Standard library only, so it starts fast and runs
under any interpreter.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWUTS = 0x00020000, 0x10000000, 0x20000000, 0x04000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_libc = ctypes.CDLL(None, use_errno=True)


class Unavailable(OSError):
    """The namespaces or mounts a replica's container needs are not allowed here."""


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise Unavailable(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source or fstype} on {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces() -> None:
    """A mount, a PID and a host-name namespace (and, when not root, a user namespace mapping
    only us)."""
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUTS | (0 if uid == 0 else CLONE_NEWUSER)
    _check(_libc.unshare(flags), "unshare")
    if uid != 0:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host


def name_host(config: dict) -> None:
    """The replica's own host name (each Vertex replica is a machine of its own: files named
    after the host, such as TensorBoard's, do not collide), resolvable through an /etc/hosts of
    its own that adds every replica's name on loopback."""
    hostname = config.get("hostname")
    if not hostname:
        return
    encoded = hostname.encode()
    _check(_libc.sethostname(encoded, len(encoded)), "sethostname")
    try:
        with open("/etc/hosts", encoding="utf-8") as f:
            base = f.read()
    except OSError:
        base = "127.0.0.1 localhost\n"
    hosts = os.path.join(config["mounts"], f"hosts-{os.getpid()}")
    with open(hosts, "w", encoding="utf-8") as f:
        f.write(base.rstrip("\n") + "\n127.0.0.1 " + " ".join(config.get("hosts") or [hostname]) + "\n")
    if os.path.isfile("/etc/hosts"):
        _mount(hosts, "/etc/hosts", None, MS_BIND)


def build_root(config: dict) -> str | None:
    """Mount what the replica sees; returns the new root to chroot into (None: the host's own
    root, with ``/gcs`` bound over the host's ``/gcs``)."""
    name_host(config)
    gcs_root = config["gcs_root"]
    binds = [(local, path) for local, path in config.get("binds", [])]
    missing_tops = {path.strip("/").split("/")[0] for _, path in binds} - set(os.listdir("/"))
    if os.path.isdir("/gcs") and not missing_tops:
        _mount(gcs_root, "/gcs", None, MS_BIND | MS_REC)
        for local, path in binds:
            _mount(local, path, None, MS_BIND | MS_REC)
        return None
    root = os.path.join(config["mounts"], f"root-{os.getpid()}")
    os.makedirs(root, exist_ok=True)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID, "mode=755")
    for name in sorted(os.listdir("/")):
        if name in ("proc", "gcs"):
            continue
        host, inside = "/" + name, os.path.join(root, name)
        if os.path.islink(host):
            os.symlink(os.readlink(host), inside)
        elif os.path.isdir(host):
            os.mkdir(inside)
            _mount(host, inside, None, MS_BIND | MS_REC)
        else:
            open(inside, "w").close()
            _mount(host, inside, None, MS_BIND)
    for name in ("proc", "gcs"):
        os.mkdir(os.path.join(root, name))
    _mount(gcs_root, os.path.join(root, "gcs"), None, MS_BIND | MS_REC)
    for local, path in binds:
        target = os.path.join(root, path.strip("/"))
        if path.strip("/").split("/")[0] in missing_tops:
            os.makedirs(target, exist_ok=True)
            _mount(local, target, None, MS_BIND | MS_REC)
    # The bound tree holds a copy of this new root's own mount point: detach it.
    _libc.umount2(os.path.join(root, root.lstrip("/")).encode(), MNT_DETACH)
    return root


def run_init(root: str | None, cwd: str, argv: list[str], status_fd: int, bucket: tuple[int, int]) -> None:
    """Process 1 of the replica: mount its /proc, start the command, pass signals on, reap
    every process, and when the command ends take the rest down; never returns. `bucket` is
    the (device, inode) the replica's ``/gcs`` must be: the command never starts otherwise."""
    _libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    proc = os.path.join(root, "proc") if root else "/proc"
    try:
        _mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except Unavailable:
        if root:  # keep the host's view rather than none (pids then read as the host's)
            _mount("/proc", proc, None, MS_BIND | MS_REC)
    if root:
        os.chroot(root)
    os.chdir(cwd)
    seen = os.stat("/gcs")
    if (seen.st_dev, seen.st_ino) != bucket:
        print("labkit emulator: the replica's /gcs is not the emulated bucket; not starting it",
              file=sys.stderr, flush=True)
        os.write(status_fd, str(125 << 8).encode())
        os._exit(0)
    child = os.fork()
    if child == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"labkit emulator: cannot run {argv[0]!r} in the replica: {e.strerror}", file=sys.stderr,
                  flush=True)
            os._exit(127)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: _send(child, s))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            os.write(status_fd, str(status).encode())
            try:
                os.kill(-1, signal.SIGKILL)  # as a container's other processes end with it
            except ProcessLookupError:
                pass
    os._exit(0)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def exit_like(status: int) -> None:
    """End this process as the command ended: the same exit code, or the same signal."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def run(config: dict, argv: list[str]) -> None:
    parent = os.getppid()
    st = os.stat(config["gcs_root"])
    bucket = (st.st_dev, st.st_ino)
    enter_namespaces()
    root = build_root(config)
    read_fd, write_fd = os.pipe()
    init = os.fork()  # process 1 of the new PID namespace
    if init == 0:
        os.close(read_fd)
        run_init(root, config["cwd"], argv, write_fd, bucket)
    os.close(write_fd)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: _send(init, s))
    while True:
        try:
            pid, _ = os.waitpid(init, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            break
        if os.getppid() != parent:  # the emulator is gone: so is this replica's machine
            _send(init, signal.SIGKILL)
        time.sleep(0.05)
    raw = os.read(read_fd, 64)
    exit_like(int(raw) if raw else (128 + signal.SIGKILL) << 8)


def probe(gcs_root: str, mounts: str) -> int:
    """Exit 0 when a replica's container can be made here (run in a child process)."""
    config = {"gcs_root": gcs_root, "mounts": mounts, "cwd": "/", "binds": []}
    marker = os.path.join(gcs_root, ".probe")
    open(marker, "w").close()
    try:
        run(config, [sys.executable, "-c", "import os, sys; sys.exit(0 if os.path.exists('/gcs/.probe') "
                                           "and os.getpid() == 2 else 3)"])
    except (Unavailable, OSError) as e:
        print(f"{e}", file=sys.stderr)
        return 2
    return 1  # not reached: run() ends this process with the command's status


def main(args: list[str]) -> None:
    if args[:1] == ["--probe"]:
        sys.exit(probe(args[1], args[2]))
    if len(args) < 3 or args[1] != "--":
        print("usage: replica_container.py CONFIG_JSON -- COMMAND ...", file=sys.stderr)
        sys.exit(2)
    try:
        run(json.loads(args[0]), args[2:])
    except Unavailable as e:
        print(f"labkit emulator: the replica's container could not be made here ({e})", file=sys.stderr)
        sys.exit(125)


if __name__ == "__main__":
    main(sys.argv[1:])

