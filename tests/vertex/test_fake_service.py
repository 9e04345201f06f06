"""The real google-cloud-aiplatform client against the local fake JobService: what arrives from
`labkit.vertex.submit` and from the vertex_job recipe, and the fake answering as Vertex does
(states, errors, cancel, tuning jobs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.api_core import exceptions

from labkit import vertex
from labkit.core.train_config import TrainConfig
from labkit.vertex.fake_service import FakeVertex
from labkit.vertex.submit import job_service_client


@pytest.fixture(scope="module", autouse=True)
def _aiplatform():
    """The Vertex AI client, imported when this module's first test runs rather than at collection."""
    global aiplatform_v1
    pytest.importorskip("google.cloud.aiplatform")
    from google.cloud import aiplatform_v1


REPO = Path(__file__).resolve().parents[2]
PARENT = "projects/p/locations/us-central1"
POOL = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
        "container_spec": {"image_uri": "us-docker.pkg.dev/p/r/img:1", "command": ["python"]}}


@pytest.fixture(autouse=True)
def _images_in_project_p(monkeypatch):
    """labkit's default images live in the test project ("p"), not the placeholder project."""
    monkeypatch.setenv("LABKIT_IMAGE_REGISTRY", "us-central1-docker.pkg.dev/p/labkit")


@pytest.fixture
def fake():
    with FakeVertex() as f:
        yield f


@pytest.fixture
def client(fake):
    return job_service_client(endpoint=fake.endpoint)


def _create(client, **job) -> aiplatform_v1.CustomJob:
    spec = job.pop("job_spec", {"worker_pool_specs": [POOL]})
    return client.create_custom_job(parent=PARENT, custom_job=aiplatform_v1.CustomJob(
        display_name=job.pop("display_name", "t"), job_spec=spec, **job))


def test_a_job_goes_pending_running_succeeded(fake, client):
    job = _create(client)
    assert job.name.startswith(f"{PARENT}/customJobs/")
    assert job.state == aiplatform_v1.JobState.JOB_STATE_PENDING and job.create_time
    seen = [client.get_custom_job(name=job.name) for _ in range(3)]
    assert [j.state.name for j in seen] == ["JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED",
                                            "JOB_STATE_SUCCEEDED"]
    assert seen[-1].end_time >= seen[-1].start_time >= job.create_time
    assert [r.method for r in fake.requests] == ["POST", "GET", "GET", "GET"]
    assert [j.name for j in client.list_custom_jobs(parent=PARENT)] == [job.name]


def test_slower_jobs_and_failures_follow_the_settings():
    with FakeVertex(polls_per_state=2, final_state="JOB_STATE_FAILED") as f:
        client = job_service_client(endpoint=f.endpoint)
        job = _create(client)
        states = [client.get_custom_job(name=job.name).state.name for _ in range(4)]
        assert states == ["JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_RUNNING",
                          "JOB_STATE_FAILED"]
        assert client.get_custom_job(name=job.name).error.code == 13


def test_cancel_then_cancelled_and_a_finished_job_cannot_be_cancelled(fake, client):
    job = _create(client)
    client.cancel_custom_job(name=job.name)
    assert fake.state(job.name) == "JOB_STATE_CANCELLING"
    done = client.get_custom_job(name=job.name)
    assert done.state.name == "JOB_STATE_CANCELLED" and done.error.code == 1
    with pytest.raises(exceptions.BadRequest, match="cannot be cancelled"):
        client.cancel_custom_job(name=job.name)
    client.delete_custom_job(name=job.name).result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        client.get_custom_job(name=job.name)


