"""Contract 3: the local emulator gives each replica Vertex's environment, applies Vertex's
restart rules and injects faults; real DDP and TF jobs finish through it."""

from __future__ import annotations

import json
import sys

import pytest

from labkit import vertex
from labkit.core import cluster
from labkit.vertex.emulator import (
    CANCELLED,
    DEFAULT_TIMEOUT_S,
    FAILED,
    SUCCEEDED,
    Fault,
    LocalPaths,
    local_argv,
    replica_envs,
    run_local,
)
from tests.fixtures.vertex_demo import demo_job

OUT = "gs://bkt/job"


def script_job(script: str, *, workers: int = 1, restart_job: bool = False, spot: bool = False,
               timeout_s: int | None = None):
    pool = {"image_uri": "gcr.io/p/img", "command": ["python", "-c", script]}
    return vertex.custom_job_spec(
        vertex.PoolConfig(**pool), vertex.PoolConfig(replica_count=workers, **pool) if workers else None,
        output_uri=OUT, restart_job_on_worker_restart=restart_job, spot=spot, timeout_s=timeout_s)


def test_replica_environments_match_vertex(tmp_path):
    pool = vertex.PoolConfig(args=["python", "x.py"], env={"DATA": "/gcs/bkt/data"})
    spec = vertex.custom_job_spec(pool, vertex.PoolConfig(replica_count=2, args=["python", "x.py"]),
                                  vertex.reduction_server_pool(1), vertex.PoolConfig(args=["python", "e.py"]),
                                  output_uri=OUT)
    envs = replica_envs(spec, LocalPaths(tmp_path))
    assert sorted(envs) == [(0, 0), (1, 0), (1, 1), (2, 0), (3, 0)]
    roles = {k: cluster.from_env(e) for k, e in envs.items()}
    assert [(roles[k].role, roles[k].rank) for k in sorted(envs)] == [
        ("chief", 0), ("worker", 1), ("worker", 2), ("reduction_server", None), ("evaluator", None)]
    chief = envs[(0, 0)]
    spec_json = json.loads(chief["CLUSTER_SPEC"])
    assert spec_json["task"] == {"type": "workerpool0", "index": 0, "trial": ""}
    assert len(spec_json["cluster"]["workerpool1"]) == 2 and spec_json["environment"] == "cloud"
    tfc = json.loads(envs[(1, 1)]["TF_CONFIG"])
    assert tfc["task"] == {"type": "worker", "index": 1, "cloud": "emulated-0"} and "ps" not in tfc["cluster"]
    assert tfc["environment"] == "cloud" and tfc["job"]["worker_pool_specs"][1]["replica_count"] == 2
    assert "TF_CONFIG" not in envs[(2, 0)] and "RANK" not in envs[(2, 0)]
    assert (chief["WORLD_SIZE"], chief["RANK"], envs[(1, 1)]["RANK"]) == ("3", "0", "2")
    assert chief["MASTER_ADDR"] == "127.0.0.1" and chief["MASTER_PORT"] == envs[(1, 0)]["MASTER_PORT"]
    # The same gs:// addresses Vertex gives (not local folders); /gcs/ values go through the mount.
    assert chief["AIP_CHECKPOINT_DIR"] == "gs://bkt/job/checkpoints/"
    assert chief["AIP_MODEL_DIR"] == "gs://bkt/job/model/"
    assert chief["AIP_TENSORBOARD_LOG_DIR"] == "gs://bkt/job/logs/"
    assert chief["CLOUD_ML_JOB_ID"] == "0" and chief["CLOUD_ML_PROJECT_ID"] == "0"
    assert "CLOUD_ML_TRIAL_ID" not in chief and "trial" not in tfc["task"]
    assert chief["DATA"] == str(tmp_path.resolve() / "gcs/bkt/data")  # /gcs rewritten: no mount here
    mounted = replica_envs(spec, LocalPaths(tmp_path, mounted=True))
    assert mounted[(0, 0)]["DATA"] == "/gcs/bkt/data"  # the replica's own /gcs holds the bucket
    trial = replica_envs(spec, LocalPaths(tmp_path), trial="3", job_id="77")
    assert json.loads(trial[(1, 0)]["TF_CONFIG"])["task"]["trial"] == "3"
    assert trial[(1, 0)]["CLOUD_ML_TRIAL_ID"] == "3" and trial[(1, 0)]["CLOUD_ML_JOB_ID"] == "77"
    single = replica_envs(vertex.custom_job_spec(pool), LocalPaths(tmp_path))
    assert "TF_CONFIG" not in single[(0, 0)]  # TF_CONFIG only for multi-replica jobs


