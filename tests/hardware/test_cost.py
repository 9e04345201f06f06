"""The estimator's arithmetic against cases worked out by hand, Spot overhead, skipping of
unpriced rows, and the Pareto front."""

from __future__ import annotations

import datetime as dt

import pytest

from labkit.core.config import ParameterError
from labkit.hardware.catalog import CatalogEntry
from labkit.hardware.cost import (
    CostAssumptions,
    SpotModel,
    Workload,
    estimate_costs,
    mfu_from_measurement,
    pareto_front,
)
from labkit.hardware.roofline import Roofline, matmul_intensity


def entry(name, tflops, price, spot, count=1, fp32=None):
    """A catalog row whose machine (accelerators and host) costs `price` ($/h), `spot` on Spot."""
    return CatalogEntry(
        name=name, accelerator_type="NVIDIA_X", machine_type="m", accelerator_count=count,
        memory_gb=16, peak_bf16_tflops=tflops, peak_fp32_tflops=fp32, memory_bw_gbs=1000,
        region="us-central1", on_demand_usd_hr=price, spot_usd_hr=spot,
        price_source="https://example.com/p", price_read_on=dt.date(2026, 11, 22),
        datasheet_source="https://example.com/d", note="" if price is not None else "no price",
    )


NO_SPOT_OVERHEAD = SpotModel(preemptions_per_hour=0.0)


def test_hand_computed_case():
    # 100 TFLOP/s peak at 50% MFU = 50e12 FLOP/s; 1e15 FLOP/step -> 20 s/step.
    # 1000 samples / 10 per step = 100 steps -> 2000 s = 0.5555... h per epoch; 3 epochs = 1.6667 h.
    # The machine (GPU and host) at $3/h -> $1.6667/epoch, $5/run.
    w = Workload(flops_per_step=1e15, samples_per_step=10, samples_per_epoch=1000, epochs=3)
    t = estimate_costs(w, [entry("X", 100, 3.0, 0.75)],
                       CostAssumptions(mfu=0.5, spot=NO_SPOT_OVERHEAD))
    e = t.estimates[0]
    assert e.step_s == pytest.approx(20.0)
    assert e.hours_per_epoch == pytest.approx(2000 / 3600)
    assert e.hours_per_run == pytest.approx(6000 / 3600)
    assert e.on_demand_per_epoch == pytest.approx(2000 / 3600 * 3.0)
    assert e.on_demand_per_run == pytest.approx(5.0)
    assert e.spot_per_run == pytest.approx(6000 / 3600 * 0.75)


def test_partial_last_step_counts_as_a_step_and_count_multiplies_peak():
    w = Workload(flops_per_step=8e12, samples_per_step=3, samples_per_epoch=10)  # 4 steps
    t = estimate_costs(w, [entry("X4", 1, 4.0, None, count=4)], CostAssumptions(mfu=1.0))
    e = t.estimates[0]
    assert w.steps_per_epoch == 4
    assert e.step_s == pytest.approx(2.0)  # 8e12 / (4 × 1e12)
    assert e.hours_per_epoch == pytest.approx(8 / 3600)
    assert e.spot_per_run is None


def test_spot_overhead_formula_and_effect():
    spot = SpotModel(preemptions_per_hour=0.2, checkpoint_every_min=30, restart_min=6)
    # 0.07 of each hour is lost (half-intervals and restarts), and lost time is preempted too
    factor = 1 / (1 - 0.2 * (15 + 6) / 60)
    assert 1 + spot.overhead == pytest.approx(factor)
    w = Workload(flops_per_step=3.6e15, samples_per_step=1, samples_per_epoch=1)
    t = estimate_costs(w, [entry("X", 1000, 10.0, 3.0)], CostAssumptions(mfu=1.0, spot=spot))
    e = t.estimates[0]
    assert e.hours_per_run == pytest.approx(1 / 1000)
    assert e.spot_hours_per_run == pytest.approx(factor / 1000)
    assert e.spot_per_run == pytest.approx(factor / 1000 * 3.0)


