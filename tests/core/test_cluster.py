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
                                "WORLD_SIZE": "3", "RANK": "1"}  # one process per node: Vertex's


def test_several_gpus_per_node_global_rank():
    env = cluster_spec("workerpool1", 1) | {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    info = cluster.from_env(env)
    assert info.rank == 2 and info.global_rank == 2 * 8 + 3 and info.global_world_size == 24
    assert info.torch_env() | {"MASTER_ADDR": "-"} == {
        "MASTER_ADDR": "-", "MASTER_PORT": "2222", "WORLD_SIZE": "24", "RANK": "19",
        "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    assert not info.is_chief and not cluster.from_env(cluster_spec("workerpool0", 0) | {
        "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8"}).is_chief  # only local process 0 of node 0


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
    (tf_config("evaluator", -1), "TF_CONFIG.task.index"),
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


# ---------------------------------------------------------------- the torch variables

TWO_NODES = {"workerpool0": ["n0:2222"], "workerpool1": ["n1:2222"]}


@pytest.mark.parametrize("env,expected", [
    # Vertex (no LOCAL_WORLD_SIZE): one process per node, the variables count nodes.
    ({"MASTER_ADDR": "h", "WORLD_SIZE": "4", "RANK": "3"}, ("worker", 2, 3, 4, 3, 4)),
    # labkit's local launcher / torchrun --standalone: 2 processes on one node.
    ({"MASTER_ADDR": "h", "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
     ("single", 0, 0, 1, 1, 2)),
    # torchrun on 2 nodes x 4 GPUs: process-level; node = RANK // LOCAL_WORLD_SIZE (= GROUP_RANK).
    ({"MASTER_ADDR": "h", "WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
      "GROUP_RANK": "1"}, ("worker", 0, 1, 2, 5, 8)),
    ({"MASTER_ADDR": "h", "WORLD_SIZE": "8", "RANK": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"},
     ("chief", 0, 0, 2, 2, 8)),
])
def test_torch_variables_count_nodes_or_processes(env, expected):
    info = cluster.from_env(env)
    assert (info.role, info.index, info.rank, info.world_size, info.global_rank,
            info.global_world_size) == expected
    assert cluster.from_env(info.torch_env()) == info  # torch_env() reads back as the same place


def test_a_local_two_process_launch_counts_two_processes():
    infos = cluster.local_processes(2, 1234)
    envs = [i.torch_env() for i in infos]
    assert envs[1] == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234", "WORLD_SIZE": "2",
                       "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    back = [cluster.from_env(e) for e in envs]
    assert [(b.global_rank, b.global_world_size, b.world_size) for b in back] == [(0, 2, 1), (1, 2, 1)]
    assert [b.is_chief for b in back] == [True, False]


@pytest.mark.parametrize("extra", [
    {"WORLD_SIZE": "2", "RANK": "1"},  # Vertex's own, per node
    {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"},  # torchrun
])
def test_torch_variables_that_agree_with_cluster_spec(extra):
    info = cluster.from_env(cluster_spec("workerpool1", 0, TWO_NODES) | extra)
    assert info.source == "CLUSTER_SPEC" and info.rank == 1 and info.world_size == 2


@pytest.mark.parametrize("source,extra", [
    (cluster_spec("workerpool1", 0, TWO_NODES), {"WORLD_SIZE": "8", "RANK": "5"}),
    (cluster_spec("workerpool1", 0, TWO_NODES), {"WORLD_SIZE": "2", "RANK": "0"}),
    (cluster_spec("workerpool1", 0, TWO_NODES), {"RANK": "0"}),
    (cluster_spec("workerpool1", 0, TWO_NODES),
     {"WORLD_SIZE": "8", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}),  # node 0's
    (cluster_spec("workerpool1", 0, TWO_NODES),
     {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0"}),
    (tf_config("worker", 1), {"WORLD_SIZE": "3", "RANK": "1"}),
])
def test_torch_variables_that_contradict_the_cluster_raise_naming_both(source, extra):
    with pytest.raises(ValueError) as err:
        cluster.from_env(source | extra)
    message = str(err.value)
    assert next(iter(source)) in message and any(name in message for name in extra)


@pytest.mark.parametrize("env,field", [
    ({"WORLD_SIZE": "6", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE"),
    ({"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_RANK"),
    ({"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0"},
     "GROUP_RANK"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK"),
    ({"WORLD_SIZE": "2", "RANK": "1.0"}, "RANK"),
])
def test_inconsistent_torch_variables_raise_naming_the_variable(env, field):
    with pytest.raises(ValueError, match=field):
        cluster.from_env(env)


# ---------------------------------------------------------------- TF_CONFIG round trip

@pytest.mark.parametrize("source", [
    cluster_spec("workerpool0", 0), cluster_spec("workerpool1", 1), cluster_spec("workerpool2", 0),
    cluster_spec("workerpool3", 0), tf_config("master", 0, "master"), tf_config("worker", 0, "master"),
    tf_config("ps", 0), {},
], ids=["chief", "worker", "ps", "evaluator", "master", "worker-of-master", "tf-ps", "single"])
def test_every_role_reads_back_the_tf_config_it_writes(source):
    info = cluster.from_env(source)
    written = info.tf_config()
    back = cluster.from_env({"TF_CONFIG": json.dumps(written)})
    assert (back.role, back.index, back.rank, back.world_size, back.is_chief) == \
        (info.role, info.index, info.rank, info.world_size, info.is_chief)
    assert back.tf_config() == written
    if info.role != "single":
        assert (back.master_addr, back.master_port) == (info.master_addr, info.master_port)


def test_evaluator_is_named_only_as_the_task():
    ev = cluster.from_env(cluster_spec("workerpool3", 0))
    tfc = ev.tf_config()
    assert "evaluator" not in tfc["cluster"] and tfc["task"] == {"type": "evaluator", "index": 0}
    assert cluster.from_env({"TF_CONFIG": json.dumps(tfc)}).role == "evaluator"
    # TF_CONFIG that does list the evaluator is read too.
    listed = {"cluster": {"chief": ["a:1"], "evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}}
    assert cluster.from_env({"TF_CONFIG": json.dumps(listed)}).role == "evaluator"


def test_vertex_names_for_the_primary():
    info = cluster.from_env(cluster_spec("workerpool0", 0))
    tfc = info.tf_config(primary_name="master")
    assert "chief" not in tfc["cluster"] and tfc["task"]["type"] == "master"
    assert cluster.from_env({"TF_CONFIG": json.dumps(tfc)}).role == "chief"


def test_local_tf_cluster():
    infos = cluster.local_tf_cluster(3, 1, ports=[1, 2, 3, 4])
    assert [(i.role, i.index, i.rank) for i in infos] == [
        ("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2), ("ps", 0, None)]
    assert infos[1].tf_config() == {"cluster": {"chief": ["127.0.0.1:1"],
                                                "worker": ["127.0.0.1:2", "127.0.0.1:3"],
                                                "ps": ["127.0.0.1:4"]},
                                    "task": {"type": "worker", "index": 0}}


# ---------------------------------------------------------------- Reduction Server

RS = cluster.REDUCTION_SERVER_IMAGE
TRAINER = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"


def job_with_pool2(image: str, camel: bool = True) -> dict:
    if camel:
        pool = lambda img: {"machineSpec": {"machineType": "n1-highcpu-16"}, "replicaCount": 1,  # noqa: E731
                            "containerSpec": {"imageUri": img}}
        return {"workerPoolSpecs": [pool(TRAINER), pool(TRAINER), pool(image)]}
    pool = lambda img: {"replica_count": 1, "container_spec": {"image_uri": img}}  # noqa: E731
    return {"worker_pool_specs": [pool(TRAINER), pool(TRAINER), pool(image)]}


def spec_with_job(task_type: str, job) -> dict[str, str]:
    spec = {"cluster": POOLS, "environment": "cloud", "task": {"type": task_type, "index": 0}, "job": job}
    return {"CLUSTER_SPEC": json.dumps(spec)}


@pytest.mark.parametrize("job", [
    job_with_pool2(RS), job_with_pool2(RS, camel=False), json.dumps(job_with_pool2(RS)),
    job_with_pool2(RS.replace(":latest", ":20240101")),
    job_with_pool2(RS.replace(":latest", "@sha256:" + "0" * 64)),
], ids=["camelCase", "snake_case", "json-string", "tagged", "digest"])
def test_reduction_server_is_read_from_the_job_in_cluster_spec(job):
    reducer = cluster.from_env(spec_with_job("workerpool2", job))
    assert reducer.role == "reduction_server" and reducer.rank is None
    chief = cluster.from_env(spec_with_job("workerpool0", job))
    assert "ps" not in chief.tf_config()["cluster"] and chief.world_size == 3


def test_pool2_with_another_image_is_parameter_servers():
    chief = cluster.from_env(spec_with_job("workerpool0", job_with_pool2(TRAINER)))
    assert chief.tf_config()["cluster"]["ps"] == POOLS["workerpool2"]
    assert cluster.from_env(spec_with_job("workerpool2", job_with_pool2(TRAINER))).role == "ps"


def test_pool2_role_variable_contradicting_the_job_raises():
    env = spec_with_job("workerpool0", job_with_pool2(TRAINER)) | {cluster.POOL2_ROLE_ENV: "reduction_server"}
    with pytest.raises(ValueError, match=f"{cluster.POOL2_ROLE_ENV}.*CLUSTER_SPEC.job"):
        cluster.from_env(env)


def test_job_specs_tell_training_pools_that_pool2_reduces():
    from labkit import vertex

    spec = vertex.training_job({"framework": "torch"}, output_uri="gs://bkt/j", replica_count=3,
                               reduction_server_count=2, machine_type="g2-standard-8",
                               accelerator_type="NVIDIA_L4", accelerator_count=1)
    pools = spec["worker_pool_specs"]
    envs = [{e["name"]: e["value"] for e in p["container_spec"].get("env", [])} for p in pools]
    assert envs[0][cluster.POOL2_ROLE_ENV] == envs[1][cluster.POOL2_ROLE_ENV] == "reduction_server"
    assert cluster.POOL2_ROLE_ENV not in envs[2]  # Google's image, not labkit
    plain = vertex.training_job({"framework": "torch"}, output_uri="gs://bkt/j", replica_count=3)
    assert all("env" not in p["container_spec"] for p in plain["worker_pool_specs"])
    # What a real replica of that job sees: the variable and the job agree.
    pools_env = {"workerpool0": ["a:1"], "workerpool1": ["b:1", "c:1"], "workerpool2": ["d:1", "e:1"]}
    cs = {"cluster": pools_env, "task": {"type": "workerpool1", "index": 1}, "job": spec}
    info = cluster.from_env({"CLUSTER_SPEC": json.dumps(cs), **envs[1]})
    assert "ps" not in info.tf_config()["cluster"] and info.rank == 2


# ---------------------------------------------------------------- more bad input

@pytest.mark.parametrize("index", [0.7, "0.7", True, None, [0]])
def test_task_index_must_be_an_integer(index):
    with pytest.raises(ValueError, match=r"CLUSTER_SPEC\.task\.index"):
        cluster.from_env(cluster_spec("workerpool1", index))


@pytest.mark.parametrize("job,field", [
    ("{not json", "CLUSTER_SPEC.job"),
    ([1], "CLUSTER_SPEC.job"),
    ({"workerPoolSpecs": {"0": {}}}, "CLUSTER_SPEC.job.workerPoolSpecs"),
    ({"workerPoolSpecs": [{}, {}, "x"]}, "CLUSTER_SPEC.job.workerPoolSpecs[2]"),
    ({"workerPoolSpecs": [{}, {}, {"containerSpec": "x"}]}, "CLUSTER_SPEC.job.workerPoolSpecs[2].containerSpec"),
])
def test_malformed_job_raises_naming_the_field(job, field):
    with pytest.raises(ValueError) as err:
        cluster.from_env(spec_with_job("workerpool0", job))
    assert field in str(err.value)


def test_empty_tf_config_is_a_single_node():
    assert cluster.from_env({"TF_CONFIG": "{}"}).role == "single"


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    """Ports the OS hands to outgoing connections can be taken between the pick and the
    replica's bind; labkit picks below that range."""
    import socket

    from labkit.core import cluster

    ports = cluster.free_ports(8)
    assert len(set(ports)) == 8
    low = cluster._ephemeral_low()
    if low > cluster.PICKED_FROM:
        assert all(cluster.PICKED_FROM <= p < low for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_free_ports_fall_back_to_the_os_where_the_range_is_unknown(monkeypatch, tmp_path):
    from labkit.core import cluster

    monkeypatch.setattr(cluster, "EPHEMERAL_RANGE_FILE", str(tmp_path / "absent"))
    assert cluster._ephemeral_low() == 0
    assert len(set(cluster.free_ports(3))) == 3


def test_free_ports_do_not_follow_a_seeded_random():
    """Trainers seed Python's `random`; two launchers seeded alike must not pick alike."""
    import random

    from labkit.core import cluster

    random.seed(0)
    first = cluster.free_ports(4)
    random.seed(0)
    assert cluster.free_ports(4) != first
