"""Contract 2: every spec labkit builds is accepted by aiplatform_v1 and round-trips."""

from __future__ import annotations

import json

import pytest

from labkit import vertex
from labkit.core.config import ParameterError
from labkit.vertex import userjob


@pytest.fixture(scope="module", autouse=True)
def _aiplatform():
    """The Vertex AI client, imported when this module's first test runs rather than at collection."""
    global types
    types = pytest.importorskip("google.cloud.aiplatform_v1.types")


OUT = "gs://my-bucket/runs/r1"


def roundtrip(spec):
    message = types.CustomJobSpec(**spec)
    again = types.CustomJobSpec(**types.CustomJobSpec.to_dict(message))
    assert again == message
    return types.CustomJobSpec.to_dict(message, use_integers_for_enums=False)


TPU_IMAGE = "us-docker.pkg.dev/p/own/jax-tpu:1"  # a user's own TPU image: labkit's have no TPU path


@pytest.mark.parametrize("job", ["training", "notebook"])
@pytest.mark.parametrize("machine", [dict(machine_type="ct5lp-hightpu-4t", tpu_topology="2x2"),
                                     dict(machine_type="ct6e-standard-4t", tpu_topology="2x2"),
                                     dict(machine_type="cloud-tpu", accelerator_type="TPU_V3",
                                          accelerator_count=8)])
@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_a_tpu_machine_is_refused_for_labkits_own_code(job, machine, framework):
    build = {"training": lambda: vertex.training_job({"framework": framework}, output_uri=OUT, **machine),
             "notebook": lambda: vertex.notebook_job("gs://bkt/nb.ipynb", {}, output_uri=OUT,
                                                     framework=framework, **machine)}[job]
    with pytest.raises(ParameterError) as err:
        build()
    assert err.value.name == "machine_type"
    for words in ("TPU", "no TPU path", "CPU at TPU prices", "GPU machine type", "labkit job --image"):
        assert words in str(err.value)
    # the user's own TPU code in their own image is their business
    assert userjob.user_job(["python", "train.py"], output_uri=OUT, image_uri=TPU_IMAGE,
                            machine_type="cloud-tpu", accelerator_type="TPU_V3", accelerator_count=8)


# labkit's torch image on the CUDA 12.6 wheels (`labkit image --torch-cuda cu126`): it has V100 kernels.
V100_IMAGE = vertex.labkit_image("torch", torch_cuda="cu126")


def all_specs():
    """A builder per kind of spec: built inside the test, since building one validates it with
    aiplatform_v1, which collection does not import."""
    yield lambda: vertex.notebook_job("notebooks/06_multi_node.ipynb", {"scale": "smoke"}, output_uri=OUT)
    yield lambda: vertex.notebook_job("gs://bkt/nb.ipynb", {}, output_uri=OUT, machine_type="n1-highmem-96",
                                      accelerator_type="NVIDIA_TESLA_V100", accelerator_count=8,
                                      replica_count=5, spot=True, reduction_server_count=16, timeout_s=7200,
                                      image_uri=V100_IMAGE)
    yield lambda: vertex.notebook_job("nb.ipynb", {"a": [1, 2]}, output_uri=OUT, image_uri="gcr.io/p/img:1",
                                      env={"X": "1"}, framework="tf")
    yield lambda: vertex.training_job({"steps": 10, "framework": "tf"}, output_uri=OUT, replica_count=2)
    yield lambda: vertex.training_job({"model": "gpt", "precision": "bf16"}, output_uri=OUT,
                                      machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                                      accelerator_count=1, spot=True)
    yield lambda: vertex.training_job({"model": "gpt"}, output_uri=OUT, machine_type="a3-ultragpu-8g",
                                      accelerator_type="NVIDIA_H200_141GB", accelerator_count=8)
    yield lambda: vertex.custom_job_spec(vertex.PoolConfig(machine_type="ct5lp-hightpu-4t", tpu_topology="2x2",
                                                           image_uri=TPU_IMAGE), output_uri=OUT)
    yield lambda: vertex.training_job({"model": "gpt"}, output_uri=OUT, machine_type="a3-highgpu-8g",
                                      accelerator_type="NVIDIA_H100_80GB", accelerator_count=8, flex_start=True,
                                      max_wait_s=3600, persistent_resource_id=None, labels={"team": "ml"},
                                      tensorboard="projects/p/locations/us-central1/tensorboards/1",
                                      service_account="trainer@p.iam.gserviceaccount.com")
    yield lambda: vertex.training_job({}, output_uri=OUT, machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                                      accelerator_count=1, reservation="projects/p/zones/us-central1-a/reservations/r",
                                      persistent_resource_id=None)
    yield lambda: vertex.training_job({}, output_uri=OUT, persistent_resource_id="my-cluster")
    yield lambda: vertex.custom_job_spec(vertex.PoolConfig(), None, None,
                                         vertex.PoolConfig(replica_count=2), output_uri=OUT)


