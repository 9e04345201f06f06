"""Interop with TensorFlow's own TFRecord implementation, both ways, plain and compressed, and
the Example payload parsed by tf.io.parse_example."""

from __future__ import annotations

import os

import numpy as np
import pytest

from labkit.data import (
    CorruptRecordError,
    ImageDatasetConfig,
    ReadConfig,
    ShardConfig,
    SyntheticImages,
    decode_example,
    encode_example,
    read_batches,
    read_records,
    write_image_shards,
    write_records,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    """TensorFlow, imported when this module's first test runs rather than at collection."""
    global tf
    tf = pytest.importorskip("tensorflow")


RECORDS = [b"", b"x", os.urandom(3000), os.urandom(100_000)]
TF_COMPRESSION = {None: "", "GZIP": "GZIP", "ZLIB": "ZLIB"}


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_tensorflow_writer_read_by_labkit(tmp_path, compression):
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path, options=TF_COMPRESSION[compression]) as w:
        for r in RECORDS:
            w.write(r)
    assert list(read_records(path, compression)) == RECORDS


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_labkit_writer_read_by_tensorflow(tmp_path, compression):
    path = str(tmp_path / "lk.tfrecord")
    write_records(path, RECORDS, compression)
    ds = tf.data.TFRecordDataset(path, compression_type=TF_COMPRESSION[compression])
    assert [r.numpy() for r in ds] == RECORDS


def test_tensorflow_detects_labkit_crcs(tmp_path):
    path = str(tmp_path / "lk.tfrecord")
    write_records(path, [b"abcdefgh"])
    raw = bytearray(open(path, "rb").read())
    raw[14] ^= 1
    open(path, "wb").write(bytes(raw))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(path))


def test_example_codec_matches_tensorflow():
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    ours = encode_example({"index": 7, "label": -2, "image": image.tobytes(), "shape": [2, 3, 3],
                           "w": np.array([0.5, -1.25], np.float32), "big": [2**40, -(2**62)]})
    ex = tf.train.Example.FromString(ours)
    f = ex.features.feature
    assert list(f["index"].int64_list.value) == [7] and list(f["label"].int64_list.value) == [-2]
    assert f["image"].bytes_list.value[0] == image.tobytes()
    assert list(f["w"].float_list.value) == [0.5, -1.25]
    assert list(f["big"].int64_list.value) == [2**40, -(2**62)]
    # and TensorFlow's serialization decodes here
    back = decode_example(ex.SerializeToString())
    assert back["index"] == [7] and back["label"] == [-2] and back["big"] == [2**40, -(2**62)]
    assert bytes(back["image"][0]) == image.tobytes()
    np.testing.assert_array_equal(back["w"], [0.5, -1.25])


def test_tf_written_examples_read_as_labkit_image_batches(tmp_path):
    path = str(tmp_path / "tf-images.tfrecord")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (5, 4, 4, 3), dtype=np.uint8)
    with tf.io.TFRecordWriter(path, options="GZIP") as w:
        for i, img in enumerate(images):
            feat = {"index": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[img.tobytes()])),
                    "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=[4, 4, 3]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())
    (batch,) = read_batches(path, ReadConfig(kind="images", batch_size=8, compression="GZIP"))
    np.testing.assert_array_equal(batch["image"], images)
    assert batch["label"].tolist() == [0, 1, 0, 1, 0]


def test_labkit_image_shards_parsed_by_tf(tmp_path):
    ds = SyntheticImages(ImageDatasetConfig(num_samples=6, image_size=5, num_classes=3))
    shards = write_image_shards(tmp_path, ds, ShardConfig(records_per_shard=4, compression="ZLIB"))
    spec = {"index": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
            "image": tf.io.FixedLenFeature([], tf.string)}
    rows = tf.data.TFRecordDataset(shards.paths, compression_type="ZLIB").batch(6).map(
        lambda r: tf.io.parse_example(r, spec))
    (got,) = list(rows)
    images = tf.reshape(tf.io.decode_raw(got["image"], tf.uint8), (-1, 5, 5, 3)).numpy()
    want_images, want_labels = ds.batch(range(6))
    np.testing.assert_array_equal(images, want_images)
    np.testing.assert_array_equal(got["label"].numpy(), want_labels)
    assert got["index"].numpy().tolist() == list(range(6))


@pytest.mark.parametrize("size", [1000, 100_000])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_tensorflow_writer_many_equal_records_read_identically(tmp_path, size, compression):
    # many records of one size: labkit frames and checks them as runs, in batches too
    n = 400 if size == 1000 else 12
    recs = [bytes([i % 256]) * size for i in range(n)]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path, options=TF_COMPRESSION[compression]) as w:
        for r in recs:
            w.write(r)
    assert list(read_records(path, compression)) == recs
    (batch, *rest) = read_batches(path, ReadConfig(kind="raw", batch_size=n, compression=compression))
    assert not rest and batch["record"].shape == (n, size)
    assert [bytes(row) for row in batch["record"]] == recs


@pytest.mark.parametrize("where", [0, 200, 399])
def test_a_flip_tensorflow_rejects_is_rejected_here_at_the_same_record(tmp_path, where):
    recs = [bytes([i % 256]) * 1000 for i in range(400)]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in recs:
            w.write(r)
    raw = bytearray(open(path, "rb").read())
    at = where * 1016
    raw[at + 12 + 500] ^= 4
    open(path, "wb").write(bytes(raw))
    tf_got = []
    with pytest.raises(tf.errors.DataLossError):
        for r in tf.data.TFRecordDataset(path):
            tf_got.append(r.numpy())
    got = []
    with pytest.raises(CorruptRecordError) as e:
        for r in read_records(path):
            got.append(r)
    assert got == tf_got == recs[:where] and e.value.offset == at
