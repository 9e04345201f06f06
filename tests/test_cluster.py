"""Contract 1: `labkit.core.cluster.from_env` on Vertex's documented variables and on bad ones."""

from __future__ import annotations

import json

import pytest

from labkit.core import cluster

JOB = {"worker_pool_specs": [{"machine_spec": {"machine_type": "n1-standard-4"}}]}
# Vertex's documented CLUSTER_SPEC example (all four pools).
POOLS = {
    "workerpool0": ["cmle-training-workerpool0-ab123cd4e5-0:2222"],
    "workerpool1": ["cmle-training-workerpool1-ab123cd4e5-0:2222",
                    "cmle-training-workerpool1-ab123cd4e5-1:2222"],
    "workerpool2": ["cmle-training-workerpool2-ab123cd4e5-0:2222"],
    "workerpool3": ["cmle-training-workerpool3-ab123cd4e5-0:2222"],
}


def cluster_spec(task_type: str, index: int, pools=None) -> dict[str, str]:
    spec = {"cluster": pools or POOLS, "environment": "cloud",
            "task": {"type": task_type, "index": index, "trial": "TRIAL_ID"}, "job": JOB}
    return {"CLUSTER_SPEC": json.dumps(spec)}


def tf_config(task_type: str, index: int, chief_key: str = "chief") -> dict[str, str]:
    spec = {"cluster": {chief_key: POOLS["workerpool0"], "worker": POOLS["workerpool1"],
                        "ps": POOLS["workerpool2"]},
            "environment": "cloud", "task": {"type": task_type, "index": index, "trial": "TRIAL_ID"},
            "job": JOB}
    return {"TF_CONFIG": json.dumps(spec)}


@pytest.mark.parametrize("pool,index,role,rank", [
    ("workerpool0", 0, "chief", 0),
    ("workerpool1", 0, "worker", 1),
    ("workerpool1", 1, "worker", 2),
    ("workerpool2", 0, "ps", None),
    ("workerpool3", 0, "evaluator", None),
])
def test_cluster_spec_roles_and_ranks(pool, index, role, rank):
    info = cluster.from_env(cluster_spec(pool, index))
    assert (info.role, info.index, info.rank) == (role, index, rank)
    assert info.world_size == 3  # chief + 2 workers; ps and evaluator are not training nodes
    assert info.master_addr == "cmle-training-workerpool0-ab123cd4e5-0"
    assert info.master_port == 2222
    assert info.is_chief == (role == "chief")
    assert info.trial == "TRIAL_ID"
    assert info.source == "CLUSTER_SPEC"


def test_cluster_spec_tf_config_uses_chief_and_excludes_evaluator():
    tfc = cluster.from_env(cluster_spec("workerpool1", 1)).tf_config()
    assert tfc == {"cluster": {"chief": POOLS["workerpool0"], "worker": POOLS["workerpool1"],
                               "ps": POOLS["workerpool2"]},
                   "task": {"type": "worker", "index": 1}}
    ev = cluster.from_env(cluster_spec("workerpool3", 0)).tf_config()
    assert "evaluator" not in ev["cluster"] and ev["task"] == {"type": "evaluator", "index": 0}


def test_pool2_as_reduction_server():
    env = cluster_spec("workerpool2", 0) | {cluster.POOL2_ROLE_ENV: "reduction_server"}
    info = cluster.from_env(env)
    assert info.role == "reduction_server" and info.rank is None and not info.is_training
    chief = cluster.from_env(cluster_spec("workerpool0", 0) | {cluster.POOL2_ROLE_ENV: "reduction_server"})
    assert "ps" not in chief.tf_config()["cluster"]
    with pytest.raises(ValueError, match="role"):
        info.tf_config()


def test_torch_variables_override_master_of_cluster_spec():
    env = cluster_spec("workerpool1", 0) | {"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "3333"}
    info = cluster.from_env(env)
    assert (info.master_addr, info.master_port) == ("10.0.0.2", 3333)
    assert info.torch_env() == {"MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "3333",
                                "WORLD_SIZE": "3", "RANK": "1"}


def test_several_gpus_per_node_global_rank():
    env = cluster_spec("workerpool1", 1) | {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    info = cluster.from_env(env)
    assert info.rank == 2 and info.global_rank == 2 * 8 + 3 and info.global_world_size == 24


@pytest.mark.parametrize("chief_key", ["chief", "master"])
@pytest.mark.parametrize("task_type,index,role,rank", [
    ("CHIEF", 0, "chief", 0), ("worker", 0, "worker", 1), ("worker", 1, "worker", 2),
    ("ps", 0, "ps", None),
])
def test_tf_config_roles_and_ranks(chief_key, task_type, index, role, rank):
    task_type = chief_key if task_type == "CHIEF" else task_type
    info = cluster.from_env(tf_config(task_type, index, chief_key))
    assert (info.role, info.index, info.rank, info.world_size) == (role, index, rank, 3)
    tfc = info.tf_config()
    assert "master" not in tfc["cluster"] and tfc["cluster"]["chief"] == POOLS["workerpool0"]
    assert tfc["task"] == {"type": role, "index": index}


def test_tf_config_without_chief_makes_worker0_chief():
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                    "task": {"type": "worker", "index": 0}})}
    info = cluster.from_env(env)
    assert info.rank == 0 and info.is_chief and info.world_size == 2 and info.master_addr == "a"


