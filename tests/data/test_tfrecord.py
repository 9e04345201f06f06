"""The raw TFRecord layer: round trips, CRC verification with file and offset, compression,
bad input, and the shard writer."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from labkit.core.config import ParameterError
from labkit.data import (
    CorruptRecordError,
    ImageDatasetConfig,
    ReadConfig,
    ShardConfig,
    SyntheticImages,
    SyntheticTokens,
    TokenDatasetConfig,
    count_records,
    masked_crc32c,
    read_batches,
    read_records,
    write_image_shards,
    write_records,
    write_token_shards,
)
from labkit.data.tfrecord import iter_views

RECORDS = [b"", b"a", b"hello world", bytes(range(256)) * 40, os.urandom(100_000)]


def test_masked_crc_known_value():
    import crc32c

    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value

    c = crc32c.crc32c(b"abc")
    assert masked_crc32c(b"abc") == ((((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_round_trip(tmp_path, compression):
    path = tmp_path / "r.tfrecord"
    assert write_records(path, RECORDS, compression=compression) == len(RECORDS)
    assert list(read_records(path, compression=compression)) == RECORDS
    assert list(read_records([str(path), str(path)], compression)) == RECORDS * 2
    assert count_records(path, compression) == len(RECORDS)


def test_file_layout_is_tfrecord_framing(tmp_path):
    path = tmp_path / "r.tfrecord"
    write_records(path, [b"xyz"])
    raw = path.read_bytes()
    assert len(raw) == 8 + 4 + 3 + 4
    assert int.from_bytes(raw[:8], "little") == 3
    assert int.from_bytes(raw[8:12], "little") == masked_crc32c(raw[:8])
    assert raw[12:15] == b"xyz"
    assert int.from_bytes(raw[15:], "little") == masked_crc32c(b"xyz")


def test_records_larger_than_the_read_buffer(tmp_path):
    path = tmp_path / "big.tfrecord"
    recs = [os.urandom(5000), os.urandom(70_000), b"z", os.urandom(3)]
    write_records(path, recs)
    # an opener forces the buffered (read) path instead of the memory-mapped one
    views = iter_views(str(path), chunk_bytes=64, opener=lambda p: open(p, "rb"))
    assert [bytes(v) for v in views] == recs
    assert [bytes(v) for v in iter_views(str(path))] == recs


# Both reading paths: memory-mapped (local, uncompressed) and buffered (any opener).
BUFFERED = {"opener": lambda p: open(p, "rb", buffering=0)}


def _offsets(records):
    out, pos = [], 0
    for r in records:
        out.append(pos)
        pos += 16 + len(r)
    return out


@pytest.mark.parametrize("kw", [{}, BUFFERED], ids=["mmap", "buffered"])
def test_flipped_data_byte_names_file_and_offset(tmp_path, kw):
    path = tmp_path / "bad.tfrecord"
    recs = [b"first record", b"second record", b"third"]
    write_records(path, recs)
    raw = bytearray(path.read_bytes())
    bad_at = _offsets(recs)[1]
    raw[bad_at + 12 + 3] ^= 0x01
    path.write_bytes(bytes(raw))
    got = []
    with pytest.raises(CorruptRecordError) as e:
        for r in read_records(path, **kw):
            got.append(r)
    assert got == recs[:1]
    assert e.value.path == str(path) and e.value.offset == bad_at
    assert str(path) in str(e.value) and f"offset {bad_at}" in str(e.value)
    assert "data CRC" in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("kw", [{}, BUFFERED], ids=["mmap", "buffered"])
def test_corrupt_length_is_caught_by_length_crc(tmp_path, kw):
    path = tmp_path / "bad.tfrecord"
    recs = [b"aaaa", b"bbbb"]
    write_records(path, recs)
    raw = bytearray(path.read_bytes())
    raw[_offsets(recs)[1]] ^= 0x04
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError, match=f"offset {_offsets(recs)[1]}.*length CRC"):
        list(read_records(path, **kw))


@pytest.mark.parametrize("cut", [5, 12, 20, 1])
@pytest.mark.parametrize("kw", [{}, BUFFERED], ids=["mmap", "buffered"])
def test_truncated_file(tmp_path, kw, cut):
    path = tmp_path / "trunc.tfrecord"
    recs = [b"x" * 30, b"y" * 30]
    write_records(path, recs)
    raw = path.read_bytes()
    path.write_bytes(raw[:-cut])
    with pytest.raises(CorruptRecordError) as e:
        list(read_records(path, **kw))
    assert e.value.offset == _offsets(recs)[1]
    assert str(path) in str(e.value)


def test_verification_can_be_disabled_for_data_crc(tmp_path):
    path = tmp_path / "r.tfrecord"
    write_records(path, [b"abcdef"])
    raw = bytearray(path.read_bytes())
    raw[13] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert len(list(read_records(path, verify=False))) == 1


def test_truncated_gzip_file(tmp_path):
    path = tmp_path / "r.tfrecord.gz"
    write_records(path, [os.urandom(1000) for _ in range(20)], compression="GZIP")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CorruptRecordError, match=str(path)):
        list(read_records(path, compression="GZIP"))


def test_gzip_file_is_a_real_gzip_stream(tmp_path):
    path = tmp_path / "r.tfrecord.gz"
    write_records(path, [b"abc"], compression="gzip")
    assert gzip.decompress(path.read_bytes())[12:15] == b"abc"


def test_empty_file_has_no_records(tmp_path):
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    assert list(read_records(tmp_path / "empty.tfrecord")) == []


def test_bad_input_errors(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        list(read_records([]))
    with pytest.raises(FileNotFoundError, match="nope.tfrecord"):
        list(read_records(tmp_path / "nope.tfrecord"))
    with pytest.raises(FileNotFoundError, match=r"\*.tfrecord"):
        list(read_records(str(tmp_path / "*.tfrecord")))
    notrec = tmp_path / "notes.txt"
    notrec.write_text("this is a text file, not a TFRecord file at all\n" * 3)
    with pytest.raises(CorruptRecordError, match=f"{notrec}.*offset 0.*not a TFRecord"):
        list(read_records(notrec))
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("hi")
    with pytest.raises(CorruptRecordError, match="offset 0"):
        list(read_records(tiny))
    with pytest.raises(ParameterError, match="compression"):
        list(read_records(notrec, compression="LZ4"))
    with pytest.raises(ParameterError, match="compression"):
        write_records(tmp_path / "x.tfrecord", [b"a"], compression="snappy")
    # a plain file read as GZIP: clear error naming the file
    plain = tmp_path / "plain.tfrecord"
    write_records(plain, [b"abc"])
    with pytest.raises(CorruptRecordError, match="plain.tfrecord.*decompress"):
        list(read_records(plain, compression="GZIP"))


def test_glob_expansion_is_sorted(tmp_path):
    for i in (2, 0, 1):
        write_records(tmp_path / f"s-{i}.tfrecord", [bytes([i])])
    assert list(read_records(str(tmp_path / "s-*.tfrecord"))) == [b"\x00", b"\x01", b"\x02"]


def test_fsspec_url_round_trip():
    url = "memory://labkit-test/r.tfrecord"
    write_records(url, RECORDS[:3])
    assert list(read_records(url)) == RECORDS[:3]


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_image_shards_round_trip(tmp_path, compression):
    ds = SyntheticImages(ImageDatasetConfig(num_samples=23, image_size=8, num_classes=4))
    shards = write_image_shards(tmp_path, ds, ShardConfig(records_per_shard=5, compression=compression,
                                                          prefix="img"))
    assert len(shards.paths) == 5 and shards.counts == [5, 5, 5, 5, 3] and shards.num_records == 23
    assert os.path.basename(shards.paths[0]).startswith("img-00000-of-00005.tfrecord")
    manifest = json.loads((tmp_path / "img-manifest.json").read_text())
    assert manifest["num_records"] == 23 and manifest["kind"] == "images"
    batches = list(read_batches(shards.paths, ReadConfig(kind="images", batch_size=8,
                                                          compression=compression)))
    assert [len(b["index"]) for b in batches] == [8, 8, 7]
    images = np.concatenate([b["image"] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    idx = np.concatenate([b["index"] for b in batches])
    assert idx.tolist() == list(range(23))
    want_images, want_labels = ds.batch(range(23))
    np.testing.assert_array_equal(images, want_images)
    np.testing.assert_array_equal(labels, want_labels)


def test_token_shards_round_trip(tmp_path):
    ds = SyntheticTokens(TokenDatasetConfig(num_sequences=10, block_size=16, vocab_size=1000))
    shards = write_token_shards(tmp_path, ds, ShardConfig(records_per_shard=4, compression="ZLIB"))
    batches = list(read_batches(shards.paths, ReadConfig(kind="tokens", batch_size=10, compression="ZLIB")))
    assert len(batches) == 1
    np.testing.assert_array_equal(batches[0]["tokens"], np.stack([ds[i] for i in range(10)]))


def test_reading_images_as_tokens_is_a_clear_error(tmp_path):
    ds = SyntheticImages(ImageDatasetConfig(num_samples=2, image_size=4))
    shards = write_image_shards(tmp_path, ds)
    with pytest.raises(ValueError, match="tokens example"):
        list(read_batches(shards.paths, ReadConfig(kind="tokens")))


def test_shard_config_validation():
    with pytest.raises(ParameterError, match="records_per_shard"):
        ShardConfig(records_per_shard=0)
    with pytest.raises(ParameterError, match="compression"):
        ShardConfig(compression="BZ2")


def test_image_shards_through_an_fsspec_url():
    ds = SyntheticImages(ImageDatasetConfig(num_samples=5, image_size=4))
    shards = write_image_shards("memory://labkit-shards/run1", ds, ShardConfig(records_per_shard=2,
                                                                               compression="GZIP"))
    assert shards.paths[0].startswith("memory://labkit-shards/run1/data-00000-of-00003")
    (batch,) = read_batches("memory://labkit-shards/run1/*.tfrecord.gz",
                            ReadConfig(batch_size=8, compression="GZIP"))
    assert batch["index"].tolist() == list(range(5))
    np.testing.assert_array_equal(batch["image"], ds.batch(range(5))[0])


def test_buffer_pool_reuses_only_released_arrays():
    from labkit.data.reader import BufferPool

    pool = BufferPool(capacity=2)
    a = pool.array((4, 3), np.uint8)
    a[:] = 7
    b = pool.array((4, 3), np.uint8)
    assert a is not b
    view = a[1:]
    del a
    c = pool.array((4, 3), np.uint8)  # `a` is still referenced through `view`: not reused
    assert not np.shares_memory(c, view) and pool.reused == 0
    del b
    d = pool.array((4, 3), np.uint8)
    assert pool.reused == 1 and not np.shares_memory(d, view)
    assert (view == 7).all()


def test_data_layer_works_without_torch_or_tensorflow(tmp_path, hide_frameworks):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        from labkit.data import (ImageDatasetConfig, ReadConfig, ShardConfig, SyntheticImages,
                                 read_batches, write_image_shards)
        shards = write_image_shards({str(tmp_path)!r}, SyntheticImages(ImageDatasetConfig(num_samples=6)),
                                    ShardConfig(records_per_shard=4, compression="GZIP"))
        (batch,) = read_batches(shards.paths, ReadConfig(batch_size=8, compression="GZIP"))
        assert batch["index"].tolist() == list(range(6))
        assert sys.modules.get("torch") is None and sys.modules.get("tensorflow") is None
        print("ok")
    """)
    env = hide_frameworks("torch", "tensorflow")
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


