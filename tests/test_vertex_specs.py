"""Contract 2: every spec labkit builds is accepted by aiplatform_v1 and round-trips."""

from __future__ import annotations

import json

import pytest

from labkit import vertex
from labkit.core.config import ParameterError

types = pytest.importorskip("google.cloud.aiplatform_v1.types")

OUT = "gs://my-bucket/runs/r1"


def roundtrip(spec):
    message = types.CustomJobSpec(**spec)
    again = types.CustomJobSpec(**types.CustomJobSpec.to_dict(message))
    assert again == message
    return types.CustomJobSpec.to_dict(message, use_integers_for_enums=False)


def all_specs():
    yield vertex.notebook_job("notebooks/06_multi_node.ipynb", {"scale": "smoke"}, output_uri=OUT)
    yield vertex.notebook_job("gs://b/nb.ipynb", {}, output_uri=OUT, machine_type="a3-highgpu-8g",
                              accelerator_type="NVIDIA_H100_80GB", accelerator_count=8,
                              replica_count=4, spot=True, reduction_server_count=4, timeout_s=7200)
    yield vertex.notebook_job("nb.ipynb", {"a": [1, 2]}, output_uri=OUT, image_uri="gcr.io/p/img:1",
                              env={"X": "1"}, framework="tf")
    yield vertex.training_job({"steps": 10, "framework": "tf"}, output_uri=OUT, replica_count=2)
    yield vertex.training_job({"model": "gpt", "precision": "bf16"}, output_uri=OUT,
                              machine_type="g2-standard-8", accelerator_type="NVIDIA_L4",
                              accelerator_count=1, spot=True)
    yield vertex.custom_job_spec(vertex.PoolConfig(), None, None,
                                 vertex.PoolConfig(replica_count=2), output_uri=OUT)


@pytest.mark.parametrize("spec", list(all_specs()))
def test_every_spec_is_accepted_and_round_trips(spec):
    d = roundtrip(spec)
    assert d["worker_pool_specs"][0]["replica_count"] == "1"
    assert d["base_output_directory"]["output_uri_prefix"] == OUT
    assert vertex.validate(spec) == types.CustomJobSpec(**spec)


def test_notebook_job_runs_papermill_entry_with_parameters():
    spec = vertex.notebook_job("notebooks/06_multi_node.ipynb", {"scale": "full", "steps": 3},
                               output_uri=OUT)
    pool = spec["worker_pool_specs"][0]
    assert len(spec["worker_pool_specs"]) == 1 and "scheduling" not in spec
    args = pool["container_spec"]["args"]
    assert args[:4] == ["python", "-m", "labkit.vertex.entry", "notebook"]
    assert args[4] == "/gcs/my-bucket/runs/r1/inputs/06_multi_node.ipynb"
    assert args[5] == "/gcs/my-bucket/runs/r1/notebooks"
    assert json.loads(args[7]) == {"scale": "full", "steps": 3}
    assert pool["container_spec"]["image_uri"] == vertex.PREBUILT_IMAGES["torch"]
    assert "/gcs/my-bucket/runs/r1/inputs/labkit.tar.gz" in pool["container_spec"]["command"][2]


def test_spot_sets_spot_strategy():
    spec = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, spot=True)
    assert spec["scheduling"]["strategy"] == "SPOT"
    assert types.CustomJobSpec(**spec).scheduling.strategy == types.Scheduling.Strategy.SPOT
    assert "strategy" not in vertex.notebook_job("nb.ipynb", {}, output_uri=OUT).get("scheduling", {})


def test_multi_node_pools_reduction_server_and_restart():
    spec = vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, machine_type="a3-highgpu-8g",
                               accelerator_type="NVIDIA_H100_80GB", accelerator_count=8,
                               replica_count=4, reduction_server_count=2, timeout_s=3600)
    p0, p1, p2 = spec["worker_pool_specs"]
    assert p0["replica_count"] == 1 and p1["replica_count"] == 3
    assert p1["machine_spec"] == {"machine_type": "a3-highgpu-8g",
                                  "accelerator_type": "NVIDIA_H100_80GB", "accelerator_count": 8}
    assert p2["container_spec"] == {"image_uri": vertex.REDUCTION_SERVER_IMAGE}
    assert p2["machine_spec"] == {"machine_type": "n1-highcpu-16"} and p2["replica_count"] == 2
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


@pytest.mark.parametrize("kwargs,name", [
    ({"accelerator_type": "H100", "accelerator_count": 1}, "accelerator_type"),
    ({"accelerator_count": 2}, "accelerator_type"),
    ({"accelerator_type": "NVIDIA_L4"}, "accelerator_count"),
    ({"replica_count": 0}, "replica_count"),
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
    price = vertex.pricing.accelerator_prices()["NVIDIA_H100_80GB"]
    assert dr.cost.spot and dr.cost.usd_per_hour == pytest.approx(16 * price.spot)
    assert dr.cost.on_demand_usd_hr == pytest.approx(16 * price.on_demand)
    assert not dr.preflight.ready
    text = dr.text()
    for what in ("credentials", "project", "region", "bucket", "$"):
        assert what in text


def test_preflight_ready_with_everything(tmp_path):
    key = tmp_path / "key.json"
    key.write_text("{}")
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
