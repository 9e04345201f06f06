"""What a CustomJob costs per hour: every pool is replicas x its machine's row in the machine
price list (on-demand and Spot), CPU pools included; a machine the list does not price is named
as unpriced, never $0.00; Compute Engine figures are labelled lower bounds."""

from __future__ import annotations

import math

import pytest

from labkit import vertex
from labkit.hardware.catalog import VERTEX_BASIS, load_machine_prices, machine_price
from labkit.vertex.machines import GPU_COUNTS, TPU_TOPOLOGIES

OUT = "gs://labkit-test-bucket/run"
PRICES = load_machine_prices()


def pool(machine_type, accelerator_type="", count=0, replicas=1, topology=None):
    spec = {"machine_type": machine_type}
    if accelerator_type:
        spec |= {"accelerator_type": accelerator_type, "accelerator_count": count}
    if topology:
        spec["tpu_topology"] = topology
    return {"machine_spec": spec, "replica_count": replicas,
            "container_spec": {"image_uri": "us-docker.pkg.dev/p/r/i:1"}}


def job(*pools, spot=False):
    spec = {"worker_pool_specs": list(pools)}
    return spec | ({"scheduling": {"strategy": "SPOT"}} if spot else {})


def one_replica_pool(row):
    """A pool of one machine that the row prices: the machine itself, or for a host row or an
    attached-GPU row, the host with those GPUs; and the rows that pool is priced from."""
    if row.machine_type in TPU_TOPOLOGIES:
        (topology,) = [t for t, chips in TPU_TOPOLOGIES[row.machine_type].items() if chips == row.accelerator_count]
        return pool(row.machine_type, topology=topology), [row]
    if row.machine_type and (row.accelerator_type or row.machine_type not in GPU_COUNTS
                             or row.machine_type.startswith("n1-")):
        return pool(row.machine_type, row.accelerator_type, row.accelerator_count), [row]
    # a host without its GPUs, or GPUs without their host: the machine with both
    by_key = {p.key: p for p in PRICES}
    for machine, carried in GPU_COUNTS.items():
        for accelerator, counts in carried.items():
            attached = by_key.get(("", accelerator, row.accelerator_count or counts[-1]))
            if (machine, "", 0) in by_key and attached and attached.accelerator_count in counts and \
                    row in (by_key[(machine, "", 0)], attached) and (row.machine_type in ("", machine)):
                return pool(machine, accelerator, attached.accelerator_count), [by_key[(machine, "", 0)], attached]
    raise AssertionError(f"no machine takes {row.key}")


@pytest.mark.parametrize("row", PRICES, ids=lambda r: "/".join(str(x) for x in r.key if x))
def test_every_price_row_prices_a_one_replica_pool_of_its_machine(row):
    """On-demand and Spot: the estimate for one replica is the row's price (with its host's or
    GPUs' row where the source lists them apart), on the row's rate card and source."""
    spec_pool, rows = one_replica_pool(row)
    cost = vertex.estimate_cost(job(spec_pool))
    assert cost.priced and cost.unpriced == []
    assert cost.on_demand_usd_hr == pytest.approx(sum(r.on_demand_usd_hr for r in rows))
    for r in rows:
        assert r.price_source in "\n".join(cost.sources) and r.price_basis in cost.bases
    spot = vertex.estimate_cost(job(spec_pool, spot=True))
    if any(r.spot_usd_hr is None for r in rows):
        assert not spot.priced and math.isnan(spot.spot_usd_hr) and "$0.00" not in spot.text()
        assert "no Spot price for" in spot.text()
    else:
        assert spot.priced and spot.usd_per_hour == pytest.approx(sum(r.spot_usd_hr for r in rows))


def test_g2_standard_32_is_priced_at_its_own_row_not_a_scaled_g2_standard_8():
    cost = vertex.estimate_cost(vertex.training_job({}, output_uri=OUT, machine_type="g2-standard-32",
                                                    accelerator_type="NVIDIA_L4", accelerator_count=1))
    own = machine_price(PRICES, "g2-standard-32", "NVIDIA_L4", 1).hourly()
    small = machine_price(PRICES, "g2-standard-8", "NVIDIA_L4", 1).hourly()
    assert cost.on_demand_usd_hr == pytest.approx(own) == pytest.approx(1.734376367)
    assert cost.on_demand_usd_hr > 2 * small  # the old per-L4 scaling gave g2-standard-8's $0.85