def test_measured_step_time_overrides_datasheet():
    w = Workload(flops_per_step=1e12, samples_per_step=1, samples_per_epoch=3600)
    t = estimate_costs(w, [entry("X", 100, 1.0, 0.3)], measured_step_s={"X": 0.5})
    e = t.estimates[0]
    assert e.measured and e.hours_per_epoch == pytest.approx(0.5)
    assert t.rows()[0]["from"] == "measured"


def test_unpriced_rows_are_skipped_visibly():
    w = Workload(flops_per_step=1e12, samples_per_step=1, samples_per_epoch=10)
    t = estimate_costs(w, [entry("A", 100, None, None), entry("B", 100, 1.0, 0.5)])
    assert [e.name for e in t.estimates] == ["B"]
    assert t.skipped and t.skipped[0][0] == "A"
    assert "skipped A" in t.skipped_text()


def test_the_shipped_catalog_is_estimated_in_full():
    """Every shipped row has a price (the T4's too), so a bf16 estimate skips none; the H200 row
    is an 8-GPU machine, so its step uses eight GPUs' peak and its hour the whole machine's price."""
    from labkit.hardware.catalog import find, load_catalog

    catalog = load_catalog()
    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=100)
    t = estimate_costs(w, catalog, CostAssumptions(mfu=0.4, spot=NO_SPOT_OVERHEAD))
    assert not t.skipped and [e.name for e in t.estimates] == [e.name for e in catalog]
    row = find(catalog, "H200")
    h200 = next(e for e in t.estimates if e.name == "H200")
    assert h200.step_s == pytest.approx(1e15 / (0.4 * 8 * row.peak_bf16_tflops * 1e12))
    assert h200.on_demand_per_epoch == pytest.approx(h200.hours_per_epoch * row.hourly())


def test_fp32_without_rate_is_skipped():
    w = Workload(flops_per_step=1e12, samples_per_step=1, samples_per_epoch=10)
    t = estimate_costs(w, [entry("A", 100, 1.0, 0.5, fp32=None)], CostAssumptions(precision="fp32"))
    assert not t.estimates and "fp32" in t.skipped[0][1]


def test_pareto_front():
    pts = [("a", "on-demand", 1.0, 10.0), ("b", "on-demand", 2.0, 5.0),
           ("c", "on-demand", 3.0, 6.0), ("d", "spot", 2.0, 5.0), ("e", "spot", 0.5, 20.0)]
    front = pareto_front(pts)
    assert [p[0] for p in front] == ["e", "a", "b", "d"]  # c is beaten by b; b and d tie


def test_cheapest_and_fastest():
    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=100)
    t = estimate_costs(w, [entry("slow", 10, 0.1, 0.05), entry("fast", 1000, 20.0, 6.0)])
    assert t.fastest().name == "fast"
    assert t.cheapest().name == "slow" and t.cheapest(spot=True).name == "slow"


def test_mfu_from_measurement():
    assert mfu_from_measurement(1e12, 0.01, 200.0) == pytest.approx(0.5)


def test_default_mfu_is_the_measured_h100_run_against_its_datasheet_peak():
    """The estimator's default utilisation is read from the repository's H100 results and
    restated against the catalog's datasheet peak, not typed in."""
    from labkit.hardware import results
    from labkit.hardware.catalog import find, load_catalog
    from labkit.hardware.cost import default_mfu_reference

    ref = default_mfu_reference()
    data = results.load(results.GPT_FILE).data
    row = next(r for r in data["rows"] if (r["workload"], r["variant"]) == results.DEFAULT_MFU_ROW)
    assert ref.datasheet_tflops == find(load_catalog(), "H100 80GB").peak_bf16_tflops
    assert ref.of_measured == row["mfu"] and ref.measured_tflops == data["peak_tflops"]
    assert ref.of_datasheet == pytest.approx(row["mfu"] * data["peak_tflops"] / ref.datasheet_tflops)
    assert 0.3 < ref.of_datasheet < ref.of_measured  # the datasheet peak is the higher one
    assert CostAssumptions().mfu == pytest.approx(ref.of_datasheet)


