"""The torch engine on CPU: DDP equals the large batch, accumulation equals the large batch, fp16
overflow skips the step, checkpoints resume bit for bit and fall back past corrupt ones."""

from __future__ import annotations

import io
import os
import signal
import warnings
import zipfile
from dataclasses import replace

import pytest

from labkit.core import checkpoint
from labkit.core.train_config import Preempted, TrainConfig, with_vertex_dirs


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, engine, trainer, state, DataPosition, DistInfo
    torch = pytest.importorskip("torch")
    from labkit.torch import engine, state, trainer
    from labkit.torch.data import DataPosition
    from labkit.torch.distributed import DistInfo


# No held-out evaluation, except in the tests that are about it (they ask for the product's default).
BASE = TrainConfig(model="cnn", steps=4, batch_size=16, lr=1e-3, num_samples=64, eval_samples=0,
                   progress=False, device="cpu")
EVAL_SAMPLES = TrainConfig().eval_samples


def _final_params(ckpt_dir) -> dict:
    return state.from_bytes(checkpoint.load(str(ckpt_dir)).files["model.pt"])


def _assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst <= atol, f"parameters differ by {worst}"


def test_fit_writes_metrics_and_learns(tmp_path):
    cfg = replace(BASE, steps=12, metrics_out=str(tmp_path / "m.json"))
    log = trainer.fit(cfg)
    steps = log.steps
    assert [s["step"] for s in steps] == list(range(12))
    for key in ("loss", "step_time_s", "data_time_s", "samples_per_s", "mfu", "peak_memory_bytes", "lr"):
        assert key in steps[0], key
    assert sum(log.losses[-3:]) / 3 < log.losses[0]  # the synthetic task is learnable
    assert (tmp_path / "m.json").exists()


def test_a_smoke_model_learns_on_samples_it_never_saw_and_evaluating_changes_nothing(tmp_path, monkeypatch):
    """The course's smoke task: ten steps of the smoke CNN at lr 10^-2 take the held-out loss well
    under chance (ln 10); held-out loss is measured after the last step, and at each checkpoint
    inside a tuning trial that optimises it, and measuring it leaves the training losses exactly
    as they were."""
    from labkit.core import hypertune

    monkeypatch.setenv(hypertune.TUNING_METRIC_ENV, "heldout_loss")
    monkeypatch.setenv(hypertune.METRIC_FILE_ENV, str(tmp_path / "hypertune" / "output.metrics"))
    cfg = replace(BASE, steps=10, batch_size=64, lr=1e-2, num_samples=None, checkpoint_every=5,
                  eval_samples=EVAL_SAMPLES, checkpoint_dir=str(tmp_path / "ck"),
                  metrics_out=str(tmp_path / "m.json"))
    log = trainer.fit(cfg)
    data = log.to_dict()
    heldout = data["run"]["heldout"]
    assert heldout["samples"] == 256 and heldout["chance"] == pytest.approx(2.302585, abs=1e-5)
    assert heldout["loss"] < 0.8 * heldout["chance"], heldout
    assert [s["step"] for s in log.steps if "heldout_loss" in s] == [4, 9]
    assert data["summary"]["heldout_loss"] == heldout["loss"] == log.steps[-1]["heldout_loss"]
    plain = trainer.fit(replace(cfg, eval_samples=0, checkpoint_dir=str(tmp_path / "ck0"), metrics_out=None))
    assert plain.losses == log.losses and "heldout" not in plain.run
    monkeypatch.delenv(hypertune.TUNING_METRIC_ENV)  # outside a trial: after the last step only
    once = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "ck1"), metrics_out=None))
    assert [s["step"] for s in once.steps if "heldout_loss" in s] == [9] and once.losses == log.losses


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("levers", [
    {"model": "cnn", "precision": "bf16", "channels_last": True, "compile": True},
    {"model": "gpt", "precision": "bf16", "compile": True, "compile_mode": "tuned", "cuda_graph_step": True},
], ids=["cnn-bf16-channels-last-compiled", "gpt-compiled-whole-step-graph"])
def test_gpu_the_fast_levers_learn_and_evaluating_between_steps_changes_nothing(levers, tmp_path, monkeypatch):
    """On a GPU the held-out forward runs the plain module eagerly, in eval mode, beside a
    compiled step or a captured CUDA graph, at each checkpoint of a tuning trial: the run must
    still learn, report a held-out loss under chance, and train exactly as far as without it."""
    from labkit.core import hypertune

    if levers["model"] == "gpt" and torch.cuda.get_device_capability() >= (8, 9):
        levers = {**levers, "fp8_head": True}  # its eval forward is the model's own fp8 loss
    monkeypatch.setenv(hypertune.TUNING_METRIC_ENV, "heldout_loss")
    monkeypatch.setenv(hypertune.METRIC_FILE_ENV, str(tmp_path / "hypertune" / "output.metrics"))
    cfg = replace(BASE, **levers, device="cuda", steps=12, batch_size=32, lr=1e-2, num_samples=None,
                  eval_samples=EVAL_SAMPLES, checkpoint_every=4, checkpoint_dir=str(tmp_path / "ck"))
    log = trainer.fit(cfg)
    heldout = log.run["heldout"]
    assert [s["step"] for s in log.steps if "heldout_loss" in s] == [3, 7, 11]
    assert heldout["loss"] < 0.8 * heldout["chance"], heldout
    plain = trainer.fit(replace(cfg, eval_samples=0, checkpoint_dir=str(tmp_path / "ck0")))
    # Compiled kernels may reorder reductions between two runs: equal within rounding, not bits.
    assert max(abs(a - b) for a, b in zip(plain.losses, log.losses, strict=True)) < 0.05


