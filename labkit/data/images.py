"""Reading the image shards `labkit data shard` writes: JPEG / PNG records decoded a batch at a
time, into one uint8 array (B, S, S, 3) per batch.

    for batch in iter_image_batches("shards/", ImageReadConfig(image_size=224, batch_size=64)):
        batch["image"], batch["label"], batch["index"]            # NumPy
    loader = image_loader("shards/", ImageReadConfig(...), LoaderConfig(num_workers=4))  # torch

Why a batch at a time: torchvision's `ImageFolder` makes a PIL image, then a float tensor, per
sample, and the DataLoader's collate copies them into the batch; here each image is decoded
straight into its row of the batch (uint8: a quarter of float32's bytes to hand from a loader
worker to the training process; normalise on the GPU). JPEGs are decoded at reduced scale when
much larger than `image_size` (Pillow's `draft`, the DCT scaling libjpeg offers), then resized
so the shorter side is `image_size` and centre-cropped: the usual evaluation transform.

Splitting is `labkit.data.reader.assign_shards` over DDP ranks × loader workers, so every record
is read exactly once per epoch. The tf.data reader of the same shards is
`labkit.data.tf_pipeline.make_tf_image_dataset`.
"""

from __future__ import annotations

import io
import random
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from labkit.core.config import check_bool, check_int
from labkit.data.example import decode_example
from labkit.data.reader import assign_shards, shuffle_buffer
from labkit.data.shards import (
    MANIFEST_SUFFIX,
    ManifestError,
    ShardFolder,
    join_path,
    manifest_name,
    read_manifest,
)
from labkit.data.tfrecord import Opener, expand_paths, is_pattern, iter_views

KIND = "encoded_images"


