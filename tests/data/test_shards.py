"""Shard sets against their manifest: verify finds missing, extra and short shards; a rewrite
into the same folder replaces the old set whole or is refused, never mixes."""

from __future__ import annotations

import json

import pytest

from labkit.data import (
    ImageDatasetConfig,
    ReadConfig,
    ShardConfig,
    SyntheticImages,
    read_batches,
    write_image_shards,
)
from labkit.data.shards import (
    ManifestError,
    ShardSetExistsError,
    load_shard_set,
    read_manifest,
    verify_shards,
)


def _write(d, n=10, per_shard=3, if_exists="replace", **kw):
    ds = SyntheticImages(ImageDatasetConfig(num_samples=n, image_size=4))
    return write_image_shards(d, ds, ShardConfig(records_per_shard=per_shard, **kw), if_exists=if_exists)


def test_a_fresh_set_verifies_clean_and_loads_from_its_manifest(tmp_path):
    s = _write(tmp_path)
    report = verify_shards(tmp_path)
    assert report.ok and report.files == 4 and report.records == 10
    assert load_shard_set(tmp_path).paths == s.paths and load_shard_set(tmp_path).counts == [3, 3, 3, 1]


@pytest.mark.parametrize("damage", ["emptied", "cut at a record boundary", "deleted", "stale extra"])
def test_verify_names_missing_extra_and_short_shards(tmp_path, damage):
    s = _write(tmp_path)
    shard = tmp_path / "data-00001-of-00004.tfrecord"
    raw = shard.read_bytes()
    if damage == "emptied":
        shard.write_bytes(b"")
    elif damage == "cut at a record boundary":
        shard.write_bytes(raw[: len(raw) // 3])  # 3 equal records: exactly one left
    elif damage == "deleted":
        shard.unlink()
    else:
        (tmp_path / "data-00004-of-00005.tfrecord").write_bytes(raw)
    assert list(read_batches(s.paths if damage != "deleted" else s.paths[:1] + s.paths[2:],
                             ReadConfig(batch_size=16)))  # the shards still read without error
    report = verify_shards(tmp_path)
    want = {"emptied": "data-00001-of-00004.tfrecord: short: 0 records, data-manifest.json says 3",
            "cut at a record boundary": "data-00001-of-00004.tfrecord: short: 1 records, data-manifest.json says 3",
            "deleted": "data-00001-of-00004.tfrecord: missing (listed in data-manifest.json with 3 records)",
            "stale extra": "data-00004-of-00005.tfrecord: extra shard, listed in no manifest"}[damage]
    assert len(report.problems) == 1 and want in report.problems[0], report.problems


def test_verify_a_file_checks_its_count_against_the_manifest_beside_it(tmp_path):
    _write(tmp_path)
    shard = tmp_path / "data-00000-of-00004.tfrecord"
    raw = shard.read_bytes()
    shard.write_bytes(raw[: 2 * len(raw) // 3])
    report = verify_shards(str(shard))
    assert report.problems == [f"{shard}: short: 2 records, data-manifest.json says 3"]
    assert verify_shards(str(tmp_path / "data-00002-of-00004.tfrecord")).ok


def test_verify_reports_corruption_with_file_and_offset(tmp_path):
    _write(tmp_path)
    shard = tmp_path / "data-00002-of-00004.tfrecord"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 1  # the last record's data CRC
    shard.write_bytes(bytes(raw))
    (problem,) = verify_shards(tmp_path).problems
    assert str(shard) in problem and "byte offset" in problem and "data CRC" in problem


def test_verify_uses_the_manifest_compression(tmp_path):
    _write(tmp_path, compression="GZIP")
    assert verify_shards(tmp_path).ok
    # a GZIP shard named directly, not listed anywhere: corrupt, and the message says why
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "x.tfrecord.gz").write_bytes((tmp_path / "data-00000-of-00004.tfrecord.gz").read_bytes())
    (problem,) = verify_shards(str(lone / "x.tfrecord.gz")).problems
    assert 'compression="GZIP"' in problem


def test_verify_bad_input_raises_one_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no TFRecord shards and no shard manifest"):
        verify_shards(tmp_path)
    _write(tmp_path)
    (tmp_path / "data-manifest.json").unlink()
    with pytest.raises(ManifestError, match="4 TFRecord files but no"):
        verify_shards(tmp_path)
    (tmp_path / "data-manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not a labkit shard manifest"):
        verify_shards(tmp_path)
    (tmp_path / "data-manifest.json").write_text(json.dumps({"shards": ["a"], "counts": [1], "num_records": 2}))
    with pytest.raises(ManifestError, match="num_records"):
        read_manifest(tmp_path / "data-manifest.json")
    (tmp_path / "data-manifest.json").write_text(json.dumps({"shards": ["a"], "counts": [1], "num_records": 1}))
    with pytest.raises(ManifestError, match=r"data-manifest.json: 'sha256' must list one digest per shard"):
        read_manifest(tmp_path / "data-manifest.json")
    with pytest.raises(FileNotFoundError, match="nope"):
        verify_shards(tmp_path / "nope")
    assert issubclass(ManifestError, ValueError)


def test_rewrite_is_refused_or_replaces_the_old_set_whole(tmp_path):
    _write(tmp_path, n=10, per_shard=3)  # 4 shards
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ShardSetExistsError, match="already holds a shard set with prefix 'data'") as e:
        _write(tmp_path, n=10, per_shard=5, if_exists="error")
    assert isinstance(e.value, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing touched
    new = _write(tmp_path, n=10, per_shard=5, compression="GZIP", if_exists="replace")  # 2 shards
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data-00000-of-00002.tfrecord.gz", "data-00001-of-00002.tfrecord.gz", "data-manifest.json"]
    assert sorted(str(p) for p in tmp_path.glob("data-*.tfrecord*")) == new.paths
    assert verify_shards(tmp_path).ok
    # another prefix in the same folder is another set: left alone
    _write(tmp_path, n=4, per_shard=2, prefix="val", if_exists="error")
    assert verify_shards(tmp_path).ok and load_shard_set(tmp_path).paths == new.paths


@pytest.mark.parametrize("target", ["a file", "under a file"])
def test_writing_into_a_file_is_refused_before_anything_is_written(tmp_path, target):
    f = tmp_path / "file"
    f.write_text("x")
    out = f if target == "a file" else f / "sub"
    with pytest.raises(NotADirectoryError, match=f"cannot write shards into {out}"):
        _write(out)


def test_a_path_with_brackets_that_exists_is_that_file_not_a_glob(tmp_path):
    from labkit.data.shards import verify_shards
    from labkit.data.tfrecord import expand_paths, write_records

    write_records(tmp_path / "run[1].tfrecord", [b"a", b"b"])
    write_records(tmp_path / "run1.tfrecord", [b"c"])  # what the pattern run[1] would match
    literal = str(tmp_path / "run[1].tfrecord")
    assert expand_paths(literal) == [literal]
    assert verify_shards(literal).records == 2
    assert expand_paths(str(tmp_path / "run[0-9].tfrecord")) == [str(tmp_path / "run1.tfrecord")]  # a glob still


def test_a_glob_over_an_unfinished_set_is_not_passed(tmp_path):
    """Shards named -of-00025 without a manifest, three of them present: a write that stopped."""
    from labkit.data.shards import verify_shards
    from labkit.data.tfrecord import write_records

    for i in range(3):
        write_records(tmp_path / f"data-{i:05d}-of-00025.tfrecord", [b"x"])
    report = verify_shards(str(tmp_path / "data-*.tfrecord"))
    assert report.records == 3 and not report.ok
    assert "3 of the set's 25 shards are here" in report.problems[0] and "data-00003-of-00025" in report.problems[0]
    for i in range(3, 25):
        write_records(tmp_path / f"data-{i:05d}-of-00025.tfrecord", [b"x"])
    assert verify_shards(str(tmp_path / "data-*.tfrecord")).ok  # the whole set: nothing to say
