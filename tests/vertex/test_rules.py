"""Issue "Vertex for real": what the service refuses or needs is refused or done before a job is
built, each rule from Vertex AI's own pages, and every new field travels through the real
google-cloud-aiplatform client to the fake service and back."""

from __future__ import annotations

import json

import pytest

from labkit import vertex
from labkit.core.config import ParameterError
from labkit.vertex.fake_service import FakeVertex
from labkit.vertex.reduction import ReductionServerWarning
from labkit.vertex.specs import NCCL_ENV_SCRIPT


@pytest.fixture(scope="module", autouse=True)
def _aiplatform():
    """The Vertex AI client, imported when this module's first test runs rather than at collection."""
    global types
    types = pytest.importorskip("google.cloud.aiplatform_v1.types")


OUT = "gs://bkt/run"
H100 = dict(machine_type="a3-highgpu-8g", accelerator_type="NVIDIA_H100_80GB", accelerator_count=8)
L4 = dict(machine_type="g2-standard-8", accelerator_type="NVIDIA_L4", accelerator_count=1)
TB = "projects/p/locations/us-central1/tensorboards/123"
SA = "trainer@p.iam.gserviceaccount.com"


def refused(call, name, *words):
    with pytest.raises(ParameterError) as err:
        call()
    assert err.value.name == name, str(err.value)
    assert "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value), str(err.value)
    return err.value


# ---------------------------------------------------------------- outputs and notebooks

@pytest.mark.parametrize(("bucket", "rule"), [
    ("My Bucket", "lowercase"), ("my_bucket_", "start and end"), ("ab", "3 to 63"), ("a" * 64, "3 to 63"),
    ("192.168.5.4", "IP address"), ("goog-data", "goog"), ("my-g00gle-data", "google")])
def test_bucket_names_follow_cloud_storage_rules(bucket, rule):
    err = refused(lambda: vertex.training_job({}, output_uri=f"gs://{bucket}/run"), "output_uri", rule)
    assert "storage/docs/buckets#naming" in str(err)


def test_good_bucket_names_and_the_placeholder_pass_until_submitted(tmp_path):
    for bucket in ("my-bucket", "my_bucket-2", "a.b.c", "x" * 63, ".".join(["y" * 63] * 3)):
        assert vertex.training_job({}, output_uri=f"gs://{bucket}/run")
    spec = vertex.training_job({}, output_uri="gs://YOUR_BUCKET/run", image_uri=IMAGE)  # shown, as notebooks do
    with FakeVertex() as fake:
        with pytest.raises(ParameterError, match=r"'output_uri' still holds the placeholder YOUR_BUCKET"):
            _submit(spec, fake, tmp_path)
        assert fake.created() == []  # refused before anything was created
    local = vertex.with_bucket(spec, "labkit-local")  # for a local stand-in only
    assert vertex.submission_placeholder(spec) == "output_uri" and vertex.submission_placeholder(local) is None
    assert local["base_output_directory"]["output_uri_prefix"] == "gs://labkit-local/run"
    assert local.labels == spec.labels  # a training job's labels travel beside its dict
    with pytest.raises(ParameterError, match="placeholder bucket YOUR_BUCKET"):
        vertex.check_output_uri("gs://YOUR_BUCKET/run", placeholder_ok=False)


@pytest.mark.parametrize("uri", ["b/run", "/tmp/run", "/gcs/bkt/run", "gs://", "gs:///run", "s3://b/run"])
def test_outputs_must_be_in_cloud_storage(uri):
    refused(lambda: vertex.training_job({}, output_uri=uri), "output_uri", "gs://", "restarts")
    refused(lambda: vertex.notebook_job("nb.ipynb", {}, output_uri=uri), "output_uri")
    refused(lambda: vertex.tuning_job({}, output_uri=uri, metric="loss", goal="minimize",
                                      parameters={"lr": [0.1, 0.2]}, max_trial_count=2,
                                      parallel_trial_count=1), "output_uri")
    refused(lambda: vertex.custom_job_spec(vertex.PoolConfig(), output_uri=uri), "output_uri")