def test_on_step_callback_sees_every_step():
    seen = []
    trainer.fit(replace(BASE, steps=3), on_step=lambda step, m: seen.append((step, m["loss"])))
    assert [s for s, _ in seen] == [0, 1, 2]


def test_batch_must_split_evenly():
    with pytest.raises(ValueError, match="batch_size"):
        engine.micro_batch_size(replace(BASE, batch_size=10, grad_accum=4), 1)


def test_accumulation_equals_large_batch(tmp_path):
    trainer.fit(replace(BASE, checkpoint_dir=str(tmp_path / "big")))
    trainer.fit(replace(BASE, grad_accum=4, checkpoint_dir=str(tmp_path / "acc")))
    # The gradients agree to float rounding (next test, 1e-6); over 4 AdamW steps of lr 1e-3, a
    # weight whose gradient is near zero turns a rounding difference into an update difference
    # of a fair fraction of lr (Adam divides by sqrt(v)), so the weights get lr / 10.
    _assert_close(_final_params(tmp_path / "big"), _final_params(tmp_path / "acc"), atol=1e-4)


def test_accumulated_gradients_match_exactly_in_one_step():
    from labkit.torch.memory import gradients

    c = engine.build(BASE, DistInfo(), torch.device("cpu"))
    from labkit.torch.data import make_dataset

    ds = make_dataset(c.model_config, 64, 0)
    x, y = ds[list(range(16))]
    whole = gradients(c, [(x, y)])
    parts = gradients(c, [(x[:8], y[:8]), (x[8:], y[8:])])
    _assert_close(whole, parts, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_two_gloo_processes_equal_one_process_with_the_doubled_batch(tmp_path, monkeypatch):
    import tempfile

    from labkit.torch.launch import run_local

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # Global batch 16: each of 2 replicas takes 8, the single process takes all 16.
    ddp = run_local(replace(BASE, checkpoint_dir=str(tmp_path / "ddp")), 2)
    assert not list(tmp_path.glob("labkit-ddp-*")), "the metrics' temporary folder was left behind"
    single = trainer.fit(replace(BASE, checkpoint_dir=str(tmp_path / "one")))
    assert ddp.run["world_size"] == 2 and ddp.run["micro_batch"] == 8
    _assert_close(_final_params(tmp_path / "ddp"), _final_params(tmp_path / "one"), atol=1e-5)
    assert ddp.losses == pytest.approx(single.losses, abs=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_with_accumulation_uses_no_sync_and_still_matches(tmp_path):
    from labkit.torch.launch import run_local

    run_local(replace(BASE, grad_accum=2, checkpoint_dir=str(tmp_path / "ddp")), 2)
    trainer.fit(replace(BASE, checkpoint_dir=str(tmp_path / "one")))
    _assert_close(_final_params(tmp_path / "ddp"), _final_params(tmp_path / "one"), atol=1e-5)


def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    cfg = replace(BASE, precision="fp16", grad_clip=None)
    c = engine.build(cfg, DistInfo(), torch.device("cpu"))
    c.scaler = c.policy.make_scaler(init_scale=2.0**100)  # any fp16 gradient overflows
    from labkit.torch.data import make_dataset

    x, y = engine.to_device(make_dataset(c.model_config, 64, 0)[list(range(16))], c, False)
    before = {k: v.clone() for k, v in c.model.state_dict().items()}
    _, skipped = trainer.train_step(c, [(x, y)], None)
    assert bool(skipped) and c.scaler.get_scale() == 2.0**99
    _assert_close(before, c.model.state_dict(), atol=0.0)  # weights untouched
    c.scaler = c.policy.make_scaler(init_scale=2.0**8)
    _, skipped = trainer.train_step(c, [(x, y)], None)
    assert not bool(skipped)
    assert any((before[k] != v).any() for k, v in c.model.state_dict().items())


def test_resume_is_bitwise_equal(tmp_path):
    # 64 samples / batch 16 = 4 steps per epoch: the run crosses two epoch boundaries.
    cfg = replace(BASE, steps=10, checkpoint_every=3, grad_accum=2, warmup_steps=4)
    full = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "full")))
    with pytest.raises(Preempted) as info:
        trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "cut"), preempt_at=5))
    assert info.value.step == 5
    rest = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "cut")))
    assert [s["step"] for s in rest.steps] == list(range(6, 10))
    assert rest.losses == full.losses[6:]  # exact, not approximate
    assert [s["lr"] for s in rest.steps] == [s["lr"] for s in full.steps[6:]]
    _assert_close(_final_params(tmp_path / "full"), _final_params(tmp_path / "cut"), atol=0.0)