@pytest.mark.parametrize("build", list(all_specs()))
def test_every_spec_is_accepted_and_round_trips(build):
    spec = build()
    d = roundtrip(spec)
    assert d["worker_pool_specs"][0]["replica_count"] == "1"
    assert d["base_output_directory"]["output_uri_prefix"] == OUT
    assert vertex.validate(spec) == types.CustomJobSpec(**spec)


def test_notebook_job_runs_papermill_entry_with_parameters():
    spec = vertex.notebook_job("notebooks/06_multi_node.ipynb", {"scale": "full", "steps": 3},
                               output_uri=OUT)
    pool = spec["worker_pool_specs"][0]
    assert len(spec["worker_pool_specs"]) == 1
    assert spec["scheduling"] == {"timeout": f"{vertex.DEFAULT_TIMEOUT_S}s"}  # a cost guard by default
    args = pool["container_spec"]["args"]
    assert args[:4] == ["python", "-m", "labkit.vertex.entry", "notebook"]
    assert args[4] == "/gcs/my-bucket/runs/r1/inputs/06_multi_node.ipynb"
    assert args[5] == "/gcs/my-bucket/runs/r1/notebooks"
    assert json.loads(args[7]) == {"scale": "full", "steps": 3}
    # The kernel log and the notebook's files go to the bucket beside the executed notebook.
    assert args[args.index("--artifacts") + 1] == "/gcs/my-bucket/runs/r1/notebooks/artifacts/06_multi_node"
    assert args[args.index("--cell-timeout") + 1] == "1800" and "--device" not in args
    # labkit's own image: it has labkit and papermill, so nothing is installed at start.
    assert pool["container_spec"]["image_uri"] == vertex.default_image("torch")
    assert "/labkit/labkit-torch:" in pool["container_spec"]["image_uri"]
    assert "command" not in pool["container_spec"]


def test_on_a_prebuilt_image_the_job_installs_labkit_first():
    image = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-9.py312:latest"  # not in the table
    own = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, image_uri=image)
    assert "command" not in own["worker_pool_specs"][0]["container_spec"]  # a custom image has labkit
    with_package = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, image_uri=image,
                                       package_uri="gs://bkt/labkit.tar.gz")
    command = with_package["worker_pool_specs"][0]["container_spec"]["command"]
    assert command[:2] == ["bash", "-c"] and "pip install --quiet /gcs/bkt/labkit.tar.gz papermill" in command[2]


@pytest.mark.parametrize("image,why", [
    ("us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest", "labkit needs torch>=2.6"),
    ("europe-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest", "end of availability in 2026-07"),
])
def test_outdated_prebuilt_images_are_refused(image, why):
    with pytest.raises(ParameterError, match=why) as err:
        vertex.training_job({"framework": "tf" if "tf-" in image else "torch"}, output_uri=OUT,
                            image_uri=image)
    assert err.value.name == "image_uri"


def test_spot_sets_spot_strategy():
    spec = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, spot=True)
    assert spec["scheduling"]["strategy"] == "SPOT"
    assert types.CustomJobSpec(**spec).scheduling.strategy == types.Scheduling.Strategy.SPOT
    assert "strategy" not in vertex.notebook_job("nb.ipynb", {}, output_uri=OUT).get("scheduling", {})


def test_multi_node_pools_reduction_server_and_restart():
    # Vertex's own example: 5 n1-highmem-96 nodes with 8 V100 (100 Gbps each) need 16
    # n1-highcpu-16 reducers (32 Gbps each). V100s run labkit's image built on the CUDA 12.6 wheels.
    spec = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, machine_type="n1-highmem-96",
                               accelerator_type="NVIDIA_TESLA_V100", accelerator_count=8,
                               replica_count=5, reduction_server_count=16, timeout_s=3600,
                               image_uri=V100_IMAGE)
    p0, p1, p2 = spec["worker_pool_specs"]
    assert p0["replica_count"] == 1 and p1["replica_count"] == 4
    assert p1["machine_spec"] == {"machine_type": "n1-highmem-96",
                                  "accelerator_type": "NVIDIA_TESLA_V100", "accelerator_count": 8}
    assert p2["container_spec"] == {"image_uri": vertex.REDUCTION_SERVER_IMAGE}
    assert p2["machine_spec"] == {"machine_type": "n1-highcpu-16"} and p2["replica_count"] == 16
    assert spec["scheduling"] == {"timeout": "3600s", "restart_job_on_worker_restart": True}
    assert roundtrip(spec)["scheduling"]["timeout"] == "3600s"


