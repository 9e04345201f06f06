"""The tf.data pipeline over labkit shards: every knob keeps the data exact; worker sharding
is a partition; the latency injector slows file opens."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.core.config import ParameterError
from labkit.data import ImageDatasetConfig, ShardConfig, SyntheticImages, write_image_shards
from labkit.data.latency import StorageLatency
from labkit.data.tf_pipeline import AUTOTUNE, TFPipelineConfig, make_tf_dataset

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    """TensorFlow, imported when this module's first test runs rather than at collection."""
    global tf
    tf = pytest.importorskip("tensorflow")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    ds = SyntheticImages(ImageDatasetConfig(num_samples=30, image_size=6, num_classes=5))
    return ds, write_image_shards(tmp_path_factory.mktemp("tfs"), ds,
                                  ShardConfig(records_per_shard=4, compression="GZIP"))


def _collect(ds):
    rows = list(ds.as_numpy_iterator())
    return (np.concatenate([r["index"] for r in rows]), np.concatenate([r["image"] for r in rows]),
            np.concatenate([r["label"] for r in rows]))


@pytest.mark.parametrize("knobs", [
    {},
    {"num_parallel_reads": 3, "parallel_calls": 2, "prefetch": 2},
    {"num_parallel_reads": AUTOTUNE, "parallel_calls": AUTOTUNE, "prefetch": AUTOTUNE, "cache": True,
     "shuffle_buffer": 16},
])
def test_every_setting_yields_exactly_the_dataset(shards, knobs):
    ds, s = shards
    cfg = TFPipelineConfig(batch_size=7, compression="GZIP", **knobs)
    idx, images, labels = _collect(make_tf_dataset(s.paths, cfg))
    order = np.argsort(idx)
    assert idx[order].tolist() == list(range(30))
    want_images, want_labels = ds.batch(idx)
    np.testing.assert_array_equal(images, want_images)
    np.testing.assert_array_equal(labels, want_labels)
    if not knobs:
        assert idx.tolist() == list(range(30))


@pytest.mark.parametrize("workers", [2, 3])  # 8 files: by file for 2, by record for 3
def test_worker_sharding_is_a_partition(shards, workers):
    _, s = shards
    seen = []
    for w in range(workers):
        cfg = TFPipelineConfig(batch_size=5, compression="GZIP", num_workers=workers, worker_index=w,
                               num_parallel_reads=2)
        seen += _collect(make_tf_dataset(s.paths, cfg))[0].tolist()
    assert sorted(seen) == list(range(30))


def test_augment_keeps_shapes(shards):
    _, s = shards
    batch = next(iter(make_tf_dataset(s.paths, TFPipelineConfig(batch_size=4, compression="GZIP",
                                                                augment=True))))
    assert batch["image"].shape == (4, 6, 6, 3) and batch["image"].dtype == tf.uint8


def test_latency_injector_in_tf(shards):
    _, s = shards
    cfg = TFPipelineConfig(batch_size=30, compression="GZIP")
    slept: list[float] = []  # a fake clock: the delays are recorded, not waited for
    latency = StorageLatency(open_latency_ms=50, bandwidth_mb_s=None, sleep=slept.append)
    _collect(make_tf_dataset(s.paths, cfg, latency=latency))
    assert sorted(slept) == [pytest.approx(0.05)] * len(s.paths)  # once per file


def test_bad_config():
    with pytest.raises(ParameterError, match="num_parallel_reads"):
        TFPipelineConfig(num_parallel_reads=0)
    with pytest.raises(ParameterError, match="worker_index"):
        TFPipelineConfig(num_workers=2, worker_index=2)
    with pytest.raises(ParameterError, match="compression"):
        TFPipelineConfig(compression="XZ")
    with pytest.raises(ValueError, match="empty"):
        make_tf_dataset([])


def test_token_shards_through_tf_data(tmp_path):
    from labkit.data import SyntheticTokens, TokenDatasetConfig, write_token_shards

    ds = SyntheticTokens(TokenDatasetConfig(num_sequences=9, block_size=12, vocab_size=70000))
    shards = write_token_shards(tmp_path, ds, ShardConfig(records_per_shard=4))
    rows = list(make_tf_dataset(shards.paths, TFPipelineConfig(kind="tokens", batch_size=9)).as_numpy_iterator())
    assert len(rows) == 1 and rows[0]["tokens"].dtype == np.int64
    np.testing.assert_array_equal(rows[0]["tokens"], np.stack([ds[i] for i in range(9)]))
    assert rows[0]["index"].tolist() == list(range(9))
