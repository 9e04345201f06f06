"""The mistake-beside-the-fix measurements: each returns numbers computed in the run that can
show the mistake (and would fail these tests if the mistake stopped showing). The sentences and
plots beside each are computed from the measurement they describe, so a different measurement
gives a different sentence; notebook 02's (a per-process batch), 04's two (softmax, TF32), 07's
(torch.save to a gs:// string) and 08's (training memory) return numbers and verdicts only, and the notebook writes the
sentences."""

from __future__ import annotations

import math

import matplotlib
import pytest

matplotlib.use("Agg")

from labkit.core.config import ParameterError  # noqa: E402
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
    pytest.importorskip("gcsfs")
    r = mistakes.save_to_bucket_url(tmp_path, "my-bucket/run/ckpt")
    assert r.address == "gs://my-bucket/run/ckpt" and r.gs_handler == "gcsfs.core.GCSFileSystem"
    wrong, right = r.mistake, r.fix
    assert wrong.disk_files == ("gs:/my-bucket/run/ckpt/step-00000000/state.pt",) and wrong.local_folder == "gs:"
    assert (tmp_path / "job" / "gs:" / "my-bucket" / "run" / "ckpt" / "step-00000000" / "state.pt").is_file()
    assert wrong.bucket_files == () and wrong.resumes_from is None  # a restarted job starts again
    assert right.disk_files == () and right.local_folder is None
    assert right.bucket_files == ("gs://my-bucket/run/ckpt/step-00000000/COMMITTED",
                                  "gs://my-bucket/run/ckpt/step-00000000/state.pt")
    assert (tmp_path / "buckets" / "my-bucket" / "run" / "ckpt" / "step-00000000" / "COMMITTED").is_file()
    assert right.resumes_from == "gs://my-bucket/run/ckpt/step-00000000" and right.read_back_equal
    with pytest.raises(ParameterError, match="bucket_path"):
        mistakes.save_to_bucket_url(tmp_path, "just-a-bucket")


def test_the_save_mistake_measured_is_the_recipes_mistake_lines(tmp_path, monkeypatch):
    """The lines notebook 07 shows as the change are the preemptible recipe's `save`, and the same
    function, with and without them, is what the measurement runs: the address as a path lands on
    the local disk, fsspec's file object in the bucket's filesystem, marker last."""
    import fsspec
    import torch

    from labkit.course import recipe_view
    from labkit.recipes import preemptible

    change = recipe_view.mistake_lines("preemptible", "save-to-url")
    assert change.function == "save" and change.removed[-1] == "return"
    assert 'torch.save(state, f"{address}/state.pt")' in change.removed[-2]
    assert change.added[:3] == ("fs.makedirs(folder, exist_ok=True)", 'with fs.open(f"{folder}/state.pt", "wb") as f:',
                                "    torch.save(state, f)")
    monkeypatch.chdir(tmp_path)
    fs, root = fsspec.filesystem("memory"), f"/labkit-test-{tmp_path.name}/ckpt"
    preemptible.save(fs, root, 3, {"w": torch.ones(2)}, "save-to-url")
    assert (tmp_path / "memory:" / root.strip("/") / "step-00000003" / "state.pt").is_file()
    assert preemptible.newest_committed(fs, root) is None
    preemptible.save(fs, root, 3, {"w": torch.ones(2)})
    assert preemptible.newest_committed(fs, root) == f"{root}/step-00000003"
    fs.rm(root.rsplit("/", 1)[0], recursive=True)


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
    assert r.tokens == 2 * 129 - 2 == r.sparse_grad_rows_uncoalesced
    assert 0 < r.rows_touched <= r.tokens and r.rows_touched_fraction == r.rows_touched / 4096
    assert r.dense_gradient_bytes == 4096 * 32 * 4
    assert r.dense_allreduce_bytes_per_rank == 2 * 3 / 4 * r.dense_gradient_bytes
    assert r.touched_rows_allgather_bytes_per_rank == 3 * r.rows_touched * (32 * 4 + 8)
    assert r.tied_rows_touched_fraction == 1.0  # the output layer touches every row
    assert r.sparse_over_dense == pytest.approx(r.touched_rows_allgather_bytes_per_rank / r.dense_allreduce_bytes_per_rank)
    with pytest.raises(ParameterError, match="world_size"):
        mistakes.embedding_gradient_traffic(vocab_size=64, dim=4, batch_size=1, block_size=8, world_size=0)


