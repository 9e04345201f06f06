"""The PyTorch recipes give `labkit train`'s per-step losses for the same settings (fp32 within
1e-5, bf16, fp16 and fp8 within 1e-3): each recipe runs as a learner runs it (`python -m
labkit.recipes.NAME`, torchrun for ddp and fsdp), the engine with the same settings."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.core import precisions
from labkit.core.train_config import PREEMPTED_EXIT_CODE
from labkit.recipes.common import engine_config_from_argv
from labkit.train import run_replicas, run_training
from tests.conftest import launch_output, recipe_env


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch
    torch = pytest.importorskip("torch")


REPO = Path(__file__).resolve().parents[2]
SMALL = ["--batch-size", "16", "--num-samples", "64"]  # 4 steps per epoch: runs cross epochs
# What notebook 04 holds a recipe to (`labkit.course.recipe_view.Comparison.tolerance`): 1e-5 in a
# 4-byte format, 1e-3 in a narrower one.
TOLERANCE = {p.name: 1e-5 if p.bytes == 4 else 1e-3 for p in precisions.precisions("torch")}


def _recipe(name: str, *argv: str, nproc: int = 1, expect: int = 0) -> subprocess.CompletedProcess:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] \
        if nproc > 1 else []
    cmd = [sys.executable, *launcher, "-m", f"labkit.recipes.{name}", *argv]
    r = subprocess.run(cmd, env=recipe_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == expect, launch_output(r)
    return r


def _losses(path: Path) -> list[float]:
    return [s["loss"] for s in json.loads(path.read_text())["steps"]]


def _engine(argv: list[str], nproc: int = 1) -> list[float]:
    config = engine_config_from_argv(argv)
    config = replace(config, checkpoint_dir=None, preempt_at=None, checkpoint_every=0,
                     metrics_out=None, device="cpu")
    return (run_replicas(config, nproc) if nproc > 1 else run_training(config)).losses


def _assert_equal(recipe: list[float], engine: list[float], precision: str = "fp32") -> None:
    assert len(recipe) == len(engine)
    gap = max(abs(a - b) for a, b in zip(recipe, engine, strict=True))
    assert gap <= TOLERANCE[precision], f"largest loss gap {gap:.3g} ({precision})"


def test_sample_dataset_batches_are_the_engine_batches():
    """DataLoader(SampleDataset, batch_size=micro, sampler=DistributedSampler) over two epochs,
    rank 1 of 2: the engine loader's micro-batches, byte for byte (images and tokens)."""
    from torch.utils.data import DataLoader, DistributedSampler

    from labkit.core.models import build_config
    from labkit.torch.data import ResumableLoader, make_dataset, make_sample_dataset

    for model in ("cnn", "gpt"):
        cfg = build_config(model)
        engine = ResumableLoader(make_dataset(cfg, 40, 3), 4, world_size=2, rank=1, seed=3)
        samples = make_sample_dataset(cfg, 40, 3)
        sampler = DistributedSampler(samples, num_replicas=2, rank=1, shuffle=True, seed=3, drop_last=True)
        loader = DataLoader(samples, batch_size=4, sampler=sampler, drop_last=True)
        plain = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            plain += list(loader)
        for x, y in plain:
            ex, ey = next(engine)
            assert x.dtype == ex.dtype and torch.equal(x, ex) and torch.equal(y, ey)


@pytest.mark.slow
def test_mixed_precision_fp32_equals_the_engine(tmp_path):
    argv = ["--model", "cnn", "--steps", "6", *SMALL, "--metrics-out", str(tmp_path / "m.json")]
    _recipe("mixed_precision", *argv)
    data = json.loads((tmp_path / "m.json").read_text())
    assert [s["step"] for s in data["steps"]] == list(range(6))
    assert {"loss", "step_time_s", "lr"} <= data["steps"][0].keys()
    assert data["run"]["recipe"] == "mixed_precision" and data["summary"]["num_steps"] == 6
    _assert_equal(_losses(tmp_path / "m.json"), _engine(argv))


@pytest.mark.slow
@pytest.mark.parametrize("model,precision", [("gpt", "bf16"), ("cnn", "fp16"), ("gpt", "fp8")])
def test_mixed_precision_modes_equal_the_engine(tmp_path, model, precision):
    argv = ["--model", model, "--precision", precision, "--steps", "5", *SMALL,
            "--metrics-out", str(tmp_path / "m.json")]
    _recipe("mixed_precision", *argv)
    _assert_equal(_losses(tmp_path / "m.json"), _engine(argv), precision)


