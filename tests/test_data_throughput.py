"""Throughput measurement, ceilings, the latency injector on the NumPy/torch path, and the
data-time fraction of real training steps (values are checked for sense, never for speed)."""

from __future__ import annotations

import os
import time

import pytest

from labkit.core.config import ParameterError
from labkit.data import (
    ImageDatasetConfig,
    ReadConfig,
    ShardConfig,
    SyntheticImages,
    read_batches,
    write_image_shards,
    write_records,
)
from labkit.data.latency import StorageLatency
from labkit.data.throughput import (
    crc32c_rate,
    data_time_fraction,
    files_bytes,
    measure,
    raw_read_rate,
    single_core_ceiling,
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    ds = SyntheticImages(ImageDatasetConfig(num_samples=24, image_size=8, num_classes=3))
    return write_image_shards(tmp_path_factory.mktemp("tp"), ds, ShardConfig(records_per_shard=4))


def test_measure_counts_samples_and_bytes(shards):
    nbytes = files_bytes(shards.paths)
    t = measure("numpy", lambda: read_batches(shards.paths, ReadConfig(batch_size=5)), nbytes=nbytes,
                repeats=2)
    assert t.samples == 24 and t.nbytes == nbytes and t.seconds > 0
    assert t.samples_per_s == pytest.approx(24 / t.seconds)


def test_ceilings(tmp_path):
    path = tmp_path / "r.tfrecord"
    write_records(path, (os.urandom(100_000) for _ in range(20)))
    raw, crc = raw_read_rate([path], repeats=1), crc32c_rate([path], repeats=1)
    assert raw > 0 and crc > 0
    ceiling = single_core_ceiling(raw, crc)
    assert ceiling < min(raw, crc) and ceiling == pytest.approx(1 / (1 / raw + 1 / crc))


def test_latency_opener_charges_per_file_and_caps_bandwidth(shards):
    slow = StorageLatency(open_latency_ms=40, bandwidth_mb_s=None)
    t0 = time.perf_counter()
    batches = list(read_batches(shards.paths, ReadConfig(batch_size=24), opener=slow.opener()))
    assert time.perf_counter() - t0 >= 6 * 0.04 and len(batches[0]["index"]) == 24
    capped = StorageLatency(open_latency_ms=0, bandwidth_mb_s=0.5)  # 0.5 MB/s
    nbytes = files_bytes(shards.paths)
    t0 = time.perf_counter()
    list(read_batches(shards.paths, ReadConfig(batch_size=24), opener=capped.opener()))
    assert time.perf_counter() - t0 >= 0.9 * nbytes / 0.5e6
    assert capped.file_cost_s(1_000_000) == pytest.approx(2.0)
    with pytest.raises(ParameterError, match="open_latency_ms"):
        StorageLatency(open_latency_ms=-1)


def test_data_time_fraction_separates_wait_from_compute():
    def slow_batches():
        while True:
            time.sleep(0.02)
            yield {"x": [0]}

    dt = data_time_fraction(slow_batches(), lambda b: time.sleep(0.005), steps=4, warmup=1)
    assert dt.steps == 4 and dt.data_s >= 4 * 0.02 and dt.compute_s >= 4 * 0.005
    assert 0.5 < dt.fraction < 1


@pytest.mark.slow
def test_torch_step_behind_the_loader(shards):
    pytest.importorskip("torch")
    from labkit.course.input_pipeline.step_probe import torch_image_step
    from labkit.data.torch_loader import LoaderConfig, make_loader

    step = torch_image_step(num_classes=3, width=8, device="cpu")
    loader = make_loader(shards.paths, ReadConfig(batch_size=4), LoaderConfig(num_workers=1))
    dt = data_time_fraction(loader, step, steps=3, warmup=1)
    assert dt.steps == 3 and 0 <= dt.fraction <= 1 and dt.compute_s > 0


@pytest.mark.slow
def test_tf_step_behind_tf_data(shards):
    pytest.importorskip("tensorflow")
    from labkit.course.input_pipeline.step_probe import tf_image_step
    from labkit.data.tf_pipeline import TFPipelineConfig, make_tf_dataset

    step = tf_image_step(num_classes=3, width=8)
    losses = [step(b) for b in make_tf_dataset(shards.paths, TFPipelineConfig(batch_size=8))]
    assert len(losses) == 3 and all(loss > 0 for loss in losses)


@pytest.mark.gpu
def test_torch_step_on_the_gpu_with_pinned_batches(shards):
    from labkit.course.input_pipeline.step_probe import torch_image_step
    from labkit.data.torch_loader import LoaderConfig, make_loader

    step = torch_image_step(num_classes=3, width=8)  # auto → cuda
    loader = make_loader(shards.paths, ReadConfig(batch_size=4),
                         LoaderConfig(num_workers=2, pin_memory=True, persistent_workers=True))
    dt = data_time_fraction(loader, step, steps=3, warmup=1)
    assert dt.steps == 3 and dt.compute_s > 0
