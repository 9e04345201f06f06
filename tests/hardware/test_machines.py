"""Which catalog row a machine is, and its price: GPU names matched by whole words, the target
machine looked up by row name, the reader's price or the catalog's (a whole one-GPU machine, or
one GPU's share of a multi-GPU machine)."""

from __future__ import annotations

import datetime as dt

import pytest

from labkit.core import devices
from labkit.core.config import ParameterError
from labkit.hardware import machines
from labkit.hardware.catalog import CatalogEntry, load_catalog
from labkit.hardware.machines import Price


def _entry(name, count=1, tpu=False, price=2.5, spot=1.25):
    return CatalogEntry(name=name, accelerator_type=("TPU_X" if tpu else "NVIDIA_" + name.split()[0]),
                        machine_type=f"m-{count}g", accelerator_count=count, memory_gb=80,
                        peak_bf16_tflops=1.0, peak_fp32_tflops=1.0, memory_bw_gbs=1.0, region="r",
                        on_demand_usd_hr=price, spot_usd_hr=spot, price_source="src",
                        price_read_on=dt.date(2026, 11, 22), datasheet_source="ds")


def test_match_gpu_by_whole_words():
    entries = [_entry("L4"), _entry("A100 40GB"), _entry("A100 80GB"), _entry("H200", count=8)]
    assert machines.match_gpu(entries, "NVIDIA L4").name == "L4"
    assert machines.match_gpu(entries, "NVIDIA L40S") is None
    assert machines.match_gpu(entries, "NVIDIA A100-SXM4-80GB").name == "A100 80GB"
    assert machines.match_gpu(entries, "NVIDIA H200") is None  # only an 8-GPU row
    assert [e.name for e in machines.gpu_rows(entries, "NVIDIA H200")] == ["H200"]
    assert machines.gpu_rows(entries, "NVIDIA L40S") == []


def test_a_gpu_of_a_multi_gpu_machine_is_priced_as_its_share():
    entries = [_entry("L4"), _entry("H200", count=8, price=80.0, spot=32.0)]
    price = machines.catalog_price(entries, "NVIDIA H200")
    assert price.on_demand == pytest.approx(10.0) and price.spot == pytest.approx(4.0)
    assert "one GPU's share" in price.source and "divided by its 8 GPUs" in price.source
    assert "m-8g with 8 x NVIDIA_H200" in price.source and "read 2026-11-22 from src" in price.source
    single = machines.catalog_price(entries, "NVIDIA L4")
    assert (single.on_demand, single.spot) == (2.5, 1.25) and "share" not in single.source
    assert machines.catalog_price(entries, "NVIDIA L40S") is None
    no_spot = machines.catalog_price([_entry("H200", count=8, price=80.0, spot=None)], "NVIDIA H200")
    assert no_spot.on_demand == pytest.approx(10.0) and no_spot.spot is None


def test_the_fewest_gpus_priced_row_wins():
    one, eight = _entry("H200", count=1, price=12.0, spot=5.0), _entry("H200", count=8, price=80.0, spot=32.0)
    assert machines.catalog_price([eight, one], "NVIDIA H200").on_demand == 12.0
    unpriced = _entry("H200", count=1, price=None, spot=None)
    assert machines.catalog_price([unpriced, eight], "NVIDIA H200").on_demand == pytest.approx(10.0)
    assert machines.catalog_price([unpriced], "NVIDIA H200") is None


def test_the_shipped_catalog_prices_an_h100():
    entry = machines.match_gpu(load_catalog(), "NVIDIA H100 80GB HBM3")
    assert entry is not None and entry.accelerator_type == "NVIDIA_H100_80GB" and entry.has_price


@pytest.mark.parametrize("gpu_name,row,count", [
    ("Tesla T4", "T4", 1), ("NVIDIA T4", "T4", 1), ("NVIDIA L4", "L4", 1),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1), ("NVIDIA A100-SXM4-80GB", "A100 80GB", 1),
    ("NVIDIA H100 80GB HBM3", "H100 80GB", 1), ("NVIDIA H200", "H200", 8),
])
def test_this_machine_is_priced_from_the_shipped_catalog(monkeypatch, gpu_name, row, count):
    """What notebook 09 prints on each GPU the course plans for: a price, never none."""
    gpu = devices.GPU(0, gpu_name, 80 * 2**30, "9.0")
    monkeypatch.setattr(devices, "detect", lambda: devices.DeviceInfo(8, "cpu", None, gpus=(gpu,)))
    entry = next(e for e in load_catalog() if e.name == row)
    price = machines.price_for_this_machine()
    assert price is not None and f"catalog row {row} ({entry.machine_type}" in price.source
    assert price.on_demand == pytest.approx(entry.hourly() / count)
    assert price.spot == pytest.approx(entry.hourly(spot=True) / count)
    assert ("one GPU's share" in price.source) == (count > 1)


def test_a_cpu_machine_has_no_catalog_price(monkeypatch):
    monkeypatch.setattr(devices, "detect", lambda: devices.DeviceInfo(2, "cpu", None))
    assert machines.price_for_this_machine() is None


def test_price_parameter_wins_and_is_validated():
    assert machines.price_for_this_machine(3.0, 1.0) == Price(3.0, 1.0, "price_per_hour parameter")
    with pytest.raises(ParameterError, match="spot_price_per_hour"):
        machines.price_for_this_machine(3.0, -1.0)


def test_unknown_target_names_the_parameter():
    assert machines.target_machine("H100 80GB").machine_type == "a3-highgpu-1g"
    with pytest.raises(ParameterError, match="target.*H100 80GB"):
        machines.target_machine("H100")