@dataclass(frozen=True)
class ImageReadConfig:
    """`image_size` (square output side), `batch_size`, whether the last short batch is dropped,
    a shuffle buffer of records (0: off) and its seed, threads decoding each batch, CRC checks."""

    image_size: int = 224
    batch_size: int = 64
    drop_remainder: bool = False
    shuffle_buffer: int = 0
    seed: int = 0
    decode_threads: int = 1
    verify: bool = True

    def __post_init__(self) -> None:
        check_int("image_size", self.image_size, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_bool("drop_remainder", self.drop_remainder)
        check_int("shuffle_buffer", self.shuffle_buffer, minimum=0)
        check_int("seed", self.seed)
        check_int("decode_threads", self.decode_threads, minimum=1)
        check_bool("verify", self.verify)


def shard_files(src) -> tuple[list[str], str]:
    """(files, compression) of an image shard set: a folder with its manifest (the exact list),
    or shard files / globs (uncompressed)."""
    if isinstance(src, (str, bytes)) or hasattr(src, "__fspath__"):
        path = str(src)
        if not is_pattern(path) and not path.endswith(".tfrecord"):
            manifest = _manifest_in(path)
            if manifest is not None:
                if manifest.get("kind") != KIND:
                    raise ManifestError(f"{path} holds {manifest.get('kind')!r} shards, not images written "
                                        f"by labkit data shard")
                return [join_path(path, n) for n in manifest["shards"]], manifest["compression"]
    return expand_paths(src), ""


def _manifest_in(folder: str) -> dict | None:
    """The manifest of the shard set in `folder` (None: `folder` is not a folder)."""
    name = manifest_name("data")
    where = ShardFolder(folder)
    if not where.is_dir():
        return None
    manifests = sorted(n for n in where.names() if n.endswith(MANIFEST_SUFFIX))
    if not manifests:
        raise ManifestError(f"no shard manifest in {folder} (write the shards with labkit data shard)")
    if name not in manifests and len(manifests) > 1:
        raise ManifestError(f"{folder} holds several shard sets ({', '.join(manifests)}): name the files")
    return read_manifest(join_path(folder, name if name in manifests else manifests[0]))


def decode_image(data, size: int, out: np.ndarray | None = None) -> np.ndarray:
    """One JPEG or PNG as uint8 (size, size, 3): shorter side resized to `size`, centre crop."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        if im.format == "JPEG":
            im.draft("RGB", (size, size))  # DCT scaling: decode at 1/2, 1/4, 1/8 when that still covers size
        im = im.convert("RGB")
        w, h = im.size
        scale = size / min(w, h)
        nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
        if (nw, nh) != (w, h):
            im = im.resize((nw, nh), Image.BILINEAR)
        left, top = (nw - size) // 2, (nh - size) // 2
        if (nw, nh) != (size, size):
            im = im.crop((left, top, left + size, top + size))
        arr = np.asarray(im, dtype=np.uint8)
    if out is None:
        return arr
    out[...] = arr
    return out


def decode_images(blobs: Sequence, size: int, out: np.ndarray | None = None,
                  pool: ThreadPoolExecutor | None = None) -> np.ndarray:
    """A batch of JPEG / PNG bytes into one uint8 array (len(blobs), size, size, 3), each image
    decoded straight into its row (Pillow releases the GIL while decoding: a thread `pool`
    decodes the rows in parallel)."""
    if out is None:
        out = np.empty((len(blobs), size, size, 3), np.uint8)
    if pool is None:
        for i, b in enumerate(blobs):
            decode_image(b, size, out[i])
    else:
        list(pool.map(lambda ib: decode_image(ib[1], size, out[ib[0]]), enumerate(blobs)))
    return out


def iter_image_batches(src, config: ImageReadConfig | None = None, *, num_consumers: int = 1,
                       consumer: int = 0, epoch: int = 0, shard_mode: str = "auto",
                       opener: Opener | None = None) -> Iterator[dict]:
    """This consumer's share of an image shard set as batches of NumPy arrays: `image` uint8
    (B, S, S, 3), `label` int64 (B,), `index` int64 (B,) (the record's place in the set).
    `opener` opens each shard (default: `labkit.data.tfrecord.open_binary`)."""
    config = config or ImageReadConfig()
    files, comp = shard_files(src)
    assignment = assign_shards(files, num_consumers, consumer, shard_mode)
    pool = ThreadPoolExecutor(config.decode_threads) if config.decode_threads > 1 else None
    try:
        records = _records(assignment, comp, config.verify, opener)
        if config.shuffle_buffer > 1:
            records = shuffle_buffer(records, config.shuffle_buffer, random.Random(config.seed * 7919 + epoch))
        blobs: list = []
        labels: list[int] = []
        indices: list[int] = []
        for index, label, blob in records:
            blobs.append(blob)
            labels.append(label)
            indices.append(index)
            if len(blobs) == config.batch_size:
                yield _batch(blobs, labels, indices, config.image_size, pool)
                blobs, labels, indices = [], [], []
        if blobs and not config.drop_remainder:
            yield _batch(blobs, labels, indices, config.image_size, pool)
    finally:
        if pool is not None:
            pool.shutdown()


def _records(assignment, comp: str, verify: bool, opener: Opener | None) -> Iterator[tuple[int, int, bytes]]:
    for path, off in zip(assignment.files, assignment.offsets, strict=True):
        for view in iter_views(path, compression=comp, verify=verify, every=assignment.every, offset=off,
                               opener=opener):
            ex = decode_example(view)
            if "image" not in ex or "label" not in ex:
                raise ValueError(f"{path}: a record without 'image' and 'label' features (not written by "
                                 f"labkit data shard from images?)")
            yield int(ex["index"][0]) if "index" in ex else -1, int(ex["label"][0]), bytes(ex["image"][0])


def _batch(blobs, labels, indices, size: int, pool) -> dict:
    return {"image": decode_images(blobs, size, pool=pool), "label": np.asarray(labels, np.int64),
            "index": np.asarray(indices, np.int64)}


def image_loader(src, config: ImageReadConfig | None = None, loader=None):
    """A torch DataLoader over an image shard set: dicts of tensors `image` uint8 (B, S, S, 3),
    `label` and `index` int64. `loader` is a `labkit.data.LoaderConfig` (workers, pinned memory,
    prefetch, rank / world size; default: taken from torch.distributed). Each worker decodes whole
    batches; the DataLoader runs with `batch_size=None`."""
    from torch.utils.data import DataLoader

    from labkit.data.torch_loader import LoaderConfig, as_is, dist_rank_world

    config, loader = config or ImageReadConfig(), loader or LoaderConfig()
    rank, world = dist_rank_world(loader)
    dataset = _dataset_class()(src, config, rank, world, loader.shard_mode)
    kwargs = {}
    if loader.num_workers:
        kwargs = {"prefetch_factor": loader.prefetch_factor or 2, "persistent_workers": loader.persistent_workers,
                  "multiprocessing_context": loader.multiprocessing_context}
    return DataLoader(dataset, batch_size=None, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                      collate_fn=as_is, **kwargs)


def _dataset_class():
    """The torch IterableDataset, built on first use (importing this module imports no torch);
    at module level (see `__getattr__`) so it pickles for workers started with "spawn"."""
    cls = globals().get("_ImageShards")
    if cls is not None:
        return cls
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    class ImageShards(IterableDataset):
        """This rank's and this loader worker's share of an image shard set, a batch at a time."""

        def __init__(self, src, config: ImageReadConfig, rank: int = 0, world_size: int = 1,
                     shard_mode: str = "auto") -> None:
            self.src, self.config, self.rank, self.world_size = src, config, rank, world_size
            self.shard_mode, self.epoch = shard_mode, 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            info = get_worker_info()
            workers, wid = (info.num_workers, info.id) if info else (1, 0)
            for batch in iter_image_batches(self.src, self.config, num_consumers=self.world_size * workers,
                                            consumer=self.rank * workers + wid, epoch=self.epoch,
                                            shard_mode=self.shard_mode):
                yield {k: torch.from_numpy(v) for k, v in batch.items()}

    ImageShards.__qualname__ = ImageShards.__name__ = "_ImageShards"
    ImageShards.__module__ = __name__
    globals()["_ImageShards"] = ImageShards
    return ImageShards


def __getattr__(name: str):
    if name == "_ImageShards":
        return _dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