@pytest.mark.slow  # loader worker processes
def test_resume_with_loader_workers_is_bitwise_equal(tmp_path):
    cfg = replace(BASE, steps=6, num_workers=1, checkpoint_every=2)
    full = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "a")))
    with pytest.raises(Preempted):
        trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "b"), preempt_at=2))
    rest = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "b")))
    assert rest.losses == full.losses[3:]


def test_checkpoint_without_marker_is_ignored(tmp_path):
    d = tmp_path / "ck"
    trainer.fit(replace(BASE, steps=4, checkpoint_every=2, checkpoint_dir=str(d)))
    (d / "step-00000003" / checkpoint.MARKER).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error", checkpoint.CheckpointWarning)
        log = trainer.fit(replace(BASE, steps=6, checkpoint_dir=str(d)))
    assert log.steps[0]["step"] == 2


def test_truncated_checkpoint_falls_back_to_previous_step(tmp_path):
    d = tmp_path / "ck"
    full = trainer.fit(replace(BASE, steps=6, checkpoint_every=2, checkpoint_dir=str(tmp_path / "ref")))
    trainer.fit(replace(BASE, steps=4, checkpoint_every=2, checkpoint_dir=str(d)))
    blob = d / "step-00000003" / "model.pt"
    blob.write_bytes(blob.read_bytes()[:100])
    with pytest.warns(checkpoint.CheckpointWarning, match=r"step 3.*model\.pt.*truncated"):
        log = trainer.fit(replace(BASE, steps=6, checkpoint_dir=str(d)))
    assert [s["step"] for s in log.steps] == [2, 3, 4, 5]
    assert log.losses == full.losses[2:]


