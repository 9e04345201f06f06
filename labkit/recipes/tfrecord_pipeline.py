"""TFRecord shards: written once, read by tf.data (interleave, map, batch, prefetch, AUTOTUNE) and
by a PyTorch DataLoader, which trains on them.

    python -m labkit.recipes.tfrecord_pipeline --model cnn --steps 20 --batch-size 32 --data-dir runs/shards

Thousands of small files are slow on any remote storage (each open costs a round trip); a few
hundred shards of ~100 MB each stream at full speed. A record is one serialized
tf.train.Example (here: `index`, `label`, `image` bytes, `shape`; or `index`, `tokens` bytes).
The torch side reads the same files without TensorFlow: an index of record offsets (what the
`tfrecord` package's tfrecord2idx builds) turns the shards into a map-style Dataset, so
DistributedSampler shuffles and splits them like any dataset, and training gives
`labkit train`'s losses. With TensorFlow installed, the tf.data pipeline then reads one epoch of
the same shards and checks that every sample arrives exactly once.
"""

from __future__ import annotations

import os
import struct
import time

import fsspec
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from labkit.data import ShardConfig, decode_example, write_image_shards, write_token_shards
from labkit.data.synthetic import SyntheticImages
from labkit.recipes import common


def write_shards(args, folder: str, records_per_shard: int = 256) -> list[str]:
    """The synthetic dataset as TFRecord shards (skipped when already there)."""
    fs, root = fsspec.core.url_to_fs(folder)
    if not fs.exists(f"{root}/data-manifest.json"):
        samples = common.synthetic_samples(args)
        write = write_image_shards if isinstance(samples, SyntheticImages) else write_token_shards
        write(folder, samples, ShardConfig(records_per_shard=records_per_shard))
    return sorted(fs.unstrip_protocol(p) for p in fs.glob(f"{root}/data-*.tfrecord"))


class TFRecordShards(Dataset):
    """Record i of the shards, decoded to tensors: (uint8 CHW image, label) or (inputs, targets)."""

    def __init__(self, paths: list[str]):
        self.files = {}
        self.index = []  # (path, where the record's bytes start, their length)
        for path in paths:
            with fsspec.open(path, "rb") as f:
                # Framing: uint64 length, uint32 CRC of the length, the bytes, uint32 CRC of them.
                while header := f.read(12):
                    (length,) = struct.unpack("<Q", header[:8])
                    self.index.append((path, f.tell(), length))
                    f.seek(length + 4, 1)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        path, offset, length = self.index[i]
        key = (os.getpid(), path)  # each DataLoader worker process opens its own handles
        if key not in self.files:
            self.files[key] = fsspec.open(path, "rb").open()
        f = self.files[key]
        f.seek(offset)
        example = decode_example(f.read(length))  # a real reader also checks the CRCs
        if "image" in example:
            h, w, c = example["shape"]
            image = torch.frombuffer(bytearray(example["image"][0]), dtype=torch.uint8)
            return image.view(h, w, c).permute(2, 0, 1), torch.tensor(example["label"][0])
        tokens = torch.from_numpy(np.frombuffer(example["tokens"][0], dtype="<i4").astype(np.int64))
        return tokens[:-1], tokens[1:]


def tf_pipeline(paths: list[str], batch_size: int, images: bool):
    """tf.data over the shards: read several files at once, parse whole batches in parallel,
    keep batches ready ahead of the consumer; AUTOTUNE sizes each stage at run time. Yields
    (sample ids, images, labels) or (sample ids, token sequences)."""
    import tensorflow as tf

    spec = {"index": tf.io.FixedLenFeature([], tf.int64)}
    if images:
        spec |= {"image": tf.io.FixedLenFeature([], tf.string),
                 "label": tf.io.FixedLenFeature([], tf.int64),
                 "shape": tf.io.FixedLenFeature([3], tf.int64)}
    else:
        spec |= {"tokens": tf.io.FixedLenFeature([], tf.string)}

    def parse(records):  # one call per batch: vectorised, far cheaper than one per record
        ex = tf.io.parse_example(records, spec)
        if images:
            pixels = tf.io.decode_raw(ex["image"], tf.uint8)
            return ex["index"], tf.reshape(pixels, tf.concat([[-1], ex["shape"][0]], 0)), ex["label"]
        return ex["index"], tf.io.decode_raw(ex["tokens"], tf.int32)

    files = tf.data.Dataset.from_tensor_slices(paths)
    records = files.interleave(tf.data.TFRecordDataset, cycle_length=4,
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return records.batch(batch_size).map(parse, num_parallel_calls=tf.data.AUTOTUNE) \
        .prefetch(tf.data.AUTOTUNE)


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--data-dir", default="runs/shards", help="local path, gs://... or /gcs/...")
    p.add_argument("--records-per-shard", type=int, default=256)
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes")
    args = common.parse(p, argv)
    device = common.device(args.device)
    torch.backends.cudnn.allow_tf32 = False  # fp32 as labkit train's: cuDNN convolutions default to TF32

    name = f"{common.dataset_name(args)}-{args.records_per_shard}-per-shard"
    paths = write_shards(args, f"{args.data_dir.rstrip('/')}/{name}", args.records_per_shard)
    dataset = TFRecordShards(paths)
    model = common.torch_model(args).to(device)
    optimizer, scheduler = common.adamw(model, args)
    data = common.batches(dataset, args.batch_size, args.seed, num_workers=args.num_workers,
                          pin_memory=device.type == "cuda")
    log = common.StepLog("tfrecord_pipeline", args, device=str(device), shards=len(paths))

    for step in range(args.steps):
        lr = scheduler.get_last_lr()[0]
        x, y = common.to_device(next(data), device)
        loss = F.cross_entropy(model(x).flatten(0, -2).float(), y.flatten())
        loss.backward()
        if args.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        log.log(step, loss.item(), lr=lr)

    try:
        import tensorflow  # noqa: F401
    except ImportError:
        print("TensorFlow is not installed: the tf.data half is skipped")
    else:
        start, seen = time.perf_counter(), []
        for batch in tf_pipeline(paths, args.batch_size, images=args.model != "gpt"):
            seen.extend(batch[0].numpy().tolist())
        seconds = time.perf_counter() - start
        if sorted(seen) != list(range(len(dataset))):
            raise RuntimeError(f"tf.data delivered {len(seen)} records, not each of {len(dataset)} once")
        log.metrics.run["tf_data"] = {"records": len(seen), "seconds": seconds,
                                      "records_per_s": len(seen) / seconds}
        print(f"tf.data read all {len(seen)} records once in {seconds:.2f} s")
    log.write()
    return log


if __name__ == "__main__":
    main()
