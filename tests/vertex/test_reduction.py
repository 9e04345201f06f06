"""The Reduction Server plan: reducers only where they help, sized from the bandwidth they can
use, priced with the training pools, and a user's own count kept with a one-line warning."""

from __future__ import annotations

import math
import warnings

import pytest

from labkit import vertex
from labkit.core.config import ParameterError
from labkit.hardware.catalog import load_machine_prices, machine_price
from labkit.vertex.machines import gpudirect_on_vertex, network_gbps, vm_network_gbps
from labkit.vertex.reduction import (
    ReductionServerWarning,
    check_reducers,
    plan_reducers,
    price_plan,
    size_reducers,
)

OUT = "gs://bkt/run"
A100 = dict(machine_type="a2-highgpu-8g", accelerator_type="NVIDIA_TESLA_A100", accelerator_count=8)
H100 = dict(machine_type="a3-highgpu-8g", accelerator_type="NVIDIA_H100_80GB", accelerator_count=8)
MEGA = dict(machine_type="a3-megagpu-8g", accelerator_type="NVIDIA_H100_MEGA_80GB", accelerator_count=8)
ULTRA = dict(machine_type="a3-ultragpu-8g", accelerator_type="NVIDIA_H200_141GB", accelerator_count=8)
B200 = dict(machine_type="a4-highgpu-8g", accelerator_type="NVIDIA_B200", accelerator_count=8)
PRICES = load_machine_prices()


def job(count, replicas=4, **machine):
    return vertex.training_job({"model": "gpt"}, output_uri=OUT, replica_count=replicas,
                               reduction_server_count=count, **machine)


def plan(count, nodes, machine):
    return plan_reducers(count, nodes, machine["machine_type"], machine["accelerator_type"],
                         accelerator_count=machine["accelerator_count"])


def test_a_users_count_below_the_rule_is_kept_with_a_one_line_warning():
    with pytest.warns(ReductionServerWarning) as caught:
        spec = job(2, **A100)
    assert spec["worker_pool_specs"][2]["replica_count"] == 2
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "\n" not in message and caught[0].filename == __file__  # points at the caller's line
    for words in ("reduction_server_count=2 kept", "below Vertex's bandwidth rule", "13 x n1-highcpu-16",
                  "4 x 100 Gbps / 32 Gbps", "distributed-training"):
        assert words in message, message
    with pytest.warns(ReductionServerWarning, match="kept, below"):
        assert check_reducers(2, 4, A100["machine_type"], A100["accelerator_type"], "n1-highcpu-16", 8) == 2


def test_a_count_that_meets_the_rule_and_auto_are_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert job(13, **A100)["worker_pool_specs"][2]["replica_count"] == 13
        assert job(40, **A100)["worker_pool_specs"][2]["replica_count"] == 40
        assert job("auto", **A100)["worker_pool_specs"][2]["replica_count"] == 13
        assert job("auto", **H100)["worker_pool_specs"][2]["replica_count"] == 25


def test_sizing_uses_the_vm_network_not_the_gpudirect_total():
    # a3-highgpu-8g: 1,000 Gbps in Compute Engine's table, of which its primary NIC carries 200;
    # the other 800 are four GPUDirect-TCPX GPU NICs the CPU reducers do not share.
    assert network_gbps(**H100) == 1000 and vm_network_gbps(**H100) == 200
    sizing = size_reducers(4, H100["machine_type"], H100["accelerator_type"], "n1-highcpu-16", 8)
    assert (sizing.worker_gbps, sizing.total_gbps, sizing.needed) == (200, 1000, 25)
    assert sizing.needed == math.ceil(4 * 200 / 32) != math.ceil(4 * 1000 / 32)
    for words in ("matches or exceeds", "200 Gbps", "1,000 Gbps", "GPUDirect-TCPX", "25 reducer(s)"):
        assert words in sizing.text(), sizing.text()
    # Where the machine has no GPU NICs, its whole bandwidth is its VM network: Google's examples.
    v100 = size_reducers(5, "n1-highmem-96", "NVIDIA_TESLA_V100", "n1-highcpu-16", 8)
    a2 = size_reducers(8, "a2-megagpu-16g", "NVIDIA_TESLA_A100", "n1-highcpu-16", 16)
    assert (v100.needed, a2.needed) == (16, 25) and a2.total_gbps == a2.worker_gbps == 100
    # A bigger reducer counts with its own bandwidth (n1-highcpu-8: 16 Gbps -> twice as many).
    assert size_reducers(4, "a2-highgpu-8g", "NVIDIA_TESLA_A100", "n1-highcpu-8", 8).needed == 25


