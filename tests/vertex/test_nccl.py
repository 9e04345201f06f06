"""The NCCL variables table is well formed (name, what, when, default, a source URL), and a
container's environment (NCCL_DEBUG=INFO, say) travels through the spec builders, validated."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from labkit import vertex
from labkit.core.config import ParameterError
from labkit.vertex import nccl

OUT = "gs://bkt/run"
ROOT = Path(__file__).resolve().parents[2]
H100 = dict(machine_type="a3-highgpu-8g", accelerator_type="NVIDIA_H100_80GB", accelerator_count=8)
ASKED = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE",
         "NCCL_P2P_LEVEL", "NCCL_NVLS_ENABLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT",
         "NCCL_CROSS_NIC", "NCCL_ALGO", "NCCL_PROTO", "NCCL_FASTRAK_IFNAME", "LD_LIBRARY_PATH")


def test_every_entry_is_well_formed_and_sourced():
    names = [v.name for v in nccl.VARIABLES]
    assert len(names) == len(set(names)) and set(ASKED) <= set(names)
    for v in nccl.VARIABLES:
        assert v.what and v.when and v.default and v.source.startswith("https://"), v
        assert any(host in v.source for host in ("docs.nvidia.com", "pytorch.org", "cloud.google.com",
                                                 "github.com/NVIDIA")), v.source
    assert [r["variable"] for r in nccl.rows()] == names
    assert set(nccl.rows()[0]) == {"variable", "what it does", "when to set it"}
    assert all(s.endswith(f"(read {nccl.READ_ON})") for s in nccl.sources())
    with pytest.raises(ValueError, match="source"):
        nccl.EnvVar("NCCL_X", "a", "b", "c", "docs.nvidia.com/x")


def test_env_reaches_every_training_container():
    spec = vertex.training_job({"model": "gpt"}, output_uri=OUT, replica_count=2,
                               env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, **H100)
    for pool in spec["worker_pool_specs"][:2]:
        env = {e["name"]: e["value"] for e in pool["container_spec"]["env"]}
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    pool = vertex.PoolConfig(env={"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": 3})
    assert pool.to_spec()["container_spec"]["env"] == [{"name": "NCCL_DEBUG", "value": "WARN"},
                                                        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "3"}]


@pytest.mark.parametrize(("env", "name"), [
    ({"NCCL DEBUG": "INFO"}, "env"), ({"1NCCL": "x"}, "env"), ("NCCL_DEBUG=INFO", "env"),
    ({"NCCL_DEBUG": None}, "env['NCCL_DEBUG']"), ({"NCCL_DEBUG": ["INFO"]}, "env['NCCL_DEBUG']")])
def test_a_bad_env_is_refused_in_one_line_naming_it(env, name):
    with pytest.raises(ParameterError) as err:
        vertex.PoolConfig(env=env)
    assert err.value.name == name and "\n" not in str(err.value)
    with pytest.raises(ParameterError):
        vertex.training_job({}, output_uri=OUT, env=env)


# ---------------------------------------------------------------- GPUDirect-RDMA machines (gIB)

A3_ULTRA = dict(machine_type="a3-ultragpu-8g", accelerator_type="NVIDIA_H200_141GB", accelerator_count=8)


def _image_ld_library_path(tmp_path) -> str:
    """LD_LIBRARY_PATH as labkit's Dockerfile sets it (read by labkit's own Dockerfile reader)."""
    from labkit.vertex.dockerfile import read_dockerfile

    return read_dockerfile(ROOT / "Dockerfile", tmp_path / "staging").image.env["LD_LIBRARY_PATH"]


@pytest.mark.parametrize("job", ["training", "notebook"])
def test_an_a3_ultra_multi_node_job_puts_gib_first_on_the_loader_path(job, tmp_path):
    build = {"training": lambda **kw: vertex.training_job({"model": "gpt"}, output_uri=OUT, **kw),
             "notebook": lambda **kw: vertex.notebook_job("nb.ipynb", {}, output_uri=OUT, **kw)}[job]
    spec = build(replica_count=2, **A3_ULTRA)
    for pool in spec["worker_pool_specs"][:2]:
        command = pool["container_spec"]["command"]
        assert command[:2] == ["bash", "-c"]
        steps = command[2].split(" && ")
        assert steps[0] == f"source {nccl.GIB_ENV_SCRIPT}" and steps[1] == nccl.gib_loader_path_step()
        assert nccl.GIB_LIB_DIR in command[2] and steps[-1] == 'exec "$@"'
    # The step run by bash on the image's own LD_LIBRARY_PATH: gIB's folder first, the driver's
    # kept, the Reduction Server plugin's folder (a FastSocket-family plugin) gone.
    image_path = _image_ld_library_path(tmp_path)
    assert nccl.REDUCTION_SERVER_LIB_DIR in image_path.split(":")
    out = subprocess.run(["bash", "-c", nccl.gib_loader_path_step() + ' && printf %s "$LD_LIBRARY_PATH"'],
                         env={"LD_LIBRARY_PATH": image_path, "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, check=True).stdout
    folders = out.split(":")
    assert folders[0] == nccl.GIB_LIB_DIR and "/usr/local/nvidia/lib64" in folders
    assert nccl.REDUCTION_SERVER_LIB_DIR not in folders and "" not in folders
    # One node needs no network plugin, and other machines do not run gIB.
    assert "command" not in build(**A3_ULTRA)["worker_pool_specs"][0]["container_spec"]
    assert "command" not in build(replica_count=2, **H100)["worker_pool_specs"][0]["container_spec"]


def test_the_gib_facts_are_sourced():
    assert nccl.GIB_PAGE.startswith("https://docs.cloud.google.com/") and "NCCL/FastSocket" in nccl.__doc__
    assert nccl.GIB_LIB_DIR in nccl.BY_NAME["LD_LIBRARY_PATH"].when
    assert nccl.NCCL_IBV_SOURCE.startswith("https://github.com/NVIDIA/nccl/blob/")
    assert vertex.specs.NCCL_ENV_SCRIPT == nccl.GIB_ENV_SCRIPT