def test_sigterm_handler_chains_the_previous_one(tmp_path):
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with pytest.raises(Preempted):
            trainer.fit(replace(BASE, steps=5, preempt_at=1, checkpoint_dir=str(tmp_path)))
        assert calls == [signal.SIGTERM]
        assert checkpoint.committed_steps(str(tmp_path)) == [1]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_reading_the_loss_one_step_late_changes_nothing(tmp_path):
    cfg = replace(BASE, steps=6, checkpoint_every=4)
    now = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "a")), read_loss_late=False)
    seen = []
    late = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "b")), read_loss_late=True,
                      on_step=lambda step, m: seen.append(step))
    assert late.losses == now.losses and seen == list(range(6))
    with pytest.raises(Preempted):
        trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "c"), preempt_at=2), read_loss_late=True)
    rest = trainer.fit(replace(cfg, checkpoint_dir=str(tmp_path / "c")), read_loss_late=True)
    assert rest.losses == now.losses[3:]


def test_background_checkpoint_writes_every_step_and_reports_failures(tmp_path):
    trainer.fit(replace(BASE, steps=5, checkpoint_every=1, keep_checkpoints=0, checkpoint_dir=str(tmp_path / "ck")))
    assert checkpoint.committed_steps(str(tmp_path / "ck")) == [0, 1, 2, 3, 4]
    trainer.fit(replace(BASE, steps=9, checkpoint_every=1, keep_checkpoints=2, checkpoint_dir=str(tmp_path / "ck")))
    assert checkpoint.committed_steps(str(tmp_path / "ck")) == [7, 8]  # the older ones deleted
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint folder should go")
    c = engine.build(BASE, DistInfo(), torch.device("cpu"))
    saver = state.Saver(str(blocker / "ck"), DistInfo())
    saver.save(c, 0, DataPosition())
    with pytest.raises(RuntimeError, match="writing a checkpoint"):
        saver.wait()


def test_snapshot_is_a_private_copy_that_keeps_tied_weights_tied():
    # The background save serialises this copy while training goes on: nothing may alias it.
    c = engine.build(replace(BASE, model="gpt"), DistInfo(), torch.device("cpu"))
    x = torch.randint(c.model_config.vocab_size, (4, c.model_config.block_size))
    trainer.train_step(c, [(x, x)], None)
    snap = state.snapshot(c, DistInfo(), 0, DataPosition())
    kept = {name: t.clone() for name, t in snap["model.pt"].items()}
    moments = [s["exp_avg"].clone() for s in snap["train.pt"]["optimizer"]["state"].values()]
    trainer.train_step(c, [(x, x)], None)
    live = c.model.state_dict()
    assert any(not torch.equal(kept[k], live[k]) for k in kept), "training did not change the weights"
    assert all(torch.equal(kept[k], snap["model.pt"][k]) for k in kept)
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, snap["train.pt"]["optimizer"]["state"].values(),
                                                             strict=True))
    assert snap["model.pt"]["wte.weight"].data_ptr() == snap["model.pt"]["lm_head.weight"].data_ptr()


def test_blobs_skip_the_zip_crc_and_leave_torchs_own_setting_alone():
    # labkit.core.checkpoint checks each blob's CRC-32C; torch.load never reads the zip's CRC-32.
    config = pytest.importorskip("torch.utils.serialization").config
    blob = state.to_bytes({"w": torch.arange(1000.0)})
    assert config.save.compute_crc32, "to_bytes left torch.save's zip CRC switched off"
    crcs = {info.CRC for info in zipfile.ZipFile(io.BytesIO(blob)).infolist()}
    assert crcs == {0}, "the zip records carry CRC-32s"
    assert torch.equal(state.from_bytes(blob)["w"], torch.arange(1000.0))


def test_tensorboard_events_are_written(tmp_path):
    trainer.fit(replace(BASE, steps=2, tensorboard_dir=str(tmp_path / "tb")))
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_the_checkpoint_folder_is_leased_while_training_and_released_after(tmp_path):
    from labkit.core import lease

    ck = str(tmp_path / "ck")
    holders = []
    trainer.fit(replace(BASE, steps=2, checkpoint_dir=ck),
               on_step=lambda step, row: holders.append(lease.read_holder(ck)))
    assert [h.pid for h in holders] == [os.getpid()] * 2
    assert lease.read_holder(ck) is None
    with pytest.raises(Preempted):
        trainer.fit(replace(BASE, steps=4, checkpoint_dir=ck, preempt_at=2))
    assert lease.read_holder(ck) is None  # a preempted run lets its restart take the folder