def test_embedding_traffic_names_the_way_that_sends_fewer_bytes_and_where_that_turns():
    from dataclasses import replace

    # 1,000 rows of 4 floats: the dense gradient is 16,000 bytes; 100 touched rows are 100 × 24 = 2,400
    # bytes, so the row gather sends more than the ring from N > 2 × 16,000 / 2,400 = 13.3 ranks on.
    r = mistakes.EmbeddingTraffic(vocab_size=1000, dim=4, tokens=200, rows_touched=100,
                                  sparse_grad_rows_uncoalesced=200, world_size=13, tied_rows_touched=1000)
    assert r.sparse_sends_more_from == 14
    assert r.fewer_bytes == mistakes.SPARSE_FEWER and r.sparse_over_dense < 1
    at_14 = replace(r, world_size=14)
    assert at_14.fewer_bytes == mistakes.DENSE_FEWER and at_14.sparse_over_dense > 1
    alone = replace(r, world_size=1)
    assert alone.fewer_bytes == mistakes.SAME_BYTES and alone.sparse_over_dense is None


def test_training_memory_counts_every_kind_of_byte():
    cfg = GPTConfig(vocab_size=1000, block_size=32, n_layer=2, n_head=2, n_embd=64)
    small, big = (mistakes.training_memory(cfg, batch_size=b) for b in (2, 4))
    n = small.parameters
    assert small.param_bytes == small.grad_bytes == small.guess_bytes == 4 * n
    tensors = 2 + 2 * 6 + 1  # embeddings, six per block, final norm (the head is tied)
    assert small.optimizer_bytes == 2 * 4 * n + 4 * tensors  # exp_avg, exp_avg_sq, step
    assert small.state_bytes_per_parameter == pytest.approx(16, abs=0.01)  # 4 + 4 + 8, whatever the batch
    assert big.state_bytes_per_parameter == small.state_bytes_per_parameter
    assert big.activation_bytes == pytest.approx(2 * small.activation_bytes, rel=0.01)
    assert big.activation_share > small.activation_share and big.tokens_per_step == 4 * 32
    half = mistakes.training_memory(cfg, batch_size=4, precision="bf16")
    assert half.activation_bytes < big.activation_bytes and half.param_bytes == big.param_bytes
    with pytest.raises(ParameterError, match="precision"):
        mistakes.training_memory(cfg, precision="fp16")


def test_a_110m_model_needs_far_more_than_parameters_times_four():
    r = mistakes.training_memory(batch_size=8)
    assert 105e6 < r.parameters < 115e6
    assert r.total_over_guess > 5 and r.activation_bytes > r.param_bytes
    assert r.total_bytes == r.param_bytes + r.grad_bytes + r.optimizer_bytes + r.activation_bytes


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_per_process_batch_taken_for_the_global_one_changes_the_curve():
    from labkit.core.train_config import TrainConfig

    job = TrainConfig(model="cnn", steps=4, batch_size=16, num_samples=128, device="cpu")
    r = mistakes.per_process_batch(job, 2)
    assert r.right_max_gap <= mistakes.RIGHT_TOLERANCE and r.right_within_tolerance
    assert len(r.single) == len(r.right) == 4 and len(r.mistaken) == 2  # the same samples, in half the steps
    assert (r.samples, r.per_process, r.mistaken_global_batch) == (64, 8, 32)
    assert r.right[0] == pytest.approx(r.single[0], abs=1e-5) and r.mistaken[0] != r.single[0]
    assert max(abs(a - b) for a, b in zip(r.single_at_equal_samples, r.mistaken, strict=True)) > 1e-3
    assert r.end_comparison is None and "no verdict" in r.verdict  # 2 matched steps


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_ddp_recipes_mistake_trains_a_global_batch_nproc_times_larger():
    """Under torchrun, `--mistake per-process-batch` gives every process the whole batch: the run
    is `labkit train`'s with twice the global batch, not the one asked for."""
    from labkit.course import recipe_view

    argv = ["--model", "cnn", "--steps", "3", "--num-samples", "128", "--device", "cpu"]
    wrong = recipe_view.run("ddp", [*argv, "--batch-size", "16", "--mistake", "per-process-batch"], nproc=2)
    assert (wrong.run["micro_batch"], wrong.run["world_size"], wrong.run["config"]["mistake"]) == (16, 2,
                                                                                                    "per-process-batch")
    engine, _ = recipe_view.engine_losses("ddp", [*argv, "--batch-size", "32"], nproc=2)
    assert max(abs(a - b) for a, b in zip(wrong.losses, engine, strict=True)) <= 1e-5


