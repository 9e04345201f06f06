"""The mistake-beside-the-fix measurements: each returns numbers computed in the run that can
show the mistake (and would fail these tests if the mistake stopped showing). The sentences and
plots beside each are computed from the measurement they describe, so a different measurement
gives a different sentence; notebook 04's two (softmax, TF32) return numbers and verdicts only,
and the notebook writes the sentences."""

from __future__ import annotations

import math

import matplotlib
import pytest

matplotlib.use("Agg")

from labkit.core.models import GPTConfig  # noqa: E402
from labkit.course import mistakes  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("torch")


@pytest.mark.slow
def test_softmax_into_cross_entropy_shrinks_gradients_and_floors_the_logged_loss():
    r = mistakes.softmax_into_cross_entropy(model="gpt", steps=6, batch_size=8, optimizer="sgd")
    assert r.classes == 512
    assert r.gradient_shrink > 100  # about the class count, at uniform predictions
    assert min(r.mistaken_logged) >= r.logged_floor > 5.2
    assert r.right[-1] < r.right[0] - 0.05 and r.right_trend == "fell"  # right: learns
    assert r.mistaken_trend == "stayed flat"  # mistaken: SGD steps ~500x too small
    assert r.right[0] == r.mistaken[0]  # same weights, same first batch
    assert r.final_gap == r.mistaken[-1] - r.right[-1] > 0


def test_softmax_mistake_with_adamw_hides_in_the_logged_loss():
    r = mistakes.softmax_into_cross_entropy(model="cnn", steps=3, batch_size=8, optimizer="adamw")
    assert r.lr == 1e-3 and r.optimizer == "adamw" and len(r.mistaken_logged) == len(r.right) == 3
    assert r.logged_floor == pytest.approx(math.log(1 + (r.classes - 1) / math.e))
    with pytest.raises(ValueError, match="optimizer"):
        mistakes.softmax_into_cross_entropy(optimizer="adam")


def test_the_mistake_measured_is_the_recipes_mistake_line():
    """The lines notebook 04 shows as the change are the recipe's, and they are what the
    measurement trains with: cross_entropy of probabilities, against cross_entropy of logits."""
    import torch
    import torch.nn.functional as F

    from labkit.course import recipe_view
    from labkit.recipes import mixed_precision

    change = recipe_view.mistake_lines("mixed_precision", "softmax")
    assert change.removed == ("return F.cross_entropy(F.softmax(logits, -1), y)",)
    assert change.added == ("return F.cross_entropy(logits, y)",)
    logits, y = torch.randn(4, 10), torch.tensor([1, 2, 3, 4])
    assert torch.equal(mixed_precision.cross_entropy(logits, y, "softmax"), F.cross_entropy(logits.softmax(-1), y))
    assert torch.equal(mixed_precision.cross_entropy(logits, y), F.cross_entropy(logits, y))


def test_the_recipe_trains_with_the_mistake_on_request():
    from labkit.recipes import mixed_precision

    argv = ["--model", "gpt", "--steps", "3", "--batch-size", "4", "--num-samples", "16", "--device", "cpu"]
    right, wrong = mixed_precision.main(argv), mixed_precision.main([*argv, "--mistake", "softmax"])
    assert wrong.metrics.run["config"]["mistake"] == "softmax" and right.metrics.run["config"]["mistake"] is None
    floor = math.log(1 + (512 - 1) / math.e)  # the smoke GPT's 512 classes
    assert min(wrong.losses) >= floor
    # the logged loss of probabilities barely moves while the right loss does
    assert max(wrong.losses) - min(wrong.losses) < (max(right.losses) - min(right.losses)) / 10


@pytest.mark.slow
def test_torch_save_to_a_gs_string_lands_in_a_local_folder(tmp_path):
    r = mistakes.save_to_bucket_url(tmp_path, "my-bucket/run/model.pt")
    assert r["mistake_local_folder"] == "gs:"
    assert (tmp_path / "gs:" / "my-bucket" / "run" / "model.pt").is_file()
    assert r["mistake_files_in_workdir"] == ["gs:/my-bucket/run/model.pt"]  # nothing from the fix
    assert r["fix_url"] == "memory://my-bucket/run/model.pt" and r["fix_bytes"] > 4000
    assert r["fix_round_trip_equal"]


