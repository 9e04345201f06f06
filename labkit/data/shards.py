"""Writing datasets as sharded TFRecord files, and the record payloads both engines parse.

Payload (one `tf.train.Example` per sample, see `labkit.data.example`):

- images: `index` int64 (the sample id; proves sharding has no duplicates and no gaps),
  `label` int64, `image` bytes (uint8 H×W×C, row-major), `shape` int64 [H, W, C].
- tokens: `index` int64, `tokens` bytes (block_size + 1 ids as little-endian int32).

Shards are named `{prefix}-{i:05d}-of-{n:05d}.tfrecord` (`.gz` / `.zz` when compressed) and
written through fsspec, so `out_dir` may be local, a `/gcs/bucket/...` mount or `gs://bucket/...`.
A small `{prefix}-manifest.json` beside them records the counts and the payload.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

import numpy as np

from labkit.core.config import check_int, check_str
from labkit.core.progress import progress
from labkit.data.example import encode_example
from labkit.data.synthetic import SyntheticImages, SyntheticTokens
from labkit.data.tfrecord import RecordWriter, is_remote, normalize_compression, open_binary

SUFFIX = {"": ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zz"}


@dataclass(frozen=True)
class ShardConfig:
    """How a dataset is cut into files: `records_per_shard` samples per file (the last one may
    be shorter), optional "GZIP"/"ZLIB" compression, and the file-name `prefix`."""

    records_per_shard: int = 256
    compression: str | None = None
    prefix: str = "data"

    def __post_init__(self) -> None:
        check_int("records_per_shard", self.records_per_shard, minimum=1)
        normalize_compression(self.compression)
        check_str("prefix", self.prefix)
        if "/" in self.prefix:
            raise ValueError(f"parameter 'prefix' must be a file-name prefix, not a path (got {self.prefix!r})")


@dataclass(frozen=True)
class ShardSet:
    """What was written: the shard paths in order and their record counts."""

    paths: list[str]
    counts: list[int]
    kind: str
    compression: str
    bytes_written: int

    @property
    def num_records(self) -> int:
        return sum(self.counts)


def image_example(index: int, image: np.ndarray, label: int) -> bytes:
    """The record payload of one image sample."""
    return encode_example({"index": index, "label": int(label), "image": image.tobytes(),
                           "shape": list(image.shape)})


def token_example(index: int, tokens: np.ndarray) -> bytes:
    """The record payload of one token sequence."""
    return encode_example({"index": index, "tokens": tokens.astype("<i4").tobytes()})


def write_shards(
    out_dir: str | os.PathLike, num_records: int, make_record: Callable[[int], bytes],
    config: ShardConfig, *, kind: str = "raw",
) -> ShardSet:
    """Write records `make_record(0..num_records-1)` into shards of `config.records_per_shard`,
    with a progress bar (`labkit.core.progress`)."""
    check_int("num_records", num_records, minimum=1)
    out = os.fspath(out_dir)
    comp = normalize_compression(config.compression)
    n = math.ceil(num_records / config.records_per_shard)
    paths, counts, total = [], [], 0
    with progress(num_records, f"write {kind} shards", unit="record") as bar:
        for s in range(n):
            path = _join(out, f"{config.prefix}-{s:05d}-of-{n:05d}{SUFFIX[comp]}")
            lo, hi = s * config.records_per_shard, min(num_records, (s + 1) * config.records_per_shard)
            with RecordWriter(path, comp) as w:
                for i in range(lo, hi):
                    w.write(make_record(i))
            paths.append(path)
            counts.append(hi - lo)
            total += w.bytes_written
            bar.update(hi - lo)
    shards = ShardSet(paths, counts, kind, comp, total)
    manifest = {"kind": kind, "compression": comp, "num_records": num_records,
                "shards": [os.path.basename(p) for p in paths], "counts": counts,
                "shard_config": asdict(config)}
    with open_binary(_join(out, f"{config.prefix}-manifest.json"), "wb") as f:
        f.write(json.dumps(manifest, indent=1).encode())
    return shards


def write_image_shards(out_dir, dataset: SyntheticImages, config: ShardConfig = ShardConfig()) -> ShardSet:
    """Every sample of a SyntheticImages dataset as image Examples in shards."""
    def make(i: int) -> bytes:
        image, label = dataset[i]
        return image_example(i, image, label)

    return write_shards(out_dir, len(dataset), make, config, kind="images")


def write_token_shards(out_dir, dataset: SyntheticTokens, config: ShardConfig = ShardConfig()) -> ShardSet:
    """Every sequence of a SyntheticTokens dataset as token Examples in shards."""
    return write_shards(out_dir, len(dataset), lambda i: token_example(i, dataset[i]), config,
                        kind="tokens")


def write_raw_shards(out_dir, records: Iterable[bytes], num_records: int, config: ShardConfig) -> ShardSet:
    """Opaque records (benchmarks: fixed-size random payloads) in shards."""
    it = iter(records)
    return write_shards(out_dir, num_records, lambda _i: next(it), config, kind="raw")


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name if is_remote(directory) else os.path.join(directory, name)