@pytest.mark.parametrize("machine", [MEGA, ULTRA, B200], ids=lambda m: m["machine_type"])
def test_auto_proposes_no_reducers_on_gpudirect_machines_and_says_why(machine):
    nics = gpudirect_on_vertex(machine["machine_type"])
    assert nics is not None and nics.gpu_gbps > nics.host_gbps
    with pytest.warns(ReductionServerWarning, match="'auto': no reducers on") as caught:
        spec = job("auto", **machine)
    assert len(spec["worker_pool_specs"]) == 2  # no pool 2
    assert nics.stack in str(caught[0].message) and "\n" not in str(caught[0].message)
    p = plan("auto", 4, machine)
    assert (p.helps, p.count) == (False, 0)
    assert "does not help" in p.text() and "plan: no reducers (auto)" in p.text()
    assert p.sizing.worker_gbps == nics.host_gbps  # what a user's own count would be measured against


def test_a_users_count_is_kept_where_reducers_do_not_help_with_a_warning():
    with pytest.warns(ReductionServerWarning, match="reduction_server_count=8 kept, but on a3-megagpu-8g it "
                                                    "does not help: Vertex sets it up with GPUDirect-TCPXO"):
        spec = job(8, **MEGA)
    assert spec["worker_pool_specs"][2]["replica_count"] == 8


def test_no_reducers_on_one_node_or_without_gpus():
    with pytest.warns(ReductionServerWarning, match="one node"):
        assert len(job("auto", replicas=1, **A100)["worker_pool_specs"]) == 1
    with pytest.warns(ReductionServerWarning, match="no GPUs"):
        assert len(job("auto", replicas=2)["worker_pool_specs"]) == 2
    for p in (plan("auto", 1, A100), plan_reducers("auto", 3, "n1-standard-8", None)):
        assert (p.helps, p.count, p.sizing) == (False, 0, None)
    # A count on a job the reducers cannot serve at all is refused, as before.
    with pytest.raises(ParameterError, match="replica_count >= 2") as err:
        job(2, replicas=1, **A100)
    assert err.value.name == "reduction_server_count"


@pytest.mark.parametrize("bad", [-1, 2.5, "many", True, None])
def test_invalid_counts_are_refused_naming_the_field(bad):
    with pytest.raises(ParameterError) as err:
        plan(bad, 4, A100)
    assert err.value.name == "reduction_server_count"
    with pytest.raises(ParameterError) as err:
        job(bad, **A100)
    assert err.value.name == "reduction_server_count"


def test_a_reducer_machine_must_be_n1_or_n2():
    for machine in ("a2-highgpu-8g", "e2-standard-4"):
        with pytest.raises(ParameterError) as err:
            vertex.training_job({}, output_uri=OUT, replica_count=4, reduction_server_count=2,
                                reduction_server_machine_type=machine, **A100)
        assert err.value.name == "reduction_server_machine_type"


def test_the_plan_prices_the_reducers_next_to_the_training_pools():
    p = plan("auto", 4, H100)
    cost = price_plan(p)
    reducer = machine_price(PRICES, "n1-highcpu-16").hourly()
    node = machine_price(PRICES, "a3-highgpu-8g", "NVIDIA_H100_80GB", 8).hourly()
    assert cost.reducers_usd_hr == pytest.approx(25 * reducer)
    assert cost.training_usd_hr == pytest.approx(4 * node)
    assert 0 < cost.reducers_share < 0.1  # affordable: a few percent of the job
    for words in ("reducers 25 x n1-highcpu-16", f"${25 * reducer:,.2f}/h", f"${4 * node:,.2f}/h", "on-demand"):
        assert words in cost.text(), cost.text()
    # The job's own estimate prices every pool, the reducers' line included, with the same figures.
    estimate = vertex.estimate_cost(job("auto", **H100))
    assert estimate.priced and len(estimate.lines) == 3 and "25 x n1-highcpu-16" in estimate.lines[-1]
    assert estimate.on_demand_usd_hr == pytest.approx(cost.training_usd_hr + cost.reducers_usd_hr)
    spot = price_plan(p, spot=True)
    assert spot.reducers_usd_hr == pytest.approx(25 * machine_price(PRICES, "n1-highcpu-16").hourly(spot=True))
    none = price_plan(plan("auto", 4, MEGA))
    assert none.reducers_usd_hr == 0 and "no reducers" in none.text()
