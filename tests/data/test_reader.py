"""Batch decoding: runs of same-shaped records decoded at once (ExampleLayout) give exactly the
batches that decoding every record on its own gives, whatever breaks a run up."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.data import (
    ReadConfig,
    ShardConfig,
    decode_example,
    encode_example,
    read_batches,
    read_records,
)
from labkit.data.example import example_layout
from labkit.data.reader import PayloadError
from labkit.data.shards import image_example, token_example, write_shards


def _reference(paths, kind, batch_size, compression=None):
    """Batches built record by record with decode_example: what every fast path must equal."""
    rows = [decode_example(r) for r in read_records(paths, compression)]
    out = []
    for i in range(0, len(rows), batch_size):
        chunk = rows[i:i + batch_size]
        b = {"index": np.array([r["index"][0] for r in chunk], np.int64)}
        if kind == "images":
            shape = tuple(chunk[0]["shape"])
            b["label"] = np.array([r["label"][0] for r in chunk], np.int64)
            b["image"] = np.stack([np.frombuffer(r["image"][0], np.uint8).reshape(shape) for r in chunk])
        else:
            b["tokens"] = np.stack([np.frombuffer(r["tokens"][0], "<i4") for r in chunk]).astype(np.int64)
        out.append(b)
    return out


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=k)


def _images(n, side, labels=lambda i: i % 10, first_index=0):
    rng = np.random.default_rng(1)
    pool = rng.integers(0, 256, (7, side, side, 3), dtype=np.uint8)
    return lambda i: image_example(first_index + i, pool[i % 7], labels(i))


# indexes crossing 127 -> 128 and 16383 -> 16384 change the varint length mid-file (a new run
# and a new layout); negative labels are ten-byte varints
@pytest.mark.parametrize("first_index", [0, 100, 16_300])
@pytest.mark.parametrize("batch_size", [1, 7, 64])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_image_batches_equal_record_by_record_decoding(tmp_path, first_index, batch_size, compression):
    make = _images(300, 6, labels=lambda i: -(i % 3) if i % 50 == 7 else i % 10, first_index=first_index)
    s = write_shards(tmp_path, 300, make, ShardConfig(records_per_shard=120, compression=compression),
                     kind="images")
    got = list(read_batches(s.paths, ReadConfig(kind="images", batch_size=batch_size, compression=compression)))
    _assert_same(got, _reference(s.paths, "images", batch_size, compression))


def test_token_batches_equal_record_by_record_decoding(tmp_path):
    rng = np.random.default_rng(2)
    s = write_shards(tmp_path, 500, lambda i: token_example(i, rng.integers(0, 50_000, 65)),
                     ShardConfig(records_per_shard=200), kind="tokens")
    got = list(read_batches(s.paths, ReadConfig(kind="tokens", batch_size=32)))
    _assert_same(got, _reference(s.paths, "tokens", 32))


def test_records_with_an_extra_varying_feature_still_decode(tmp_path):
    # a feature outside the layout's holes that changes from record to record (a file name):
    # layouts never match, every record is decoded on its own, results are the same
    img = np.zeros((4, 4, 3), np.uint8)
    make = lambda i: encode_example({"index": i, "label": 1, "image": img.tobytes(), "shape": [4, 4, 3],  # noqa: E731
                                     "name": f"file-{i:04d}".encode()})
    s = write_shards(tmp_path, 40, make, ShardConfig(records_per_shard=40), kind="images")
    got = list(read_batches(s.paths, ReadConfig(kind="images", batch_size=16)))
    _assert_same(got, _reference(s.paths, "images", 16))


def test_a_shape_change_mid_file_is_a_payload_error_not_a_wrong_batch(tmp_path):
    small, big = np.zeros((4, 4, 3), np.uint8), np.zeros((4, 8, 3), np.uint8)
    s = write_shards(tmp_path, 20, lambda i: image_example(i, small if i < 10 else big, 0),
                     ShardConfig(records_per_shard=20), kind="images")
    with pytest.raises(PayloadError):
        list(read_batches(s.paths, ReadConfig(kind="images", batch_size=16)))
    # batches that end before the change are fine
    assert len(list(read_batches(s.paths, ReadConfig(kind="images", batch_size=10)))) == 2


def test_raw_batches_and_a_length_change(tmp_path):
    recs = [bytes([i]) * 300 for i in range(50)]
    s = write_shards(tmp_path, 50, lambda i: recs[i], ShardConfig(records_per_shard=50), kind="raw")
    batches = list(read_batches(s.paths, ReadConfig(kind="raw", batch_size=16)))
    np.testing.assert_array_equal(np.concatenate([b["record"] for b in batches]),
                                  np.frombuffer(b"".join(recs), np.uint8).reshape(50, 300))
    mixed = write_shards(tmp_path / "mixed", 20, lambda i: b"x" * (10 if i < 15 else 11),
                         ShardConfig(records_per_shard=20), kind="raw")
    with pytest.raises(PayloadError, match="one length"):
        list(read_batches(mixed.paths, ReadConfig(kind="raw", batch_size=20)))


def test_layout_matches_only_records_that_parse_alike():
    img = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    ref = image_example(5, img, 3)
    lay = example_layout(ref, ("index", "label"), ("image",))
    assert lay is not None and lay.matches(memoryview(ref))
    same_shape = image_example(120, img[::-1].copy(), 9)  # other values, same varint lengths
    assert lay.matches(memoryview(same_shape)) and lay.int64(memoryview(same_shape), "index") == 120
    longer = image_example(200, img, 3)  # index needs two varint bytes: another size
    assert not lay.matches(memoryview(longer))
    other_shape = image_example(5, np.zeros((1, 4, 3), np.uint8), 3)  # same size, other shape bytes
    assert len(other_shape) == len(ref) and not lay.matches(memoryview(other_shape))
    rows = np.stack([np.frombuffer(r, np.uint8) for r in (ref, same_shape, other_shape, ref)])
    assert lay.leading_matches(rows) == 2
    assert lay.int64_column(rows[:2], "index").tolist() == [5, 120]
    assert lay.int64_column(rows[:2], "label").tolist() == [3, 9]


def test_layout_is_refused_for_unusual_records():
    two_values = encode_example({"index": [1, 2], "image": b"ab"})
    assert example_layout(two_values, ("index",), ("image",)) is None
    missing = encode_example({"image": b"ab"})
    assert example_layout(missing, ("index",), ("image",)) is None
    assert example_layout(b"\x00garbage", ("index",), ()) is None


# --- Large records: batches and errors are the same through the default reader and through an
# opener (a stream read piece by piece, as for a remote or a latency-injected file) ----------

BIG = 182  # 182 x 182 x 3 = 99,372-byte images: ~100 KB records
CHUNKED = {"opener": lambda p: open(p, "rb", buffering=0)}


def _big_shards(tmp_path, n=12, per_shard=12, shape_at=None):
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 256, (3, BIG, BIG, 3), dtype=np.uint8)
    other = rng.integers(0, 256, (BIG, BIG - 1, 3), dtype=np.uint8)

    def make(i):
        image = other if shape_at is not None and i >= shape_at else pool[i % 3]
        return image_example(120 + i, image, -1 if i == 5 else i % 10)  # index 127 -> 128 at i = 8

    return write_shards(tmp_path, n, make, ShardConfig(records_per_shard=per_shard), kind="images")


def _batches_or_error(paths, batch_size, **kw):
    got = []
    try:
        for b in read_batches(paths, ReadConfig(kind="images", batch_size=batch_size), **kw):
            got.append({k: np.array(v) for k, v in b.items()})
    except ValueError as e:
        return got, e
    return got, None


@pytest.mark.parametrize("batch_size", [1, 5, 64])
def test_large_records_equal_through_an_opener_and_record_by_record(tmp_path, batch_size):
    s = _big_shards(tmp_path, n=20, per_shard=9)
    got, err = _batches_or_error(s.paths, batch_size)
    want, want_err = _batches_or_error(s.paths, batch_size, **CHUNKED)
    assert err is None and want_err is None
    _assert_same(got, want)
    _assert_same(got, _reference(s.paths, "images", batch_size))


@pytest.mark.parametrize("where", [0, 6, 11])
@pytest.mark.parametrize("what", [12 + 30, 12 + 5000, 12 + 99_440, 3, 9, -2])  # data bytes, length, its CRC, data CRC
def test_large_records_corruption_is_the_chunked_readers_error(tmp_path, where, what):
    s = _big_shards(tmp_path)
    path = s.paths[0]
    raw = bytearray(open(path, "rb").read())
    offsets = [r * 0 for r in range(12)]
    pos = 0
    for i in range(12):
        offsets[i] = pos
        pos += int.from_bytes(raw[pos:pos + 8], "little") + 16
    at = offsets[where]
    end = offsets[where + 1] if where + 1 < 12 else len(raw)
    raw[(at + what) if what >= 0 else (end + what)] ^= 0x04
    open(path, "wb").write(bytes(raw))
    got, err = _batches_or_error(s.paths, 5)
    want, want_err = _batches_or_error(s.paths, 5, **CHUNKED)
    _assert_same(got, want)
    assert type(err) is type(want_err) and str(err) == str(want_err) and f"offset {at}" in str(err)


@pytest.mark.parametrize("cut", [0, 5, 40_000])
def test_large_records_truncation_is_the_chunked_readers_error(tmp_path, cut):
    s = _big_shards(tmp_path)
    path = s.paths[0]
    raw = open(path, "rb").read()
    last = len(raw) - (len(raw) // 12)
    open(path, "wb").write(raw[: last + cut])
    got, err = _batches_or_error(s.paths, 5)
    want, want_err = _batches_or_error(s.paths, 5, **CHUNKED)
    _assert_same(got, want)
    assert str(err) == str(want_err)
    assert (err is None) == (cut == 0)


@pytest.mark.parametrize("shape_at,batch_size", [(5, 5), (7, 5)])  # at a batch boundary; inside one
def test_large_records_shape_change_behaves_as_chunked(tmp_path, shape_at, batch_size):
    s = _big_shards(tmp_path, shape_at=shape_at)
    got, err = _batches_or_error(s.paths, batch_size)
    want, want_err = _batches_or_error(s.paths, batch_size, **CHUNKED)
    _assert_same(got, want)
    assert type(err) is type(want_err) and str(err) == str(want_err)
    assert (err is None) == (shape_at % batch_size == 0)


def test_large_raw_records_and_unverified_reads(tmp_path):
    recs = [bytes([i]) * 70_000 for i in range(9)]
    s = write_shards(tmp_path, 9, lambda i: recs[i], ShardConfig(records_per_shard=9), kind="raw")
    (batch,) = read_batches(s.paths, ReadConfig(kind="raw", batch_size=16))
    assert [bytes(r) for r in batch["record"]] == recs
    raw = bytearray(open(s.paths[0], "rb").read())
    raw[3 * 70_016 + 100] ^= 1  # record 3's data
    open(s.paths[0], "wb").write(bytes(raw))
    (batch,) = read_batches(s.paths, ReadConfig(kind="raw", batch_size=16, verify=False))
    assert bytes(batch["record"][3]) != recs[3] and [bytes(r) for r in batch["record"][4:]] == recs[4:]
    with pytest.raises(ValueError, match=f"offset {3 * 70_016}"):
        list(read_batches(s.paths, ReadConfig(kind="raw", batch_size=16)))
