"""Throughput measurement, ceilings, the latency injector on the NumPy/torch path, and the
data-time fraction of real training steps (values are checked for sense, never for speed)."""

from __future__ import annotations

import math
import os

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
    compare,
    crc32c_pass,
    files_bytes,
    measure,
    raw_read_pass,
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
    nbytes = files_bytes([path])
    timed = compare({"raw": raw_read_pass([path]), "crc32c": crc32c_pass([path])}, nbytes=nbytes, repeats=1)
    assert {t.nbytes for t in timed.values()} == {nbytes}
    raw, crc = timed["raw"].gb_per_s, timed["crc32c"].gb_per_s
    ceiling = single_core_ceiling(raw, crc)
    assert ceiling < min(raw, crc) and ceiling == pytest.approx(1 / (1 / raw + 1 / crc))


class FakeClock:
    """Time that passes only when slept."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_latency_opener_charges_per_file_and_caps_bandwidth(shards):
    clock = FakeClock()
    slow = StorageLatency(open_latency_ms=40, bandwidth_mb_s=None, clock=clock, sleep=clock.sleep)
    batches = list(read_batches(shards.paths, ReadConfig(batch_size=24), opener=slow.opener()))
    assert len(batches[0]["index"]) == 24
    assert clock.sleeps == [pytest.approx(0.04)] * len(shards.paths)  # one open latency per shard
    clock = FakeClock()
    capped = StorageLatency(open_latency_ms=0, bandwidth_mb_s=0.5, clock=clock, sleep=clock.sleep)
    nbytes = files_bytes(shards.paths)
    list(read_batches(shards.paths, ReadConfig(batch_size=24), opener=capped.opener()))
    assert clock.now == pytest.approx(nbytes / 0.5e6)  # paced to exactly 0.5 MB/s
    assert capped.file_cost_s(1_000_000) == pytest.approx(2.0)
    with pytest.raises(ParameterError, match="open_latency_ms"):
        StorageLatency(open_latency_ms=-1)


def test_timed_epoch_separates_wait_from_compute(monkeypatch):
    import labkit.course.input_pipeline.ladder as ladder

    clock = [0.0]  # a fake clock: the loader waits 20 ms per batch, the step takes 5 ms
    def batches():
        for _ in range(4):
            clock[0] += 0.02  # waiting for the batch
            yield {"x": [0, 0]}

    def step(_batch):
        clock[0] += 0.005

    monkeypatch.setattr(ladder.time, "perf_counter", lambda: clock[0])
    rung = ladder.timed_epoch("numpy", "k", batches(), step)
    assert rung.samples == 8 and rung.seconds == pytest.approx(4 * 0.025)
    assert rung.data_fraction == pytest.approx(0.02 / 0.025)


@pytest.mark.slow
def test_torch_step_behind_the_loader(shards):
    pytest.importorskip("torch")
    from labkit.course.input_pipeline.ladder import timed_epoch
    from labkit.course.input_pipeline.step_probe import torch_image_step
    from labkit.data.torch_loader import LoaderConfig, make_loader

    step = torch_image_step(num_classes=3, width=8, device="cpu")
    loader = make_loader(shards.paths, ReadConfig(batch_size=4), LoaderConfig(num_workers=1))
    rung = timed_epoch("torch", "workers", loader, step)
    assert rung.samples == 24 and 0 < rung.data_fraction < 1


@pytest.mark.slow
def test_tf_step_behind_tf_data(shards):
    pytest.importorskip("tensorflow")
    from labkit.course.input_pipeline.step_probe import tf_image_step
    from labkit.data.tf_pipeline import TFPipelineConfig, make_tf_dataset

    step = tf_image_step(num_classes=3, width=8)
    losses = [step(b) for b in make_tf_dataset(shards.paths, TFPipelineConfig(batch_size=8))]
    # a fresh 3-class classifier starts near chance: cross-entropy about ln 3
    assert len(losses) == 3 and all(abs(float(loss) - math.log(3)) < 0.5 for loss in losses)


@pytest.mark.gpu
def test_torch_step_on_the_gpu_with_pinned_batches(shards):
    from labkit.course.input_pipeline.ladder import timed_epoch
    from labkit.course.input_pipeline.step_probe import torch_image_step
    from labkit.data.torch_loader import LoaderConfig, make_loader

    step = torch_image_step(num_classes=3, width=8)  # auto → cuda
    loader = make_loader(shards.paths, ReadConfig(batch_size=4),
                         LoaderConfig(num_workers=2, pin_memory=True, persistent_workers=True))
    rung = timed_epoch("torch", "pinned", loader, step)
    assert rung.samples == 24 and 0 < rung.data_fraction < 1
