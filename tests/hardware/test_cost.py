"""The estimator's arithmetic against cases worked out by hand, Spot overhead, skipping of
unpriced rows, the Pareto front, and comparisons on equal terms: one GPU count per comparison,
the MFU of the model's kind with its source on every row, TPU rows without a TPU MFU reduced to
their break-even MFU, and the input pipeline capping every row."""

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


def entry(name, tflops, price, spot, count=1, fp32=None, accelerator="NVIDIA_X"):
    """A catalog row whose machine (accelerators and host) costs `price` ($/h), `spot` on Spot;
    `tflops` is one accelerator's peak."""
    return CatalogEntry(
        name=name, accelerator_type=accelerator, machine_type="m", accelerator_count=count,
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


def test_partial_last_step_counts_as_a_step_and_a_multi_gpu_machine_is_priced_per_gpu_used():
    """A 4-GPU machine at one GPU: one GPU's peak, a quarter of the machine's price; the step
    is one GPU's, not four GPUs' perfectly scaled."""
    w = Workload(flops_per_step=8e12, samples_per_step=3, samples_per_epoch=10)  # 4 steps
    t = estimate_costs(w, [entry("X4", 1, 4.0, None, count=4)], CostAssumptions(mfu=1.0))
    e = t.estimates[0]
    assert w.steps_per_epoch == 4 and w.steps_per_epoch_on(2) == 2
    assert e.gpus == 1 and e.step_s == pytest.approx(8.0)  # 8e12 / 1e12
    assert e.hours_per_epoch == pytest.approx(32 / 3600)
    assert e.on_demand_per_epoch == pytest.approx(32 / 3600 * 1.0)  # $4/h machine ÷ 4 GPUs
    assert e.spot_per_run is None and e.priced_as == "1 × 1/4 of m"
    assert "renting 1 whole machine(s) for them costs 4×" in t.assumptions_text() and "costs 4×" in t.basis(e)


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
    t = estimate_costs(w, [entry("X", 100, 1.0, 0.3)], CostAssumptions(mfu=0.4), measured_step_s={"X": 0.5})
    e = t.estimates[0]
    assert e.measured and e.hours_per_epoch == pytest.approx(0.5)
    assert t.rows()[0]["from"] == "measured"


def test_unpriced_rows_are_skipped_visibly():
    w = Workload(flops_per_step=1e12, samples_per_step=1, samples_per_epoch=10)
    t = estimate_costs(w, [entry("A", 100, None, None), entry("B", 100, 1.0, 0.5)], CostAssumptions(mfu=0.4))
    assert [e.name for e in t.estimates] == ["B"]
    assert t.skipped and t.skipped[0][0] == "A"
    assert "skipped A" in t.skipped_text()


def test_the_shipped_catalog_is_estimated_in_full_at_one_gpu_count():
    """Every shipped row has a price (the T4's too), so a bf16 estimate skips none. The H200 row
    is an 8-GPU machine: at one GPU its step is one H200's and its hour an eighth of the
    machine's, so it never races single GPUs with eight; at eight GPUs every row has eight."""
    from labkit.hardware.catalog import find, load_catalog

    catalog = load_catalog()
    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=100)
    t = estimate_costs(w, catalog, CostAssumptions(mfu=0.4, spot=NO_SPOT_OVERHEAD))
    assert not t.skipped and [e.name for e in t.estimates] == [e.name for e in catalog]
    assert {e.gpus for e in t.estimates} == {1} and t.gpus == 1
    row, h100 = find(catalog, "H200"), find(catalog, "H100 80GB")
    h200 = next(e for e in t.estimates if e.name == "H200")
    assert h200.step_s == pytest.approx(1e15 / (0.4 * row.peak_bf16_tflops * 1e12))
    assert h200.on_demand_per_epoch == pytest.approx(h200.hours_per_epoch * row.hourly() / 8)
    # The same datasheet peak as the H100: the same time, so the headline is not the 8-GPU machine's.
    assert row.peak_bf16_tflops == h100.peak_bf16_tflops
    assert h200.hours_per_run == pytest.approx(next(e for e in t.estimates if e.name == "H100 80GB").hours_per_run)
    eight = estimate_costs(w, catalog, CostAssumptions(mfu=0.4, spot=NO_SPOT_OVERHEAD, gpus=8))
    assert {e.gpus for e in eight.estimates} == {8} and eight.gpus == 8
    h200_8 = next(e for e in eight.estimates if e.name == "H200")
    assert h200_8.on_demand_per_epoch == pytest.approx(h200_8.hours_per_epoch * row.hourly())  # the whole machine
    assert "8 per a3-ultragpu-8g" not in eight.assumptions_text()  # eight GPUs fill it: nothing to warn of


