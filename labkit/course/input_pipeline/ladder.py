"""Notebook 03's input-pipeline ladder: naive → shards → parallel reads → prefetch → cache, for
the torch DataLoader and for tf.data, each rung measured as real training epochs behind
injected Cloud-Storage-like latency: samples/s and the share of step time spent waiting for data.
After a discarded warm-up of each rung, the rungs take turns epoch by epoch `repeats` times
(`labkit.course.ladder`); a rung reports its median epoch and keeps every epoch, so the
conclusions can say whether a step up the ladder is measurably faster.

    data = write_ladder_data(out_dir, InputLadderConfig())
    ladder = torch_ladder(data, step)       # or tf_ladder(data, step)
    ladder.rung("shards").samples_per_s     # rungs are found by key; labels are for display

The page-cache reading rates and the ceilings are `read_rates` beside this module; the
sentences computed from both, `conclusions`.
"""

from __future__ import annotations

import itertools
import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from labkit.core import stats
from labkit.core.config import check_float, check_int
from labkit.course import ladder
from labkit.course.plots import finish, new_figure
from labkit.data.latency import StorageLatency
from labkit.data.reader import ReadConfig
from labkit.data.shards import ShardConfig, ShardSet, write_image_shards
from labkit.data.synthetic import ImageDatasetConfig, SyntheticImages
from labkit.data.throughput import DataTime, batch_size_of

# The rungs in climbing order: key -> label.
INPUT_RUNGS = {"naive": "naive: one file per sample", "shards": "shards", "parallel_reads": "parallel reads",
               "prefetch": "prefetch", "cache": "cache"}