def test_notebook_parameters_are_checked_against_the_notebook_before_the_spec():
    refused(lambda: vertex.notebook_job("notebooks/00_tour.ipynb", {"scale": "huge"}, output_uri=OUT),
            "scale", "'smoke'", "00_tour.ipynb")
    refused(lambda: vertex.notebook_job("notebooks/04_mixed_precision.ipynb", {"precision": "bf16"},
                                        output_uri=OUT), "precision", "not a parameter")
    refused(lambda: vertex.notebook_job("notebooks/06_multi_node.ipynb", {"steps": "many"}, output_uri=OUT),
            "steps", "integer")
    # A notebook not readable here: the parameters every notebook shares are still checked.
    refused(lambda: vertex.notebook_job("gs://bkt/nb.ipynb", {"scale": "huge"}, output_uri=OUT), "scale")
    vertex.notebook_job("notebooks/00_tour.ipynb", {"scale": "smoke"}, output_uri=OUT)


def test_a_notebook_job_keeps_its_log_and_files_in_the_bucket_and_bounds_each_cell():
    spec = vertex.notebook_job("notebooks/00_tour.ipynb", {}, output_uri=OUT, cell_timeout_s=600, **L4)
    args = spec["worker_pool_specs"][0]["container_spec"]["args"]
    assert args[args.index("--artifacts") + 1] == "/gcs/bkt/run/notebooks/artifacts/00_tour"
    assert args[args.index("--cell-timeout") + 1] == "600"
    assert args[args.index("--device") + 1] == "cuda"  # a job with GPUs fails at once without CUDA
    unbounded = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, cell_timeout_s=None)
    args = unbounded["worker_pool_specs"][0]["container_spec"]["args"]
    assert args[args.index("--cell-timeout") + 1] == "0"
    refused(lambda: vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, cell_timeout_s=0), "cell_timeout_s")


# ---------------------------------------------------------------- GPUs, RDMA, Arm

def test_jobs_with_gpus_train_with_device_cuda():
    args = vertex.training_job({"model": "gpt"}, output_uri=OUT, **L4)["worker_pool_specs"][0]["container_spec"]["args"]
    assert args[args.index("--device") + 1] == "cuda"
    node = vertex.training_job({}, output_uri=OUT, replica_count=2, **H100)
    assert "--device" in node["worker_pool_specs"][1]["container_spec"]["args"]
    trial = vertex.tuning_job({}, output_uri=OUT, metric="loss", goal="minimize", parameters={"lr": [0.1, 0.2]},
                              max_trial_count=2, parallel_trial_count=1, **L4)
    targs = trial["trial_job_spec"]["worker_pool_specs"][0]["container_spec"]["args"]
    assert targs[targs.index("--device") + 1] == "cuda"
    refused(lambda: vertex.training_job({"device": "cpu"}, output_uri=OUT, **L4), "device", "GPUs")
    cpu_only = vertex.training_job({}, output_uri=OUT)["worker_pool_specs"][0]["container_spec"]["args"]
    assert "--device" not in cpu_only


@pytest.mark.parametrize("machine,accelerator,count,disk", [
    ("a3-ultragpu-8g", "NVIDIA_H200_141GB", 8, "hyperdisk-balanced"),
    ("a4-highgpu-8g", "NVIDIA_B200", 8, "hyperdisk-balanced"),
])
def test_multi_node_rdma_jobs_source_the_nccl_setup_first(machine, accelerator, count, disk):
    kw = dict(machine_type=machine, accelerator_type=accelerator, accelerator_count=count)
    spec = vertex.training_job({"model": "gpt"}, output_uri=OUT, replica_count=2, **kw)
    for pool in spec["worker_pool_specs"]:
        command = pool["container_spec"]["command"]
        assert command[:2] == ["bash", "-c"] and command[2].startswith(f"source {NCCL_ENV_SCRIPT} && ")
        assert pool["disk_spec"]["boot_disk_type"] == disk
    single = vertex.training_job({"model": "gpt"}, output_uri=OUT, **kw)
    assert "command" not in single["worker_pool_specs"][0]["container_spec"]
    h100 = vertex.training_job({"model": "gpt"}, output_uri=OUT, replica_count=2, **H100)
    assert "command" not in h100["worker_pool_specs"][0]["container_spec"]


def test_a4x_is_arm_and_needs_a_reservation():
    a4x = dict(machine_type="a4x-highgpu-4g", accelerator_type="NVIDIA_GB200", accelerator_count=4)
    refused(lambda: vertex.training_job({}, output_uri=OUT, **a4x), "machine_type", "arm64", "amd64")
    refused(lambda: vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, **a4x), "machine_type", "Arm")
    arm = "us-docker.pkg.dev/p/r/labkit-arm:1"
    refused(lambda: vertex.training_job({}, output_uri=OUT, image_uri=arm, **a4x), "reservation", "GB200")
    spec = vertex.training_job({}, output_uri=OUT, image_uri=arm, reservation="any", replica_count=2, **a4x)
    machine = spec["worker_pool_specs"][0]["machine_spec"]
    assert machine["reservation_affinity"] == {"reservation_affinity_type": "ANY_RESERVATION"}
    assert spec["worker_pool_specs"][0]["container_spec"]["command"][2].startswith(f"source {NCCL_ENV_SCRIPT}")
    assert vertex.machine_arch("a4x-highgpu-4g") == "arm64" and vertex.machine_arch("a4-highgpu-8g") == "amd64"