def test_fp32_without_rate_is_skipped():
    w = Workload(flops_per_step=1e12, samples_per_step=1, samples_per_epoch=10)
    t = estimate_costs(w, [entry("A", 100, 1.0, 0.5, fp32=None)], CostAssumptions(mfu=0.4, precision="fp32"))
    assert not t.estimates and "fp32" in t.skipped[0][1]


def test_pareto_front():
    pts = [("a", "on-demand", 1.0, 10.0), ("b", "on-demand", 2.0, 5.0),
           ("c", "on-demand", 3.0, 6.0), ("d", "spot", 2.0, 5.0), ("e", "spot", 0.5, 20.0)]
    front = pareto_front(pts)
    assert [p[0] for p in front] == ["e", "a", "b", "d"]  # c is beaten by b; b and d tie


def test_cheapest_and_fastest():
    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=100)
    t = estimate_costs(w, [entry("slow", 10, 0.1, 0.05), entry("fast", 1000, 20.0, 6.0)], CostAssumptions(mfu=0.4))
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


def tpu(name, tflops, price, spot):
    return entry(name, tflops, price, spot, accelerator="TPU_V5_LITEPOD")


def test_a_tpu_without_a_tpu_mfu_gets_its_break_even_and_is_never_the_cheapest():
    """A TPU as fast as the GPU on paper at half the price would be 'cheapest' at the GPU's MFU;
    without a TPU MFU it has no cost, only the MFU at which it matches the GPU: half the GPU's."""
    from labkit.hardware.cost import tpu_break_even

    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=10)
    options = [tpu("TPU", 100, 1.0, 0.5), entry("GPU", 100, 2.0, 1.0)]
    t = estimate_costs(w, options, CostAssumptions(mfu=0.4, spot=NO_SPOT_OVERHEAD))
    row = next(e for e in t.estimates if e.name == "TPU")
    assert row.is_tpu and not row.comparable and row.on_demand_per_run is None and row.mfu is None
    assert row.break_even_mfu == pytest.approx(0.2) and "pass tpu_mfu" in row.mfu_source
    assert t.cheapest().name == t.cheapest(spot=True).name == t.fastest().name == "GPU"
    assert {p[0] for p in t.pareto()} == {"GPU"}
    assert "1 TPU row without a TPU MFU left out" in t.basis(t.cheapest())
    [summary] = tpu_break_even(t)
    assert summary["break-even TPU MFU"] == pytest.approx(0.2) and summary["reachable"]
    assert summary["cheapest GPU row"] == "GPU" and summary["TPU $/run"] is None
    # With a TPU MFU of the user's, the TPU row is priced with it, named as its source, and may win.
    mine = estimate_costs(w, options, CostAssumptions(mfu=0.4, tpu_mfu=0.3, spot=NO_SPOT_OVERHEAD))
    row = next(e for e in mine.estimates if e.name == "TPU")
    assert row.comparable and row.mfu == 0.3 and row.mfu_source == "your tpu_mfu parameter"
    assert mine.cheapest().name == "TPU" and row.break_even_mfu == pytest.approx(0.2)


