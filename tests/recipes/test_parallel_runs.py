"""Every parallel mode of `labkit train` on real local processes (gloo): the single process's
losses at the same global batch, the calculator's bytes per rank, bytes sent counted from the
collectives, sharded checkpoints resumed after the preemption drill, gradient compression, and
each parallelism recipe equal to the engine. Two processes, one 2 × 2 case."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from labkit.core import parallelism
from labkit.core.models import GPTConfig
from labkit.core.train_config import Preempted, TrainConfig
from labkit.train import run_replicas, run_training
from tests.conftest import launch_output, recipe_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch
    torch = pytest.importorskip("torch")


BASE = TrainConfig(model="gpt", steps=4, batch_size=8, device="cpu", progress=False)
DEEPSPEED = pytest.mark.skipif(
    __import__("labkit.core.frameworks", fromlist=["x"]).is_installed("deepspeed") is False,
    reason="DeepSpeed is not installed (pip install 'labkit[deepspeed]')")


@pytest.fixture(scope="module")
def single() -> list[float]:
    return run_training(BASE).losses


def _relative_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def _check_memory(config: TrainConfig, run: dict, nproc: int) -> None:
    layout = parallelism.Layout.of(config, nproc)
    for rank, measured in enumerate(run["memory_by_rank"]):
        e = parallelism.estimate(GPTConfig(), layout, batch_size=config.batch_size, rank=rank,
                                 reshard_after_forward=config.reshard_after_forward)
        assert sum(measured.values()) == pytest.approx(e.total_bytes, rel=0.05), (config.parallel, rank)


@pytest.mark.parametrize("mode", ["zero1", "zero2", "zero3", "tp", "pp"])
def test_each_mode_gives_one_process_losses_and_the_calculators_memory(mode, single, tmp_path):
    config = replace(BASE, parallel=mode, metrics_out=str(tmp_path / "m.json"))
    log = run_replicas(config, 2)
    assert _relative_gap(log.losses, single) <= 1e-4
    run = json.loads((tmp_path / "m.json").read_text())["run"]
    assert run["parallel"]["mode"] == mode and set(run["memory_per_rank"]) == {
        "params_bytes", "grads_bytes", "optimizer_bytes"}
    _check_memory(config, run, 2)
    # bytes sent, counted from the collectives, agree with the ring model of the calculator
    e = parallelism.estimate(GPTConfig(), parallelism.Layout.of(config, 2), batch_size=8)
    assert run["comm_bytes_per_step"] == pytest.approx(e.comm_bytes_per_step, rel=0.01)
    if mode == "pp":
        assert run["pipeline_bubble"]["theory"] == pytest.approx(1 / 5)
        assert all(0 <= b < 1 for b in run["pipeline_bubble"]["measured_by_rank"])


def test_tensor_parallel_two_by_two(single, tmp_path):
    config = replace(BASE, parallel="tp", tp_degree=2, metrics_out=str(tmp_path / "m.json"))
    log = run_replicas(config, 4)
    assert _relative_gap(log.losses, single) <= 1e-4
    run = json.loads((tmp_path / "m.json").read_text())["run"]
    assert (run["parallel"]["dp"], run["parallel"]["tp"]) == (2, 2)
    _check_memory(config, run, 4)


@pytest.mark.parametrize("mode, extra", [("zero3", {}), ("pp", {"pp_schedule": "gpipe"}),
                                         ("zero2", {}), ("zero1", {}), ("tp", {})])
def test_sharded_checkpoints_resume_after_the_drill(mode, extra, single, tmp_path):
    config = replace(BASE, parallel=mode, checkpoint_dir=str(tmp_path / "ckpt"), preempt_at=2,
                     metrics_out=str(tmp_path / "m.json"), **extra)
    with pytest.raises(Preempted):
        run_replicas(config, 2)
    marker = json.loads(next((tmp_path / "ckpt").glob("step-*/COMMITTED")).read_text())
    assert set(marker["files"]) == {"rank0.pt", "rank1.pt"} and marker["meta"]["sharded"]
    log = run_replicas(config, 2)  # the rerun resumes after the checkpointed step
    assert log.run["resumed_from_step"] == 2
    assert [s["step"] for s in log.steps] == list(range(len(single)))  # steps 0-2 kept from the first run
    assert log.losses == pytest.approx(single, rel=1e-5)
    other = replace(config, parallel="zero1" if mode != "zero1" else "zero2", preempt_at=None, **{
        k: TrainConfig.pp_schedule for k in extra})
    with pytest.raises(RuntimeError, match="layout"):
        run_replicas(replace(other, steps=6), 2)


@DEEPSPEED
@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_stages_give_one_process_losses_and_resume(stage, single, tmp_path):
    config = replace(BASE, parallel=f"zero{stage}", sharding_backend="deepspeed",
                     checkpoint_dir=str(tmp_path / "ckpt"), preempt_at=2, metrics_out=str(tmp_path / "m.json"))
    with pytest.raises(Preempted):
        run_replicas(config, 2)
    log = run_replicas(config, 2)  # the metrics file keeps the first attempt's steps 0-2
    assert _relative_gap(log.losses, single) <= 1e-3
    assert log.run["parallel"]["sharding_backend"] == "deepspeed"


def test_gradient_compression_sends_fewer_bytes(single, tmp_path):
    sent = {}
    for kind in ("fp16", "powersgd"):
        config = replace(BASE, steps=6, grad_compression=kind, metrics_out=str(tmp_path / f"{kind}.json"))
        log = run_replicas(config, 2)
        assert _relative_gap(log.losses[:4], single) <= 2e-2  # rounding / low rank: close, not equal
        sent[kind] = json.loads((tmp_path / f"{kind}.json").read_text())["run"]["comm_bytes_per_step"]
    full = parallelism.estimate(GPTConfig(), parallelism.Layout("ddp", 2)).comm_bytes_per_step
    assert sent["fp16"] == pytest.approx(full / 2, rel=0.01)
    assert sent["powersgd"] < full / 10


@pytest.mark.parametrize("recipe, argv", [
    ("zero", ["--stage", "2"]),
    ("tensor_parallel", []), ("pipeline", ["--schedule", "gpipe", "--microbatches", "2"]),
    pytest.param("deepspeed_zero", ["--stage", "2"], marks=DEEPSPEED)])
def test_parallel_recipes_equal_the_engine(recipe, argv, tmp_path):
    from labkit.course.recipe_view import engine_losses

    flags = ["--model", "gpt", "--steps", "4", "--batch-size", "8", *argv]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", f"labkit.recipes.{recipe}", *flags, "--metrics-out", str(tmp_path / "m.json")]
    r = subprocess.run(cmd, env=recipe_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, launch_output(r)
    recipe_losses = [s["loss"] for s in json.loads((tmp_path / "m.json").read_text())["steps"]]
    engine, _ = engine_losses(recipe, flags, nproc=2)
    assert max(abs(a - b) for a, b in zip(recipe_losses, engine, strict=True)) <= 1e-5


@DEEPSPEED
@pytest.mark.parametrize("argv", [["--stage", "2", "--offload-optimizer", "cpu"],
                                  ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"]],
                         ids=["zero2-offload-optimizer", "zero3-offload-all"])
def test_deepspeed_offload_gives_the_engines_losses_and_moves_the_optimizer_state(argv, tmp_path):
    """ZeRO-Offload moves where the update runs, not what it computes: the offloaded recipe gives
    `labkit train --parallel zeroN --sharding-backend deepspeed`'s losses (the same run without
    offload equals the engine to 1e-5 above), and each rank's optimizer state (fp32 master
    partition + two moments, 12 bytes a parameter over the ranks) is in host memory."""
    from labkit.course.recipe_view import engine_losses

    flags = ["--model", "gpt", "--steps", "4", "--batch-size", "8", *argv]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "labkit.recipes.deepspeed_zero", *flags, "--metrics-out", str(tmp_path / "m.json")]
    r = subprocess.run(cmd, env=recipe_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, launch_output(r)
    metrics = json.loads((tmp_path / "m.json").read_text())
    engine, _ = engine_losses("deepspeed_zero", flags, nproc=2)
    assert _relative_gap([s["loss"] for s in metrics["steps"]], engine) <= 1e-3
    assert metrics["run"]["offload"]["optimizer"] == "cpu"
    held = metrics["run"]["optimizer_bytes_by_device"]
    assert len(held) == 2 and all(set(rank) == {"cpu"} for rank in held)  # nothing left on a device
    params = parallelism.GPTShape.of(GPTConfig()).total
    assert sum(rank["cpu"] for rank in held) == pytest.approx(12 * params, rel=0.01)


GPU_RECIPES = [("zero", ["--stage", "1"]), ("zero", ["--stage", "2"]), ("zero", ["--stage", "3"]),
               ("tensor_parallel", []), ("pipeline", ["--microbatches", "2"]),
               pytest.param("deepspeed_zero", ["--stage", "2"], marks=DEEPSPEED)]


@pytest.mark.gpu
@pytest.mark.parametrize("recipe, argv", GPU_RECIPES, ids=lambda v: "-".join(v) if isinstance(v, list) else v)
def test_parallel_recipes_train_on_gpus_with_nccl(recipe, argv, tmp_path):
    """The code a learner copies runs on their GPUs unchanged: one process per GPU (up to two; on
    a one-GPU machine a group of one), NCCL, and the losses the same recipe gives with as many
    gloo processes on the CPU, within fp32's GPU/CPU rounding. (On the CPU each recipe equals
    the engine: test_parallel_recipes_equal_the_engine; the engine refuses a parallel mode in
    one process, so it is no reference here.)"""
    nproc = min(2, torch.cuda.device_count())
    flags = ["--model", "gpt", "--steps", "4", "--batch-size", "8", *argv]
    losses = {}
    for device in ("cuda", "cpu"):
        out = tmp_path / f"{device}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", f"labkit.recipes.{recipe}", *flags, "--device", device, "--metrics-out", str(out)]
        r = subprocess.run(cmd, env=recipe_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, launch_output(r)
        metrics = json.loads(out.read_text())
        assert metrics["run"]["device"].startswith(device), metrics["run"]["device"]
        losses[device] = [s["loss"] for s in metrics["steps"]]
    assert _relative_gap(losses["cuda"], losses["cpu"]) <= 1e-3
