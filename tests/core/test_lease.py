"""One writer per checkpoint folder (`labkit.core.lease`): on a local folder, through fsspec's
memory filesystem (as `gs://` goes through gcsfs), a refused second writer names the holder, a
stale lease is taken over with a warning, a restarted attempt of the same Vertex job takes its
own lease back, and a writer whose lease was taken stops before committing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, replace

import pytest

from labkit.core import lease as leases
from labkit.core.lease import Holder, Lease, LeaseHeld, LeaseLost, LeaseWarning


@pytest.fixture(params=["local", "memory"])
def folder(request, tmp_path):
    """A checkpoint folder: a local path (also what a /gcs/ mount is), or an fsspec URL."""
    if request.param == "local":
        return str(tmp_path / "ck")
    return f"memory://bucket-{uuid.uuid4().hex[:8]}/run/ck"


def write_holder(folder: str, holder: Holder) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(folder)
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root}/{leases.LEASE_FILE}", "w") as f:
        f.write(json.dumps(asdict(holder)))


def someone(**changes) -> Holder:
    """Another writer: by default a live process on this host (our parent)."""
    now = time.time()
    base = Holder(owner="ana", host=socket.gethostname(), pid=os.getppid(),
                  pid_start=leases.process_start_time(os.getppid()), since=now, heartbeat=now,
                  job=None, token=uuid.uuid4().hex)
    return replace(base, **changes)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_lease_names_its_holder_and_goes_when_released(folder):
    with Lease(folder, env={"CLOUD_ML_JOB_ID": "123", "CLOUD_ML_TRIAL_ID": "4"}) as mine:
        held = leases.read_holder(folder)
        assert held == mine.holder
        assert (held.pid, held.host, held.job) == (os.getpid(), socket.gethostname(), "123/4")
        assert held.owner and held.since <= held.heartbeat <= time.time()
    assert leases.read_holder(folder) is None


def test_a_second_writer_is_refused_naming_the_holder(folder):
    write_holder(folder, someone())
    with pytest.raises(LeaseHeld, match=rf"being written by another run: pid {os.getppid()} on host "):
        Lease(folder).acquire()
    with pytest.raises(LeaseHeld):
        leases.check_free(folder)
    with Lease(folder + "-other"):  # another folder is free
        pass


def test_two_writers_in_one_process_are_two_writers(folder):
    with Lease(folder), pytest.raises(LeaseHeld, match=f"pid {os.getpid()}"):
        Lease(folder).acquire()


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over_with_a_warning(folder):
    gone = dead_pid()
    write_holder(folder, someone(pid=gone, pid_start=None))
    with pytest.warns(LeaseWarning, match=rf"taking over the lease of pid {gone} .*: pid {gone} on this host is gone"):
        mine = Lease(folder).acquire()
    assert leases.read_holder(folder).token == mine.holder.token
    mine.release()


def test_a_reused_pid_does_not_keep_a_lease_alive(folder):
    write_holder(folder, someone(pid=os.getpid(), pid_start=1.0, token="earlier"))  # our pid, not us
    with pytest.warns(LeaseWarning, match="is gone"):
        Lease(folder).acquire().release()


def test_another_hosts_lease_holds_until_its_heartbeat_is_stale(folder):
    write_holder(folder, someone(host="vm-elsewhere", pid=1))
    with pytest.raises(LeaseHeld, match="on host vm-elsewhere"):
        Lease(folder).acquire()
    old = time.time() - leases.STALE_AFTER_S - 5
    write_holder(folder, someone(host="vm-elsewhere", pid=1, since=old, heartbeat=old))
    with pytest.warns(LeaseWarning, match=r"heartbeat is \d+s old"):
        Lease(folder).acquire().release()


def test_a_restarted_attempt_of_the_same_job_takes_its_lease_back_quietly(folder, recwarn):
    env = {"CLOUD_ML_JOB_ID": "8734"}
    write_holder(folder, someone(host="vm-before-preemption", pid=1, job="8734"))
    leases.check_free(folder, env)
    Lease(folder, env=env).acquire().release()
    assert not [w for w in recwarn if issubclass(w.category, LeaseWarning)]
    write_holder(folder, someone(host="vm-before-preemption", pid=1, job="another-job"))
    with pytest.raises(LeaseHeld, match="Vertex job another-job"):
        Lease(folder, env=env).acquire()


def test_a_writer_whose_lease_was_taken_stops_before_committing(folder):
    mine = Lease(folder).acquire()
    mine.verify()
    write_holder(folder, someone(token="the-new-writer"))
    with pytest.raises(LeaseLost, match=f"taken over by pid {os.getppid()}"):
        mine.verify()
    mine.release()
    assert leases.read_holder(folder).token == "the-new-writer"  # not ours to remove


def test_the_heartbeat_keeps_the_lease_fresh(folder):
    with Lease(folder, heartbeat_s=0.05) as mine:
        first = leases.read_holder(folder).heartbeat
        deadline = time.time() + 10
        while leases.read_holder(folder).heartbeat == first and time.time() < deadline:
            time.sleep(0.05)
        assert leases.read_holder(folder).heartbeat > first
        assert leases.read_holder(folder).token == mine.holder.token


def test_a_half_written_lease_holds_nothing(tmp_path):
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / leases.LEASE_FILE).write_text('{"owner": "ana", "ho')
    assert leases.read_holder(str(tmp_path / "ck")) is None
    Lease(str(tmp_path / "ck")).acquire().release()


def test_a_reader_never_finds_the_lease_half_written_while_the_heartbeat_rewrites_it(tmp_path):
    """The holder's own `verify` before a commit reads the file the heartbeat thread rewrites:
    an empty or partial file there would stop the run as if its lease were lost. (On a local
    disk or a /gcs/ mount; a Cloud Storage object is never seen half-written.)"""
    folder = str(tmp_path / "ck")
    with Lease(folder, heartbeat_s=0.001) as mine:
        deadline = time.time() + 1.0
        reads = 0
        while time.time() < deadline:
            assert leases.read_holder(folder) is not None
            mine.verify()
            reads += 1
        assert reads > 100
