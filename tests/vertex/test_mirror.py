"""A notebook job works on the VM's disk and copies its files to the bucket: changed files only,
commit markers last, at once on a new checkpoint, and back again when a job restarts."""

from __future__ import annotations

import json
import time

import nbformat
import pytest

from labkit.vertex import mirror
from labkit.vertex.mirror import Mirror, restore


def _checkpoint(folder, step, payload=b"weights"):
    step_dir = folder / f"step-{step:08d}"
    step_dir.mkdir(parents=True)
    (step_dir / "model.pt").write_bytes(payload)
    (step_dir / "COMMITTED").write_text(json.dumps({"step": step}))


def test_a_pass_copies_new_and_changed_files_and_markers_last(tmp_path, monkeypatch):
    local, dest = tmp_path / "local", tmp_path / "bucket"
    _checkpoint(local / "ckpt", 1)
    (local / "notes.txt").write_text("a")
    order = []
    real_copy = mirror._copy
    monkeypatch.setattr(mirror, "_copy", lambda src, to: (order.append(src.name), real_copy(src, to)))
    m = Mirror([(local, dest)])
    assert m.sync() == 3
    assert order[-1] == "COMMITTED" and set(order) == {"model.pt", "COMMITTED", "notes.txt"}
    assert (dest / "ckpt/step-00000001/model.pt").read_bytes() == b"weights"
    order.clear()
    assert m.sync() == 0 and order == []  # nothing changed, nothing copied
    (local / "notes.txt").write_text("ab")
    assert m.sync() == 1 and (dest / "notes.txt").read_text() == "ab"


def test_a_committed_checkpoint_is_copied_at_once_and_the_rest_at_the_end(tmp_path):
    local, dest = tmp_path / "local", tmp_path / "bucket"
    local.mkdir()
    with Mirror([(local, dest)], every_s=3600, poll_s=0.05):
        (local / "scratch.bin").write_bytes(b"x")
        time.sleep(0.3)
        assert not (dest / "scratch.bin").exists()  # the cadence has not come round
        _checkpoint(local / "ckpt", 7)
        deadline = time.monotonic() + 10
        while not (dest / "ckpt/step-00000007/COMMITTED").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (dest / "ckpt/step-00000007/model.pt").exists()
        (local / "late.txt").write_text("end")
    assert (dest / "late.txt").read_text() == "end"  # the final pass on exit


def test_restore_brings_back_a_previous_attempts_files_without_replacing_newer_ones(tmp_path):
    dest, local = tmp_path / "bucket", tmp_path / "local"
    _checkpoint(dest / "ckpt", 3)
    (local).mkdir()
    (local / "keep.txt").write_text("mine")
    (dest / "keep.txt").write_text("old")
    assert restore(dest, local) == 2
    assert (local / "ckpt/step-00000003/COMMITTED").exists() and (local / "keep.txt").read_text() == "mine"
    assert restore(tmp_path / "absent", local) == 0


NOTEBOOK_SOURCE = """
import os
from labkit.notebooks.artifacts import artifacts_dir
from labkit.notebooks.stderr import route_kernel_stderr
route_kernel_stderr()
os.write(2, b"kernel says hello\\n")  # what C libraries print
out = artifacts_dir("demo")
runs = len(list(out.glob("run-*.txt")))
(out / f"run-{runs}.txt").write_text(os.getcwd())
print("cwd", os.getcwd(), "previous runs", runs)
"""


@pytest.mark.slow
def test_a_notebook_job_runs_on_local_disk_and_leaves_everything_in_the_outputs(tmp_path):
    from labkit.notebooks.kernel import KERNEL_NAME
    from labkit.vertex.entry import main

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_NAME, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("scale = 'smoke'", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(NOTEBOOK_SOURCE)]
    bucket = tmp_path / "gcs" / "bkt"
    (bucket / "inputs").mkdir(parents=True)
    nbformat.write(nb, bucket / "inputs" / "demo.ipynb")
    for attempt in (0, 1):  # the second: a restarted job on a fresh VM (an empty work folder)
        work = tmp_path / f"vm{attempt}"
        assert main(["notebook", str(bucket / "inputs/demo.ipynb"), str(bucket / "notebooks"),
                     "--artifacts", str(bucket / "notebooks/artifacts/demo"), "--workdir", str(work)]) == 0
        executed = nbformat.read(bucket / "notebooks/demo.ipynb", as_version=4)
        text = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
        assert f"cwd {work.resolve()}" in text and f"previous runs {attempt}" in text
    assert sorted(p.name for p in (bucket / "notebooks/artifacts/demo/demo").iterdir()) == ["run-0.txt", "run-1.txt"]
    assert "kernel says hello" in (bucket / "notebooks/demo.log").read_text()


@pytest.mark.slow
def test_sigterm_copies_what_the_notebook_made_before_the_job_dies(tmp_path):
    import signal
    import subprocess
    import sys

    from labkit.notebooks.kernel import KERNEL_NAME

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": KERNEL_NAME, "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("scale = 'smoke'", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("from labkit.notebooks.artifacts import artifacts_dir\n"
                                          "(artifacts_dir('demo') / 'made.txt').write_text('kept')\n"
                                          "import os, time\n"
                                          "(artifacts_dir('demo') / 'kernel.pid').write_text(str(os.getpid()))\n"
                                          "time.sleep(120)")]
    nbformat.write(nb, tmp_path / "demo.ipynb")
    work, dest = tmp_path / "vm", tmp_path / "bucket"
    job = subprocess.Popen([sys.executable, "-m", "labkit.vertex.entry", "notebook", str(tmp_path / "demo.ipynb"),
                            str(dest / "notebooks"), "--artifacts", str(dest / "artifacts"), "--workdir", str(work),
                            "--sync-every", "3600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (work / "artifacts/demo/kernel.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=30) == -signal.SIGTERM
    finally:
        job.kill()
    assert (dest / "artifacts/demo/made.txt").read_text() == "kept"
    assert (dest / "notebooks/demo.ipynb").exists()  # the notebook as far as it ran
    kernel = int((dest / "artifacts/demo/kernel.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(kernel) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(kernel), "the kernel outlived its job"


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
