"""GPU utilisation and memory sampled while the torch engine trains (`labkit.torch.gpu_samples`):
nothing on a CPU run, `system/` scalars and step-line fields on a GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from labkit.core.scalars import event_files, read_scalars
from labkit.core.train_config import TrainConfig


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, engine, trainer, gpu_samples
    torch = pytest.importorskip("torch")
    from labkit.torch import engine, gpu_samples, trainer


BASE = TrainConfig(model="cnn", steps=3, batch_size=8, num_samples=64, eval_samples=0, progress=False)


def test_the_nvml_device_is_the_one_cuda_visible_devices_names():
    assert gpu_samples.nvml_target(0, {}) == 0 and gpu_samples.nvml_target(1, {}) == 1
    assert gpu_samples.nvml_target(0, {"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert gpu_samples.nvml_target(1, {"CUDA_VISIBLE_DEVICES": "2, 3"}) == 3
    uuid = "GPU-5d4b0e3e-1b2c-4c6f-9f1e-0a1b2c3d4e5f"
    assert gpu_samples.nvml_target(0, {"CUDA_VISIBLE_DEVICES": uuid}) == uuid


def test_a_cpu_run_samples_nothing(tmp_path):
    pytest.importorskip("tensorboard")
    assert gpu_samples.sampler_for(torch.device("cpu")) is None
    trainer.fit(replace(BASE, device="cpu", tensorboard_dir=str(tmp_path / "tb")))
    (path,) = event_files(tmp_path / "tb")
    tags = set(read_scalars(path))
    assert "train/samples_per_s" in tags and not {t for t in tags if t.startswith("system/")}


@pytest.mark.gpu
def test_a_gpu_run_samples_utilisation_and_memory(tmp_path):
    pytest.importorskip("tensorboard")
    sampler = gpu_samples.sampler_for(torch.device("cuda", 0))
    first = sampler()
    assert first is not None and first["gpu_mem_gib"] > 0, sampler.reason
    assert 0 <= first.get("gpu_util", 0) <= 100 and sampler() is None  # the next is not due yet
    trainer.fit(replace(BASE, device="cuda", steps=20, tensorboard_dir=str(tmp_path / "tb")))
    (path,) = event_files(tmp_path / "tb")
    scalars = read_scalars(path)
    assert scalars["system/gpu_mem_gib"] and scalars["system/gpu_mem_gib"][0][0] == 0
    assert all(v > 0 for _, v in scalars["system/gpu_mem_gib"])