@dataclass(frozen=True)
class InputLadderConfig:
    """Sizes and knobs of the ladder: the dataset, the shard size, the batch, the readers'
    parallelism, and the injected storage latency."""

    num_samples: int = 256
    image_size: int = 32
    num_classes: int = 10
    records_per_shard: int = 32
    batch_size: int = 32
    num_workers: int = 4
    prefetch: int = 4
    open_latency_ms: float = 20.0
    bandwidth_mb_s: float = 50.0
    repeats: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_samples", self.num_samples, minimum=1)
        check_int("image_size", self.image_size, minimum=4)
        check_int("num_classes", self.num_classes, minimum=2)
        check_int("records_per_shard", self.records_per_shard, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("num_workers", self.num_workers, minimum=1)
        check_int("prefetch", self.prefetch, minimum=1)
        check_float("open_latency_ms", self.open_latency_ms, minimum=0.0)
        check_float("bandwidth_mb_s", self.bandwidth_mb_s, minimum=1e-3)
        check_int("repeats", self.repeats, minimum=1)

    @property
    def latency(self) -> StorageLatency:
        return StorageLatency(self.open_latency_ms, self.bandwidth_mb_s)


@dataclass(frozen=True)
class LadderData:
    """The same dataset written twice: one file per sample, and in shards."""

    small_files: ShardSet
    shards: ShardSet
    config: InputLadderConfig


def write_ladder_data(out_dir: str | os.PathLike, config: InputLadderConfig) -> LadderData:
    ds = SyntheticImages(ImageDatasetConfig(num_samples=config.num_samples, image_size=config.image_size,
                                            num_classes=config.num_classes, seed=config.seed))
    out = os.fspath(out_dir)
    small = write_image_shards(os.path.join(out, "small-files"), ds,
                               ShardConfig(records_per_shard=1, prefix="sample"))
    shards = write_image_shards(os.path.join(out, "shards"), ds,
                                ShardConfig(records_per_shard=config.records_per_shard, prefix="train"))
    return LadderData(small, shards, config)


@dataclass(frozen=True)
class InputRung:
    """A rung's measured epochs: `seconds` and `data_fraction` are the median epoch's, and
    `epochs_s` holds every measured epoch's seconds (one entry for a single epoch)."""

    engine: str
    key: str
    samples: int
    seconds: float
    data_fraction: float
    epochs_s: tuple[float, ...] = ()

    @property
    def label(self) -> str:
        return INPUT_RUNGS[self.key]

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else float("inf")

    @property
    def rates(self) -> tuple[float, ...]:
        """Samples/s of every measured epoch."""
        return tuple(self.samples / s if s else float("inf") for s in (self.epochs_s or (self.seconds,)))

    @property
    def range_text(self) -> str:
        return stats.Spread(self.rates).range_text()


@dataclass
class InputLadder:
    engine: str
    rungs: list[InputRung] = field(default_factory=list)

    @property
    def best(self) -> InputRung:
        return max(self.rungs, key=lambda r: r.samples_per_s)

    def rung(self, key: str) -> InputRung:
        for r in self.rungs:
            if r.key == key:
                return r
        raise KeyError(f"{self.engine} ladder has no rung {key!r} (rungs: {', '.join(r.key for r in self.rungs)})")

    def speedup(self) -> float:
        """Best rung over the naive one (ratio of median epochs)."""
        return self.best.samples_per_s / self.rungs[0].samples_per_s

    def comparison(self, before: str, after: str) -> stats.Comparison | None:
        """Rung `after` against rung `before` (samples/s of their epochs), or None when either
        has fewer epochs than a verdict needs."""
        a, b = self.rung(before).rates, self.rung(after).rates
        if min(len(a), len(b)) < stats.MIN_REPEATS:
            return None
        return stats.compare(a, b)

    def verdict(self, before: str, after: str) -> str:
        c = self.comparison(before, after)
        if c is None:
            return f"fewer than {stats.MIN_REPEATS} epochs: no verdict"
        return stats.NO_DIFFERENCE if c.winner is None else ("faster" if c.b_is_better else "slower")

    def rows(self) -> list[dict[str, Any]]:
        """Median samples/s, their range, ratio to the first rung, and data wait, one row per rung."""
        base = self.rungs[0].samples_per_s
        return [{"rung": r.label, "samples/s": r.samples_per_s, "range": r.range_text,
                 "vs naive": r.samples_per_s / base, "data wait (%)": round(100 * r.data_fraction)}
                for r in self.rungs]


def measure_rungs(engine: str, rungs: Mapping[str, Iterable], step: Callable[[object], object], repeats: int,
                  warm_up: Mapping[str, Callable[[], object]] | None = None) -> list[InputRung]:
    """Epochs of every rung in turns: a discarded warm-up of each (`warm_up[key]`, default the
    first two batches of an epoch), then `repeats` epochs of each, round-robin. One `InputRung`
    per key, in order, holding the median epoch and every epoch's time."""
    warm = {key: (warm_up or {}).get(key, lambda b=batches: list(itertools.islice(iter(b), ladder.WARM_UP_STEPS)))
            for key, batches in rungs.items()}
    runs = ladder.in_turns({key: (lambda k=key, b=batches: timed_epoch(engine, k, b, step))
                            for key, batches in rungs.items()}, repeats=repeats, warm_up_with=warm)
    out = []
    for key in rungs:
        epochs = runs[key]
        median = sorted(epochs, key=lambda r: r.seconds)[len(epochs) // 2]
        out.append(InputRung(engine, key, median.samples, median.seconds,
                             statistics.median(e.data_fraction for e in epochs), tuple(e.seconds for e in epochs)))
    return out


def timed_epoch(engine: str, key: str, batches: Iterable, step: Callable[[object], object]) -> InputRung:
    """One epoch of `step` over `batches`, timing the waits for data apart from the steps."""
    t0 = time.perf_counter()
    data = compute = 0.0
    samples = 0
    it = iter(batches)
    while True:  # until the iterator is exhausted
        t1 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        t2 = time.perf_counter()
        step(batch)
        compute += time.perf_counter() - t2
        data += t2 - t1
        samples += batch_size_of(batch)
    total = time.perf_counter() - t0
    return InputRung(engine, key, samples, total, DataTime(1, data, compute).fraction)


class CachedBatches:
    """The torch counterpart of `tf.data.Dataset.cache()`: the first pass keeps every batch in
    memory, later passes replay them without touching storage."""

    def __init__(self, source: Iterable):
        self.source = source
        self._cache: list | None = None

    def __iter__(self):
        if self._cache is not None:
            yield from self._cache
            return
        kept = []
        for b in self.source:
            kept.append(b)
            yield b
        self._cache = kept


def torch_ladder(data: LadderData, step: Callable[[dict], object]) -> InputLadder:
    """The ladder for the torch DataLoader (mechanism "batch"), every rung behind the latency.
    More workers than cores is deliberate here: they mostly wait on (injected) storage."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return _torch_ladder(data, step)


def _torch_ladder(data: LadderData, step: Callable[[dict], object]) -> InputLadder:
    from labkit.core import devices
    from labkit.data.torch_loader import LoaderConfig, make_loader

    c = data.config
    opener = c.latency.opener()
    read = ReadConfig(kind="images", batch_size=c.batch_size)
    pre_cfg = LoaderConfig(num_workers=c.num_workers, prefetch_factor=c.prefetch, persistent_workers=True,
                           pin_memory=devices.cuda_available())
    pre = make_loader(data.shards.paths, read, pre_cfg, opener=opener)
    cached = CachedBatches(pre)
    rungs = {
        "naive": make_loader(data.small_files.paths, read, LoaderConfig(), opener=opener),
        "shards": make_loader(data.shards.paths, read, LoaderConfig(), opener=opener),
        "parallel_reads": make_loader(data.shards.paths, read, LoaderConfig(num_workers=c.num_workers), opener=opener),
        "prefetch": pre,
        "cache": cached,
    }
    # A full first epoch starts the persistent workers and fills the cache; the measured
    # epochs are the later ones.
    warm_up = {"prefetch": lambda: list(pre), "cache": lambda: list(cached)}
    return InputLadder("torch", measure_rungs("torch", rungs, step, c.repeats, warm_up))


def tf_ladder(data: LadderData, step: Callable[[dict], object]) -> InputLadder:
    """The same ladder with tf.data: sequential reads, shards, interleave + parallel parse,
    prefetch (AUTOTUNE), cache."""
    from labkit.data.tf_pipeline import AUTOTUNE, TFPipelineConfig, make_tf_dataset

    c = data.config
    lat = c.latency
    base = TFPipelineConfig(kind="images", batch_size=c.batch_size)
    par = replace(base, num_parallel_reads=c.num_workers, parallel_calls=AUTOTUNE)
    configs = [("naive", data.small_files, base), ("shards", data.shards, base),
               ("parallel_reads", data.shards, par), ("prefetch", data.shards, replace(par, prefetch=AUTOTUNE))]
    rungs = {key: make_tf_dataset(files.paths, cfg, latency=lat) for key, files, cfg in configs}
    cached = make_tf_dataset(data.shards.paths, replace(par, prefetch=AUTOTUNE, cache=True), latency=lat)
    rungs["cache"] = cached
    # the first epoch fills the cache (a partial epoch would leave it unfinished)
    return InputLadder("tf", measure_rungs("tf", rungs, step, c.repeats, {"cache": lambda: list(cached)}))


def plot_ladders(ladders: list[InputLadder], path: str | os.PathLike | None = None):
    """Bars of training samples/s per rung (log scale), one group per engine."""
    fig, ax = new_figure((8, 3.5))
    width = 0.8 / max(1, len(ladders))
    for i, lad in enumerate(ladders):
        xs = [j + i * width for j in range(len(lad.rungs))]
        ax.bar(xs, [r.samples_per_s for r in lad.rungs], width, label=lad.engine)
    ax.set_xticks([j + width * (len(ladders) - 1) / 2 for j in range(len(INPUT_RUNGS))])
    ax.set_xticklabels([label.split(":")[0] for label in INPUT_RUNGS.values()])
    ax.set_yscale("log")
    ax.set_ylabel("training samples/s")
    ax.set_title("input-pipeline ladder under injected storage latency")
    ax.legend()
    return finish(fig, path)