def test_default_mfu_without_results_asks_for_a_value(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    with pytest.raises(ParameterError, match="mfu"):
        CostAssumptions()
    assert CostAssumptions(mfu=0.3).mfu == 0.3


def test_mfu_assumption_names_where_the_value_comes_from(monkeypatch, tmp_path):
    from labkit.hardware.cost import default_mfu_reference, mfu_assumption

    default = mfu_assumption(None)
    assert default.value == pytest.approx(default_mfu_reference().of_datasheet)
    assert "the default" in default.text() and len(default.references) == 3
    assert default.value in [m for _, m in default.sensitivity_cases()] and len(default.sensitivity_cases()) == 3
    mine = mfu_assumption(0.3)
    assert mine.value == 0.3 and mine.sensitivity_cases()[-1] == ("your mfu parameter", 0.3)
    with pytest.raises(ParameterError, match="mfu"):
        mfu_assumption(1.5)
    monkeypatch.setenv("LABKIT_RESULTS_DIR", str(tmp_path))
    assert mfu_assumption(0.3).references == () and "not found" in mfu_assumption(0.3).text()
    with pytest.raises(ParameterError, match="no measured default"):
        mfu_assumption(None)


def test_mfu_sensitivity_scales_time_and_cost_and_keeps_the_ranking():
    from labkit.hardware.cost import mfu_sensitivity

    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=100)
    options = [entry("slow", 10, 0.1, 0.05), entry("fast", 1000, 20.0, 6.0)]
    a = CostAssumptions(mfu=0.5, spot=NO_SPOT_OVERHEAD)
    rows = mfu_sensitivity(w, options, a, [("low", 0.25), ("high", 0.5)])
    assert [r["cheapest on-demand"] for r in rows] == ["slow", "slow"]
    assert rows[0]["$/run"] == pytest.approx(2 * rows[1]["$/run"])
    assert rows[0]["fastest h/run"] == pytest.approx(2 * rows[1]["fastest h/run"])


def test_bad_parameters_name_themselves():
    with pytest.raises(ParameterError, match="mfu"):
        CostAssumptions(mfu=1.5)
    with pytest.raises(ParameterError, match="samples_per_step"):
        Workload(flops_per_step=1.0, samples_per_step=0, samples_per_epoch=1)


def test_roofline():
    r = Roofline("x", peak_tflops=100, bandwidth_gbs=1000)
    assert r.ridge_flops_per_byte == pytest.approx(100.0)
    assert r.attainable_tflops(10) == pytest.approx(10.0)
    assert r.attainable_tflops(1000) == pytest.approx(100.0)
    assert r.bound(1) == "memory-bound" and r.bound(500) == "compute-bound"
    assert matmul_intensity(3000, 2) == pytest.approx(1000.0)


def test_tpu_break_even():
    from labkit.hardware.cost import tpu_break_even

    tpu = entry("TPU", 100, 1.0, 0.5)
    tpu = tpu.__class__(**{**tpu.__dict__, "accelerator_type": "TPU_V5_LITEPOD"})
    gpu = entry("GPU", 100, 2.0, 1.0)
    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=10)
    t = estimate_costs(w, [tpu, gpu], CostAssumptions(mfu=0.4))
    rows = tpu_break_even(t, [tpu, gpu], mfu=0.4)
    # Same speed, half the price: the TPU breaks even at half the GPU's MFU.
    assert rows[0]["break-even TPU MFU"] == pytest.approx(0.2)
    assert rows[0]["cheaper at the same MFU"] and rows[0]["reachable"]


def test_gpt_flops_match_the_reference_figure():
    from labkit.core.models import GPTConfig
    from labkit.hardware.flops import gpt_flops_per_token, mlp_training_flops

    assert gpt_flops_per_token(GPTConfig.gpt2_small()) == pytest.approx(0.8548e9, rel=1e-3)
    assert mlp_training_flops(width=4, depth=2, batch_size=3, out_features=2) == 6 * (32 + 8) * 3


def test_flop_counter_agrees_with_formula():
    torch = pytest.importorskip("torch")
    from labkit.hardware.flops import count_training_flops, mlp_training_flops

    model = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10, bias=False))
    counted = count_training_flops(model, torch.randn(8, 64))
    # The first layer's input gradient is not needed: 6·W·B minus 2·(64·64)·8.
    assert counted == pytest.approx(mlp_training_flops(64, 1, 8) - 2 * 64 * 64 * 8)