def test_requests_vertex_would_refuse_are_refused_naming_the_field(client):
    with pytest.raises(exceptions.BadRequest, match="display_name"):
        _create(client, display_name="")
    with pytest.raises(exceptions.BadRequest, match=r"worker_pool_specs\[0\].replica_count"):
        _create(client, job_spec={"worker_pool_specs": [{**POOL, "replica_count": 2}]})
    with pytest.raises(exceptions.BadRequest, match=r"worker_pool_specs\[1\]"):
        _create(client, job_spec={"worker_pool_specs": [POOL, {"machine_spec": {"machine_type": "n1"},
                                                               "replica_count": 1}]})
    running = _create(client)
    with pytest.raises(exceptions.BadRequest, match="cancel it before deleting"):
        client.delete_custom_job(name=running.name)


def test_tuning_jobs_share_the_calls(fake, client):
    spec = {"display_name": "study", "max_trial_count": 4, "parallel_trial_count": 2,
            "study_spec": {"metrics": [{"metric_id": "loss", "goal": "MINIMIZE"}],
                           "parameters": [{"parameter_id": "lr",
                                           "double_value_spec": {"min_value": 1e-4, "max_value": 1e-2},
                                           "scale_type": "UNIT_LOG_SCALE"}]},
            "trial_job_spec": {"worker_pool_specs": [POOL]}}
    job = client.create_hyperparameter_tuning_job(
        parent=PARENT, hyperparameter_tuning_job=aiplatform_v1.HyperparameterTuningJob(**spec))
    assert "/hyperparameterTuningJobs/" in job.name
    assert client.get_hyperparameter_tuning_job(name=job.name).state.name == "JOB_STATE_RUNNING"
    client.cancel_hyperparameter_tuning_job(name=job.name)
    assert client.get_hyperparameter_tuning_job(name=job.name).state.name == "JOB_STATE_CANCELLED"
    arrived = fake.created("hyperparameterTuningJobs")[0]
    assert arrived["study_spec"]["parameters"][0]["scale_type"] == "UNIT_LOG_SCALE"
    assert fake.created() == []  # custom jobs are a separate collection
    with pytest.raises(exceptions.BadRequest, match="study_spec.metrics"):
        client.create_hyperparameter_tuning_job(parent=PARENT, hyperparameter_tuning_job=
                                                aiplatform_v1.HyperparameterTuningJob(
                                                    **{**spec, "study_spec": {}}))