def test_local_argv_maps_python_gcs_and_drops_setup_wrapper(tmp_path):
    spec = vertex.notebook_job("nb.ipynb", {"a": 1}, output_uri=OUT)
    argv = local_argv(spec["worker_pool_specs"][0]["container_spec"], LocalPaths(tmp_path), "p")
    assert argv[:3] == [sys.executable, "-m", "labkit.vertex.entry"]
    assert argv[4] == str(tmp_path.resolve() / "gcs/bkt/job/inputs/nb.ipynb")
    with pytest.raises(ValueError, match=r"worker_pool_specs\[0\].container_spec.command"):
        local_argv({"image_uri": "gcr.io/x"}, LocalPaths(tmp_path), "worker_pool_specs[0].container_spec")


FLAKY = """
import os, pathlib, sys, time
from labkit.core.gcs import mount_path
start = time.time()
folder = pathlib.Path(mount_path(os.environ["AIP_MODEL_DIR"]))
marker = folder / ("tries-" + os.environ.get("RANK", "x"))
marker.parent.mkdir(parents=True, exist_ok=True)
n = int(marker.read_text()) if marker.exists() else 0
marker.write_text(str(n + 1))
if os.environ["RANK"] == "1" and n < FAILS:
    print("worker gives up: bad input", flush=True)
    sys.exit(CODE)
# The primary waits for the worker's verdict: once it exits 0 the job has succeeded.
worker = folder / "tries-1"
while os.environ["RANK"] == "0" and not (worker.exists() and worker.stat().st_mtime >= start - 1):
    time.sleep(0.05)
time.sleep(0.5 if os.environ["RANK"] == "0" else 0)
"""


def flaky(fails: int, code: int = 3, **kw):
    return script_job(FLAKY.replace("FAILS", str(fails)).replace("CODE", str(code)), **kw)


def test_an_error_in_the_code_fails_the_job_at_once(tmp_path):
    """Vertex's common errors: a user-code exception is permanent; nothing is restarted."""
    job = run_local(flaky(1, code=1), tmp_path)
    assert job.state == FAILED and job.worker_restarts == 0 and job.job_restarts == 0
    assert [r.exit_code for r in job.runs if r.pool == 1] == [1]
    assert "workerpool1[0] exited 1" in job.error and "permanent" in job.error
    assert "worker gives up: bad input" in job.error  # the replica's last words say why
    assert "understanding-training-service" in job.error  # and the rule's source


@pytest.mark.parametrize("code,signal_name", [(6, "SIGABRT"), (134, "SIGABRT"), (11, "SIGSEGV"),
                                              (139, "SIGSEGV")])
@pytest.mark.slow
def test_sigabrt_and_sigsegv_exits_restart_the_job_up_to_three_times(tmp_path, code, signal_name):
    ok = run_local(flaky(2, code=code), tmp_path / "ok")
    assert ok.state == SUCCEEDED and ok.job_restarts == 2 and ok.worker_restarts == 0
    assert any(signal_name in e and "job restart 2 of 3" in e for e in ok.events)
    bad = run_local(flaky(99, code=code), tmp_path / "bad")
    assert bad.state == FAILED and bad.job_restarts == 3
    assert len([r for r in bad.runs if r.pool == 1]) == 4 and f"exited {code}" in bad.error


@pytest.mark.slow  # three rounds of replica processes
def test_a_non_permanent_failure_restarts_the_worker_alone(tmp_path):
    """An injected SIGKILL stands for the machine's side (a VM failing): the worker restarts on
    its own, up to five times."""
    job = run_local(script_job(STEPPER), tmp_path,
                    fault=Fault("workerpool1[0]", at_step=2, signal="SIGKILL", times=2))
    assert job.state == SUCCEEDED and job.worker_restarts == 2 and job.job_restarts == 0, job.summary()
    assert job.faults_sent == 2
    worker = [r for r in job.runs if r.pool == 1]
    assert [r.exit_code for r in worker] == [-9, -9, 0] and [r.restart for r in worker] == [0, 1, 2]
    assert job.final("workerpool1[0]").log_path.name == "workerpool1-0.restart2.log"