def test_outputs_are_checked_before_the_first_step(tmp_path):
    (tmp_path / "file").write_text("x")
    steps = []
    for bad in ({"checkpoint_dir": str(tmp_path / "file")}, {"metrics_out": str(tmp_path)},
                {"tensorboard_dir": str(tmp_path / "file" / "tb")}):
        with pytest.raises(ValueError, match=f"parameter '{next(iter(bad))}'"):
            trainer.fit(replace(BASE, **bad), on_step=lambda step, row: steps.append(step))
    assert steps == []


_CLAIM = """
import sys
from labkit.core.train_config import TrainConfig
from labkit.torch import distributed, state
info = distributed.init("cpu", distributed.info_from_env())
try:
    state.claim(TrainConfig(checkpoint_dir=sys.argv[1], device="cpu"), info)
except OSError as e:
    print(f"{type(e).__name__}: {e}")
    distributed.exit_if_replica(2)  # as the labkit command ends: gloo's teardown can abort an exiting process
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_replicas_refused_on_rank_0_all_stop_instead_of_waiting(tmp_path):
    """Rank 0 finds the checkpoint folder held by another live run; rank 1, which takes no
    lease, must not go on to wait for rank 0 in a collective: both exit, rank 1 naming rank
    0's reason."""
    import json
    import socket
    import sys
    import time
    from dataclasses import asdict

    from labkit.core import lease
    from labkit.torch.launch import launch_replicas

    ck = tmp_path / "ck"
    ck.mkdir()
    holder = lease.Holder("ana", socket.gethostname(), os.getppid(), None, time.time(), time.time(),
                          None, "theirs")
    (ck / lease.LEASE_FILE).write_text(json.dumps(asdict(holder)))
    result = launch_replicas([sys.executable, "-c", _CLAIM, str(ck)], 2, timeout_s=120, ok_codes=(2,))
    assert result.returncodes == [2, 2]
    rank0, rank1 = (r.output for r in result.results)
    assert rank0.startswith("LeaseHeld: checkpoint_dir") and "being written by another run" in rank0
    assert rank1.startswith("RefusedOnAnotherRank: rank 0 could not start: checkpoint_dir")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_preempted_and_resumed_matches_the_uninterrupted_ddp_run(tmp_path):
    from labkit.torch.launch import run_local

    cfg = replace(BASE, steps=6, checkpoint_every=2)
    full = run_local(replace(cfg, checkpoint_dir=str(tmp_path / "full")), 2)
    with pytest.raises(Preempted):
        run_local(replace(cfg, checkpoint_dir=str(tmp_path / "cut"), preempt_at=2), 2)
    ck = checkpoint.load(str(tmp_path / "cut"))
    assert ck.step == 2 and {"rng-rank0.pt", "rng-rank1.pt", "model.pt", "train.pt"} <= ck.files.keys()
    rest = run_local(replace(cfg, checkpoint_dir=str(tmp_path / "cut")), 2)
    assert rest.losses == full.losses[3:]


def test_injected_input_latency_shows_up_as_data_time():
    log = trainer.fit(replace(BASE, steps=3, input_latency_ms=30.0))
    # A lower bound only (sleep never returns early); no upper bound on a shared machine.
    assert all(s["data_time_s"] >= 0.03 for s in log.steps)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_loader_workers_give_the_same_batches_as_the_main_process():
    plain = trainer.fit(replace(BASE, steps=5))
    workers = trainer.fit(replace(BASE, steps=5, num_workers=2, input_latency_ms=5.0))
    assert workers.losses == plain.losses