def test_the_per_process_batch_mistake_is_the_recipes_batch_line():
    from labkit.course import recipe_view

    change = recipe_view.mistake_lines("ddp", "per-process-batch")
    assert change.function == "main"
    assert change.removed == ("micro_batch = args.batch_size // args.grad_accum",)
    assert change.added == ("micro_batch = args.batch_size // (world_size * args.grad_accum)",)


def test_a_per_process_batch_demo_is_refused_by_name_before_it_runs():
    from labkit.core.train_config import TrainConfig

    for job, nproc, name in ((TrainConfig(steps=4, batch_size=16), 1, "nproc"),
                             (TrainConfig(steps=1, batch_size=16), 2, "steps"),
                             (TrainConfig(steps=4, batch_size=15), 2, "batch_size")):
        with pytest.raises(ParameterError, match=f"parameter '{name}'"):
            mistakes.per_process_batch(job, nproc)


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


def test_memory_rows_add_up():
    cfg = GPTConfig(vocab_size=1000, block_size=32, n_layer=2, n_head=2, n_embd=64)
    fp32, bf16 = (mistakes.training_memory(cfg, batch_size=2, precision=p) for p in ("fp32", "bf16"))
    rows = mistakes.memory_rows(fp32, bf16)
    assert [r["precision"] for r in rows] == ["fp32", "bf16"]
    for row, r in zip(rows, (fp32, bf16), strict=True):
        parts = row["params"] + row["grads"] + row["AdamW state"] + row["activations"]
        assert parts == pytest.approx(row["total"]) and row["total / guess"] == r.total_over_guess


def test_the_per_process_batch_verdict_comes_from_the_matched_steps():
    from labkit.core.stats import NO_DIFFERENCE

    single = tuple(2.3 - 0.05 * i for i in range(16))  # falls steadily, 16 steps of batch 64
    slow = mistakes.PerProcessBatch(2, 64, single, single, tuple(2.3 - 0.02 * k for k in range(8)))
    assert slow.single_at_equal_samples == single[1::2] and slow.right_max_gap == 0
    assert slow.matched_tail == 3 and slow.verdict == "worse"  # higher loss after the same samples
    c = slow.end_comparison
    assert c.a.values == single[-5::2] and c.b.values == slow.mistaken[-3:]
    same = mistakes.PerProcessBatch(2, 64, single, single, single[1::2])
    assert same.verdict == NO_DIFFERENCE
    assert "no verdict" in mistakes.PerProcessBatch(2, 64, single[:4], single[:4], single[1:4:2]).verdict
    off = mistakes.PerProcessBatch(2, 64, (2.3, 2.2), (2.3, 2.2 + 1e-4), (2.25,))
    assert off.right_max_gap == pytest.approx(1e-4) and not off.right_within_tolerance


def test_per_process_batch_plot_is_by_samples_seen():
    r = mistakes.PerProcessBatch(2, 64, (2.3, 2.2), (2.3, 2.2), (2.25,))
    lines = mistakes.plot_per_process_batch(r).axes[0].lines
    assert len(lines) == 3 and list(lines[2].get_xdata()) == [128] and list(lines[0].get_xdata()) == [64, 128]
    assert "2 processes × 32" in lines[1].get_label()