def test_replicas_show_the_progress_their_steps_are_read_from_whatever_this_process_shows(tmp_path, monkeypatch):
    """A fault fires at a step read from a replica's progress bar: a parent that turned its own
    bar off (a headless notebook run) must not leave the trigger blind."""
    monkeypatch.setenv("LABKIT_PROGRESS", "off")
    monkeypatch.setenv("LABKIT_NO_PROGRESS", "1")
    show = "import os; print('style', os.environ.get('LABKIT_PROGRESS'), os.environ.get('LABKIT_NO_PROGRESS'))"
    job = run_local(script_job(show, workers=0), tmp_path, show_progress=False)
    assert job.state == SUCCEEDED and "style terminal None" in job.final().log()


def test_a_drill_whose_signal_never_arrived_says_so_instead_of_comparing(tmp_path, monkeypatch):
    """Two jobs that were never interrupted are trivially identical: that must not pass for a
    resume that works."""
    from labkit.course.preemption import drill
    from labkit.vertex.emulator import LocalJob

    monkeypatch.setattr(drill, "run_local", lambda *a, **k: LocalJob(SUCCEEDED, [], [], 0, 0, 1.0, tmp_path))
    with pytest.raises(RuntimeError, match=r"SIGTERM never reached workerpool1\[0\].*step 9"):
        drill.preemption_drill(drill.DrillConfig(), tmp_path)


@pytest.mark.slow
def test_non_permanent_failures_past_the_restarts_retry_the_job_then_fail_it(tmp_path):
    """Five restarts of the worker; failing once more retries the whole job, up to three
    times; then the job fails."""
    job = run_local(script_job(STEPPER), tmp_path,
                    fault=Fault("workerpool1[0]", at_step=1, signal="SIGKILL", times=99))
    assert job.state == FAILED and job.worker_restarts == 5 * 4 and job.job_restarts == 3
    assert len([r for r in job.runs if r.pool == 1]) == 6 * 4
    assert "after 5 restarts, and the job after 3 retries" in job.error


@pytest.mark.slow
def test_restart_job_on_worker_restart_restarts_everyone(tmp_path):
    job = run_local(script_job(STEPPER, restart_job=True), tmp_path,
                    fault=Fault("workerpool1[0]", at_step=2, signal="SIGKILL"))
    assert job.state == SUCCEEDED and job.job_restarts == 1 and job.worker_restarts == 0
    assert sorted({(r.job_attempt, r.pool) for r in job.runs}) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.slow
def test_spot_preemptions_restart_the_job_up_to_six_times(tmp_path):
    job = run_local(script_job(STEPPER, spot=True, workers=0), tmp_path,
                    fault=Fault("workerpool0", at_step=1, signal="SIGTERM", times=7, grace_s=1.0))
    assert job.state == FAILED and job.job_restarts == 6 and "preempted more than 6 times" in job.error


STEPPER = """
import os, pathlib, time
from labkit.core.gcs import mount_path
folder = pathlib.Path(mount_path(os.environ["AIP_MODEL_DIR"]))
for step in range(1, 6):
    print(f"step {step}", flush=True)
    time.sleep(0.1)
folder.mkdir(parents=True, exist_ok=True)
(folder / ("done-" + os.environ["RANK"])).write_text("ok")
# The primary waits for the worker to finish: once it exits 0 the job has succeeded.
while os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] != "1" and not (folder / "done-1").exists():
    time.sleep(0.05)
"""


@pytest.mark.parametrize("sig,expected", [("SIGKILL", -9), ("SIGTERM", -15)])
@pytest.mark.slow
def test_fault_injection_at_step_then_restart(tmp_path, sig, expected):
    job = run_local(script_job(STEPPER), tmp_path, fault=Fault("workerpool1[0]", at_step=3, signal=sig))
    first = job.runs[[r.name for r in job.runs].index("workerpool1[0]")]
    # The fault fires when any replica reports step 3: the chief may get there before this
    # replica has printed a step (a slow start on a loaded machine), so it may have none.
    assert first.signal_sent == sig and first.exit_code == expected and (first.last_step or 0) < 5
    assert job.state == SUCCEEDED and job.worker_restarts == 1
    assert job.final("workerpool1[0]").last_step == 5
    assert any(f"sent {sig} to workerpool1[0]" in e for e in job.events)


@pytest.mark.slow
def test_spot_preemption_restarts_the_whole_job(tmp_path):
    job = run_local(script_job(STEPPER, spot=True), tmp_path,
                    fault=Fault("workerpool0", at_step=2, signal="SIGTERM"))
    assert job.state == SUCCEEDED and job.job_restarts == 1
    assert any("preempted (Spot)" in e for e in job.events)


@pytest.mark.slow
def test_timeout_fails_the_job(tmp_path):
    job = run_local(script_job("import time; time.sleep(30)", workers=0), tmp_path, timeout_s=1)
    assert job.state == FAILED and "timeout" in job.error
    assert DEFAULT_TIMEOUT_S == 7 * 24 * 3600  # no timeout in the spec: the service's own default