def test_skipped_pools_are_empty_dicts():
    spec = vertex.custom_job_spec(vertex.PoolConfig(), None, None, vertex.PoolConfig())
    assert spec["worker_pool_specs"][1:3] == [{}, {}]
    assert roundtrip(spec)["worker_pool_specs"][1]["replica_count"] == "0"


def test_training_job_passes_train_flags_and_gcs_paths():
    spec = vertex.training_job({"steps": 7, "channels_last": True, "progress": False},
                               output_uri=OUT, replica_count=2)
    args = spec["worker_pool_specs"][1]["container_spec"]["args"]
    assert args[:4] == ["python", "-m", "labkit", "train"]
    assert args[args.index("--steps") + 1] == "7" and "--channels-last" in args and "--no-progress" in args
    assert args[args.index("--checkpoint-dir") + 1] == "/gcs/my-bucket/runs/r1/checkpoints"
    # TensorBoard logs go where Vertex points AIP_TENSORBOARD_LOG_DIR (Vertex AI TensorBoard
    # uploads from there); the engines read it when the run starts.
    assert "--tensorboard-dir" not in args and "--device" not in args  # no GPUs asked for


# Pairings the service refuses; each error names the machine type and the accelerator.
@pytest.mark.parametrize("machine,accelerator,count,field,words", [
    ("n1-standard-8", "NVIDIA_L4", 1, "accelerator_type", ["n1-standard-8", "NVIDIA_L4", "g2-standard-8"]),
    ("a3-highgpu-8g", "NVIDIA_H100_80GB", 4, "accelerator_count", ["a3-highgpu-8g", "exactly 8"]),
    ("g2-standard-8", "NVIDIA_A100_80GB", 1, "accelerator_type", ["g2-standard-8", "NVIDIA_A100_80GB", "NVIDIA_L4"]),
    ("a2-highgpu-2g", "NVIDIA_TESLA_A100", 1, "accelerator_count", ["a2-highgpu-2g", "exactly 2"]),
    ("n1-standard-32", "NVIDIA_TESLA_V100", 1, "accelerator_count", ["[4, 8]", "n1-standard-32"]),
    ("n1-standard-32", "NVIDIA_TESLA_T4", 1, "accelerator_count", ["[2, 4]", "configure-compute"]),
    ("n1-standard-96", "NVIDIA_TESLA_P100", 4, "accelerator_type", ["n1-standard-96", "NVIDIA_TESLA_P100"]),
    ("n1-standard-2", None, 0, "machine_type", ["not a machine type Vertex AI offers for training"]),
    ("n1-highcpu-8", None, 0, "machine_type", ["n1-highcpu-16", "configure-compute"]),
    ("ct4p-hightpu-4t", "TPU_V4_POD", 4, "machine_type", ["not a machine type"]),
    ("n1-standard-8", "NVIDIA_TESLA_T4", 3, "accelerator_count", ["[1, 2, 4]", "NVIDIA_TESLA_T4"]),
    ("a2-ultragpu-1g", None, 0, "accelerator_type", ["NVIDIA_A100_80GB", "a2-ultragpu-1g"]),
    ("ct5lp-hightpu-4t", "TPU_V5_LITEPOD", 4, "accelerator_type", ["ct5lp-hightpu-4t", "tpu_topology"]),
    ("ct5lp-hightpu-4t", None, 0, "tpu_topology", ["2x2", "4x4"]),
    ("cloud-tpu", "TPU_V3", 16, "accelerator_count", ["multiple of 32"]),
])
def test_machine_and_accelerator_must_pair(machine, accelerator, count, field, words):
    with pytest.raises(ParameterError) as err:
        vertex.training_job({}, output_uri=OUT, machine_type=machine, accelerator_type=accelerator,
                            accelerator_count=count)
    assert err.value.name == field
    for word in words:
        assert word in str(err.value)


