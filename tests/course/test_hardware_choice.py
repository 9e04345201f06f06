"""Notebook 01's inputs to the estimate: FLOPs per sample of a course model, the input rate
(the reader's, or one loader process timed here), what a headline says it assumes, and the
time-cost plot of the rows that have a time and a cost."""

from __future__ import annotations

import pytest

from labkit.core.config import ParameterError
from labkit.course import hardware_choice
from labkit.hardware.catalog import load_catalog
from labkit.hardware.cost import CostAssumptions, Workload, estimate_costs
from tests.conftest import NOTEBOOK_DIR


def test_flops_per_sample_of_each_course_model_and_of_yours():
    from labkit.core.models import build_config, flops_per_sample

    for model in ("gpt", "cnn", "resnet"):
        assert hardware_choice.workload_flops_per_sample(model) == flops_per_sample(build_config(model, "full"))
    assert hardware_choice.workload_flops_per_sample("resnet") == pytest.approx(24.5e9, rel=0.01)  # ResNet-50: 3 × 2 × 4.1 GMAC
    assert hardware_choice.workload_flops_per_sample("mine", 3e9) == 3e9
    with pytest.raises(ParameterError, match="flops_per_sample"):
        hardware_choice.workload_flops_per_sample("mine")


def test_input_rate_is_yours_or_measured_here_with_its_spread():
    mine = hardware_choice.input_rate("gpt", 250.0)
    assert mine.samples_per_s == 250.0 and mine.source == "your input_samples_per_s parameter" and mine.passes is None
    here = hardware_choice.input_rate("gpt", repeats=2)
    assert len(here.passes.values) == 2 and here.samples_per_s == here.passes.median > 0
    assert "measured here: one loader process" in here.source
    unknown = hardware_choice.input_rate("mine")
    assert unknown.samples_per_s is None and unknown.passes is None and "pass input_samples_per_s" in unknown.source
    with pytest.raises(ParameterError, match="input_samples_per_s"):
        hardware_choice.input_rate("gpt", -1.0)


def test_token_reads_count_sequences():
    rates = hardware_choice.token_read_rates(2, sequences=8, block_size=16)
    assert len(rates) == 2 and all(r > 0 for r in rates)


def test_the_shipped_catalog_headlines_compare_equal_terms(tmp_path):
    """At one GPU no headline is the 8-GPU machine's eight GPUs or a TPU guessed at a GPU's MFU,
    and each note says what it assumes; the plot leaves out the rows without a cost."""
    w = Workload(flops_per_step=875e9 * 12, samples_per_step=12, samples_per_epoch=100_000)
    t = estimate_costs(w, load_catalog(), CostAssumptions(model="gpt", input_samples_per_s=1e4))
    for pick in (t.fastest(), t.cheapest(), t.cheapest(spot=True)):
        assert pick.gpus == 1 and not pick.is_tpu
        note = t.basis(pick)
        assert "at 1 GPU each" in note and "2 TPU rows without a TPU MFU left out" in note
        assert f"MFU {pick.mfu:.1%}" in note and pick.mfu_source in note and "compute" in note
    fig = hardware_choice.plot_time_cost(t, title="t", path=tmp_path / "cost.png")
    names = {a.get_text() for a in fig.axes[0].texts}
    assert "H100 80GB" in names and not names & {"TPU v5e", "TPU v6e"}


def test_estimate_basis_uses_the_rows_own_mfu_and_source():
    from labkit.hardware.cost import Estimate

    row = Estimate("L4", 1.0, 1.0, 1.0, 1.0, 1.0, None, None, None, mfu=0.127, mfu_source="measured: ResNet-50")
    assert hardware_choice.estimate_basis(row) == \
        "estimate: datasheet peak × 13% MFU (measured: ResNet-50), not measured on L4"
    tpu = Estimate("TPU v6e", *(None,) * 8, is_tpu=True, mfu_source="none: no TPU run measured")
    assert hardware_choice.estimate_basis(tpu) == "no estimate: none: no TPU run measured"


def test_the_notebook_says_where_prices_live():
    text = (NOTEBOOK_DIR / "01_hardware_choice.py").read_text(encoding="utf-8")
    assert "labkit/hardware/machine_prices.csv" in text
    assert "gpus = 1" in text and "tpu_mfu = None" in text and "input_samples_per_s = None" in text