@pytest.mark.slow
def test_preemption_drill_then_resume_gives_the_uninterrupted_curve(tmp_path):
    """SIGTERM to itself in step 3: checkpoint, exit 143; the rerun resumes at step 4. The two
    metrics files together are the engine's uninterrupted run, and the checkpoint folders are
    committed by a marker each."""
    ckpt = tmp_path / "ckpt"
    argv = ["--model", "cnn", "--steps", "7", *SMALL, "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "2", "--preempt-at", "3"]
    _recipe("preemptible", *argv, "--metrics-out", str(tmp_path / "a.json"), expect=PREEMPTED_EXIT_CODE)
    r = _recipe("preemptible", *argv, "--metrics-out", str(tmp_path / "b.json"))
    assert "continuing with step 4" in r.stdout
    first, second = (json.loads((tmp_path / f).read_text())["steps"] for f in ("a.json", "b.json"))
    assert [s["step"] for s in first + second] == list(range(7))
    assert sorted(p.name for p in ckpt.iterdir()) == \
        ["step-00000001", "step-00000003", "step-00000005", "step-00000006"]
    assert all((p / "COMMITTED").exists() for p in ckpt.iterdir())
    _assert_equal([s["loss"] for s in first + second], _engine(argv))


@pytest.mark.gpu
def test_preemption_drill_then_resume_on_the_gpu_gives_the_uninterrupted_curve(tmp_path):
    """On CUDA the checkpoint is loaded onto the GPU, its RNG states too, which torch takes back
    only as CPU tensors: the resumed run must get past loading and match an uninterrupted one."""
    argv = ["--model", "cnn", "--steps", "5", *SMALL, "--device", "cuda", "--checkpoint-every", "2"]
    drill = ["--checkpoint-dir", str(tmp_path / "drill"), "--preempt-at", "2"]
    _recipe("preemptible", *argv, *drill, "--metrics-out", str(tmp_path / "a.json"), expect=PREEMPTED_EXIT_CODE)
    assert "continuing with step 3" in _recipe("preemptible", *argv, *drill,
                                               "--metrics-out", str(tmp_path / "b.json")).stdout
    _recipe("preemptible", *argv, "--checkpoint-dir", str(tmp_path / "whole"),
            "--metrics-out", str(tmp_path / "c.json"))
    resumed = _losses(tmp_path / "a.json") + _losses(tmp_path / "b.json")
    assert len(resumed) == 5
    _assert_equal(resumed, _losses(tmp_path / "c.json"), "bf16")  # cuDNN's kernels may differ by rounding


def test_an_uncommitted_checkpoint_is_not_resumed(tmp_path, capsys):
    """A step folder without its marker (a save cut off by the VM going away) is skipped."""
    from labkit.recipes import preemptible

    ckpt = tmp_path / "ckpt"
    argv = ["--model", "cnn", *SMALL, "--checkpoint-dir", str(ckpt)]
    preemptible.main([*argv, "--steps", "3"])
    (ckpt / "step-00000002" / "COMMITTED").unlink()
    (ckpt / "step-00000009").mkdir()
    capsys.readouterr()
    log = preemptible.main([*argv, "--steps", "4"])
    assert "resumed" not in capsys.readouterr().out  # nothing committed: started over
    assert [s["step"] for s in log.metrics.steps] == [0, 1, 2, 3]
    assert (ckpt / "step-00000003" / "COMMITTED").exists()


def test_bad_flags_fail_with_one_line_naming_the_flag(capsys):
    from labkit.recipes import ddp, mixed_precision

    with pytest.raises(SystemExit) as e:
        mixed_precision.main(["--steps", "0"])
    assert e.value.code == 2 and "parameter 'steps' must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ddp.main(["--batch-size", "30", "--grad-accum", "4"])
    assert "--batch-size 30 must divide by processes x --grad-accum" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mixed_precision.main(["--batch-size", "16", "--num-samples", "8"])
    assert "parameter 'num_samples' must hold at least one global batch" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mixed_precision.main(["--model", "cnn", "--precision", "fp8", "--device", "cpu"])
    with pytest.raises(ValueError) as engine:  # `labkit train`'s words for the same flags
        engine_config_from_argv(["--model", "cnn", "--precision", "fp8"])
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {engine.value}")


@pytest.mark.slow
def test_profile_writes_a_trace_and_keeps_the_losses(tmp_path):
    argv = ["--model", "gpt", "--steps", "5", *SMALL, "--trace-dir", str(tmp_path / "tb"),
            "--metrics-out", str(tmp_path / "m.json")]
    r = _recipe("profile", *argv)
    traces = list((tmp_path / "tb").glob("*.pt.trace.json"))
    assert len(traces) == 1 and "aten::mm" in r.stdout
    names = {e.get("name") for e in json.loads(traces[0].read_text())["traceEvents"]}
    assert {"forward", "backward", "optimizer"} <= names  # the record_function regions
    _assert_equal(_losses(tmp_path / "m.json"), _engine(argv))


@pytest.mark.slow
def test_tfrecord_shards_through_a_dataloader_equal_the_engine(tmp_path):
    """GPT tokens from the shards through a DataLoader with 2 worker processes."""
    argv = ["--model", "gpt", "--steps", "5", "--batch-size", "16", "--num-samples", "300",
            "--num-workers", "2", "--data-dir", str(tmp_path / "shards"),
            "--metrics-out", str(tmp_path / "m.json")]
    _recipe("tfrecord_pipeline", *argv)
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["run"]["shards"] == 2  # 300 records, 256 per shard
    if data["run"].get("tf_data") is not None:  # TensorFlow installed: every record once
        assert data["run"]["tf_data"]["records"] == 300
    _assert_equal(_losses(tmp_path / "m.json"), _engine(argv))


def test_tfrecord_shards_decode_to_the_synthetic_samples(tmp_path):
    """The map-style dataset over the shards returns the generator's samples, index for index."""
    import argparse

    from labkit.recipes import common, tfrecord_pipeline

    for model in ("cnn", "gpt"):
        args = argparse.Namespace(model=model, scale="smoke", batch_size=8, num_samples=300, seed=1,
                                  steps=1, lr=1e-3, warmup_steps=0, grad_clip=1.0, metrics_out=None)
        paths = tfrecord_pipeline.write_shards(args, str(tmp_path / model))
        shards = tfrecord_pipeline.TFRecordShards(paths)
        direct = common.torch_dataset(args)
        assert len(shards) == len(direct) == 300
        for i in (0, 255, 256, 299):
            for a, b in zip(shards[i], direct[i], strict=True):
                assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_under_torchrun_with_no_sync_accumulation_equals_the_engine(tmp_path):
    argv = ["--model", "gpt", "--steps", "5", *SMALL, "--grad-accum", "2",
            "--metrics-out", str(tmp_path / "m.json")]
    r = _recipe("ddp", *argv, nproc=2)
    assert r.stdout.count("step 0 loss") == 1  # rank 0 alone prints
    data = json.loads((tmp_path / "m.json").read_text())
    assert (data["run"]["world_size"], data["run"]["micro_batch"]) == (2, 4)
    _assert_equal(_losses(tmp_path / "m.json"), _engine(argv, nproc=2))


def test_ddp_without_torchrun_is_one_process():
    from labkit.recipes import ddp

    argv = ["--model", "cnn", "--steps", "4", *SMALL]
    log = ddp.main(argv)
    assert log.metrics.run["world_size"] == 1
    _assert_equal(log.losses, _engine(argv))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_under_torchrun_equals_the_engine(tmp_path):
    argv = ["--model", "gpt", "--steps", "5", *SMALL, "--metrics-out", str(tmp_path / "m.json")]
    _recipe("fsdp", *argv, nproc=2)
    _assert_equal(_losses(tmp_path / "m.json"), _engine(argv, nproc=2))


def test_adamw_keeps_sharded_parameters_apart_for_the_fused_kernel():
    """A tensor-parallel model holds DTensor shards beside plain parameters. On a GPU the recipes
    step AdamW's fused kernel, which (like the multi-tensor one) refuses a group mixing the two:
    the recipe's groups hold one kind each, and the fused kernel steps them, here on the CPU."""
    import argparse

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    from labkit.recipes import common

    own_group = not dist.is_initialized()  # a group of one, unless an earlier test left one
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
        parallelize_module(model, init_device_mesh("cpu", (1,)), {"0": ColwiseParallel()})
        optimizer, _ = common.adamw(model, argparse.Namespace(lr=1e-3, warmup_steps=0))
        kinds = [{isinstance(p, DTensor) for p in g["params"]} for g in optimizer.param_groups]
        assert kinds == [{False}, {False}, {True}, {True}]
        assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0, 0.1, 0.0]
        fused = torch.optim.AdamW([{"params": g["params"], "weight_decay": g["weight_decay"]}
                                   for g in optimizer.param_groups], fused=True)  # as on a GPU
        model(torch.randn(3, 4)).sum().backward()
        fused.step()
    finally:
        if own_group:
            dist.destroy_process_group()


