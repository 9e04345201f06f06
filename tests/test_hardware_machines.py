"""Which catalog row a machine is, and its price: GPU names matched by whole words, the target
machine looked up by row name, the reader's price or the catalog's."""

from __future__ import annotations

import datetime as dt

import pytest

from labkit.core.config import ParameterError
from labkit.hardware import machines
from labkit.hardware.catalog import CatalogEntry, load_catalog
from labkit.hardware.machines import Price


def _entry(name, count=1, tpu=False):
    return CatalogEntry(name=name, accelerator_type=("TPU_X" if tpu else "NVIDIA_" + name.split()[0]),
                        machine_type="m", accelerator_count=count, memory_gb=80, peak_bf16_tflops=1.0,
                        peak_fp32_tflops=1.0, memory_bw_gbs=1.0, region="r", on_demand_usd_hr=2.5,
                        spot_usd_hr=1.25, price_source="src", price_read_on=dt.date(2026, 11, 22),
                        datasheet_source="ds")


def test_match_gpu_by_whole_words():
    entries = [_entry("L4"), _entry("A100 40GB"), _entry("A100 80GB"), _entry("H200 x8", count=8)]
    assert machines.match_gpu(entries, "NVIDIA L4").name == "L4"
    assert machines.match_gpu(entries, "NVIDIA L40S") is None
    assert machines.match_gpu(entries, "NVIDIA A100-SXM4-80GB").name == "A100 80GB"
    assert machines.match_gpu(entries, "NVIDIA H200") is None  # only an 8-GPU row


def test_the_shipped_catalog_prices_an_h100():
    entry = machines.match_gpu(load_catalog(), "NVIDIA H100 80GB HBM3")
    assert entry is not None and entry.accelerator_type == "NVIDIA_H100_80GB" and entry.has_price


def test_price_parameter_wins_and_is_validated():
    assert machines.price_for_this_machine(3.0, 1.0) == Price(3.0, 1.0, "price_per_hour parameter")
    with pytest.raises(ParameterError, match="spot_price_per_hour"):
        machines.price_for_this_machine(3.0, -1.0)


def test_unknown_target_names_the_parameter():
    assert machines.target_machine("H100 80GB").machine_type == "a3-highgpu-1g"
    with pytest.raises(ParameterError, match="target.*H100 80GB"):
        machines.target_machine("H100")