# ---------------------------------------------------------------- machines, disks, TPUs

@pytest.mark.parametrize("size,ok", [(20, False), (99, False), (100, True), (64_000, True), (64_001, False)])
def test_boot_disks_are_100_to_64000_gb(size, ok):
    build = lambda: vertex.training_job({}, output_uri=OUT, boot_disk_size_gb=size)  # noqa: E731
    if ok:
        assert build()["worker_pool_specs"][0]["disk_spec"]["boot_disk_size_gb"] == size
    else:
        refused(build, "boot_disk_size_gb", "between 100 and 64,000")


def test_hand_written_specs_meet_the_same_tables():
    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "disk_spec": {"boot_disk_size_gb": 20}, "container_spec": {"image_uri": "gcr.io/p/i"}}
    refused(lambda: vertex.check_spec({"worker_pool_specs": [pool]}),
            "worker_pool_specs[0].disk_spec.boot_disk_size_gb")
    tpu = {"machine_spec": {"machine_type": "ct5lp-hightpu-4t", "tpu_topology": "2x2"}, "replica_count": 1,
           "container_spec": {"image_uri": "gcr.io/p/i"}}
    vertex.check_spec({"worker_pool_specs": [tpu]})
    ok = dict(pool, disk_spec={})
    refused(lambda: vertex.check_spec({"worker_pool_specs": [tpu, ok]}),
            "worker_pool_specs[0].machine_spec.machine_type", "single worker pool")
    refused(lambda: vertex.check_spec({"worker_pool_specs": [ok, {**tpu, "replica_count": 2}]}),
            "worker_pool_specs[1].machine_spec.machine_type", "one replica")
    for machine in ("n1-standard-2", "n1-highcpu-8"):
        refused(lambda m=machine: vertex.check_spec(
            {"worker_pool_specs": [dict(ok, machine_spec={"machine_type": m})]}),
            "worker_pool_specs[0].machine_spec.machine_type", "not a machine type")


@pytest.mark.parametrize("machine,accelerator,count,ok", [
    ("n1-standard-32", "NVIDIA_TESLA_T4", 1, False), ("n1-standard-32", "NVIDIA_TESLA_T4", 2, True),
    ("n1-standard-96", "NVIDIA_TESLA_P100", 4, False), ("n1-highcpu-64", "NVIDIA_TESLA_P100", 4, True),
    ("n1-standard-16", "NVIDIA_TESLA_V100", 1, False), ("n1-highmem-2", "NVIDIA_TESLA_V100", 8, True),
    ("g2-standard-24", "NVIDIA_L4", 2, True), ("g4-standard-96", "NVIDIA_RTX_PRO_6000", 2, True),
    ("cloud-tpu", "TPU_V2", 32, True), ("cloud-tpu", "TPU_V2", 12, False),
])
def test_accelerator_counts_follow_vertexs_table(machine, accelerator, count, ok):
    check = lambda: vertex.check_machine(machine, accelerator, count)  # noqa: E731
    if ok:
        check()
    else:
        refused(check, "accelerator_type" if accelerator == "NVIDIA_TESLA_P100" else "accelerator_count")


# ---------------------------------------------------------------- the Reduction Server