def test_vertex_output_variables_fill_unset_dirs_only_through_the_gcs_mount():
    """Vertex gives gs:// addresses; a run uses them through the /gcs/ mount (no gcsfs or
    TensorFlow needed to write TensorBoard events there)."""
    env = {"AIP_CHECKPOINT_DIR": "gs://bkt/run/checkpoints/", "AIP_TENSORBOARD_LOG_DIR": "gs://bkt/run/logs/"}
    filled = with_vertex_dirs(BASE, env)
    assert (filled.checkpoint_dir, filled.tensorboard_dir) == ("/gcs/bkt/run/checkpoints/", "/gcs/bkt/run/logs/")
    assert with_vertex_dirs(replace(BASE, checkpoint_dir="/mine"), env).checkpoint_dir == "/mine"
    assert with_vertex_dirs(BASE, {}) == BASE


@pytest.mark.parametrize("model", ["cnn", "gpt"])
def test_a_small_dataset_held_in_memory_serves_the_batches_drawn_one_by_one(model, monkeypatch):
    """The engine holds a small synthetic dataset in memory (generated once): its batches must
    be the bytes the per-batch draws give, in any order, so nothing a run trains on changes."""
    import torch

    from labkit.core.models import build_config
    from labkit.torch import data

    cfg = build_config(model, "smoke")
    held = data.make_dataset(cfg, 300, 5)
    drawn = data.make_dataset(cfg, 300, 5, in_memory=False)
    assert held.held is not None and drawn.held is None
    for indices in ([0, 1, 2], [299, 7, 150, 7], list(range(256, 300))):
        for a, b in zip(held[indices], drawn[indices], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)
    monkeypatch.setattr(data, "IN_MEMORY_LIMIT_BYTES", data.source_bytes(held.source) - 1)
    assert data.make_dataset(cfg, 300, 5).held is None  # over the limit: drawn batch by batch


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["fp16", "powersgd"])
def test_a_compressed_ddp_run_preempted_and_resumed_matches_the_uninterrupted_one(tmp_path, kind):
    from labkit.torch.launch import run_local

    # PowerSGD starts compressing at its third step: a cut at step 3 resumes mid-compression,
    # where the error feedback each rank keeps decides the next gradients.
    cfg = replace(BASE, steps=6, checkpoint_every=3, grad_compression=kind)
    full = run_local(replace(cfg, checkpoint_dir=str(tmp_path / "full")), 2)
    with pytest.raises(Preempted):
        run_local(replace(cfg, checkpoint_dir=str(tmp_path / "cut"), preempt_at=3), 2)
    files = checkpoint.load(str(tmp_path / "cut")).files.keys()
    assert ({"comm-rank0.pt", "comm-rank1.pt"} <= files) == (kind == "powersgd")
    rest = run_local(replace(cfg, checkpoint_dir=str(tmp_path / "cut")), 2)
    if kind == "powersgd":  # DDP re-buckets after a process's first step: close, not bit-equal
        assert rest.losses == pytest.approx(full.losses[4:], rel=1e-3)
    else:
        assert rest.losses == full.losses[4:]


def test_a_resume_under_another_gradient_compression_is_refused_unless_allowed():
    from labkit.core.config import ParameterError
    from labkit.core.fingerprint import Resume, run_fingerprint

    saved = run_fingerprint(replace(BASE, grad_compression="powersgd"), world_size=2, data="d")
    plain = run_fingerprint(BASE, world_size=2, data="d")
    assert plain["grad_compression"] is None  # as in checkpoints written before the field existed
    assert saved["grad_compression"] == {"kind": "powersgd", "rank": BASE.powersgd_rank}
    with pytest.raises(ParameterError, match="grad_compression"):
        Resume(plain).check({"fingerprint": saved}, "ckpt")
    Resume(plain, frozenset({"grad_compression"})).check({"fingerprint": saved}, "ckpt")
    rank8 = run_fingerprint(replace(BASE, grad_compression="powersgd", powersgd_rank=8), world_size=2, data="d")
    with pytest.raises(ParameterError, match="grad_compression.rank"):
        Resume(rank8).check({"fingerprint": saved}, "ckpt")
