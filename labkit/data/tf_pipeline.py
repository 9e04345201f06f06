"""Reading labkit TFRecord shards with tf.data, every knob of the input-pipeline ladder exposed.

    files ─(shard by worker)─ interleave TFRecordDataset (parallel reads) ─ cache ─ shuffle
          ─ batch ─ map(parse_example + decode_raw + augment, parallel) ─ prefetch

Parsing runs on whole batches (`tf.io.parse_example` is vectorised), which costs far less per
record than parsing records one by one. Knobs taking a count accept `AUTOTUNE` (-1).
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.config import check_bool, check_choice, check_int
from labkit.data.latency import StorageLatency
from labkit.data.reader import KINDS, ReadConfig, read_batches
from labkit.data.tfrecord import expand_paths, normalize_compression

AUTOTUNE = -1


@dataclass(frozen=True)
class TFPipelineConfig:
    """The tf.data knobs. `num_parallel_reads`: files read at once (1: one after another);
    `parallel_calls`: batches parsed at once; `prefetch`: batches buffered ahead (0: off);
    `cache`: keep the records in memory after the first epoch; `shuffle_buffer`: records
    (0: off); `num_workers`/`worker_index`: this worker's share (by file when the files divide
    evenly, else by record). Counts may be AUTOTUNE (-1)."""

    kind: str = "images"
    batch_size: int = 32
    num_parallel_reads: int = 1
    parallel_calls: int = 1
    prefetch: int = 0
    cache: bool = False
    shuffle_buffer: int = 0
    drop_remainder: bool = False
    augment: bool = False
    compression: str | None = None
    num_workers: int = 1
    worker_index: int = 0
    deterministic: bool = True
    read_buffer_bytes: int = 256 << 10
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("kind", self.kind, KINDS)
        check_int("batch_size", self.batch_size, minimum=1)
        for name in ("num_parallel_reads", "parallel_calls"):
            v = check_int(name, getattr(self, name), minimum=-1)
            if v == 0:
                check_int(name, v, minimum=1)
        check_int("prefetch", self.prefetch, minimum=-1)
        check_bool("cache", self.cache)
        check_int("shuffle_buffer", self.shuffle_buffer, minimum=0)
        check_bool("augment", self.augment)
        normalize_compression(self.compression)
        check_int("num_workers", self.num_workers, minimum=1)
        check_int("worker_index", self.worker_index, minimum=0, maximum=self.num_workers - 1)
        check_int("read_buffer_bytes", self.read_buffer_bytes, minimum=0)


def _probe(files: list[str], kind: str, compression: str) -> tuple[int, ...]:
    """Shape of one sample from the first record (framework-free reader)."""
    first = next(read_batches(files[:1], ReadConfig(kind=kind, batch_size=1, compression=compression)))
    key = {"images": "image", "tokens": "tokens", "raw": "record"}[kind]
    return tuple(first[key].shape[1:])


def make_tf_dataset(paths, config: TFPipelineConfig | None = None, *,
                    latency: StorageLatency | None = None):
    """A tf.data.Dataset of dicts: images `{"index", "image" (B,H,W,C uint8), "label"}`, tokens
    `{"index", "tokens" (B,L int64)}`, raw `{"record": (B,) string}`. With `latency`, each file
    pays the injected open latency and transfer time before it is read."""
    import tensorflow as tf

    c = config or TFPipelineConfig()
    files = expand_paths(paths)
    comp = normalize_compression(c.compression)
    shape = _probe(files, c.kind, comp) if c.kind != "raw" else ()
    tune = {AUTOTUNE: tf.data.AUTOTUNE}

    def n(v: int) -> int:
        return tune.get(v, v)

    by_file = c.num_workers > 1 and len(files) % c.num_workers == 0
    ds = tf.data.Dataset.from_tensor_slices(files)
    if by_file:
        ds = ds.shard(c.num_workers, c.worker_index)
    if latency is not None and latency.enabled:  # parallel reads also open files in parallel
        ds = ds.map(lambda f: tf.reshape(tf.py_function(latency.tf_delay, [f], tf.string), []),
                    num_parallel_calls=None if c.num_parallel_reads == 1 else n(c.num_parallel_reads))

    def read(f):
        return tf.data.TFRecordDataset(f, compression_type=comp, buffer_size=c.read_buffer_bytes)

    if c.num_parallel_reads == 1:
        ds = ds.flat_map(read)
    else:
        reads = n(c.num_parallel_reads)
        ds = ds.interleave(read, cycle_length=reads if reads > 0 else None, num_parallel_calls=reads,
                           deterministic=c.deterministic)
    if c.num_workers > 1 and not by_file:
        ds = ds.shard(c.num_workers, c.worker_index)
    if c.cache:
        ds = ds.cache()
    if c.shuffle_buffer:
        ds = ds.shuffle(c.shuffle_buffer, seed=c.seed, reshuffle_each_iteration=True)
    ds = ds.batch(c.batch_size, drop_remainder=c.drop_remainder)
    if c.kind != "raw":
        parse = _parser(tf, c.kind, shape, c.augment, c.seed)
        if c.parallel_calls == 1:
            ds = ds.map(parse)
        else:
            ds = ds.map(parse, num_parallel_calls=n(c.parallel_calls), deterministic=c.deterministic)
    else:
        ds = ds.map(lambda r: {"record": r})
    if c.prefetch:
        ds = ds.prefetch(n(c.prefetch))
    if c.num_workers > 1:  # sharded here already: tf.distribute must not shard it again
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        ds = ds.with_options(options)
    return ds


def _parser(tf, kind: str, shape: tuple[int, ...], augment: bool, seed: int):
    if kind == "images":
        spec = {"index": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
                "image": tf.io.FixedLenFeature([], tf.string)}

        def parse(records):
            ex = tf.io.parse_example(records, spec)
            images = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (-1, *shape))
            if augment:  # random horizontal flip, per batch half: cheap, shows where augment goes
                images = tf.image.random_flip_left_right(images, seed=seed)
            return {"index": ex["index"], "image": images, "label": ex["label"]}

        return parse
    spec = {"index": tf.io.FixedLenFeature([], tf.int64), "tokens": tf.io.FixedLenFeature([], tf.string)}

    def parse_tokens(records):
        ex = tf.io.parse_example(records, spec)
        tokens = tf.cast(tf.io.decode_raw(ex["tokens"], tf.int32, little_endian=True), tf.int64)
        return {"index": ex["index"], "tokens": tf.reshape(tokens, (-1, *shape))}

    return parse_tokens


def tf_record_batches(paths, batch_size: int = 64, num_parallel_reads: int = 2, compression: str | None = None):
    """The reference peer for raw reading speed: `TFRecordDataset(files, num_parallel_reads)`
    batched, records left as strings (what tf.data does before any parsing)."""
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(expand_paths(paths), compression_type=normalize_compression(compression),
                                 num_parallel_reads=num_parallel_reads if num_parallel_reads > 1 else None)
    return ds.batch(batch_size) if batch_size > 1 else ds


def make_tf_image_dataset(src, *, image_size: int = 224, batch_size: int = 64, shuffle_buffer: int = 0,
                          seed: int = 0, drop_remainder: bool = False, num_parallel_reads: int = AUTOTUNE,
                          num_workers: int = 1, worker_index: int = 0, threads: int | None = None):
    """tf.data over the image shards `labkit data shard` writes: batches of `image` uint8
    (B, S, S, 3) (shorter side resized to `image_size`, centre crop), `label` and `index` int64.

    Files are read `num_parallel_reads` at once; records are batched, parsed a batch at a time
    (`tf.io.parse_example`) and the batch's JPEG / PNG bytes decoded in parallel
    (`tf.map_fn`). With `num_workers` > 1 this worker reads its own share here; otherwise the
    dataset carries `AutoShardPolicy.FILE` when the set has at least as many files as a
    multi-worker job has workers, else `DATA`, so a `MultiWorkerMirroredStrategy` that
    distributes it gives each worker distinct records. `threads`: the size of the dataset's
    own thread pool (default: tf.data's shared pool, one thread per core)."""
    import tensorflow as tf

    from labkit.data.images import shard_files

    check_int("image_size", image_size, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    check_int("shuffle_buffer", shuffle_buffer, minimum=0)
    check_int("num_workers", num_workers, minimum=1)
    check_int("worker_index", worker_index, minimum=0, maximum=num_workers - 1)
    check_int("threads", threads, minimum=1, allow_none=True)
    files, comp = shard_files(src)
    ds = tf.data.Dataset.from_tensor_slices(files)
    if num_workers > 1:
        ds = ds.shard(num_workers, worker_index) if len(files) % num_workers == 0 else ds
    ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=comp),
                       cycle_length=None if num_parallel_reads == AUTOTUNE else num_parallel_reads,
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=shuffle_buffer == 0)
    if num_workers > 1 and len(files) % num_workers:
        ds = ds.shard(num_workers, worker_index)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    spec = {"index": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
            "image": tf.io.FixedLenFeature([], tf.string)}
    size = image_size

    def decode_one(data):
        image = tf.io.decode_image(data, channels=3, expand_animations=False)
        shape = tf.cast(tf.shape(image)[:2], tf.float32)
        scale = size / tf.reduce_min(shape)
        new = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), size)
        image = tf.image.resize(image, new, method="bilinear", antialias=True)  # as Pillow does
        top, left = (new[0] - size) // 2, (new[1] - size) // 2
        image = image[top:top + size, left:left + size]
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)

    def parse(records):
        ex = tf.io.parse_example(records, spec)
        images = tf.map_fn(decode_one, ex["image"], fn_output_signature=tf.TensorSpec((size, size, 3), tf.uint8),
                           parallel_iterations=batch_size)
        return {"image": images, "label": ex["label"], "index": ex["index"]}

    ds = ds.batch(batch_size, drop_remainder=drop_remainder).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy
    options.experimental_distribute.auto_shard_policy = (
        policy.OFF if num_workers > 1 else policy.FILE if len(files) >= _job_workers() else policy.DATA)
    if threads:
        options.threading.private_threadpool_size = threads
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def _job_workers() -> int:
    """Workers of the multi-worker job TF_CONFIG describes (chief included); 1 outside one."""
    import json
    import os

    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    except ValueError:
        return 1
    return max(1, sum(len(cluster.get(k, [])) for k in ("chief", "master", "worker")))