def test_reducers_are_sized_by_bandwidth_and_a_smaller_count_is_kept_with_a_warning():
    # Vertex's rule is advice: 4 reducers for 4 x a3-highgpu-8g stay, with a warning naming the
    # rule's count, sized on the 200 Gbps primary NIC the reducers share (not the 1,000 Gbps total).
    with pytest.warns(ReductionServerWarning, match=r"reduction_server_count=4 kept, below .*25 x n1-highcpu-16"):
        kept = vertex.training_job({"model": "gpt"}, output_uri=OUT, replica_count=4, reduction_server_count=4,
                                   **H100)
    assert kept["worker_pool_specs"][2]["replica_count"] == 4
    auto = vertex.training_job({"model": "gpt"}, output_uri=OUT, replica_count=4, reduction_server_count="auto",
                               **H100)
    assert auto["worker_pool_specs"][2]["replica_count"] == 25
    # Google's two worked examples.
    v100 = vertex.size_reducers(5, "n1-highmem-96", "NVIDIA_TESLA_V100", "n1-highcpu-16", 8)
    a2 = vertex.size_reducers(8, "a2-megagpu-16g", "NVIDIA_TESLA_A100", "n1-highcpu-16", 16)
    assert (v100.needed, a2.needed) == (16, 25)
    refused(lambda: vertex.training_job({}, output_uri=OUT, replica_count=2, reduction_server_count=2),
            "reduction_server_count", "GPU")
    refused(lambda: vertex.training_job({}, output_uri=OUT, replica_count=2, reduction_server_count="auto",
                                        reduction_server_machine_type="e2-standard-4", **L4),
            "reduction_server_machine_type")


# ---------------------------------------------------------------- capacity and cost guards

def test_every_job_gets_a_timeout_and_labels():
    spec = vertex.training_job({}, output_uri=OUT, labels={"team": "vision"})
    assert spec["scheduling"]["timeout"] == f"{vertex.DEFAULT_TIMEOUT_S}s" and vertex.DEFAULT_TIMEOUT_S < 7 * 86400
    assert spec.labels == {"labkit-job": "training", "team": "vision"}
    assert vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, timeout_s=600)["scheduling"]["timeout"] == "600s"
    for bad in ({"Team": "x"}, {"team": "Vision"}, {"t": "x" * 65}, {"": "x"}, {"a b": "c"}):
        with pytest.raises(ParameterError, match="labels"):
            vertex.training_job({}, output_uri=OUT, labels=bad)
    for first in ("1team", "_team", "-team"):  # Google Cloud wants a lowercase letter first
        with pytest.raises(ParameterError, match=f"labels\\['{first}'\\].*start with a lowercase letter"):
            vertex.training_job({}, output_uri=OUT, labels={first: "x"})
    assert vertex.training_job({}, output_uri=OUT, labels={"équipe": "x", "t1_-": ""}).labels["équipe"] == "x"


def test_flex_start_and_its_rules():
    spec = vertex.training_job({"model": "gpt"}, output_uri=OUT, flex_start=True, max_wait_s=7200, **H100)
    assert spec["scheduling"]["strategy"] == "FLEX_START" and spec["scheduling"]["max_wait_duration"] == "7200s"
    message = vertex.validate(spec)
    assert message.scheduling.strategy == types.Scheduling.Strategy.FLEX_START
    assert message.scheduling.max_wait_duration.total_seconds() == 7200
    refused(lambda: vertex.training_job({}, output_uri=OUT, flex_start=True, spot=True, **L4), "flex_start")
    refused(lambda: vertex.training_job({}, output_uri=OUT, flex_start=True), "scheduling.strategy", "L4, A100")
    refused(lambda: vertex.training_job({}, output_uri=OUT, flex_start=True, machine_type="n1-standard-8",
                                        accelerator_type="NVIDIA_TESLA_T4", accelerator_count=1),
            "scheduling.strategy", "schedule-jobs-dws")
    refused(lambda: vertex.training_job({}, output_uri=OUT, flex_start=True, timeout_s=8 * 86400, **L4),
            "scheduling.timeout", "7 days")
    refused(lambda: vertex.training_job({"model": "gpt"}, output_uri=OUT, flex_start=True, replica_count=2,
                                        reduction_server_count="auto", **H100),
            "scheduling.strategy", "same machine configuration")
    refused(lambda: vertex.training_job({}, output_uri=OUT, flex_start=True, reservation="any", **L4),
            "reservation", "FLEX_START")
    refused(lambda: vertex.training_job({}, output_uri=OUT, max_wait_s=60, **L4), "max_wait_s")