# --- Every reading path (one record at a time, runs of equal records, record-level sharding)
# gives the same records and the same CorruptRecordError (file and offset) --------------------

SIZES = {"1KB": (1000, 300), "100KB": (100_000, 9)}  # record size, records per file


def _fixed_file(tmp_path, size_name, *, vary_every=0):
    """Records of one size (runs), or with every `vary_every`-th record one byte longer (runs
    broken up), each record's content distinct."""
    size, n = SIZES[size_name]
    recs = [bytes([i % 251]) * (size + (1 if vary_every and i % vary_every == 0 else 0)) for i in range(n)]
    path = tmp_path / f"{size_name}.tfrecord"
    write_records(path, recs)
    return path, recs


READ_KW = {"direct": {}, "opener": BUFFERED, "small buffer": {"chunk_bytes": 4096}}


def _read_all(path, kw):
    got = []
    try:
        for view in iter_views(str(path), **kw):
            got.append(bytes(view))
    except CorruptRecordError as e:
        return got, e
    return got, None


@pytest.mark.parametrize("size_name", list(SIZES))
@pytest.mark.parametrize("vary", [0, 7])
@pytest.mark.parametrize("how", list(READ_KW))
def test_every_path_reads_identical_records(tmp_path, size_name, vary, how):
    path, recs = _fixed_file(tmp_path, size_name, vary_every=vary)
    got, err = _read_all(path, READ_KW[how])
    assert err is None and got == recs
    assert list(read_records(path)) == recs
    assert count_records(path) == len(recs)