def test_every_recipe_that_trains_sets_its_float32_precision_as_the_engine_does():
    """On a GPU, PyTorch runs cuDNN convolutions in TF32 and TensorFlow runs its matmuls and
    convolutions in TF32 unless told otherwise; `labkit train --precision fp32` does neither. A
    recipe that leaves the default computes something else on a GPU than the engine it is
    compared with (about 1e-3 apart within a few steps), however equal they are on a CPU."""
    for path in sorted((REPO / "labkit" / "recipes").glob("*.py")):
        source = path.read_text()
        if "common.device(" in source:
            assert "torch.backends.cudnn.allow_tf32 =" in source, path.name
        if "tf.distribute." in source:
            assert "enable_tensor_float_32_execution(" in source, path.name


@pytest.mark.gpu
def test_an_fp32_cnn_recipe_on_the_gpu_computes_what_the_engine_computes_there(tmp_path):
    argv = ["--model", "cnn", "--steps", "8", *SMALL, "--device", "cuda"]
    _recipe("preemptible", *argv, "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--metrics-out", str(tmp_path / "recipe.json"))
    config = replace(engine_config_from_argv(argv), checkpoint_dir=None, metrics_out=None, device="cuda")
    engine = run_training(config).losses
    # Not bit for bit: some cuDNN backward kernels add in a varying order. TF32 would be ~1e-3.
    assert max(abs(a - b) for a, b in zip(_losses(tmp_path / "recipe.json"), engine, strict=True)) <= 1e-4


