"""The NCCL variables table is well formed (name, what, when, default, a source URL), and a
container's environment (NCCL_DEBUG=INFO, say) travels through the spec builders, validated."""

from __future__ import annotations

import pytest

from labkit import vertex
from labkit.core.config import ParameterError
from labkit.vertex import nccl

OUT = "gs://bkt/run"
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