@pytest.mark.slow
def test_tf32_defaults_are_read_from_a_fresh_process():
    r = mistakes.tf32_defaults()
    assert r.matmul is False  # off for matmuls since torch 1.12
    assert isinstance(r.convolutions, bool)
    assert r.matmul_precision == "highest"
    assert list(r.settings())[:3] == ["torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
                                      "torch.get_float32_matmul_precision()"]
    if r.cuda:
        assert r.matmul_error_tf32 > r.matmul_error_default and r.error_ratio > 1
    else:
        assert r.matmul_error_default is None and r.error_ratio is None


def test_tf32_settings_name_tensorflow_only_where_it_is_installed():
    r = mistakes.TF32Defaults(False, True, "highest", True, None, 1e-7, 1e-4)
    assert r.error_ratio == pytest.approx(1000)
    assert "tf.config.experimental.tensor_float_32_execution_enabled()" not in r.settings()
    with_tf = mistakes.TF32Defaults(False, True, "highest", False, True, None, None)
    assert with_tf.settings()["tf.config.experimental.tensor_float_32_execution_enabled()"] is True


def test_embedding_gradient_rows_against_the_dense_all_reduce():
    r = mistakes.embedding_gradient_traffic(vocab_size=4096, dim=32, batch_size=2, block_size=128,
                                            world_size=4)
    assert r["tokens"] == 2 * 129 - 2 == r["sparse_grad_rows_uncoalesced"]
    assert 0 < r["rows_touched"] <= r["tokens"]
    assert r["dense_gradient_bytes"] == 4096 * 32 * 4
    assert r["dense_allreduce_bytes_per_rank"] == 2 * 3 / 4 * r["dense_gradient_bytes"]
    assert r["touched_rows_allgather_bytes_per_rank"] == 3 * r["rows_touched"] * (32 * 4 + 8)
    assert r["tied_embedding_rows_touched_fraction"] == 1.0  # the output layer touches every row


def test_training_memory_counts_every_kind_of_byte():
    cfg = GPTConfig(vocab_size=1000, block_size=32, n_layer=2, n_head=2, n_embd=64)
    small, big = (mistakes.training_memory(cfg, batch_size=b) for b in (2, 4))
    n = small["parameters"]
    assert small["param_bytes"] == small["grad_bytes"] == small["guess_bytes"] == 4 * n
    tensors = 2 + 2 * 6 + 1  # embeddings, six per block, final norm (the head is tied)
    assert small["optimizer_bytes"] == 2 * 4 * n + 4 * tensors  # exp_avg, exp_avg_sq, step
    assert big["activation_bytes"] == pytest.approx(2 * small["activation_bytes"], rel=0.01)
    half = mistakes.training_memory(cfg, batch_size=4, precision="bf16")
    assert half["activation_bytes"] < big["activation_bytes"]