def test_hand_written_specs_are_checked_too():
    pool = {"machine_spec": {"machine_type": "n1-standard-8", "accelerator_type": "NVIDIA_L4",
                             "accelerator_count": 1}, "replica_count": 1,
            "container_spec": {"image_uri": "gcr.io/p/i"}}
    with pytest.raises(ParameterError, match="n1-standard-8") as err:
        vertex.validate({"worker_pool_specs": [pool]})
    assert err.value.name == "worker_pool_specs[0].machine_spec.accelerator_type"
    with pytest.raises(ParameterError) as err:  # the REST (camelCase) form is read as well
        vertex.check_spec({"workerPoolSpecs": [{"machineSpec": {"machineType": "a2-highgpu-2g",
                                                                "acceleratorType": "NVIDIA_TESLA_A100",
                                                                "acceleratorCount": 1}, "replicaCount": 1}]})
    assert err.value.name == "worker_pool_specs[0].machine_spec.accelerator_count"


def test_a_used_pool_with_no_replicas_is_refused_naming_the_field():
    ok = {"machine_spec": {"machine_type": "n1-standard-4"}, "replica_count": 1,
          "container_spec": {"image_uri": "gcr.io/p/i", "args": ["python", "-c", "0"]}}
    for bad in ({**ok, "replica_count": 0}, {k: v for k, v in ok.items() if k != "replica_count"}):
        with pytest.raises(ParameterError) as err:
            vertex.validate({"worker_pool_specs": [ok, bad]})
        assert err.value.name == "worker_pool_specs[1].replica_count" and ">= 1" in str(err.value)
    vertex.validate({"worker_pool_specs": [ok, {}, ok]})  # a skipped pool is {}


def test_boot_disk_follows_the_machine_family():
    def disk(**kw):
        spec = vertex.training_job({}, output_uri=OUT, **kw)
        return spec["worker_pool_specs"][0]["disk_spec"]["boot_disk_type"]

    assert disk() == "pd-ssd"
    assert disk(machine_type="a3-ultragpu-8g", accelerator_type="NVIDIA_H200_141GB",
                accelerator_count=8) == "hyperdisk-balanced"
    assert vertex.PoolConfig(boot_disk_type="pd-standard").boot_disk_type == "pd-standard"
    with pytest.raises(ParameterError, match="a3-ultragpu-8g") as err:
        vertex.PoolConfig(machine_type="a3-ultragpu-8g", accelerator_type="NVIDIA_H200_141GB",
                          accelerator_count=8, boot_disk_type="pd-ssd")
    assert err.value.name == "boot_disk_type"
    with pytest.raises(ParameterError, match="pd-ssd, pd-standard, hyperdisk-balanced"):
        vertex.PoolConfig(boot_disk_type="local-ssd")


def test_a_tpu_job_is_priced_per_chip_and_an_unpriced_one_says_so():
    tpu = vertex.custom_job_spec(vertex.PoolConfig(machine_type="ct5lp-hightpu-4t", tpu_topology="2x2",
                                                   image_uri=TPU_IMAGE), output_uri=OUT, spot=True)
    cost = vertex.estimate_cost(tpu)
    chip = vertex.pricing.accelerator_prices()["TPU_V5_LITEPOD"]
    assert cost.priced and cost.usd_per_hour == pytest.approx(4 * chip.spot) and cost.usd_per_hour > 0
    v3 = vertex.custom_job_spec(vertex.PoolConfig(machine_type="cloud-tpu", accelerator_type="TPU_V3",  # a v3-32:
                                                  accelerator_count=32, image_uri=TPU_IMAGE), output_uri=OUT)  # no row
    cost = vertex.estimate_cost(v3)
    assert not cost.priced and "$0.00" not in cost.text() and "no price for TPU_V3" in cost.text()


def test_an_a3_ultra_job_is_priced_as_the_catalogs_whole_8_gpu_machine():
    from labkit.hardware.catalog import find, load_catalog

    row = find(load_catalog(), "H200")
    spec = vertex.training_job({}, output_uri=OUT, machine_type="a3-ultragpu-8g",
                               accelerator_type="NVIDIA_H200_141GB", accelerator_count=8, replica_count=2)
    cost = vertex.estimate_cost(spec)
    assert cost.priced and cost.on_demand_usd_hr == pytest.approx(2 * row.hourly())
    assert cost.spot_usd_hr == pytest.approx(2 * row.hourly(spot=True))


@pytest.mark.parametrize("kwargs,name", [
    ({"accelerator_type": "H100", "accelerator_count": 1}, "accelerator_type"),
    ({"accelerator_count": 2}, "accelerator_type"),
    ({"accelerator_type": "NVIDIA_L4"}, "accelerator_count"),
    ({"replica_count": 0}, "replica_count"),
    ({"machine_type": "n1-standard-8", "accelerator_type": "NVIDIA_L4", "accelerator_count": 1},
     "accelerator_type"),
    ({"reduction_server_count": 2}, "reduction_server_count"),
    ({"spot": "yes"}, "spot"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"framework": "jax"}, "framework"),
])
def test_bad_arguments_name_the_parameter(kwargs, name):
    with pytest.raises(ParameterError) as err:
        vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, **kwargs)
    assert err.value.name == name