def test_stop_when_cancels_the_job(tmp_path):
    job = run_local(script_job("import time; time.sleep(30)", workers=1), tmp_path,
                    stop_when=lambda: True)
    assert job.state == CANCELLED and not job.succeeded and "stopped early" in job.events[-1]


# A job that checkpoints every step and is preempted (Spot) once at step 2, resuming from the
# newest committed step. HOW says how it treats AIP_CHECKPOINT_DIR.
RESUMER = """
import os, pathlib, sys, time
from labkit.core import checkpoint
from labkit.core.gcs import mount_path
address = os.environ["AIP_CHECKPOINT_DIR"]
where = {"fsspec": address, "mount": mount_path(address), "path": str(pathlib.Path(address))}["HOW"]
last = checkpoint.load(where)
start = last.step if last else 0
print("resumed at", start, "from", where, flush=True)
for step in range(start + 1, 5):
    checkpoint.save(where, step, {"s": str(step).encode()})
    print(f"step {step}", flush=True)
    time.sleep(0.3)
"""


def _preempted_once(tmp_path, how):
    job = run_local(script_job(RESUMER.replace("HOW", how), workers=0, spot=True), tmp_path,
                    fault=Fault("workerpool0", at_step=2, signal="SIGTERM", grace_s=1.0))
    assert job.state == SUCCEEDED and job.job_restarts == 1, job.summary()
    return job, job.final().log()


@pytest.mark.parametrize("how", ["fsspec", "mount"])
@pytest.mark.slow
def test_a_restarted_job_resumes_through_the_gs_address(tmp_path, how):
    job, log = _preempted_once(tmp_path, how)
    resumed = int(log.split("resumed at ")[1].split()[0])
    assert resumed >= 2  # the second attempt found the first attempt's checkpoint in the bucket
    assert (job.local("gs://bkt/job/checkpoints") / "step-00000004" / "COMMITTED").is_file()


@pytest.mark.slow
def test_treating_the_gs_address_as_a_path_loses_the_checkpoints(tmp_path):
    job, log = _preempted_once(tmp_path, "path")
    assert "resumed at 0 " in log  # the restarted job started over
    assert not job.local("gs://bkt/job/checkpoints").exists()  # nothing reached the bucket
    # They went to the first container's disk, as ``gs:/bkt/...``, and died with it.
    assert (job.container("workerpool0", 0) / "gs:/bkt/job/checkpoints/step-00000002").is_dir()