def test_torch_variables_only():
    info = cluster.from_env({"MASTER_ADDR": "h", "MASTER_PORT": "1234", "WORLD_SIZE": "4", "RANK": "3"})
    assert (info.role, info.rank, info.world_size, info.master_port) == ("worker", 3, 4, 1234)
    assert not info.is_chief and info.source == "torch"
    assert cluster.from_env({"WORLD_SIZE": "2", "RANK": "0"}).is_chief


def test_single_node_default():
    info = cluster.from_env({})
    assert (info.role, info.index, info.rank, info.world_size, info.is_chief) == ("single", 0, 0, 1, True)
    assert info.tf_config() == {} and not info.is_distributed


def test_from_env_defaults_to_os_environ(monkeypatch):
    for name in ("CLUSTER_SPEC", "TF_CONFIG", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLUSTER_SPEC", cluster_spec("workerpool1", 0)["CLUSTER_SPEC"])
    assert cluster.from_env().rank == 1


@pytest.mark.parametrize("env,field", [
    ({"CLUSTER_SPEC": "{not json"}, "CLUSTER_SPEC"),
    ({"CLUSTER_SPEC": "[1, 2]"}, "CLUSTER_SPEC"),
    ({"TF_CONFIG": "{not json"}, "TF_CONFIG"),
    (cluster_spec("workerpool1", 0, {"workerpool1": ["a:1"]}), "CLUSTER_SPEC.cluster.workerpool0"),
    (cluster_spec("workerpool0", 0, {"workerpool0": ["a:1", "b:1"]}), "CLUSTER_SPEC.cluster.workerpool0"),
    (cluster_spec("workerpool3", 0, {"workerpool0": ["a:1"]}), "CLUSTER_SPEC.task.type"),
    (cluster_spec("workerpool1", 2), "CLUSTER_SPEC.task.index"),
    (cluster_spec("workerpool1", -1), "CLUSTER_SPEC.task.index"),
    (cluster_spec("workerpool1", "x"), "CLUSTER_SPEC.task.index"),
    ({"CLUSTER_SPEC": json.dumps({"task": {"type": "workerpool0"}})}, "CLUSTER_SPEC.cluster"),
    ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["a:1"]}})}, "CLUSTER_SPEC.task"),
    (cluster_spec("workerpool0", 0, {"workerpool0": ["nohostport"]}), "CLUSTER_SPEC.cluster.workerpool0"),
    (tf_config("evaluator", 0), "TF_CONFIG.task.type"),
    (tf_config("worker", 5), "TF_CONFIG.task.index"),
    ({"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief"}})},
     "TF_CONFIG.cluster.chief"),
    ({"TF_CONFIG": json.dumps({"cluster": {"boss": ["a:1"]}, "task": {"type": "boss"}})}, "TF_CONFIG.cluster"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE"),
])
def test_bad_environments_raise_naming_the_field(env, field):
    with pytest.raises(ValueError) as err:
        cluster.from_env(env)
    assert field in str(err.value)


@pytest.mark.slow
def test_tensorflow_accepts_the_tf_config():
    tf = pytest.importorskip("tensorflow")
    for source in (cluster_spec("workerpool1", 1), tf_config("worker", 1, "master")):
        tfc = cluster.from_env(source).tf_config()
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        import os
        old = os.environ.get("TF_CONFIG")
        os.environ["TF_CONFIG"] = json.dumps(tfc)
        try:
            spec = resolver.cluster_spec().as_dict()
            assert resolver.task_type == "worker" and resolver.task_id == 1
        finally:
            if old is None:
                os.environ.pop("TF_CONFIG")
            else:
                os.environ["TF_CONFIG"] = old
        assert spec["chief"] == POOLS["workerpool0"] and spec["worker"] == POOLS["workerpool1"]
