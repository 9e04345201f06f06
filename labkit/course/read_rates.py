"""Notebook 03's reading rates from the page cache: how fast one core reads and verifies shards,
which torch reading mechanism delivers the most, and how many loader processes would feed a GPU.

Readers are found by key (`READERS`); their labels are for display.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from labkit.core.config import check_int
from labkit.course.input_ladder import LadderData
from labkit.course.plots import finish, new_figure
from labkit.data.reader import ReadConfig
from labkit.data.shards import ShardConfig, ShardSet
from labkit.data.throughput import (
    compare,
    count_pass,
    crc32c_pass,
    files_bytes,
    raw_read_pass,
    single_core_ceiling,
)

# Reference appetite of one GPU: torchvision ResNet-50 training, batch 256, bf16 autocast +
# channels_last + torch.compile, synthetic 224×224 input, on one NVIDIA H100 80GB HBM3
# (torch 2.11.0 + CUDA 13.0), median step after warm-up, measured 2026-11-22.
REFERENCE_RESNET50_IMAGES_PER_S = 5534
REFERENCE_SOURCE = "ResNet-50 bf16+channels_last+compile, batch 256, one H100 80GB, measured 2026-11-22"

# key -> label of each reader `page_cache_rates` times.
READERS = {"raw": "raw read", "crc32c": "crc32c", "torch_batch": "torch, mechanism=batch",
           "torch_sample": "torch, mechanism=sample", "tf_data": "tf.data, 2 parallel reads"}
CEILING_LABEL = "ceiling 1/(1/raw+1/crc)"


@dataclass(frozen=True)
class ReadRates:
    """Page-cache reading rates of the same shards, by reader key: GB/s of shard bytes, and
    records/s for the readers that count records."""

    gb_per_s: dict[str, float]
    records_per_s: dict[str, float]

    @property
    def ceiling(self) -> float:
        """One core reading every byte once and checksumming it once: 1 / (1/raw + 1/crc)."""
        return single_core_ceiling(self.gb_per_s["raw"], self.gb_per_s["crc32c"])

    def rows(self) -> list[dict[str, Any]]:
        return ([{"reader": READERS[k], "GB/s": v} for k, v in self.gb_per_s.items()]
                + [{"reader": CEILING_LABEL, "GB/s": self.ceiling}])


def page_cache_rates(paths, *, kind: str = "images", batch_size: int = 64, repeats: int = 3,
                     with_tf: bool = True, with_torch: bool = True) -> ReadRates:
    """Raw read, CRC32C, labkit's two torch mechanisms (in-process) and tf.data (2 parallel
    reads) on the same shards, timed round-robin in one run."""
    nbytes = files_bytes(paths)
    passes = {"raw": raw_read_pass(paths), "crc32c": crc32c_pass(paths)}
    if with_torch:
        from labkit.data.torch_loader import LoaderConfig, make_loader

        for mech in ("batch", "sample"):
            loader = make_loader(paths, ReadConfig(kind=kind, batch_size=batch_size), LoaderConfig(mechanism=mech))
            passes[f"torch_{mech}"] = count_pass(lambda ld=loader: ld)
    if with_tf:
        from labkit.data.tf_pipeline import (
            AUTOTUNE,
            TFPipelineConfig,
            make_tf_dataset,
            tf_record_batches,
        )

        if kind == "raw":  # the plain peer: records as strings, batched
            ds = tf_record_batches(paths, batch_size, num_parallel_reads=2)
        else:
            ds = make_tf_dataset(paths, TFPipelineConfig(kind=kind, batch_size=batch_size, num_parallel_reads=2,
                                                         parallel_calls=AUTOTUNE, prefetch=AUTOTUNE))
        passes["tf_data"] = count_pass(lambda: ds)
    timed = compare(passes, nbytes=nbytes, repeats=repeats)
    return ReadRates({k: t.gb_per_s for k, t in timed.items()},
                     {k: t.samples_per_s for k, t in timed.items() if t.samples})


def compare_mechanisms(data: LadderData, *, repeats: int | None = None) -> dict[str, float]:
    """Samples/s delivered from the page cache by each torch reading mechanism (no training
    step, so only reading is compared): the textbook per-sample DataLoader with workers, whole
    batches in-process, whole batches in workers, whole batches on a background thread. Timed
    round-robin after a warm-up pass (which also starts the persistent workers)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return _compare_mechanisms(data, repeats or 2 * data.config.repeats)


def _compare_mechanisms(data: LadderData, repeats: int) -> dict[str, float]:
    from labkit.data.torch_loader import LoaderConfig, make_loader

    c = data.config
    w = c.num_workers
    read = ReadConfig(kind="images", batch_size=c.batch_size)
    configs = {
        f"sample + collate, {w} workers": LoaderConfig(mechanism="sample", num_workers=w, persistent_workers=True,
                                                       prefetch_factor=c.prefetch),
        "batch, in-process": LoaderConfig(),
        f"batch, {w} workers": LoaderConfig(num_workers=w, persistent_workers=True, prefetch_factor=c.prefetch),
        "batch, background thread": LoaderConfig(mechanism="thread", prefetch_factor=c.prefetch),
    }
    loaders = {name: make_loader(data.shards.paths, read, cfg) for name, cfg in configs.items()}
    passes = {name: count_pass(lambda ld=loader: ld) for name, loader in loaders.items()}
    timed = compare(passes, nbytes=files_bytes(data.shards.paths), repeats=repeats)
    return {name: t.samples_per_s for name, t in timed.items()}


def best_torch_mechanism(mechanisms: dict[str, float]) -> str:
    """The mechanism that delivered the most samples/s."""
    return max(mechanisms, key=mechanisms.get)


def write_bench_shards(out_dir: str | os.PathLike, *, record_kb: int = 100, total_mb: int = 32,
                       shards: int = 8) -> ShardSet:
    """Fixed-size random records (`record_kb` KB each, `total_mb` MB in all) for ceiling runs."""
    from labkit.data.shards import write_raw_shards

    check_int("record_kb", record_kb, minimum=1)
    check_int("total_mb", total_mb, minimum=1)
    size = record_kb * 1000
    n = max(shards, total_mb * 1_000_000 // size)
    payload = os.urandom(size)
    return write_raw_shards(out_dir, (payload for _ in range(n)), n,
                            ShardConfig(records_per_shard=-(-n // shards), prefix=f"bench{record_kb}k"))


def workers_to_feed(*, images_per_s: float, image_bytes: int, gb_per_s: float) -> int:
    """Loader processes needed to deliver `images_per_s` images of `image_bytes` when one process
    reads `gb_per_s` (a lower bound: decoding and augmentation come on top)."""
    if not gb_per_s or gb_per_s != gb_per_s:
        return 0
    return max(1, -(-int(images_per_s * image_bytes) // int(gb_per_s * 1e9)))


def plot_rates(rates: ReadRates, path: str | os.PathLike | None = None):
    """Horizontal bars of GB/s from the page cache, the single-core ceiling drawn as a line."""
    labels = [READERS[k] for k in rates.gb_per_s]
    fig, ax = new_figure((8, 0.45 * len(labels) + 1))
    ax.barh(labels, list(rates.gb_per_s.values()), color="tab:gray")
    ax.axvline(rates.ceiling, color="tab:red", linestyle="--", label=f"single-core ceiling {rates.ceiling:.2f} GB/s")
    ax.invert_yaxis()
    ax.set_xlabel("GB/s of shard bytes (page cache, CRC verified)")
    ax.legend(loc="lower right")
    return finish(fig, path)
