"""Your own JPEGs from TFRecord shards into a PyTorch DataLoader, a batch decoded at a time.

    labkit data shard photos/ shards/                    # once: one subfolder per class
    python -m labkit.recipes.jpeg_shards shards/ --image-size 128 --batch-size 64 --workers 4

A folder of JPEGs is thousands of small files: on Cloud Storage each open is a request. The
shards hold the same bytes (`image` is the file as it was, `label`, `index`) in a few large
files. Each DataLoader worker of each DDP rank reads its own files, decodes a whole batch
straight into one uint8 array, and hands it over with `batch_size=None`: no per-sample tensor,
no collate. Normalise on the GPU, where it is free.
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import time

import fsspec
import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from labkit.data import decode_example


def decode(data: bytes, size: int, out: np.ndarray) -> None:
    """One JPEG or PNG into `out` (size, size, 3): shorter side to `size`, centre crop."""
    with Image.open(io.BytesIO(data)) as im:
        im.draft("RGB", (size, size))  # JPEG: decode at 1/2, 1/4, 1/8 scale when that is enough
        im = im.convert("RGB")
        w, h = im.size
        s = size / min(w, h)
        nw, nh = max(size, round(w * s)), max(size, round(h * s))
        if (nw, nh) != (w, h):
            im = im.resize((nw, nh), Image.BILINEAR)
        left, top = (nw - size) // 2, (nh - size) // 2
        out[...] = np.asarray(im.crop((left, top, left + size, top + size)) if (nw, nh) != (size, size) else im)


def records(path: str):
    """The records of one TFRecord file (length, its CRC, the bytes, their CRC)."""
    with fsspec.open(path, "rb") as f:
        while header := f.read(12):
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length + 4)[:length]
            yield decode_example(data)


class JpegShards(IterableDataset):
    """This rank's and this worker's files of the shard set, as batches."""

    def __init__(self, folder: str, image_size: int, batch_size: int):
        with fsspec.open(f"{folder}/data-manifest.json") as f:
            self.files = [f"{folder}/{name}" for name in json.load(f)["shards"]]
        self.size, self.batch = image_size, batch_size
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)

    def __iter__(self):
        info = get_worker_info()
        workers, wid = (info.num_workers, info.id) if info else (1, 0)
        mine = self.files[self.rank * workers + wid::self.world * workers]  # every file once per epoch
        images, labels = [], []
        for path in mine:
            for ex in records(path):
                images.append(bytes(ex["image"][0]))
                labels.append(int(ex["label"][0]))
                if len(images) == self.batch:
                    yield self.to_batch(images, labels)
                    images, labels = [], []
        if images:
            yield self.to_batch(images, labels)

    def to_batch(self, images, labels):
        out = np.empty((len(images), self.size, self.size, 3), np.uint8)
        for i, data in enumerate(images):
            decode(data, self.size, out[i])
        return torch.from_numpy(out), torch.tensor(labels)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    loader = DataLoader(JpegShards(args.folder, args.image_size, args.batch_size), batch_size=None,
                        num_workers=args.workers, pin_memory=torch.cuda.is_available())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0, n = time.perf_counter(), 0
    for images, labels in loader:
        x = images.to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255)  # NCHW on the device
        n += len(labels)
    print(f"{n} images of {tuple(x.shape[1:])} in {time.perf_counter() - t0:.2f}s "
          f"({n / (time.perf_counter() - t0):.0f} images/s)")


if __name__ == "__main__":
    main()
