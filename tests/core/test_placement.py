"""Where processes train (`labkit.core.placement`): a pure function of the process count, the GPU
count and the device asked for, checked over every combination a course demo can meet, and the
places that follow it (engine, recipes, `labkit train`, the emulator, the all-reduce benchmark)."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labkit.core.config import ParameterError
from labkit.core.placement import place


@given(processes=st.integers(1, 64), gpus=st.integers(0, 16), device=st.sampled_from(["auto", "cpu", "cuda"]))
def test_never_two_ranks_on_one_gpu(processes, gpus, device):
    try:
        where = place(processes, gpus, device=device)
    except ParameterError as e:
        assert device == "cuda" and processes > gpus and e.name == "device"
        return
    if where.on_gpu:
        assert processes <= gpus and device != "cpu"
        assert [where.device_for(r) for r in range(processes)] == [f"cuda:{r}" for r in range(processes)]
        assert where.backend == ("nccl" if processes > 1 else None)
    else:
        assert device != "cuda"
        assert {where.device_for(r) for r in range(processes)} == {"cpu"}
        assert where.backend == ("gloo" if processes > 1 else None)
    # auto uses the GPUs whenever each process can have its own
    if device == "auto":
        assert where.on_gpu == (0 < processes <= gpus)


def test_more_processes_than_gpus_run_on_the_cpu_and_say_why():
    where = place(2, 1)
    assert (where.device, where.backend) == ("cpu", "gloo")
    assert "NCCL refuses two ranks on one GPU" in where.reason and "2 processes" in where.reason


def test_cuda_without_a_gpu_names_the_device_and_the_cause():
    with pytest.raises(ParameterError, match=r"'device'.*needs a CUDA GPU, and none is visible"):
        place(1, 0, device="cuda")
    with pytest.raises(ParameterError, match=r"'device'.*2 processes need 2 GPUs; this machine has 1"):
        place(2, 1, device="cuda")


def test_bad_counts_are_refused_by_name():
    with pytest.raises(ParameterError, match="'processes'"):
        place(0, 1)
    with pytest.raises(ParameterError, match="'device'"):
        place(1, 1, device="tpu")


def test_each_emulated_node_sees_only_its_own_gpu():
    where = place(2, 4)
    assert [where.visible_devices(r) for r in range(2)] == ["0", "1"]
    assert [where.visible_devices(r, parent="5,7,9") for r in range(2)] == ["5", "7"]
    assert place(3, 2).visible_devices(2) == ""  # on the CPU: no GPU at all


def test_the_engine_puts_every_local_process_on_the_cpu_without_a_gpu_for_each():
    torch = pytest.importorskip("torch")
    from labkit.torch.distributed import DistInfo
    from labkit.torch.engine import resolve_device

    if torch.cuda.is_available():
        pytest.skip("this check is about a machine without enough GPUs")
    assert resolve_device("auto", DistInfo(rank=1, world_size=2, local_rank=1, local_world_size=2)).type == "cpu"
    with pytest.raises(ParameterError, match="'device'"):
        resolve_device("cuda", DistInfo())


@pytest.mark.slow
def test_labkit_train_says_where_auto_trains_and_refuses_cuda_on_one_line(tmp_path):
    pytest.importorskip("torch")
    import torch

    from labkit.cli import main

    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["train", "--model", "cnn", "--steps", "1", "--batch-size", "8", "--num-samples", "16",
                     "--no-progress", "--device", "cuda"])
    assert code == 2
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    assert len(lines) == 1 and "'device'" in lines[0] and "needs a CUDA GPU" in lines[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["train", "--model", "cnn", "--steps", "1", "--batch-size", "8", "--num-samples", "16",
                     "--no-progress", "--metrics-out", str(tmp_path / "m.json")])
    assert code == 0
    assert "labkit train: device auto: the CPU; no GPU is visible here" in out.getvalue()


def test_a_recipe_asked_for_cuda_without_a_gpu_exits_with_one_line():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    from labkit.recipes import mixed_precision

    with pytest.raises(SystemExit) as e:
        mixed_precision.main(["--model", "cnn", "--steps", "1", "--batch-size", "8", "--device", "cuda"])
    assert "'device'" in str(e.value.code) and "\n" not in str(e.value.code)


# ---------------------------------------------------------------- on a GPU machine


def _gpus() -> int:
    torch = pytest.importorskip("torch")
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
def test_gpu_two_processes_on_one_gpu_train_on_the_cpu_and_say_so(tmp_path):
    import subprocess
    import sys

    if _gpus() != 1:
        pytest.skip("needs a machine with exactly one GPU")
    base = ["--model", "cnn", "--steps", "2", "--batch-size", "8", "--num-samples", "32", "--no-progress"]
    run = subprocess.run([sys.executable, "-m", "labkit", "train", *base, "--nproc-per-node", "2",
                          "--metrics-out", str(tmp_path / "m.json")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "device auto: the CPU; 2 processes but 1 GPU: NCCL refuses two ranks on one GPU" in run.stdout
    recipe = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "labkit.recipes.ddp", *base[:6], "--metrics-out", str(tmp_path / "r.json")],
                            capture_output=True, text=True, timeout=300)
    assert recipe.returncode == 0, recipe.stdout + recipe.stderr
    refused = subprocess.run([sys.executable, "-m", "labkit", "train", *base, "--nproc-per-node", "2",
                              "--device", "cuda"], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "2 processes need 2 GPUs; this machine has 1" in refused.stdout


@pytest.mark.gpu
def test_gpu_out_of_memory_is_one_line_and_the_memory_comes_back():
    import torch

    from labkit.core.train_config import TrainConfig
    from labkit.torch.engine import OutOfDeviceMemory
    from labkit.torch.trainer import fit

    if not _gpus():
        pytest.skip("needs a GPU")
    too_big = TrainConfig(model="gpt", scale="full", batch_size=4096, steps=1, num_samples=4096,
                          device="cuda", progress=False)
    with pytest.raises(OutOfDeviceMemory) as e:
        fit(too_big)
    message = str(e.value)
    assert "\n" not in message and "'batch_size'" in message and "GiB" in message
    assert torch.cuda.get_device_name(0) in message
    assert torch.cuda.memory_allocated() < 2**30  # the failed run's tensors were released


@pytest.mark.gpu
def test_gpu_the_plan_probes_this_gpu_and_knows_it():
    from labkit.course import sizing

    if not _gpus():
        pytest.skip("needs a GPU")
    machine = sizing.Machine.detect()
    assert machine.has_gpu and machine.probe_tflops[machine.gpu.fastest_format()] > 1.0
    plan = sizing.plan("04", "full", machine=machine)
    assert plan["batch_size"] >= 8 and "probe" in plan.text()
