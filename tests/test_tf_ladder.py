"""The TF precision ladder (notebook 04's TensorFlow column) and its overflow demo."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
from labkit.core.config import ParameterError  # noqa: E402
from labkit.course import precision_tf as ladder


@pytest.mark.slow
def test_ladder_rows_match_the_torch_table_keys():
    rows = ladder.ladder(ladder.LadderConfig(model="cnn", scale="smoke", steps=2, batch_size=8,
                                             include_compile=True, device="cpu"))
    assert [r["rung"] for r in rows] == [r.name for r in ladder.TF_LADDER]
    assert rows[0]["speedup"] == 1.0
    for r in rows:
        assert set(ladder.COLUMNS) <= set(r)
        assert r["framework"] == "tf" and r["samples_per_s"] > 0
        assert r["final_loss"] == pytest.approx(rows[0]["final_loss"], abs=0.05)
    assert rows[-1]["compile"] is True


@pytest.mark.slow
def test_overflow_demo_skips_and_halves_until_the_scale_fits():
    rows = ladder.overflow_demo(steps=12, init_scale=2.0**28, device="cpu")
    assert rows[0]["skipped"] and not rows[-1]["skipped"]
    for a, b in zip(rows[:-1], rows[1:], strict=True):
        if a["skipped"]:
            assert b["loss_scale"] == a["loss_scale"] / 2
        else:
            assert b["loss_scale"] >= a["loss_scale"]


def test_ladder_config_names_bad_parameters():
    with pytest.raises(ParameterError, match="steps"):
        ladder.LadderConfig(steps=1)
    assert [r.xla for r in ladder.rungs(False)] == [False] * 4