def test_a_reduction_server_pool_is_priced_at_its_cpu_machine():
    spec = vertex.training_job({}, output_uri=OUT, machine_type="n1-standard-8", accelerator_type="NVIDIA_TESLA_T4",
                               accelerator_count=2, replica_count=3, reduction_server_count=4, spot=True)
    reducers = spec["worker_pool_specs"][-1]
    assert reducers["machine_spec"] == {"machine_type": "n1-highcpu-16"} and reducers["replica_count"] == 4
    cost = vertex.estimate_cost(spec)
    gpu = machine_price(PRICES, "n1-standard-8", "NVIDIA_TESLA_T4", 2)
    cpu = machine_price(PRICES, "n1-highcpu-16")
    assert cost.priced and len(cost.lines) == 3
    assert cost.on_demand_usd_hr == pytest.approx(3 * gpu.hourly() + 4 * cpu.hourly())
    assert cost.usd_per_hour == pytest.approx(3 * gpu.hourly(spot=True) + 4 * cpu.hourly(spot=True))
    assert "4 x n1-highcpu-16" in cost.lines[-1]


def test_parameter_servers_evaluators_and_cpu_only_jobs_are_priced():
    spec = job(pool("n1-standard-16", "NVIDIA_TESLA_V100", 2), pool("n1-standard-16", "NVIDIA_TESLA_V100", 2, 3),
               pool("n1-highmem-8", replicas=2), pool("e2-standard-8"))
    cost = vertex.estimate_cost(spec)
    v100 = machine_price(PRICES, "n1-standard-16", "NVIDIA_TESLA_V100", 2).hourly()
    expected = 4 * v100 + 2 * machine_price(PRICES, "n1-highmem-8").hourly() + \
        machine_price(PRICES, "e2-standard-8").hourly()
    assert cost.priced and cost.on_demand_usd_hr == pytest.approx(expected)
    cpu_only = vertex.estimate_cost(vertex.training_job({}, output_uri=OUT, machine_type="c2-standard-30"))
    assert cpu_only.priced and cpu_only.on_demand_usd_hr == pytest.approx(1.56606)


def test_an_unpriced_machine_is_reported_not_zero():
    spec = vertex.training_job({}, output_uri=OUT, machine_type="a4-highgpu-8g", accelerator_type="NVIDIA_B200",
                               accelerator_count=8)
    cost = vertex.estimate_cost(spec)
    assert not cost.priced and cost.unpriced == ["NVIDIA_B200 x 8 on a4-highgpu-8g (workerpool0)"]
    text = cost.text()
    assert "unknown: no price for NVIDIA_B200 x 8 on a4-highgpu-8g" in text and "$0.00" not in text
    assert "machine_prices.csv" in text


def test_replicas_multiply_the_machine_price():
    one = vertex.estimate_cost(job(pool("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8)))
    five = vertex.estimate_cost(job(pool("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8, replicas=5), spot=True))
    assert five.on_demand_usd_hr == pytest.approx(5 * one.on_demand_usd_hr)
    assert five.usd_per_hour == pytest.approx(5 * machine_price(PRICES, "a2-highgpu-8g", "NVIDIA_TESLA_A100", 8)
                                              .hourly(spot=True))


def test_text_says_whose_rate_card_and_that_compute_engine_is_a_lower_bound():
    compute = vertex.estimate_cost(job(pool("n1-highcpu-16")))
    assert compute.lower_bound and compute.bases == ["Compute Engine"]
    assert "at least $" in compute.text() and "a lower bound" in compute.text()
    assert "boot disks" in compute.text()  # what is not priced
    own_rate = vertex.estimate_cost(job(pool("n1-standard-4")))
    assert own_rate.bases == [VERTEX_BASIS] and not own_rate.lower_bound
    assert "lower bound" not in own_rate.text() and "Spot unknown" in own_rate.text()
    assert own_rate.priced and own_rate.usd_per_hour == pytest.approx(0.21849885)


def test_a_tpu_vm_slice_is_priced_by_its_topologys_row():
    spec = job(pool("ct6e-standard-4t", topology="4x4"))
    cost = vertex.estimate_cost(spec)
    assert cost.on_demand_usd_hr == pytest.approx(machine_price(PRICES, "ct6e-standard-4t", "TPU_V6E", 16).hourly())
    assert cost.bases == ["Cloud TPU"]
    unpriced = vertex.estimate_cost(job(pool("ct5lp-hightpu-4t", topology="16x16")))
    assert unpriced.unpriced == ["TPU_V5_LITEPOD x 256 on ct5lp-hightpu-4t (workerpool0)"]


def test_accelerator_prices_keep_one_accelerators_share_for_notebooks():
    prices = vertex.pricing.accelerator_prices()
    h200 = machine_price(PRICES, "a3-ultragpu-8g", "NVIDIA_H200_141GB", 8)
    assert prices["NVIDIA_H200_141GB"].on_demand == pytest.approx(h200.hourly() / 8)
    assert prices["NVIDIA_L4"].spot == pytest.approx(machine_price(PRICES, "g2-standard-8", "NVIDIA_L4", 1)
                                                     .hourly(spot=True))
