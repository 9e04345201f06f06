"""Notebook 03's "Your own images" section and `benchmarks/bench_jpeg.py`: a folder of real JPEG
files sharded with `labkit data shard`, then read three ways on the same worker count:

- the folder as most scripts read it: torchvision's `ImageFolder` with `Resize`, `CenterCrop`
  and `ToTensor` in a DataLoader (where torchvision is not installed, `FolderImages` below does
  exactly that per sample: open, decode, resize, crop, a float tensor, then collate);
- the shards through labkit's reader (`labkit.data.images.image_loader`: a batch decoded at a
  time, uint8, `batch_size=None`);
- the shards through tf.data (`labkit.data.tf_pipeline.make_tf_image_dataset`, its private
  thread pool the same size as the DataLoader's workers).

Each is timed over whole epochs, the three interleaved `repeats` times (`labkit.core.stats`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.core import stats

READERS = ("folder: ImageFolder + DataLoader", "shards: labkit reader + DataLoader", "shards: tf.data")


def shard_command(src: os.PathLike, out: os.PathLike, *extra: str) -> list[str]:
    """`labkit data shard SRC OUT ...` as the learner types it."""
    return ["labkit", "data", "shard", str(src), str(out), *extra]


def run_labkit(argv: list[str], cwd: os.PathLike | None = None) -> str:
    """A `labkit ...` command line run in this environment (in `cwd`); its output (it must succeed)."""
    return _run_module("labkit", argv[1:], " ".join(argv), cwd)


def _run_module(module: str, args: list[str], what: str, cwd: os.PathLike | None = None) -> str:
    """`python -m MODULE ARGS` with this interpreter; its output, or RuntimeError with its last words."""
    done = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{what} exited {done.returncode}: {done.stdout.strip()[-800:]} {done.stderr.strip()[-800:]}")
    return done.stdout.strip()


def count_files(folder: os.PathLike) -> tuple[int, int]:
    """(files, bytes) under a folder."""
    files = [p for p in Path(folder).rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


class FolderImages:
    """What torchvision's `ImageFolder(root, Compose([Resize(S), CenterCrop(S), ToTensor()]))`
    does, written out: one file opened, decoded, resized, cropped and made a float tensor per
    sample. Classes are the sorted subfolders."""

    def __init__(self, root: os.PathLike, image_size: int):
        root = Path(root)
        self.classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.samples = [(p, i) for i, c in enumerate(self.classes) for p in sorted((root / c).iterdir())
                        if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
        self.size = image_size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import numpy as np
        import torch
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            s = self.size / min(w, h)
            im = im.resize((max(self.size, round(w * s)), max(self.size, round(h * s))), Image.BILINEAR)
            left, top = (im.size[0] - self.size) // 2, (im.size[1] - self.size) // 2
            im = im.crop((left, top, left + self.size, top + self.size))
            x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255)
        return x, label


def folder_dataset(root: os.PathLike, image_size: int):
    """torchvision's ImageFolder with the usual transforms when torchvision is installed, else
    `FolderImages` (the same work); the second value names which."""
    try:
        from torchvision import datasets, transforms
    except Exception:  # not installed, or a build that does not match this torch
        return FolderImages(root, image_size), "FolderImages (torchvision not installed)"
    tf = transforms.Compose([transforms.Resize(image_size), transforms.CenterCrop(image_size), transforms.ToTensor()])
    return datasets.ImageFolder(os.fspath(root), tf), "torchvision.datasets.ImageFolder"


def _epoch(batches) -> int:
    n = 0
    for batch in batches:
        n += len(batch["label"]) if isinstance(batch, dict) else len(batch[1])
    return n


def reader_epochs(folder: os.PathLike, shards: os.PathLike, *, image_size: int, batch_size: int,
                  workers: int, frameworks: tuple[str, ...] = ("torch", "tensorflow")) -> dict[str, Callable[[], float]]:
    """One epoch of each reader as a callable returning images/s, for the readers whose
    framework is here. The DataLoaders keep their workers between epochs (persistent), so a
    repeat times reading, not starting processes."""
    out: dict[str, Callable[[], float]] = {}

    def timed(make_batches) -> Callable[[], float]:
        def run() -> float:
            t0 = time.perf_counter()
            n = _epoch(make_batches())
            return n / (time.perf_counter() - t0)
        return run

    if "torch" in frameworks:
        from torch.utils.data import DataLoader

        from labkit.data.images import ImageReadConfig, image_loader
        from labkit.data.torch_loader import LoaderConfig

        dataset, _name = folder_dataset(folder, image_size)
        extra = {"persistent_workers": True, "prefetch_factor": 2} if workers else {}
        plain = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers, **extra)
        ours = image_loader(shards, ImageReadConfig(image_size=image_size, batch_size=batch_size),
                            LoaderConfig(num_workers=workers, persistent_workers=bool(workers)))
        out[READERS[0]] = timed(lambda: iter(plain))
        out[READERS[1]] = timed(lambda: iter(ours))
    if "tensorflow" in frameworks:
        from labkit.data.tf_pipeline import make_tf_image_dataset

        ds = make_tf_image_dataset(shards, image_size=image_size, batch_size=batch_size,
                                   threads=max(1, workers))
        out[READERS[2]] = timed(lambda: ds.as_numpy_iterator())
    return out


def effective_workers(requested: int) -> int:
    """Loader workers for the comparison: `requested`, at most one per CPU core (decoding JPEGs
    is CPU work; more workers than cores only take turns)."""
    return max(0, min(requested, os.cpu_count() or 1))


def compare_readers(folder: os.PathLike, shards: os.PathLike, *, image_size: int, batch_size: int,
                    workers: int, repeats: int = stats.MIN_REPEATS,
                    frameworks: tuple[str, ...] = ("torch", "tensorflow")) -> list[dict[str, Any]]:
    """Images/s of each reader over `repeats` interleaved epochs (after one warm-up epoch each):
    one row per reader with the median, range, runs, and the ratio to the folder reader."""
    measures = reader_epochs(folder, shards, image_size=image_size, batch_size=batch_size, workers=workers,
                             frameworks=frameworks)
    runs = stats.round_robin(measures, repeats=repeats, desc="reader epochs")
    base = runs.get(READERS[0])
    rows = []
    for name, values in runs.items():
        spread = stats.Spread(tuple(values))
        row = {"reader": name, "images_per_s": spread.median, "low": spread.low, "high": spread.high,
               "runs": values}
        if base is not None and name != READERS[0] and len(values) >= stats.MIN_REPEATS:
            c = stats.compare(base, values)
            row["vs_folder"] = c.sentence("the folder reader", name.split(": ", 1)[1], "images/s")
        rows.append(row)
    return rows


def frameworks_here() -> tuple[str, ...]:
    """The readers' frameworks installed here ("torch", "tensorflow")."""
    from labkit.core.frameworks import has_tf, has_torch

    return tuple(n for n, ok in (("torch", has_torch()), ("tensorflow", has_tf())) if ok)


