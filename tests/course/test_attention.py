"""Notebook 08's attention measurement: the written-out attention and SDPA compute the same
function, and the memory each keeps for backward grows as its structure says (T² with the score
matrix, T without). No timing is asserted."""

from __future__ import annotations

import pytest

from labkit.course import attention


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, manual_attention, sdpa_attention
    torch = pytest.importorskip("torch")
    from labkit.recipes.attention import manual_attention, sdpa_attention


def _qkv(t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 2, t, 32, generator=g, requires_grad=True) for _ in range(3)]


def test_manual_and_sdpa_give_the_same_outputs_and_gradients():
    q, k, v = _qkv(64)
    a = manual_attention(q, k, v)
    grads_a = torch.autograd.grad(a.square().sum(), (q, k, v))
    b = sdpa_attention(q, k, v)
    grads_b = torch.autograd.grad(b.square().sum(), (q, k, v))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5)


def test_kept_memory_grows_with_t_squared_by_hand_and_with_t_through_sdpa():
    kept = {t: {name: attention.saved_bytes(f, *_qkv(t)) for name, f in
                (("manual", manual_attention), ("sdpa", sdpa_attention))} for t in (64, 128, 256)}
    for t in (64, 128):
        assert 3.5 < kept[2 * t]["manual"] / kept[t]["manual"] <= 4.0
        assert 1.5 < kept[2 * t]["sdpa"] / kept[t]["sdpa"] <= 2.0
    # What the written-out version keeps beyond SDPA is one score matrix per head (softmax's
    # output, kept for the backward of both softmax and the product with v), within the bytes
    # of the T×T causal mask and SDPA's own row statistics.
    extra = kept[256]["manual"] - kept[256]["sdpa"]
    assert extra == pytest.approx(attention.score_matrix_bytes(2, 2, 256), rel=0.1)


def test_measure_gives_a_row_per_length_and_method_and_findings_from_them():
    rows = attention.measure((32, 64), batch=1, heads=2, head_dim=8, repeats=1, device="cpu")
    assert [(r["T"], r["method"]) for r in rows] == [(32, "manual"), (32, "sdpa"), (64, "manual"), (64, "sdpa")]
    assert all(r["peak_mib"] is None and r["time_low_ms"] <= r["time_ms"] <= r["time_high_ms"] for r in rows)
    assert rows[2]["score_matrix_mib"] == 4 * rows[0]["score_matrix_mib"]
    found = attention.findings(rows)
    assert found.sizes == (32, 64) and found.t_ratios == (2.0,) and found.longest == 64
    manual, sdpa = found.growth
    assert (manual.method, sdpa.method) == ("manual", "sdpa") and manual.expected(2.0) == 4 and sdpa.expected(2.0) == 2
    assert (manual.law, sdpa.law) == ("T²", "T")
    assert manual.ratios == (rows[2]["saved_mib"] / rows[0]["saved_mib"],)
    assert found.memory_ratio == rows[2]["saved_mib"] / rows[3]["saved_mib"] > 1
    assert found.mask_mib == 64 * 64 / 2**20 and 0 < found.explained <= 1.01
    assert found.peak_mib == (None, None) and found.device == "cpu"
    assert found.time is None and found.time_verdict.endswith("no verdict")  # one repeat


def test_findings_give_a_time_verdict_from_three_repeats():
    rows = [{"T": t, "method": m, "saved_mib": s, "peak_mib": None, "score_matrix_mib": 1.0, "device": "cpu",
             "times_ms": times}
            for t, m, s, times in ((64, "manual", 2.0, [10.0, 11.0, 12.0]), (64, "sdpa", 0.5, [4.0, 5.0, 4.5]))]
    found = attention.findings(rows)
    assert found.growth == () and found.t_ratios == ()
    assert found.time.ratio == pytest.approx(4.5 / 11.0) and found.time_verdict == "faster"
    assert found.memory_ratio == 4.0
    with pytest.raises(ValueError, match="rows"):
        attention.findings([])


def test_bad_input_names_the_parameter():
    with pytest.raises(ValueError, match="dtype"):
        attention.measure((32,), dtype="int8")
    with pytest.raises(ValueError, match="block_sizes"):
        attention.measure((1,))