def test_the_shards_folder_name_changes_whenever_the_samples_would(monkeypatch):
    """tfrecord_pipeline reuses shards found under this name: shards of other samples (another
    seed, size, or label noise, as written by an earlier version) must not match it."""
    from labkit.data import synthetic
    from labkit.recipes import common

    def name(*argv: str) -> str:
        return common.dataset_name(common.parse(common.parser("test"), ["--model", "cnn", *argv]))

    base = name()
    assert len({base, name("--seed", "1"), name("--num-samples", "64")}) == 3
    monkeypatch.setattr(synthetic, "TRAINING_LABEL_NOISE", 0.2)
    assert name() != base and name().endswith("-labelnoise0.2")
    monkeypatch.setattr(synthetic, "TRAINING_LABEL_NOISE", 0.0)
    assert "labelnoise" not in name()


def test_recipes_use_no_engine():
    """The technique is in the recipe: no recipe imports labkit's engines or launchers."""
    import ast

    banned = ("labkit.torch.engine", "labkit.tf.engine", "labkit.train", "labkit.torch.launch",
              "labkit.tf.launch", "labkit.torch.distributed", "labkit.vertex")
    for path in (REPO / "labkit" / "recipes").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad = [n for n in names if n.startswith(banned)]
            assert not bad, f"{path.name} imports {bad}"


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["sdpa", "manual"])
def test_attention_recipe_equals_the_engine(tmp_path, attention):
    """SDPA is what labkit's GPT calls: the engine's losses. The written-out attention is the same
    maths summed in another order; over 10 steps and seeds 0-2 its losses differed from SDPA's by
    at most 4.8e-7 here (one float32 ulp of a loss near 6), so fp32's 1e-5 holds it with room
    for the rounding that Adam carries from step to step."""
    argv = ["--model", "gpt", "--steps", "4", *SMALL, "--attention", attention,
            "--metrics-out", str(tmp_path / "m.json")]
    _recipe("attention", *argv)
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["run"]["attention"] == attention
    _assert_equal(_losses(tmp_path / "m.json"), _engine(argv))


def test_attention_swap_keeps_labkit_s_parameters_and_output():
    """The recipe's Attention layer reuses labkit's qkv and proj: same parameter names in the
    same order (so AdamW's groups match), and with SDPA the model's output unchanged."""
    from labkit.recipes import attention, common

    args = attention.common.parser("t").parse_args(["--model", "gpt"])
    labkit_model, swapped = common.torch_model(args), common.torch_model(args)
    for block in swapped.blocks:
        block.attn = attention.Attention(block.attn, attention.sdpa_attention)
    assert [n for n, _ in swapped.named_parameters()] == [n for n, _ in labkit_model.named_parameters()]
    x = torch.randint(0, 512, (2, 64))
    assert torch.equal(swapped(x), labkit_model(x))


def test_attention_flags_fail_with_one_line_naming_the_flag(capsys):
    from labkit.recipes import attention

    for argv, message in ((["--model", "cnn"], "--model cnn: only gpt has attention"),
                          (["--model", "gpt", "--attention", "manual", "--backend", "math"], "--backend math: picks an SDPA kernel"),
                          (["--model", "gpt", "--backend", "efficient", "--device", "cpu"], "--backend efficient: CUDA only")):
        with pytest.raises(SystemExit) as e:
            attention.main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