def test_a_tpu_the_input_holds_back_has_no_break_even():
    """When the input pipeline alone makes a TPU row dearer than the cheapest GPU row, no MFU
    helps, and the row says so instead of giving a figure."""
    w = Workload(flops_per_step=1e15, samples_per_step=10, samples_per_epoch=100)
    options = [tpu("TPU", 1000, 10.0, 5.0), entry("GPU", 100, 1.0, 0.5)]
    t = estimate_costs(w, options, CostAssumptions(mfu=0.5, input_samples_per_s=1.0))
    row = next(e for e in t.estimates if e.name == "TPU")
    assert row.break_even_mfu is None and "the input alone makes it dearer than GPU" in row.break_even_note


def test_every_row_of_a_comparison_has_the_same_gpu_count_and_the_scaling_is_stated():
    """N GPUs: each row N GPUs at N times one GPU's share of its machine, each step slowed by the
    scaling efficiency: the default (a published figure, not labkit's) or the user's."""
    from labkit.hardware.cost import DEFAULT_SCALING_EFFICIENCY

    w = Workload(flops_per_step=1e15, samples_per_step=4, samples_per_epoch=800)
    options = [entry("one", 100, 2.0, 1.0), entry("eight", 100, 16.0, 8.0, count=8), tpu("TPU", 100, 1.0, 0.5)]
    one = estimate_costs(w, options, CostAssumptions(mfu=0.5, spot=NO_SPOT_OVERHEAD))
    four = estimate_costs(w, options, CostAssumptions(mfu=0.5, spot=NO_SPOT_OVERHEAD, gpus=4))
    assert {e.gpus for e in one.estimates} == {1} and {e.gpus for e in four.estimates} == {4}
    assert one.scaling_efficiency == 1.0 and four.scaling_efficiency == DEFAULT_SCALING_EFFICIENCY
    assert "horovod" in four.scaling_source and "not measured by labkit" in four.scaling_source
    a, b = (next(e for e in t.estimates if e.name == "eight") for t in (one, four))
    assert a.step_s == pytest.approx(20.0) and b.step_s == pytest.approx(20.0 / DEFAULT_SCALING_EFFICIENCY)
    assert a.hours_per_run == pytest.approx(200 * 20.0 / 3600)  # 800 samples / 4 per step
    assert b.hours_per_run == pytest.approx(50 * 20.0 / DEFAULT_SCALING_EFFICIENCY / 3600)  # 800 / (4 × 4)
    assert a.on_demand_per_run == pytest.approx(a.hours_per_run * 2.0)  # one GPU: an eighth of $16/h
    assert b.on_demand_per_run == pytest.approx(b.hours_per_run * 4 * 2.0)
    assert next(e for e in four.estimates if e.name == "one").on_demand_per_run == pytest.approx(b.on_demand_per_run)
    mine = estimate_costs(w, options, CostAssumptions(mfu=0.5, gpus=4, scaling_efficiency=0.5))
    assert mine.scaling_source == "your scaling_efficiency parameter"
    assert next(e for e in mine.estimates if e.name == "one").step_s == pytest.approx(40.0)
    with pytest.raises(ParameterError, match="scaling_efficiency"):
        CostAssumptions(mfu=0.5, gpus=2, scaling_efficiency=1.5)
    with pytest.raises(ParameterError, match="gpus"):
        CostAssumptions(mfu=0.5, gpus=0)


def test_the_input_pipeline_caps_every_row():
    """A GPU fast enough for 100 samples/s fed 10 per second runs at 10 per second and says so;
    a slow one the input keeps up with is compute-bound; without a rate no row claims either."""
    w = Workload(flops_per_step=1e13, samples_per_step=10, samples_per_epoch=1000)  # 1e12 FLOP per sample
    options = [entry("fast", 100, 1.0, 0.5), entry("slow", 1, 0.1, 0.05)]
    t = estimate_costs(w, options, CostAssumptions(mfu=1.0, input_samples_per_s=10.0, spot=NO_SPOT_OVERHEAD))
    fast, slow = t.estimates
    assert fast.input_bound and fast.samples_per_s == pytest.approx(10.0) and fast.step_s == pytest.approx(1.0)
    assert fast.hours_per_run == pytest.approx(100 / 3600) and fast.bound_by.startswith("INPUT")
    assert not slow.input_bound and slow.samples_per_s == pytest.approx(1.0) and slow.bound_by == "compute"
    assert all(e.samples_per_s <= 10.0 + 1e-9 for e in t.estimates)
    assert "caps every row" in t.assumptions_text() and "your input_samples_per_s parameter" in t.assumptions_text()
    assert t.rows()[0]["bound by"].startswith("INPUT")
    eight = estimate_costs(w, options, CostAssumptions(mfu=1.0, gpus=8, input_samples_per_s=10.0))
    assert eight.estimates[0].samples_per_s == pytest.approx(80.0)  # the rate is per GPU
    free = estimate_costs(w, options, CostAssumptions(mfu=1.0))
    assert free.estimates[0].input_bound is None and free.estimates[0].samples_per_s == pytest.approx(100.0)
    assert "compute only" in free.assumptions_text()


