"""Strategy choice from the cluster environment, TF_CONFIG normalisation, batch layout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from labkit.core.cluster import from_env
from labkit.core.config import ParameterError
from labkit.tf.data import BatchLayout, replica_indices
from labkit.tf.launch import tf_configs
from labkit.tf.strategy import plan_strategy

VERTEX_TF_CONFIG = {
    "cluster": {"master": ["cmle-training-workerpool0-ab-0:2222"],
                "worker": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"]},
    "environment": "cloud",
    "task": {"type": "master", "index": 0, "trial": "", "cloud": "x"},
    "job": {"python_module": "", "package_uris": []},
}


def _env(spec) -> dict[str, str]:
    return {"TF_CONFIG": json.dumps(spec)}


def test_vertex_master_becomes_chief():
    cfg = from_env(_env(VERTEX_TF_CONFIG)).tf_config()
    assert "master" not in cfg["cluster"]
    assert cfg["cluster"]["chief"] == VERTEX_TF_CONFIG["cluster"]["master"]
    assert cfg["task"] == {"type": "chief", "index": 0}


def test_plans():
    assert plan_strategy({}).kind == "default"
    assert plan_strategy({}, local_gpus=1).kind == "default"
    assert plan_strategy({}, local_gpus=4).kind == "mirrored"
    plan = plan_strategy(_env(VERTEX_TF_CONFIG))
    assert (plan.kind, plan.num_workers, plan.task_type, plan.is_chief) == \
        ("multi_worker_mirrored", 3, "chief", True)
    worker = dict(VERTEX_TF_CONFIG, task={"type": "worker", "index": 1})
    assert not plan_strategy(_env(worker)).is_chief
    with_ps = {"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]},
               "task": {"type": "ps", "index": 0}}
    assert plan_strategy(_env(with_ps)).kind == "parameter_server"


@pytest.mark.parametrize("raw, field", [
    ("{not json", "TF_CONFIG"),
    (json.dumps({"task": {"type": "chief", "index": 0}}), "cluster"),
    (json.dumps({"cluster": {"chief": ["a:1"]}, "task": {"type": "worker", "index": 0}}), "task"),
])
def test_malformed_tf_config_names_the_field(raw, field):
    with pytest.raises(ValueError, match=field):
        from_env({"TF_CONFIG": raw})


def test_launcher_tf_configs_are_a_valid_cluster():
    configs = tf_configs(3, vertex_names=True, ports=[1001, 1002, 1003])
    assert [c["task"]["type"] for c in configs] == ["master", "worker", "worker"]
    for c in configs:
        cfg = from_env(_env(c)).tf_config()
        assert cfg["cluster"] == {"chief": ["127.0.0.1:1001"],
                                  "worker": ["127.0.0.1:1002", "127.0.0.1:1003"]}


def test_batch_layout_global_semantics():
    layout = BatchLayout(global_batch=32, num_replicas=2, grad_accum=2)
    assert layout.micro_batch == 8
    with pytest.raises(ParameterError, match="batch_size"):
        BatchLayout(global_batch=30, num_replicas=4, grad_accum=1)
    # Two replicas together see exactly one replica's global batch, with no overlap.
    one = replica_indices(3, 0, BatchLayout(32, 1, 1), 256, seed=0).ravel()
    two = np.concatenate([replica_indices(3, r, layout, 256, seed=0).ravel() for r in range(2)])
    assert len(set(two)) == 32
    assert sorted(one) == sorted(two)


def _cluster_spec(task_type: str, index: int, pool2_image: str | None = None) -> dict[str, str]:
    pools = {"workerpool0": ["c:1"], "workerpool1": ["w:1", "w:2"]}
    job = {"workerPoolSpecs": [{}, {}]}
    if pool2_image:
        pools["workerpool2"] = ["r:1"]
        job["workerPoolSpecs"].append({"containerSpec": {"imageUri": pool2_image}})
    spec = {"cluster": pools, "task": {"type": task_type, "index": index}, "job": job}
    return {"CLUSTER_SPEC": json.dumps(spec)}


def test_plan_is_a_view_of_the_cluster_info():
    from labkit.core.cluster import REDUCTION_SERVER_IMAGE
    from labkit.tf.strategy import plan_for

    env = _cluster_spec("workerpool1", 1)
    plan = plan_strategy(env)
    info = from_env(env)
    assert plan == plan_for(info)
    assert (plan.kind, plan.num_workers, plan.task_type, plan.task_index, plan.is_chief) == \
        ("multi_worker_mirrored", 3, "worker", 1, False)
    assert plan.tf_config == info.tf_config()
    # A Reduction Server in pool 2 is not a parameter server: the job stays synchronous.
    rs = plan_strategy(_cluster_spec("workerpool0", 0, REDUCTION_SERVER_IMAGE))
    assert rs.kind == "multi_worker_mirrored" and "ps" not in rs.tf_config["cluster"]
    ps = plan_strategy(_cluster_spec("workerpool0", 0, "gcr.io/p/trainer"))
    assert ps.kind == "parameter_server" and ps.tf_config["cluster"]["ps"] == ["r:1"]


def test_plan_refuses_nodes_described_only_by_torch_variables():
    with pytest.raises(ValueError, match="TF_CONFIG"):
        plan_strategy({"MASTER_ADDR": "h", "WORLD_SIZE": "2", "RANK": "1"})
    # One node with two local processes is a single TensorFlow worker.
    assert plan_strategy({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1",
                          "LOCAL_WORLD_SIZE": "2"}).kind == "default"