@pytest.mark.parametrize("size_name", list(SIZES))
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("what", ["data", "length", "length crc", "data crc"])
@pytest.mark.parametrize("how", list(READ_KW))
def test_one_flip_anywhere_names_file_and_offset(tmp_path, size_name, where, what, how):
    path, recs = _fixed_file(tmp_path, size_name)
    k = {"first": 0, "middle": len(recs) // 2, "last": len(recs) - 1}[where]
    at = _offsets(recs)[k]
    byte = {"data": at + 12 + len(recs[k]) // 2, "length": at + 1, "length crc": at + 9,
            "data crc": at + 12 + len(recs[k]) + 2}[what]
    raw = bytearray(path.read_bytes())
    raw[byte] ^= 0x10
    path.write_bytes(bytes(raw))
    got, err = _read_all(path, READ_KW[how])
    assert got == recs[:k], "every record before the bad one is delivered, intact"
    assert isinstance(err, CorruptRecordError) and err.path == str(path) and err.offset == at
    assert ("length CRC" if what.startswith("length") else "data CRC") in str(err)
    assert f"offset {at}" in str(err)


@pytest.mark.parametrize("size_name", list(SIZES))
@pytest.mark.parametrize("cut", ["boundary", "inside header", "inside data"])
def test_truncation_anywhere(tmp_path, size_name, cut):
    path, recs = _fixed_file(tmp_path, size_name)
    k = len(recs) // 2
    at = _offsets(recs)[k]
    end = {"boundary": at, "inside header": at + 5, "inside data": at + 12 + 10}[cut]
    path.write_bytes(path.read_bytes()[:end])
    for how in READ_KW:
        got, err = _read_all(path, READ_KW[how])
        assert got == recs[:k]
        if cut == "boundary":  # a file cut between records is a valid, shorter file
            assert err is None
        else:
            assert err.offset == at and ("header" if cut == "inside header" else "truncated") in str(err)


@pytest.mark.parametrize("every", [2, 3])
def test_record_level_sharding_partitions_runs(tmp_path, every):
    path, recs = _fixed_file(tmp_path, "1KB", vary_every=11)
    parts = [[bytes(v) for v in iter_views(str(path), every=every, offset=o)] for o in range(every)]
    assert parts == [recs[o::every] for o in range(every)]


def test_record_level_sharding_skips_crc_of_records_it_does_not_keep(tmp_path):
    path, recs = _fixed_file(tmp_path, "1KB")
    raw = bytearray(path.read_bytes())
    raw[_offsets(recs)[5] + 20] ^= 1  # record 5's data: not ours with every=2, offset=0
    path.write_bytes(bytes(raw))
    assert [bytes(v) for v in iter_views(str(path), every=2, offset=0)] == recs[0::2]
    with pytest.raises(CorruptRecordError) as e:
        list(iter_views(str(path), every=2, offset=1))
    assert e.value.offset == _offsets(recs)[5]


def test_gzip_file_read_without_compression_suggests_gzip(tmp_path):
    path = tmp_path / "r.tfrecord.gz"
    write_records(path, [b"abc" * 100] * 3, compression="GZIP")
    with pytest.raises(CorruptRecordError, match=r'offset 0.*compression="GZIP"') as e:
        list(read_records(path))
    assert e.value.path == str(path) and isinstance(e.value, ValueError)
    zpath = tmp_path / "r.tfrecord.zz"
    write_records(zpath, [b"abc" * 100] * 3, compression="ZLIB")
    with pytest.raises(CorruptRecordError, match=r'compression="ZLIB"'):
        list(read_records(zpath))
    plain = tmp_path / "plain.txt"
    plain.write_text("not a TFRecord file, not compressed either")
    with pytest.raises(CorruptRecordError) as e:
        list(read_records(plain))
    assert "compression=" not in str(e.value)


def test_concatenated_gzip_members_read_as_one_stream(tmp_path):
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    write_records(a, [b"one", b"two"], compression="GZIP")
    write_records(b, [b"three"], compression="GZIP")
    both = tmp_path / "both.tfrecord.gz"
    both.write_bytes(a.read_bytes() + b.read_bytes())
    assert list(read_records(both, "GZIP")) == [b"one", b"two", b"three"]


def test_huge_corrupt_length_without_verification_does_not_allocate_it(tmp_path):
    path = tmp_path / "r.tfrecord"
    write_records(path, [b"x" * 100])
    raw = bytearray(path.read_bytes())
    raw[5] = 0x7F  # length ~ 2**46, length CRC not checked
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(read_records(path, verify=False))


def test_gzip_member_boundary_on_a_read_boundary(tmp_path):
    # a stream whose reads end exactly where a GZIP member ends: the next member still counts
    a, b = tmp_path / "a.gz", tmp_path / "b.gz"
    write_records(a, [b"one", b"two"], compression="GZIP")
    write_records(b, [b"three"], compression="GZIP")

    class MemberPerRead:
        def __init__(self, _path):
            self.parts = [a.read_bytes(), b.read_bytes()]

        def read(self, n=-1):
            return self.parts.pop(0) if self.parts else b""

        def close(self):
            pass

    assert list(read_records(a, "GZIP", opener=MemberPerRead)) == [b"one", b"two", b"three"]


def test_storage_errors_surface_as_themselves(tmp_path):
    path = tmp_path / "r.tfrecord"
    write_records(path, [b"abc"])

    class Failing:
        def readinto(self, view):
            raise OSError(5, "Input/output error")

        def close(self):
            pass

    with pytest.raises(OSError, match="Input/output error") as e:
        list(read_records(path, opener=lambda p: Failing()))
    assert not isinstance(e.value, CorruptRecordError)
