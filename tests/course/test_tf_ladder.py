"""The TF precision ladder (notebook 04's TensorFlow column) and its overflow demo."""

from __future__ import annotations

import pytest

from labkit.core.config import ParameterError
from labkit.course import precision
from labkit.course.precision import loss_scaling


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    """TensorFlow, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("tensorflow")


@pytest.mark.slow
def test_ladder_rows_match_the_torch_table_keys():
    rows = precision.run_ladder(precision.PrecisionLadderConfig(model="cnn", scale="smoke", steps=2, batch_size=8,
                                                                include_compile=True, device="cpu"), "tf")
    assert [r["key"] for r in rows] == [r.key for r in precision.RUNGS["tf"]]
    assert [r["rung"] for r in rows] == [r.label for r in precision.RUNGS["tf"]]
    assert rows[0]["speedup"] == 1.0
    for r in rows:
        assert set(precision.COLUMNS["tf"]) <= set(r)
        assert r["framework"] == "tf" and r["samples_per_s"] > 0
        assert r["final_loss"] == pytest.approx(rows[0]["final_loss"], abs=0.05)
    assert rows[-1]["compile"] is True


@pytest.mark.slow
def test_overflow_demo_skips_and_halves_until_the_scale_fits():
    rows = loss_scaling.overflow_demo("tf", steps=12, init_scale=2.0**28, device="cpu")
    assert rows[0]["skipped"] and not rows[-1]["skipped"]
    for a, b in zip(rows[:-1], rows[1:], strict=True):
        if a["skipped"]:
            assert b["loss_scale"] == a["loss_scale"] / 2
        else:
            assert b["loss_scale"] >= a["loss_scale"]


def test_ladder_config_names_bad_parameters():
    with pytest.raises(ParameterError, match="steps"):
        precision.PrecisionLadderConfig(steps=1)
    with pytest.raises(ParameterError, match="framework"):
        precision.rungs("jax", False)
    assert [r.compile for r in precision.rungs("tf", False)] == [False] * 4