def test_validate_names_bad_fields():
    with pytest.raises(ValueError, match="worker_pool_spec"):
        vertex.validate({"worker_pool_spec": []})
    with pytest.raises(ValueError, match="SPOTTY"):
        vertex.validate({"worker_pool_specs": [{"replica_count": 1}], "scheduling": {"strategy": "SPOTTY"}})
    with pytest.raises(ValueError, match=r"worker_pool_specs\[0\].replica_count"):
        vertex.validate({"worker_pool_specs": [{"replica_count": 2}]})


def test_dry_run_prints_rest_json_cost_and_what_is_missing(tmp_path):
    spec = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, machine_type="a3-highgpu-8g",
                               accelerator_type="NVIDIA_H100_80GB", accelerator_count=8,
                               replica_count=2, spot=True)
    dr = vertex.dry_run(spec, env={"HOME": str(tmp_path)})
    assert json.loads(dr.rest_json)["scheduling"]["strategy"] == "SPOT"
    assert "workerPoolSpecs" in dr.rest_json
    from labkit.hardware.catalog import load_machine_prices, machine_price

    price = machine_price(load_machine_prices(), "a3-highgpu-8g", "NVIDIA_H100_80GB", 8)  # 2 replicas
    assert dr.cost.spot and dr.cost.usd_per_hour == pytest.approx(2 * price.hourly(spot=True))
    assert dr.cost.on_demand_usd_hr == pytest.approx(2 * price.hourly())
    assert not dr.preflight.ready
    text = dr.text()
    for what in ("credentials", "project", "region", "bucket", "$"):
        assert what in text


def test_preflight_ready_with_everything(tmp_path):
    key = tmp_path / "key.json"
    key.write_text('{"type": "service_account", "client_email": "a@p.iam.gserviceaccount.com"}')
    env = {"HOME": str(tmp_path), "GOOGLE_APPLICATION_CREDENTIALS": str(key),
           "GOOGLE_CLOUD_PROJECT": "p", "GOOGLE_CLOUD_REGION": "us-central1", "LABKIT_BUCKET": "b"}
    assert vertex.preflight(env).ready
    partial = vertex.preflight({"HOME": str(tmp_path), "GOOGLE_CLOUD_PROJECT": "p"})
    assert [m.split(":")[0] for m in partial.missing] == ["credentials", "region", "bucket"]


def test_submit_without_cloud_explains(tmp_path):
    spec = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT)
    with pytest.raises(vertex.VertexNotConfigured) as err:
        vertex.submit(spec, display_name="x", env={"HOME": str(tmp_path)})
    assert "project" in str(err.value) and err.value.missing


def test_source_archive_is_pip_installable_layout():
    import io
    import tarfile

    from labkit.vertex.submit import source_archive

    names = tarfile.open(fileobj=io.BytesIO(source_archive())).getnames()
    assert "labkit/pyproject.toml" in names and "labkit/labkit/cluster.py" in names
    assert not any("__pycache__" in n for n in names)


def test_several_gpus_per_node_run_torchrun():
    spec = vertex.training_job({"model": "gpt"}, output_uri=OUT, machine_type="a3-highgpu-8g",
                               accelerator_type="NVIDIA_H100_80GB", accelerator_count=8, replica_count=4)
    args = spec["worker_pool_specs"][1]["container_spec"]["args"]
    assert args[:7] == ["python", "-m", "labkit.vertex.entry", "torchrun", "--nproc-per-node", "8", "--"]
    assert args[7] == "train"
    roundtrip(spec)


def test_torchrun_argv_uses_node_rank_and_count():
    from labkit.vertex.entry import torchrun_argv

    env = {"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["h:1"], "workerpool1": ["a:1", "b:1"]},
                                       "task": {"type": "workerpool1", "index": 1}}),
           "MASTER_PORT": "3333"}
    argv = torchrun_argv(8, ["--", "train", "--steps", "3"], env=env)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    assert {"--nnodes=3", "--node_rank=2", "--nproc_per_node=8", "--master_addr=h",
            "--master_port=3333"} <= set(argv)
    assert argv[-4:] == ["labkit", "train", "--steps", "3"]