def test_a_110m_model_needs_far_more_than_parameters_times_four():
    r = mistakes.training_memory(batch_size=8)
    assert 105e6 < r["parameters"] < 115e6
    assert r["total_over_guess"] > 5 and r["activation_bytes"] > r["param_bytes"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_per_process_batch_taken_for_the_global_one_changes_the_curve():
    r = mistakes.per_process_batch(model="cnn", steps=4, batch_size=16, nproc=2, num_samples=128)
    assert r["right_max_gap"] <= 1e-5
    assert r["mistaken_max_gap"] > 1e-3 and r["mistaken_global_batch"] == 32
    assert len(r["mistaken"]) == 2 and r["samples"] == 64  # the same samples, in half the steps
    assert r["heldout_single"] is not None and r["heldout_mistaken"] is not None
    text = mistakes.explain_per_process_batch(r)[1]
    assert f"{r['heldout_mistaken']:.3f} against {r['heldout_single']:.3f}" in text
    assert ("worse" in text) == (r["heldout_mistaken"] > r["heldout_single"])


def test_the_mistakes_harm_is_said_from_its_held_out_losses():
    r = {"nproc": 2, "batch_size": 32, "right_max_gap": 0.0, "mistaken_global_batch": 64, "samples": 640,
         "heldout_single": 2.0, "heldout_mistaken": 2.2}
    assert "2.200 against 2.000: worse" in mistakes.explain_per_process_batch(r)[1]
    assert "no worse in this short run" in mistakes.explain_per_process_batch({**r, "heldout_mistaken": 1.9})[1]


# ---------------------------------------------------------------- the sentences and plots


def test_softmax_plot_shows_both_optimizers():
    runs = {opt: mistakes.softmax_into_cross_entropy(model="gpt", steps=2, batch_size=4, optimizer=opt)
            for opt in ("sgd", "adamw")}
    fig = mistakes.plot_softmax(runs["sgd"], runs["adamw"])
    assert len(fig.axes) == 2 and "SGD" in fig.axes[0].get_title() and "512 classes" in fig.axes[1].get_title()
    assert [len(line.get_ydata()) for line in fig.axes[0].lines[:3]] == [2, 2, 2]


def test_a_learning_curve_is_told_apart_from_a_flat_one():
    flat = mistakes.SoftmaxRun("gpt", "sgd", 0.1, 512, [6.0, 5.0], [6.0, 5.999], [6.2, 6.2], 0.5, 1e-3)
    assert (flat.right_trend, flat.mistaken_trend, flat.logged_trend) == ("fell", "stayed flat", "stayed flat")
    assert flat.gradient_shrink == pytest.approx(500) and flat.final_gap == pytest.approx(0.999)
    assert mistakes.trend([6.0, 5.995]) == "stayed flat" and mistakes.trend([6.0, 5.98]) == "fell"


@pytest.mark.slow
def test_bucket_url_and_embedding_sentences(tmp_path):
    saved = mistakes.explain_save_to_bucket_url(mistakes.save_to_bucket_url(tmp_path, "b/m.pt"))
    assert "a local folder named 'gs:'" in saved[0] and "read back equal: True" in saved[1]
    emb = mistakes.embedding_gradient_traffic(vocab_size=4096, dim=32, batch_size=2, block_size=128, world_size=4)
    text = " ".join(mistakes.explain_embedding_gradient_traffic(emb))
    assert f"touched {emb['rows_touched']:,} of the 4,096" in text and "with 4 ranks" in text


def test_memory_sentences_and_rows_add_up():
    cfg = GPTConfig(vocab_size=1000, block_size=32, n_layer=2, n_head=2, n_embd=64)
    fp32, bf16 = (mistakes.training_memory(cfg, batch_size=2, precision=p) for p in ("fp32", "bf16"))
    rows = mistakes.memory_rows(fp32, bf16)
    for row in rows:
        parts = row["params"] + row["grads"] + row["AdamW state"] + row["activations"]
        assert parts == pytest.approx(row["total"])
    text = " ".join(mistakes.explain_training_memory(fp32, bf16))
    assert f"{fp32['total_over_guess']:.1f}× that" in text and "Under bf16 autocast" in text


def test_per_process_batch_sentences_and_plot():
    r = {"single": [2.3, 2.2], "right": [2.3, 2.2], "mistaken": [2.25], "nproc": 2, "batch_size": 64,
         "mistaken_global_batch": 128, "right_max_gap": 1e-7, "mistaken_max_gap": 0.05, "samples": 128,
         "heldout_single": 2.1, "heldout_mistaken": 2.2}
    text = " ".join(mistakes.explain_per_process_batch(r))
    assert "(32 each)" in text and "global batch 128" in text and "after the same 128 samples" in text
    lines = mistakes.plot_per_process_batch(r).axes[0].lines
    assert len(lines) == 3 and list(lines[2].get_xdata()) == [128]  # plotted by samples seen
