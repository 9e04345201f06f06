"""Code written by others as an emulated Vertex job: every ordinary spec shape, the bucket however
the code reaches it, faults that reach any code, and nothing left behind."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from labkit.core.config import ParameterError
from labkit.vertex import emulator
from labkit.vertex.emulator import CANCELLED, FAILED, SUCCEEDED, CannotEmulate, Fault, run_local
from labkit.vertex.programs import Image

OUT = "gs://bkt/job"
HOST_GCS_BEFORE = os.path.exists("/gcs")


def pool(**container) -> dict:
    return {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "container_spec": {"image_uri": "gcr.io/p/trainer", **container}}


def spec(*pools, spot: bool = False) -> dict:
    out = {"worker_pool_specs": list(pools), "base_output_directory": {"output_uri_prefix": OUT}}
    if spot:
        out["scheduling"] = {"strategy": "SPOT"}
    return out


def script(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / "image" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(code))
    return path


def running(token: str) -> list[int]:
    """Processes whose command line holds `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


WRITER = """
import os, pathlib, socket, sys
def put(path, text):
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(text)
put(sys.argv[1], "argument")
put(sys.argv[2].split("=", 1)[1], "flag")
put(os.environ["OUT_FILE"], "environment")
model = os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/")  # as Google's samples do
put(model + "computed-" + os.environ.get("CLOUD_ML_JOB_ID", "?"), socket.gethostname())
print("step 1", flush=True)
"""


def test_the_bucket_is_reached_however_the_code_builds_the_path(tmp_path):
    script(tmp_path, "writer.py", WRITER)
    shell = ("mkdir -p /gcs/bkt/job && echo shell > /gcs/bkt/job/shell.txt && python writer.py "
             "/gcs/bkt/job/arg.txt --out=/gcs/bkt/job/flag.txt")
    replica = pool(command=["bash", "-c", shell], env=[{"name": "OUT_FILE", "value": "/gcs/bkt/job/env.txt"}])
    job = run_local(spec(replica, dict(replica)), tmp_path / "w", image=Image(files=tmp_path / "image"),
                    job_id="42", show_progress=False)
    assert job.succeeded, job.summary()
    out = job.local(OUT)
    assert {p.name: p.read_text().strip() for p in out.iterdir() if p.is_file()} == {
        "shell.txt": "shell", "arg.txt": "argument", "flag.txt": "flag", "env.txt": "environment"}
    hosts = {p.read_text() for p in (out / "model").iterdir()}
    assert len(hosts) == 1 and hosts.pop().startswith("cmle-training-workerpool")  # last writer wins
    assert os.path.exists("/gcs") == HOST_GCS_BEFORE  # nothing reached this machine's own /gcs
    # Each replica ran in a fresh copy of the image's files, its container disk.
    assert (job.final("workerpool1").cwd / "writer.py").is_file() and job.final().cwd != job.final("workerpool1").cwd


def test_args_only_runs_the_images_entrypoint_or_is_refused_naming_the_field(tmp_path):
    script(tmp_path, "task.py", "import sys; print('args', sys.argv[1:])")
    only_args = spec(pool(args=["--epochs", "2"]))
    with pytest.raises(ParameterError, match=r"worker_pool_specs\[0\].container_spec.command.*--entrypoint"):
        run_local(only_args, tmp_path / "refused", show_progress=False)
    assert not (tmp_path / "refused" / "logs").exists()  # refused before any replica started
    image = Image(entrypoint=("python", "-m", "task"), files=tmp_path / "image")
    job = run_local(only_args, tmp_path / "ran", image=image, show_progress=False)
    assert job.succeeded and "args ['--epochs', '2']" in job.final().log()
    with pytest.raises(ParameterError, match="not a program here"):
        run_local(spec(pool(command=["no-such-program-here"])), tmp_path / "missing", show_progress=False)


def package(tmp_path: Path, kind: str) -> Path:
    src = tmp_path / "src"
    (src / "trainer").mkdir(parents=True)
    (src / "trainer" / "__init__.py").write_text("")
    (src / "trainer" / "task.py").write_text(textwrap.dedent("""
        import os, pathlib, sys
        out = pathlib.Path(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "ran.json").write_text(__import__("json").dumps({"args": sys.argv[1:], "from": __file__}))
    """))
    (src / "setup.py").write_text("from setuptools import setup, find_packages\n"
                                  "setup(name='trainer', version='0.1', packages=find_packages())\n")
    if kind == "folder":
        return src
    sdist = tmp_path / "trainer-0.1.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(src, arcname="trainer-0.1")
    return sdist


@pytest.mark.parametrize("kind", ["sdist", "folder"])
@pytest.mark.slow
def test_a_python_package_spec_installs_the_package_and_runs_its_module(tmp_path, kind):
    path = package(tmp_path, kind)
    uri = str(path)
    if kind == "sdist":  # as the service reads it: from the bucket
        bucket = tmp_path / "w" / "gcs" / "bkt" / "dist"
        bucket.mkdir(parents=True)
        (bucket / path.name).write_bytes(path.read_bytes())
        uri = f"gs://bkt/dist/{path.name}"
    package_pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
                    "python_package_spec": {"executor_image_uri": "us-docker.pkg.dev/vertex-ai/training/x:latest",
                                            "package_uris": [uri], "python_module": "trainer.task",
                                            "args": ["--epochs", "1"]}}
    job = run_local(spec(package_pool), tmp_path / "w", show_progress=False)
    assert job.succeeded, job.summary()
    ran = json.loads((job.local(OUT) / "model" / "ran.json").read_text())
    assert ran["args"] == ["--epochs", "1"] and "/python/trainer/task.py" in ran["from"]  # the job's own install


def test_the_specs_env_is_merged_with_what_the_emulator_needs(tmp_path):
    probe = ("import json, os, shutil, sys; print(json.dumps({'path0': sys.path[1], "
             "'storage': os.environ['STORAGE_EMULATOR_HOST'], 'torchrun': shutil.which('torchrun'), "
             "'labkit': __import__('labkit').__name__}))")
    replica = pool(command=["python", "-c", probe], env=[{"name": "PYTHONPATH", "value": "/opt/extra"}])
    job = run_local(spec(replica), tmp_path, show_progress=False)
    seen = json.loads(job.final().log().strip().splitlines()[-1])
    assert seen["path0"] == "/opt/extra" and seen["labkit"] == "labkit"  # theirs first, ours still there
    assert seen["storage"].startswith("http://127.0.0.1:")
    assert seen["torchrun"] is None or seen["torchrun"].startswith(str(Path(sys.executable).parent))


STEPPER = """
import pathlib, sys, time
for epoch in range(1, 40):
    print(f"Epoch: {epoch}", flush=True)
    if epoch == 3:  # a folder on the /gcs mount exists once made (or once an object is in it)
        pathlib.Path("/gcs/bkt/job").mkdir(parents=True, exist_ok=True)
        pathlib.Path("/gcs/bkt/job/third").write_text("x")
    time.sleep(0.15)
"""


@pytest.mark.parametrize("fault", [
    Fault("workerpool0", at_step=3, step_pattern=r"Epoch: (\d+)"),
    Fault("workerpool0", after_s=1.5),
    Fault("workerpool0", when_file="gs://bkt/job/third"),
], ids=["step-pattern", "after", "file"])
@pytest.mark.slow
def test_a_preemption_reaches_code_that_prints_its_own_progress(tmp_path, fault):
    script(tmp_path, "stepper.py", STEPPER)
    job = run_local(spec(pool(command=["python", "stepper.py"]), spot=True), tmp_path / "w",
                    image=Image(files=tmp_path / "image"), fault=Fault(**{**fault.__dict__, "grace_s": 1.0}),
                    show_progress=False, timeout_s=120)
    assert job.faults_sent == 1 and job.job_restarts == 1 and job.state == SUCCEEDED, job.summary()
    first = job.runs[0]
    assert first.signal_sent == "SIGTERM" and "Epoch: 3\n" in first.log() and "Epoch: 39" not in first.log()


ESCAPER = """
import subprocess, sys
subprocess.Popen(["sleep", "321.{token}"], start_new_session=True)  # out of the replica's group
print("step 1", flush=True)
sys.exit({code})
"""


@pytest.mark.slow
def test_nothing_the_job_started_is_left_running_after_it_fails(tmp_path):
    token = str(os.getpid())
    script(tmp_path, "worker.py", ESCAPER.format(token=token, code=0) + "import time; time.sleep(60)")
    script(tmp_path, "chief.py", "import time; time.sleep(1); raise SystemExit('bad input')")
    job = run_local(spec(pool(command=["python", "chief.py"]), pool(command=["python", "worker.py"])),
                    tmp_path / "w", image=Image(files=tmp_path / "image"), show_progress=False)
    assert job.state == FAILED and "bad input" in job.error
    assert running(f"321.{token}") == []  # the worker's detached child died with its container


def test_stopping_a_job_from_outside_stops_every_replica(tmp_path):
    job = run_local(spec(pool(command=["python", "-c", "import time; time.sleep(60)"])), tmp_path,
                    stop_when=lambda: True, show_progress=False)
    assert job.state == CANCELLED and job.seconds < 30


@pytest.mark.slow  # three emulated jobs
def test_without_namespaces_a_job_that_could_write_the_hosts_gcs_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(emulator, "container_support", lambda scratch: "unshare: Operation not permitted")
    monkeypatch.setattr(emulator, "_host_gcs_writable", lambda: True)
    job_spec = spec(pool(command=["bash", "-c", "mkdir -p /gcs/bkt/job && echo x > /gcs/bkt/job/a.txt"]))
    with pytest.raises(CannotEmulate, match="Operation not permitted.*--gcs-mount rewrite"):
        run_local(job_spec, tmp_path / "refused", show_progress=False)
    # Asked for: /gcs in args and env (shell strings included) goes to the bucket folder.
    job = run_local(job_spec, tmp_path / "rewrite", gcs_mount="rewrite", show_progress=False)
    assert job.succeeded and (job.local(OUT) / "a.txt").read_text() == "x\n"
    # labkit's own programs reach the bucket only through their flags and LABKIT_LOCAL_GCS.
    own = run_local(spec(pool(command=["python", "-m", "labkit.vertex.entry", "--help"])), tmp_path / "own",
                    show_progress=False)
    assert own.succeeded and any("without their own /gcs" in e for e in own.events)


DOCKERFILE = """
# syntax=docker/dockerfile:1
FROM python:3.11 AS build
RUN pip wheel . -w /wheels
FROM us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest
ARG APP=trainer
ENV DATA_DIR=/data \\
    MODE="fast mode"
ENV LEGACY value with spaces
COPY --from=build /wheels /wheels
WORKDIR /
COPY ${APP} /${APP}
COPY data/ /data/
ENTRYPOINT ["python", "-m", "trainer.task"]
CMD --epochs 1
"""


def test_a_dockerfile_gives_the_entrypoint_workdir_env_and_files(tmp_path):
    from labkit.vertex.dockerfile import read_dockerfile

    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "task.py").write_text("print('hi')")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("1")
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    read = read_dockerfile(tmp_path / "Dockerfile", tmp_path / "staging")
    image = read.image
    assert image.entrypoint == ("python", "-m", "trainer.task")
    assert image.cmd == ("/bin/sh", "-c", "--epochs 1") and image.workdir == "/"
    assert image.env == {"DATA_DIR": "/data", "MODE": "fast mode", "LEGACY": "value with spaces"}
    assert (image.root / "trainer" / "task.py").is_file() and (image.root / "data" / "x.csv").is_file()
    assert image.files == image.root and any("--from" in n for n in read.notes)


@pytest.mark.slow
def test_the_image_files_appear_at_their_own_paths_in_the_replica(tmp_path):
    """`WORKDIR /` with `COPY trainer /trainer`, as Google's samples build images: the module
    runs from the image's root and `/trainer` is there, without touching this machine's `/`."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "task.py").write_text(
        "import os, pathlib\nout = pathlib.Path('/gcs/bkt/job'); out.mkdir(parents=True, exist_ok=True)\n"
        # `python -m` may cache the module's bytecode beside it (as in a container without
        # PYTHONDONTWRITEBYTECODE): that folder is not one of the image's files.
        "files = sorted(set(os.listdir('/trainer')) - {'__pycache__'})\n"
        "(out / 'seen.txt').write_text(str(files) + ' ' + os.getcwd())\n")
    (tmp_path / "Dockerfile").write_text("FROM x\nWORKDIR /\nCOPY trainer /trainer\n"
                                         "ENTRYPOINT [\"python\", \"-m\", \"trainer.task\"]\n")
    from labkit.vertex.dockerfile import read_dockerfile

    image = read_dockerfile(tmp_path / "Dockerfile", tmp_path / "staging").image
    job = run_local(spec(pool()), tmp_path / "w", image=image, show_progress=False)
    assert job.succeeded, job.summary()
    seen = (job.local(OUT) / "seen.txt").read_text()
    assert seen.startswith("['task.py']") and not os.path.exists("/trainer")