def test_persistent_resources_reservations_and_tensorboard():
    spec = vertex.training_job({}, output_uri=OUT, persistent_resource_id="warm-pool",
                               tensorboard=TB, service_account=SA, **L4)
    assert spec["persistent_resource_id"] == "warm-pool" and spec["tensorboard"] == TB
    assert spec["service_account"] == SA
    name = "projects/p/zones/us-central1-a/reservations/mine"
    reserved = vertex.training_job({}, output_uri=OUT, reservation=name, **L4)
    assert reserved["worker_pool_specs"][0]["machine_spec"]["reservation_affinity"] == {
        "reservation_affinity_type": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name", "values": [name]}
    refused(lambda: vertex.training_job({}, output_uri=OUT, persistent_resource_id="warm-pool",
                                        reservation="any", **L4), "persistent_resource_id", "reservation")
    refused(lambda: vertex.training_job({}, output_uri=OUT, reservation="mine", **L4), "reservation")
    refused(lambda: vertex.training_job({}, output_uri=OUT, tensorboard=TB), "service_account", "tensorboard")
    refused(lambda: vertex.training_job({}, output_uri=OUT, tensorboard="board-1", service_account=SA),
            "tensorboard", "projects/PROJECT/locations/REGION/tensorboards/ID")


def test_tuning_jobs_carry_labels_and_the_trial_jobs_capacity():
    spec = vertex.tuning_job({}, output_uri=OUT, metric="loss", goal="minimize", parameters={"lr": [0.1, 0.2]},
                             max_trial_count=2, parallel_trial_count=1, labels={"team": "ml"},
                             flex_start=True, persistent_resource_id=None, **L4)
    assert spec["labels"] == {"labkit-job": "tuning", "team": "ml"}
    assert spec["trial_job_spec"]["scheduling"]["strategy"] == "FLEX_START"
    assert types.HyperparameterTuningJob(**spec).labels["team"] == "ml"


# ---------------------------------------------------------------- through the client and the fake

def _fs(tmp_path):
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    return DirFileSystem(str(tmp_path / "gcs"), LocalFileSystem())


def _submit(spec, fake, tmp_path, **kw):
    return vertex.submit(spec, display_name="rules", project=kw.pop("project", "p"), region="us-central1",
                         bucket="gs://bkt", endpoint=fake.endpoint, env={"HOME": str(tmp_path)},
                         filesystem=_fs(tmp_path), **kw)


IMAGE = "us-central1-docker.pkg.dev/p/labkit/labkit-torch:src-0123456789abcdef"


def test_every_new_field_reaches_the_fake_and_comes_back_as_rest_does(tmp_path):
    with FakeVertex(images={IMAGE}) as fake:
        spec = vertex.training_job({"model": "gpt"}, output_uri=OUT, image_uri=IMAGE, flex_start=True,
                                   max_wait_s=1800, timeout_s=3600, persistent_resource_id="warm-pool",
                                   tensorboard=TB, service_account=SA, labels={"team": "ml"}, **H100)
        job = _submit(spec, fake, tmp_path)
        assert job.labels == {"labkit-job": "training", "team": "ml"}
        got = vertex.get_job(job.name, endpoint=fake.endpoint)
        assert got.job_spec.scheduling.strategy.name == "FLEX_START"
        assert got.job_spec.scheduling.max_wait_duration.total_seconds() == 1800
        assert got.job_spec.scheduling.timeout.total_seconds() == 3600
        assert got.job_spec.persistent_resource_id == "warm-pool" and got.job_spec.tensorboard == TB
        assert got.job_spec.service_account == SA and dict(got.labels)["team"] == "ml"
        posted = next(q.body for q in fake.requests if q.method == "POST")
        assert posted["labels"] == {"labkit-job": "training", "team": "ml"}
        assert posted["jobSpec"]["scheduling"]["maxWaitDuration"] == "1800s"
        assert posted["jobSpec"]["persistentResourceId"] == "warm-pool"
        answer = json.loads(type(got).to_json(got))
        assert answer["jobSpec"]["tensorboard"] == TB and answer["labels"]["team"] == "ml"

        name = "projects/p/zones/us-central1-a/reservations/mine"
        reserved = _submit(vertex.training_job({}, output_uri=OUT, image_uri=IMAGE, reservation=name, **L4),
                           fake, tmp_path)
        affinity = reserved.job_spec.worker_pool_specs[0].machine_spec.reservation_affinity
        assert affinity.reservation_affinity_type.name == "SPECIFIC_RESERVATION" and list(affinity.values) == [name]
        tpu_pool = vertex.PoolConfig(machine_type="ct5lp-hightpu-4t", tpu_topology="4x4", image_uri=IMAGE)
        tpu = _submit(vertex.custom_job_spec(tpu_pool, output_uri=OUT), fake, tmp_path)
        assert tpu.job_spec.worker_pool_specs[0].machine_spec.tpu_topology == "4x4"


def test_the_fake_refuses_what_vertex_refuses_naming_the_field():
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    from labkit.vertex.submit import job_service_client

    pool = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
            "container_spec": {"image_uri": IMAGE}}
    cases = [
        ({"worker_pool_specs": [dict(pool, disk_spec={"boot_disk_size_gb": 20})]}, "boot_disk_size_gb"),
        ({"worker_pool_specs": [dict(pool, machine_spec={"machine_type": "n1-standard-2"})]}, "machine_type"),
        ({"worker_pool_specs": [pool], "scheduling": {"strategy": "FLEX_START"}}, "scheduling.strategy"),
        ({"worker_pool_specs": [pool], "tensorboard": TB,
          "base_output_directory": {"output_uri_prefix": OUT}}, "service_account"),
        ({"worker_pool_specs": [pool], "base_output_directory": {"output_uri_prefix": "bkt/run"}},
         "output_uri_prefix"),
    ]
    with FakeVertex() as fake:
        client = job_service_client(endpoint=fake.endpoint)
        for spec, field in cases:
            with pytest.raises(exceptions.BadRequest, match=field):
                client.create_custom_job(parent="projects/p/locations/us-central1", custom_job=aiplatform_v1.CustomJob(
                    display_name="x", job_spec=spec))
        with pytest.raises(exceptions.BadRequest, match="labels"):
            client.create_custom_job(parent="projects/p/locations/us-central1", custom_job=aiplatform_v1.CustomJob(
                display_name="x", job_spec={"worker_pool_specs": [pool]}, labels={"Team": "x"}))
        assert fake.created() == []