def _result(job):
    return json.loads(job.local("gs://labkit-demo/job/model/result.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_resumes_from_its_checkpoint_after_preemption(tmp_path):
    pytest.importorskip("torch")
    clean = run_local(demo_job("ddp", replica_count=1, steps=6), tmp_path / "clean")
    job = run_local(demo_job("ddp", replica_count=1, steps=6, checkpoint_every=2, step_sleep=0.3,
                             spot=True), tmp_path / "preempted",
                    fault=Fault("workerpool0", at_step=3, signal="SIGTERM"))
    assert clean.succeeded and job.succeeded and job.job_restarts == 1, job.summary()
    assert "resumed from" in job.final().log()  # found through AIP_CHECKPOINT_DIR = gs://...
    assert _result(job)["losses"] == pytest.approx(_result(clean)["losses"], rel=1e-6)


def test_demo_job_runs_on_an_image_with_labkit():
    spec = demo_job("ddp", replica_count=2)
    for pool in spec["worker_pool_specs"]:
        container = pool["container_spec"]
        assert container["image_uri"] == vertex.default_image("torch") and "command" not in container
    prebuilt = demo_job("tf", image_uri="us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-19.py310:latest",
                        package_uri="gs://bkt/in/labkit.tar.gz")
    assert "pip install --quiet /gcs/bkt/in/labkit.tar.gz" in \
        prebuilt["worker_pool_specs"][0]["container_spec"]["command"][2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_replica_ddp_job_matches_one_process(tmp_path):
    pytest.importorskip("torch")
    two = run_local(demo_job("ddp", replica_count=2, steps=6), tmp_path / "two")
    one = run_local(demo_job("ddp", replica_count=1, steps=6), tmp_path / "one")
    assert two.succeeded and one.succeeded, two.summary() + one.summary()
    r2, r1 = _result(two), _result(one)
    assert r2["world_size"] == 2 and r2["backend"] == "gloo" and len(r2["losses"]) == 6
    assert r2["losses"] == pytest.approx(r1["losses"], rel=1e-5)
    assert r2["weights"] == pytest.approx(r1["weights"], rel=1e-4, abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_worker_tf_job_finishes(tmp_path):
    pytest.importorskip("tensorflow")
    job = run_local(demo_job("tf", replica_count=2, steps=3), tmp_path)
    assert job.succeeded, job.summary() + job.final("workerpool1[0]").log()[-2000:]
    r = _result(job)
    assert r["world_size"] == 2 and r["strategy"] == "CollectiveAllReduceStrategy" and len(r["losses"]) == 3
    assert "step 3" in job.final("workerpool1[0]").log()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_preemption_drill_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from labkit.course.preemption.drill import DrillConfig, preemption_drill

    # As a headless notebook run may set them: the drill reads steps from the replicas' bars.
    monkeypatch.setenv("LABKIT_PROGRESS", "off")
    monkeypatch.setenv("LABKIT_NO_PROGRESS", "1")

    r = preemption_drill(DrillConfig(steps=8, preempt_step=4, checkpoint_every=3,
                                     input_latency_ms=100), tmp_path)
    assert r.clean.succeeded and r.preempted.succeeded, r.preempted.summary()
    assert r.preempted.job_restarts == 1 and any("preempted (Spot)" in e for e in r.preempted.events)
    assert r.preempted.faults_sent == 1 and r.clean.faults_sent == 0
    first = [x for x in r.preempted.runs if x.job_attempt == 0]
    assert {x.exit_code for x in first} == {143}  # every rank checkpointed and left at the same step
    assert r.resumed_at_step is not None and 4 <= r.resumed_at_step < 8
    assert len(r.clean_losses) == 8 and r.preempted_losses == r.clean_losses  # bit for bit
    assert r.weights_equal and r.max_weight_difference == 0.0


TCP_ALLREDUCE = """
import torch, torch.distributed as dist
from labkit.core import cluster
from labkit.torch.distributed import init_process_group
info = cluster.from_env()
assert init_process_group(info, init_method="tcp") == "gloo"
t = torch.tensor([float(info.rank + 1)])
dist.all_reduce(t)
assert t.item() == 3.0 and dist.get_rank() == info.rank and dist.get_world_size() == 2
print("step 1 sum", t.item(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_process_group_with_explicit_tcp_init(tmp_path):
    pytest.importorskip("torch")
    job = run_local(script_job(TCP_ALLREDUCE), tmp_path, timeout_s=100)
    assert job.succeeded, job.summary() + job.final().log()
    assert "sum 3.0" in job.final("workerpool1[0]").log()


def test_a_local_job_shows_the_furthest_step_any_replica_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LABKIT_PROGRESS", "text")
    steps = "import sys\nfor i in range(1, 6): print(f'step {i}', flush=True)"
    job = run_local(script_job(steps, workers=1), tmp_path)
    assert job.state == SUCCEEDED
    out = capsys.readouterr().out
    assert "local job, 2 replica(s)" in out and "5step" in out
    run_local(script_job(steps, workers=0), tmp_path / "quiet", show_progress=False)
    assert "local job" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_training_job_with_a_tensorboard_writes_its_scalars_where_vertex_uploads_them(tmp_path):
    """Vertex AI TensorBoard uploads what a job writes under AIP_TENSORBOARD_LOG_DIR: a 2-node
    `labkit train` job, emulated, leaves there an event file whose loss is the metrics' loss."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorboard")
    from labkit.core import metrics
    from labkit.core.scalars import event_files, read_scalars

    spec = vertex.training_job(dict(model="cnn", scale="smoke", steps=3, batch_size=16, device="cpu"),
                               output_uri=OUT, replica_count=2, env={"NCCL_DEBUG": "INFO"},
                               tensorboard="projects/p/locations/us-central1/tensorboards/1",
                               service_account="trainer@p.iam.gserviceaccount.com")
    job = run_local(spec, tmp_path)
    assert job.succeeded, job.summary()
    files = event_files(job.local(f"{OUT}/logs/"))
    assert len(files) == 1  # rank 0 writes; the worker does not
    scalars = read_scalars(files[0])
    losses = [s["loss"] for s in metrics.load_metrics(job.local(f"{OUT}/metrics.json"))["steps"]]
    assert len(scalars["train/loss"]) == 3
    assert [v for _, v in scalars["train/loss"]] == pytest.approx(losses, rel=1e-6)
    assert "NCCL INFO" not in "".join(r.log() for r in job.runs)  # gloo on CPU: NCCL never ran