def test_submit_sends_the_training_job_with_pools_spot_and_reduction_server(fake, tmp_path):
    """`labkit.vertex.submit` with the fake's endpoint (no credentials needed on loopback) and a
    local folder standing in for the bucket: what the JobService received is the spec."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    config = TrainConfig(model="gpt", steps=7, batch_size=64)
    spec = vertex.training_job(config, output_uri="gs://bucket/run1", replica_count=3, spot=True,
                               reduction_server_count=2, machine_type="g2-standard-8",
                               accelerator_type="NVIDIA_L4", accelerator_count=1,
                               package_uri="gs://bucket/run1/inputs/labkit.tar.gz")  # pip-installs labkit
    bucket = tmp_path / "gcs"
    job = vertex.submit(spec, display_name="labkit-test", project="p", region="us-central1",
                        bucket="gs://bucket", endpoint=fake.endpoint, env={"HOME": str(tmp_path)},
                        filesystem=DirFileSystem(str(bucket), LocalFileSystem()))
    assert job.state.name == "JOB_STATE_PENDING"
    arrived = fake.created()[0]
    assert arrived["display_name"] == "labkit-test" and arrived["name"] == job.name
    s = arrived["job_spec"]
    pools = s["worker_pool_specs"]
    assert [int(p["replica_count"]) for p in pools] == [1, 2, 2]
    assert pools[0]["machine_spec"]["accelerator_type"] == "NVIDIA_L4"
    assert pools[2]["container_spec"]["image_uri"] == vertex.REDUCTION_SERVER_IMAGE
    assert s["scheduling"]["strategy"] == "SPOT" and s["scheduling"]["restart_job_on_worker_restart"]
    assert s["base_output_directory"]["output_uri_prefix"] == "gs://bucket/run1"
    command = pools[0]["container_spec"]["command"] + pools[0]["container_spec"]["args"]
    assert command[command.index("train"):][:3] == ["train", "--model", "gpt"]
    assert "--batch-size" in command and "/gcs/bucket/run1/checkpoints" in command
    assert (bucket / "bucket" / "run1" / "inputs" / "labkit.tar.gz").stat().st_size > 1000


def test_submit_to_a_local_endpoint_needs_a_stand_in_for_the_bucket(fake, tmp_path):
    spec = vertex.training_job(TrainConfig(), output_uri="gs://bucket/run1",
                               package_uri="gs://bucket/run1/inputs/labkit.tar.gz")
    with pytest.raises(ValueError, match="filesystem"):
        vertex.submit(spec, display_name="t", project="p", region="us-central1", bucket="gs://bucket",
                      endpoint=fake.endpoint, env={"HOME": str(tmp_path)})
    assert fake.requests == []


@pytest.mark.slow
def test_the_vertex_job_recipe_sends_pools_spot_reduction_server_and_its_command(fake):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "labkit.recipes.vertex_job", "--project", "p", "--bucket", "gs://bkt",
           "--image-uri", "us-docker.pkg.dev/p/r/train:1", "--machine-type", "a2-highgpu-2g",
           "--accelerator", "NVIDIA_TESLA_A100", "--accelerator-count", "2", "--replicas", "3",
           "--reduction-servers", "2", "--spot", "--endpoint", fake.endpoint, "--wait",
           "--poll-seconds", "0.01", "--", "--model", "gpt", "--steps", "50", "--batch-size", "64"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [line.split()[-1] for line in r.stdout.splitlines() if " JOB_STATE_" in line] == \
        ["JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]
    s = fake.created()[0]["job_spec"]
    pools = s["worker_pool_specs"]
    assert [int(p["replica_count"]) for p in pools] == [1, 2, 2]
    assert pools[1]["machine_spec"] == pools[0]["machine_spec"]
    assert pools[0]["machine_spec"]["accelerator_count"] == 2
    assert pools[2]["machine_spec"]["machine_type"] == "n1-highcpu-16"
    assert pools[2]["container_spec"]["image_uri"] == vertex.REDUCTION_SERVER_IMAGE
    assert s["scheduling"]["strategy"] == "SPOT" and s["scheduling"]["restart_job_on_worker_restart"]
    base = s["base_output_directory"]["output_uri_prefix"]
    assert base.startswith("gs://bkt/labkit-ddp-")
    script = pools[0]["container_spec"]["command"]
    assert script[:2] == ["bash", "-c"]
    assert "--nnodes=$NNODES --node-rank=$NODE_RANK" in script[2] and "CLUSTER_SPEC" in script[2]
    assert "--nproc-per-node=2 -m labkit.recipes.ddp --model gpt --steps 50 --batch-size 64" in script[2]
    assert f"--metrics-out {base.replace('gs://', '/gcs/')}/metrics.json" in script[2]
    # what the client library put on the wire: enums as numbers, camelCase, int64 as strings
    posted = next(q.body for q in fake.requests if q.method == "POST")
    assert json.dumps(posted["jobSpec"]["scheduling"]) == '{"restartJobOnWorkerRestart": true, "strategy": 4}'


@pytest.mark.slow
def test_the_vertex_job_recipe_sends_tensorboard_service_account_and_env(fake):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    board, account = "projects/p/locations/us-central1/tensorboards/7", "trainer@p.iam.gserviceaccount.com"
    base = [sys.executable, "-m", "labkit.recipes.vertex_job", "--project", "p", "--bucket", "gs://bkt",
            "--image-uri", "us-docker.pkg.dev/p/r/train:1", "--endpoint", fake.endpoint]
    r = subprocess.run([*base, "--tensorboard", board, "--service-account", account, "--env", "NCCL_DEBUG=INFO",
                        "--", "--steps", "5"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    s = fake.created()[0]["job_spec"]
    assert s["tensorboard"] == board and s["service_account"] == account
    assert s["base_output_directory"]["output_uri_prefix"].startswith("gs://bkt/")
    assert s["worker_pool_specs"][0]["container_spec"]["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"}]
    posted = next(q.body for q in fake.requests if q.method == "POST")
    assert posted["jobSpec"]["tensorboard"] == board and posted["jobSpec"]["serviceAccount"] == account
    # without an account the recipe stops before sending anything, in one line naming both flags
    r = subprocess.run([*base, "--tensorboard", board], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--tensorboard needs --service-account" in r.stderr.splitlines()[-1]
    assert len(fake.created()) == 1


def _submit(spec, fake, tmp_path, **kw):
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    return vertex.submit(spec, display_name=kw.pop("display_name", "labkit-test"), project="p",
                         region="us-central1", bucket="gs://bucket", endpoint=fake.endpoint,
                         env={"HOME": str(tmp_path)},
                         filesystem=DirFileSystem(str(tmp_path / "gcs"), LocalFileSystem()), **kw)


@pytest.mark.parametrize("kind", ["custom", "tuning"])
def test_submit_then_poll_until_it_succeeds(kind, fake, tmp_path):
    """`submit` creates a CustomJob or a HyperparameterTuningJob; `job_state` and `wait` follow
    it through the states the service reports."""
    config = TrainConfig(model="cnn", steps=5)
    if kind == "custom":
        spec = vertex.training_job(config, output_uri="gs://bucket/run")
    else:
        spec = vertex.tuning_job(config, output_uri="gs://bucket/study", metric="loss", goal="MINIMIZE",
                                 parameters={"lr": ("log", 1e-4, 1e-2), "batch_size": [16, 32]},
                                 max_trial_count=4, parallel_trial_count=2)
    job = _submit(spec, fake, tmp_path)
    collection = "customJobs" if kind == "custom" else "hyperparameterTuningJobs"
    assert f"/{collection}/" in job.name and job.state.name == "JOB_STATE_PENDING"
    arrived = fake.created(collection)[0]
    assert arrived["display_name"] == "labkit-test"
    if kind == "tuning":
        assert int(arrived["max_trial_count"]) == 4 and int(arrived["parallel_trial_count"]) == 2
        assert {p["parameter_id"] for p in arrived["study_spec"]["parameters"]} == {"lr", "batch-size"}  # flag names
    states = []
    final = vertex.wait(job.name, poll_s=0.0, timeout_s=30, on_state=states.append, endpoint=fake.endpoint)
    assert final.state.name == "JOB_STATE_SUCCEEDED" and states[-1] == "JOB_STATE_SUCCEEDED"
    assert vertex.job_state(job.name, endpoint=fake.endpoint) == "JOB_STATE_SUCCEEDED"


@pytest.mark.parametrize("kind", ["custom", "tuning"])
def test_cancel_a_running_job(kind, tmp_path):
    with FakeVertex(polls_per_state=100) as fake:  # stays RUNNING long enough to cancel
        config = TrainConfig(model="cnn", steps=5)
        spec = (vertex.training_job(config, output_uri="gs://bucket/run") if kind == "custom" else
                vertex.tuning_job(config, output_uri="gs://bucket/study", metric="loss", goal="MINIMIZE",
                                  parameters={"lr": ("log", 1e-4, 1e-2)}, max_trial_count=2,
                                  parallel_trial_count=1))
        job = _submit(spec, fake, tmp_path)
        vertex.cancel(job.name, endpoint=fake.endpoint)
        final = vertex.wait(job.name, poll_s=0.0, timeout_s=30, endpoint=fake.endpoint)
        assert final.state.name == "JOB_STATE_CANCELLED"
        with pytest.raises(exceptions.GoogleAPICallError):  # an ended job cannot be cancelled
            vertex.cancel(job.name, endpoint=fake.endpoint)


def test_a_job_name_that_is_no_job_is_refused_naming_it():
    with pytest.raises(ValueError, match="projects/p/locations/r/models/1"):
        vertex.job_state("projects/p/locations/r/models/1", endpoint="http://127.0.0.1:9")