def test_submit_checks_the_image_exists_and_refuses_a_placeholder_project(tmp_path):
    with FakeVertex(images=set()) as fake:
        spec = vertex.training_job({}, output_uri=OUT, image_uri=IMAGE)
        refused(lambda: _submit(spec, fake, tmp_path), "image_uri", "does not exist", "labkit image")
        assert fake.created() == []  # nothing was created, no machine started
        asked = [q.path for q in fake.requests]
        assert asked == ["/v1/projects/p/locations/us-central1/repositories/labkit/packages/labkit-torch/tags/"
                         "src-0123456789abcdef"]
        fake.images.add(IMAGE)
        assert _submit(spec, fake, tmp_path).name
        refused(lambda: _submit(spec, fake, tmp_path, project="YOUR_PROJECT"), "project", "placeholder")
    placeholder_image = "us-central1-docker.pkg.dev/YOUR_PROJECT/labkit/labkit-torch:src-1"
    from labkit.vertex.registry import check_not_placeholder

    refused(lambda: check_not_placeholder("p", [placeholder_image]), "image_uri", "placeholder")


def test_the_emulator_runs_a_gpu_job_on_the_cpu_here_and_says_so(tmp_path):
    from labkit.core import devices
    from labkit.vertex.emulator import run_local

    if devices.detect().has_gpu:
        pytest.skip("this machine has a CUDA GPU: the job keeps --device cuda")
    pool = vertex.PoolConfig(image_uri=IMAGE, args=["python", "-c", "import sys; print('device', sys.argv[-1])",
                                                    "--device", "cuda"], **L4)
    job = run_local(vertex.custom_job_spec(pool, output_uri=OUT), tmp_path, show_progress=False)
    assert job.succeeded and "device cpu" in job.final().log()
    assert any("--device cuda" in e and "no GPU is visible here" in e for e in job.events)


def test_a_notebook_job_with_gpus_stops_at_once_without_cuda(tmp_path, capsys):
    from labkit.core import devices
    from labkit.vertex.entry import main

    if devices.detect().has_gpu:
        pytest.skip("this machine has a CUDA GPU")
    assert main(["notebook", "nb.ipynb", str(tmp_path), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "/usr/local/nvidia/lib64" in err[0]


@pytest.mark.parametrize("name", ["checkpoint_dir", "metrics_out", "tensorboard_dir"])
def test_an_output_on_the_vms_own_disk_is_refused_in_a_job(name):
    for local in ("/tmp/out", "runs/out", "out.json"):
        err = refused(lambda local=local: vertex.training_job({name: local}, output_uri=OUT), name, "fresh one",
                      "gs://BUCKET/PATH")
        assert "restart" in str(err)
    spec = vertex.training_job({name: "gs://bkt/keep/x"}, output_uri=OUT)  # the container reads /gcs/
    assert "/gcs/bkt/keep/x" in spec["worker_pool_specs"][0]["container_spec"]["args"]
    assert vertex.training_job({name: "/gcs/bkt/keep/y"}, output_uri=OUT)