def report(rows: list[dict[str, Any]], *, files: int, image_size: int, workers: int, batch_size: int) -> str:
    """The readers' table, each shard reader's sentence against the folder reader, and what
    could not run here and why."""
    from labkit.core.frameworks import missing_reason
    from labkit.course.tables import table

    lines = []
    if rows:
        lines.append(table(rows, ["reader", "images_per_s", "low", "high"],
                           title=f"{files} images read at {image_size}², {workers} workers, batch {batch_size}"))
        lines += [r["vs_folder"] for r in rows if "vs_folder" in r]
        if any(len(r["runs"]) < stats.MIN_REPEATS for r in rows):
            lines.append(f"fewer than {stats.MIN_REPEATS} runs each: no verdict on which reader is faster")
    here = frameworks_here()
    lines += [missing_reason(f) for f in ("torch", "tensorflow") if f not in here]
    return "\n".join(lines)


def comparison_of(rows: list[dict[str, Any]], a: str, b: str) -> stats.Comparison | None:
    """The comparison of reader `b` against reader `a` (None: fewer runs than a verdict needs)."""
    got = {r["reader"]: r["runs"] for r in rows}
    if a not in got or b not in got or min(len(got[a]), len(got[b])) < stats.MIN_REPEATS:
        return None
    return stats.compare(got[a], got[b])


def run_recipe(argv: list[str]) -> str:
    """`python -m labkit.recipes.jpeg_shards ARGV` in this environment; its output."""
    return _run_module("labkit.recipes.jpeg_shards", argv, "the jpeg_shards recipe")


def recipe_agrees(shards: os.PathLike, *, image_size: int, batch_size: int) -> tuple[int, bool]:
    """The recipe's batches (`labkit.recipes.jpeg_shards.JpegShards`, one process) against
    labkit's reader over the same files in the same order: (images compared, all equal)."""
    import numpy as np

    from labkit.data.images import ImageReadConfig, iter_image_batches
    from labkit.recipes.jpeg_shards import JpegShards

    ours = iter_image_batches(shards, ImageReadConfig(image_size=image_size, batch_size=batch_size), shard_mode="file")
    n, same = 0, True
    for (images, labels), batch in zip(JpegShards(os.fspath(shards), image_size, batch_size), ours, strict=True):
        same = same and np.array_equal(images.numpy(), batch["image"]) and np.array_equal(labels.numpy(), batch["label"])
        n += len(labels)
    return n, same
