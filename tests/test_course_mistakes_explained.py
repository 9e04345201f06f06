"""The sentences and plots beside each mistake: computed from the measurement they describe, so a
different measurement gives a different sentence."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import matplotlib  # noqa: E402

matplotlib.use("Agg")

from labkit.core.models import GPTConfig  # noqa: E402
from labkit.course import mistakes, mistakes_explained  # noqa: E402


def test_softmax_sentences_carry_the_measured_numbers():
    runs = {opt: mistakes.softmax_into_cross_entropy(model="gpt", steps=2, batch_size=4, optimizer=opt)
            for opt in ("sgd", "adamw")}
    text = "\n".join(mistakes_explained.softmax(runs["sgd"], runs["adamw"]))
    assert f"{runs['sgd']['gradient_shrink']:.0f}× smaller" in text and "512 classes" in text
    assert f"= {runs['adamw']['logged_floor']:.3f} for C = 512" in text
    assert "SGD (lr 0.1)" in text and "AdamW (lr 0.001)" in text
    fig = mistakes_explained.plot_softmax(runs["sgd"], runs["adamw"])
    assert len(fig.axes) == 2 and "SGD" in fig.axes[0].get_title()


def test_a_learning_curve_is_told_apart_from_a_flat_one():
    flat = {"right": [6.0, 5.0], "mistaken": [6.0, 5.999], "mistaken_logged": [6.2, 6.2], "lr": 0.1,
            "final_gap": 0.999, "gradient_shrink": 500.0, "first_grad_norm_mistaken": 1e-3,
            "first_grad_norm_right": 0.5, "classes": 512, "logged_floor": 5.24}
    learning = {**flat, "mistaken": [6.0, 5.0], "final_gap": 0.0, "lr": 1e-3}
    text = " ".join(mistakes_explained.softmax(flat, learning))
    assert text.index("SGD") < text.index("hardly learned") < text.index("still learned")
    assert "stayed flat (6.000 → 5.999)" in text and "fell from 6.000 to 5.000" in text


def test_bucket_url_tf32_and_embedding_sentences(tmp_path):
    saved = mistakes_explained.save_to_bucket_url(mistakes.save_to_bucket_url(tmp_path, "b/m.pt"))
    assert "a local folder named 'gs:'" in saved[0] and "read back equal: True" in saved[1]
    tf32 = {"torch.backends.cuda.matmul.allow_tf32": False, "torch.backends.cudnn.allow_tf32": True,
            "torch.get_float32_matmul_precision()": "highest", "cuda": False}
    text = " ".join(mistakes_explained.tf32_defaults(tf32))
    assert "float32 matmuls is off" in text and "convolutions on" in text and "not measured" in text
    gpu = {**tf32, "cuda": True, "matmul_rel_error_default": 1e-7, "matmul_rel_error_tf32": 1e-4}
    assert "(1000×)" in mistakes_explained.tf32_defaults(gpu)[-1]
    emb = mistakes.embedding_gradient_traffic(vocab_size=4096, dim=32, batch_size=2, block_size=128, world_size=4)
    text = " ".join(mistakes_explained.embedding_gradient_traffic(emb))
    assert f"touched {emb['rows_touched']:,} of the 4,096" in text and "with 4 ranks" in text


def test_memory_sentences_and_rows_add_up():
    cfg = GPTConfig(vocab_size=1000, block_size=32, n_layer=2, n_head=2, n_embd=64)
    fp32, bf16 = (mistakes.training_memory(cfg, batch_size=2, precision=p) for p in ("fp32", "bf16"))
    rows = mistakes_explained.memory_rows(fp32, bf16)
    for row in rows:
        parts = row["params"] + row["grads"] + row["AdamW state"] + row["activations"]
        assert parts == pytest.approx(row["total"])
    text = " ".join(mistakes_explained.training_memory(fp32, bf16))
    assert f"{fp32['total_over_guess']:.1f}× that" in text and "Under bf16 autocast" in text


def test_per_process_batch_sentences_and_plot():
    r = {"single": [2.3, 2.2], "right": [2.3, 2.2], "mistaken": [2.3, 2.1], "nproc": 2, "batch_size": 64,
         "mistaken_global_batch": 128, "right_max_gap": 1e-7, "mistaken_max_gap": 0.1}
    text = " ".join(mistakes_explained.per_process_batch(r))
    assert "(32 each)" in text and "global batch 128" in text and "by up to 0.100" in text
    assert len(mistakes_explained.plot_per_process_batch(r).axes[0].lines) == 3
