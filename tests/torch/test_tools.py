"""Precision policies, the ladder and demos, the batch finder, memory checks, FSDP, launcher env."""

from __future__ import annotations

import pytest

from labkit.core.train_config import TrainConfig
from labkit.course import precision
from labkit.course.precision import loss_scaling


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, course_memory, distributed, memory, PrecisionPolicy
    torch = pytest.importorskip("torch")
    from labkit.course import memory as course_memory
    from labkit.torch import distributed, memory
    from labkit.torch.precision import PrecisionPolicy


def test_precision_policies():
    assert PrecisionPolicy.for_mode("fp32", "cuda").tf32 is False
    assert PrecisionPolicy.for_mode("tf32", "cuda").autocast_dtype is None
    bf16 = PrecisionPolicy.for_mode("bf16", "cuda")
    assert bf16.autocast_dtype == torch.bfloat16 and not bf16.grad_scaler
    assert PrecisionPolicy.for_mode("fp16", "cpu").grad_scaler
    with pytest.raises(ValueError, match="precision"):
        PrecisionPolicy.for_mode("fp4", "cuda")


def test_dist_info_from_env():
    info = distributed.info_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert (info.rank, info.world_size, info.distributed, info.is_main) == (1, 2, True, False)
    assert distributed.info_from_env({}).world_size == 1
    with pytest.raises(ValueError, match="RANK"):
        distributed.info_from_env({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        distributed.info_from_env({"WORLD_SIZE": "two"})


def test_dist_info_is_the_process_level_view_of_the_cluster():
    import json

    two_nodes = {"cluster": {"workerpool0": ["a:1"], "workerpool1": ["b:1"]},
                 "task": {"type": "workerpool1", "index": 0}}
    env = {"CLUSTER_SPEC": json.dumps(two_nodes)}
    assert distributed.info_from_env(env) == distributed.DistInfo(1, 2, 0)
    torchrun = {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert distributed.info_from_env(env | torchrun) == distributed.DistInfo(5, 8, 1)
    with pytest.raises(ValueError, match="CLUSTER_SPEC"):  # the two sources disagree
        distributed.info_from_env(env | {"WORLD_SIZE": "8", "RANK": "5"})
    ps = dict(two_nodes, cluster={**two_nodes["cluster"], "workerpool2": ["c:1"]},
              task={"type": "workerpool2", "index": 0})
    with pytest.raises(ValueError, match="role"):
        distributed.info_from_env({"CLUSTER_SPEC": json.dumps(ps)})


def test_local_replicas_read_back_as_their_ranks():
    from labkit.torch.launch import local_replica_envs

    envs = local_replica_envs(2, port=1234)
    infos = [distributed.info_from_env(e) for e in envs]
    assert [(i.rank, i.world_size, i.local_rank, i.is_main) for i in infos] == \
        [(0, 2, 0, True), (1, 2, 1, False)]
    assert [e["LABKIT_NO_PROGRESS"] for e in envs] == ["", "1"] and envs[1]["OMP_NUM_THREADS"] == "1"
    # CPU replicas on a GPU machine see no GPU (run_local does this for device="cpu").
    assert [e["CUDA_VISIBLE_DEVICES"] for e in local_replica_envs(2, port=1234, cpu_only=True)] == ["", ""]


def test_powersgd_on_cpu_gradients_in_a_process_that_sees_a_gpu_fails_in_one_line(monkeypatch):
    """torch's PowerSGD hook calls torch.cuda.synchronize on the gradients' device whenever CUDA is
    available, which raises deep inside backward for CPU gradients; labkit says so up front."""
    import torch

    from labkit.torch import compression

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="grad_compression: .*CUDA_VISIBLE_DEVICES"):
        compression.hook("powersgd", 1, "cpu")
    assert compression.hook("powersgd", 1, "cuda")[0].__name__ == "powerSGD_hook"
    # DDP refuses a hook named bf16_compress_hook without CUDA + NCCL; labkit's runs on gloo too
    assert compression.hook("bf16", 1, "cpu")[0].__name__ == "bf16_hook"


@pytest.mark.slow  # a process that imports torch
def test_a_replica_leaves_with_its_code_and_output_but_without_finalizing():
    """A process that was a DDP replica ends through `exit_if_replica` (the gloo threads torch
    keeps can abort a finalizing interpreter); any other process is left alone."""
    import subprocess
    import sys

    distributed.exit_if_replica(5)  # this test process never joined a group: a no-op
    script = ("import atexit; from labkit.torch import distributed as d; "
              "atexit.register(print, 'finalized'); d._joined_process_group = True; "
              "print('done', end=''); d.exit_if_replica(3)")
    from tests.conftest import REPO

    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (3, "done")


def test_batch_finder_backs_off_and_bisects():
    def try_batch(b):
        if b > 100:
            raise torch.OutOfMemoryError(f"CUDA out of memory (batch {b})")

    result = memory.find_max_batch(try_batch, start=8, multiple_of=4)
    assert result.batch_size == 100
    assert (128, False) in result.tries and result.tries[0] == (8, True)


def test_batch_finder_lets_other_errors_through():
    def broken(b):
        raise ValueError("shape mismatch")

    with pytest.raises(ValueError, match="shape"):
        memory.find_max_batch(broken)


def test_largest_batch_against_a_cpu_budget_is_monotonic():
    cfg = TrainConfig(model="cnn", device="cpu", progress=False)
    small = memory.largest_batch(cfg, budget_mib=4, limit=512).batch_size
    large = memory.largest_batch(cfg, budget_mib=16, limit=512).batch_size
    assert 0 < small < large
    assert memory.activation_bytes(TrainConfig(model="cnn", batch_size=large, device="cpu")) <= 16 * 2**20


def test_accumulation_gradient_gap_exact_without_batch_norm_not_with_it():
    cnn = course_memory.accumulation_gradient_gap(TrainConfig(model="cnn", batch_size=16, device="cpu"), 4)
    resnet = course_memory.accumulation_gradient_gap(TrainConfig(model="resnet", batch_size=16, device="cpu"), 4)
    assert cnn["max_rel_diff"] < 1e-5
    assert resnet["max_rel_diff"] > 1e-3  # batch statistics are per micro-batch


def test_bf16_and_checkpointing_shrink_saved_activations():
    fp32 = memory.activation_bytes(TrainConfig(model="gpt", batch_size=8, device="cpu"))
    bf16 = memory.activation_bytes(TrainConfig(model="gpt", batch_size=8, device="cpu", precision="bf16"))
    ckpt = memory.activation_bytes(TrainConfig(model="gpt", batch_size=8, device="cpu",
                                               activation_checkpointing=True))
    assert bf16 < 0.8 * fp32 and ckpt < 0.5 * fp32


def test_counting_saved_activations_keeps_none_of_them_alive():
    """Notebook 04 counts the activations of every ladder run: a count that kept them (a saved
    tensor hook returning the tensor makes a cycle through C++) filled a 140 GiB GPU in 7 runs."""
    import gc

    def live_tensors() -> int:
        gc.collect()
        return sum(isinstance(o, torch.Tensor) for o in gc.get_objects())

    cfg = TrainConfig(model="resnet", batch_size=4, device="cpu", progress=False)
    first = memory.activation_bytes(cfg)
    # Objects alive now are set aside (CPython's get_objects() leaves frozen ones out), so the two
    # counts scan what the second count made rather than a whole test process, twice (seconds).
    gc.freeze()
    try:
        before = live_tensors()
        assert memory.activation_bytes(cfg) == first > 0
        assert live_tensors() == before
    finally:
        gc.unfreeze()


def test_overflow_demo_skips_then_recovers():
    rows = loss_scaling.overflow_demo("torch", steps=14, init_scale=2.0**28, device="cpu")
    assert rows[0]["skipped"] and not rows[-1]["skipped"]
    for a, b in zip(rows, rows[1:], strict=False):
        if a["skipped"]:
            assert b["loss_scale"] == a["loss_scale"] / 2


@pytest.mark.slow
def test_ladder_rows_and_findings():
    rows = precision.run_ladder(precision.PrecisionLadderConfig(model="cnn", scale="smoke", steps=2, batch_size=8,
                                                                include_compile=False, device="cpu"))
    assert [r["key"] for r in rows] == [r.key for r in precision.rungs("torch", False, model="cnn")]
    assert "fp8" not in [r["key"] for r in rows]  # a CPU, and a cnn: no fp8 rung
    assert rows[0]["speedup"] == 1.0 and all(r["samples_per_s"] > 0 for r in rows)
    # every rung ran `repeats` times after its discarded warm-up; the row is their median
    assert all(r["repeats"] == 3 and len(r["runs_samples_per_s"]) == 3 for r in rows)
    assert all(min(r["runs_samples_per_s"]) <= r["samples_per_s"] <= max(r["runs_samples_per_s"]) for r in rows)
    assert rows[0]["vs_first"] == "reference"
    assert all(r["vs_first"] in ("faster", "slower", "no measurable difference here") for r in rows[1:])
    found = precision.findings(rows)
    assert found.best.samples_per_s == max(r["samples_per_s"] for r in rows)
    assert [f.verdict for f in found.others] == [r["vs_first"] for r in rows[1:]]
    assert all(f.activation_mib > 0 for f in (found.first, *found.others))
    assert precision.find(rows, "bf16")["rung"] == "bf16 autocast"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_holds_half_the_state_per_process_with_the_same_losses(tmp_path, monkeypatch):
    import tempfile

    from labkit.course.memory import compare_sharding

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ddp, fsdp = compare_sharding(TrainConfig(model="gpt", steps=2, batch_size=8, device="cpu"), 2)
    assert not list(tmp_path.iterdir()), "the replicas' reports were left behind"
    assert fsdp["state_mib"] == pytest.approx(ddp["state_mib"] / 2, rel=0.05)
    assert fsdp["losses"] == pytest.approx(ddp["losses"], abs=1e-5)


@pytest.mark.gpu
def test_gpu_bf16_compile_channels_last_run():
    from labkit.torch.trainer import fit

    log = fit(TrainConfig(model="resnet", steps=4, batch_size=32, precision="bf16", channels_last=True,
                          compile=True, device="cuda", progress=False))
    assert log.steps[-1]["peak_memory_bytes"] > 0 and log.steps[-1]["mfu"] > 0


@pytest.mark.gpu
def test_gpu_batch_finder_catches_real_oom():
    # cuda_graph_step is set to check that the finder's tries, each a new shape, run normal steps.
    cfg = TrainConfig(model="gpt", scale="full", batch_size=1, precision="bf16", device="cuda", progress=False,
                      cuda_graph_step=True)
    result = memory.largest_batch(cfg, limit=1024)
    assert result.batch_size >= 1 and any(not ok for _, ok in result.tries)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_nccl_ddp_two_processes(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs for a 2-process nccl job")
    from labkit.torch.launch import run_local

    log = run_local(TrainConfig(model="gpt", steps=4, batch_size=16, precision="bf16", device="cuda",
                                progress=False), 2, threads_per_process=None)
    assert log.run["world_size"] == 2 and log.run["device"] == "cuda:0"