def test_fastest_among_rows_the_input_ties_is_the_cheapest_and_names_the_others():
    w = Workload(flops_per_step=1e13, samples_per_step=10, samples_per_epoch=1000)
    options = [entry("dear", 200, 5.0, 2.0), entry("cheap", 100, 1.0, 0.5)]
    t = estimate_costs(w, options, CostAssumptions(mfu=1.0, input_samples_per_s=10.0))
    assert t.fastest().name == "cheap" and "as fast: dear" in t.basis(t.fastest())


def test_mfu_differs_by_model_kind_and_every_row_names_its_source():
    """GPT takes labkit's GPT-2 small run, CNN and ResNet its ResNet-50 run, each restated
    against the H100's datasheet peak from its own results file; another model needs the user's
    figure; and the rows carry the MFU used with its source."""
    from labkit.hardware import results
    from labkit.hardware.catalog import find, load_catalog
    from labkit.hardware.cost import model_mfu

    peak = find(load_catalog(), "H100 80GB").peak_bf16_tflops
    gpt, cnn, resnet = (model_mfu(m) for m in ("gpt", "cnn", "resnet"))
    conv = results.kind_mfu("convolutional", "bf16")
    assert cnn.value == resnet.value == pytest.approx(conv.achieved_tflops / peak)
    assert gpt.value == pytest.approx(results.kind_mfu("matmul", "bf16").achieved_tflops / peak)
    assert gpt.value > 2 * cnn.value  # a ResNet reaches far less of the peak than a GPT
    assert results.GPT_FILE in gpt.source and results.RESNET_FILE in cnn.source
    assert results.RESNET_FILE in cnn.text() and "ResNet-50" in cnn.source
    assert any(abs(v - cnn.value) < 1e-12 for _, v in cnn.sensitivity_cases())
    assert model_mfu("mine", 0.2).source == "your mfu parameter"
    with pytest.raises(ParameterError, match="'mfu'.*'mine'"):
        model_mfu("mine")
    w = Workload(flops_per_step=1e15, samples_per_step=1, samples_per_epoch=10)
    for name, assumed in (("gpt", gpt), ("resnet", resnet)):
        t = estimate_costs(w, load_catalog(), CostAssumptions(model=name))
        gpu_rows = [e for e in t.estimates if not e.is_tpu]
        assert {e.mfu for e in gpu_rows} == {assumed.value} and {e.mfu_source for e in gpu_rows} == {assumed.source}
        assert all(r["MFU from"] for r in t.rows())


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


def test_n_gpus_of_a_family_cost_n_shares_in_the_price_list():
    """Why a row is priced per GPU used: in the machine price list an 8-GPU machine costs eight
    of the same family's 1-GPU machine, on-demand and on Spot."""
    from labkit.hardware.catalog import load_machine_prices, machine_price

    prices = load_machine_prices()
    for family, accelerator in (("a2-highgpu", "NVIDIA_TESLA_A100"), ("a2-ultragpu", "NVIDIA_A100_80GB"),
                                ("a3-highgpu", "NVIDIA_H100_80GB")):
        one, eight = (machine_price(prices, f"{family}-{n}g", accelerator, n) for n in (1, 8))
        for spot in (False, True):
            assert eight.hourly(spot) == pytest.approx(8 * one.hourly(spot), rel=1e-6)
