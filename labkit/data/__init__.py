"""labkit's data layer: deterministic synthetic datasets (framework-free) and, built on them,
TFRecord shards read by tf.data and by PyTorch.

The raw TFRecord layer is framework-free: `write_records(path, records)` writes an iterable of
bytes as one TFRecord file; `read_records(paths)` yields each record's bytes in order, verifying
both CRCs and raising `CorruptRecordError` (a ValueError naming the file and byte offset).

Shard sets (`write_image_shards`, ...) carry a manifest; `load_shard_set(dir)` gives their exact
file list and `verify_shards(dir)` checks every record's CRCs and the shards against it.

Readers: `read_batches` (NumPy), `make_loader` (a torch DataLoader) and `make_tf_dataset`
(tf.data).

A learner's own data: `sources` lists an image folder, a CSV of image paths or a table;
`own_shards.shard_source` writes it as byte-sized, resumable shards (`labkit data shard`);
`images` reads those image shards a batch at a time (`image_loader` for the DataLoader,
`labkit.data.tf_pipeline.make_tf_image_dataset` for tf.data); `stage` copies a shard set to
local disk (`labkit data stage`). Importing this package imports neither torch nor TensorFlow; each reader imports its
framework when called.
"""

from labkit.data.example import decode_example, encode_example
from labkit.data.latency import StorageLatency
from labkit.data.reader import BufferPool, ReadConfig, assign_shards, read_batches
from labkit.data.shards import (
    ManifestError,
    ShardConfig,
    ShardSet,
    ShardSetExistsError,
    VerifyReport,
    load_shard_set,
    verify_shards,
    write_image_shards,
    write_raw_shards,
    write_token_shards,
)
from labkit.data.synthetic import (
    ImageDatasetConfig,
    SyntheticImages,
    SyntheticTokens,
    TokenDatasetConfig,
)
from labkit.data.tf_pipeline import AUTOTUNE, TFPipelineConfig, make_tf_dataset
from labkit.data.tfrecord import (
    CorruptRecordError,
    RecordWriter,
    count_records,
    masked_crc32c,
    read_records,
    write_records,
)
from labkit.data.torch_loader import LoaderConfig, make_loader

__all__ = [
    "AUTOTUNE", "BufferPool", "CorruptRecordError", "ImageDatasetConfig", "LoaderConfig",
    "ManifestError", "ReadConfig", "RecordWriter", "ShardConfig", "ShardSet", "ShardSetExistsError",
    "StorageLatency", "SyntheticImages", "SyntheticTokens", "TFPipelineConfig", "TokenDatasetConfig",
    "VerifyReport", "assign_shards", "count_records", "decode_example", "encode_example",
    "load_shard_set", "make_loader", "make_tf_dataset", "masked_crc32c", "read_batches",
    "read_records", "verify_shards", "write_image_shards", "write_raw_shards", "write_records",
    "write_token_shards",
]
