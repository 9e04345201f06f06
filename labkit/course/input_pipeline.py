"""The input-pipeline ladder of notebook 03: naive → shards → parallel reads → prefetch → cache,
for the torch DataLoader and for tf.data, each rung measured as a real training epoch behind
injected Cloud-Storage-like latency: samples/s and the share of step time spent waiting for data.

Also here: the page-cache comparison that picks the torch reading mechanism, and the ceilings.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from labkit.core.config import check_float, check_int
from labkit.data.latency import StorageLatency
from labkit.data.reader import ReadConfig
from labkit.data.shards import ShardConfig, ShardSet, write_image_shards
from labkit.data.synthetic import ImageDatasetConfig, SyntheticImages
from labkit.data.throughput import (
    DataTime,
    batch_size_of,
    compare,
    count_pass,
    crc32c_pass,
    files_bytes,
    raw_read_pass,
    single_core_ceiling,
)

RUNGS = ("naive: one file per sample", "shards", "parallel reads", "prefetch", "cache")

# Reference appetite of one GPU: torchvision ResNet-50 training, batch 256, bf16 autocast +
# channels_last + torch.compile, synthetic 224×224 input, on one NVIDIA H100 80GB HBM3
# (torch 2.11.0 + CUDA 13.0), median step after warm-up, measured 2026-11-22.
REFERENCE_RESNET50_IMAGES_PER_S = 5534
REFERENCE_SOURCE = "ResNet-50 bf16+channels_last+compile, batch 256, one H100 80GB, measured 2026-11-22"


@dataclass(frozen=True)
class LadderConfig:
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
    config: LadderConfig


def write_ladder_data(out_dir: str | os.PathLike, config: LadderConfig) -> LadderData:
    ds = SyntheticImages(ImageDatasetConfig(num_samples=config.num_samples, image_size=config.image_size,
                                            num_classes=config.num_classes, seed=config.seed))
    out = os.fspath(out_dir)
    small = write_image_shards(os.path.join(out, "small-files"), ds,
                               ShardConfig(records_per_shard=1, prefix="sample"))
    shards = write_image_shards(os.path.join(out, "shards"), ds,
                                ShardConfig(records_per_shard=config.records_per_shard, prefix="train"))
    return LadderData(small, shards, config)


@dataclass(frozen=True)
class Rung:
    """One measured epoch: training samples/s and the fraction of step time waiting for data."""

    engine: str
    name: str
    samples: int
    seconds: float
    data_fraction: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds else float("inf")


@dataclass
class Ladder:
    engine: str
    rungs: list[Rung] = field(default_factory=list)

    @property
    def best(self) -> Rung:
        return max(self.rungs, key=lambda r: r.samples_per_s)

    def speedup(self) -> float:
        """Best rung over the naive one."""
        return self.best.samples_per_s / self.rungs[0].samples_per_s

    def table(self, versus: str = "vs naive") -> str:
        """Samples/s, ratio to the first row, and data wait, one line per rung."""
        base = self.rungs[0].samples_per_s
        lines = [f"{self.engine:6s} {'':32s} {'samples/s':>10s} {versus:>9s} {'data wait':>10s}"]
        for r in self.rungs:
            lines.append(f"{'':6s} {r.name:32s} {r.samples_per_s:10,.0f} {r.samples_per_s / base:8.1f}× "
                         f"{100 * r.data_fraction:9.0f}%")
        return "\n".join(lines)


def best_epoch(engine: str, name: str, batches: Iterable, step: Callable[[object], object],
               repeats: int) -> Rung:
    """The fastest of `repeats` epochs (a shared machine's hiccups only ever slow a run down)."""
    return min((timed_epoch(engine, name, batches, step) for _ in range(repeats)), key=lambda r: r.seconds)


def timed_epoch(engine: str, name: str, batches: Iterable, step: Callable[[object], object]) -> Rung:
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
    dt = DataTime(1, data, compute)
    return Rung(engine, name, samples, total, dt.fraction)


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


def torch_ladder(data: LadderData, step: Callable[[dict], object]) -> Ladder:
    """The ladder for the torch DataLoader (mechanism "batch"), every rung behind the latency.
    More workers than cores is deliberate here: they mostly wait on (injected) storage."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        return _torch_ladder(data, step)


def _torch_ladder(data: LadderData, step: Callable[[dict], object]) -> Ladder:
    from labkit.core import devices
    from labkit.data.torch_loader import LoaderConfig, make_loader

    c = data.config
    opener = c.latency.opener()
    read = ReadConfig(kind="images", batch_size=c.batch_size)
    pin = devices.cuda_available()
    ladder = Ladder("torch")
    small = make_loader(data.small_files.paths, read, LoaderConfig(), opener=opener)
    ladder.rungs.append(timed_epoch("torch", RUNGS[0], small, step))  # slow by design: once
    shards = make_loader(data.shards.paths, read, LoaderConfig(), opener=opener)
    ladder.rungs.append(best_epoch("torch", RUNGS[1], shards, step, c.repeats))
    par = make_loader(data.shards.paths, read, LoaderConfig(num_workers=c.num_workers), opener=opener)
    ladder.rungs.append(best_epoch("torch", RUNGS[2], par, step, c.repeats))
    pre_cfg = LoaderConfig(num_workers=c.num_workers, prefetch_factor=c.prefetch, persistent_workers=True,
                           pin_memory=pin)
    pre = make_loader(data.shards.paths, read, pre_cfg, opener=opener)
    for _ in pre:  # start the persistent workers; the measured epoch is the second
        pass
    ladder.rungs.append(best_epoch("torch", RUNGS[3], pre, step, c.repeats))
    cached = CachedBatches(pre)
    for _ in cached:
        pass
    ladder.rungs.append(best_epoch("torch", RUNGS[4], cached, step, c.repeats))
    return ladder


def tf_ladder(data: LadderData, step: Callable[[dict], object]) -> Ladder:
    """The same ladder with tf.data: sequential reads, shards, interleave + parallel parse,
    prefetch (AUTOTUNE), cache."""
    from labkit.data.tf_pipeline import AUTOTUNE, TFPipelineConfig, make_tf_dataset

    c = data.config
    lat = c.latency
    base = TFPipelineConfig(kind="images", batch_size=c.batch_size)
    par = replace(base, num_parallel_reads=c.num_workers, parallel_calls=AUTOTUNE)
    ladder = Ladder("tf")
    configs = [(RUNGS[0], data.small_files, base), (RUNGS[1], data.shards, base),
               (RUNGS[2], data.shards, par), (RUNGS[3], data.shards, replace(par, prefetch=AUTOTUNE))]
    for name, files, cfg in configs:
        ds = make_tf_dataset(files.paths, cfg, latency=lat)
        repeats = 1 if files is data.small_files else c.repeats
        ladder.rungs.append(best_epoch("tf", name, ds, step, repeats))
    cached = make_tf_dataset(data.shards.paths, replace(par, prefetch=AUTOTUNE, cache=True), latency=lat)
    for _ in cached:  # the first epoch fills the cache
        pass
    ladder.rungs.append(best_epoch("tf", RUNGS[4], cached, step, c.repeats))
    return ladder


@dataclass(frozen=True)
class ReadRates:
    """Page-cache reading rates of the same shards (GB/s of shard bytes, and records/s)."""

    gb_per_s: dict[str, float]
    records_per_s: dict[str, float]

    @property
    def ceiling(self) -> float:
        return self.gb_per_s["ceiling 1/(1/raw+1/crc)"]


def page_cache_rates(paths, *, kind: str = "images", batch_size: int = 64, repeats: int = 3,
                     with_tf: bool = True, with_torch: bool = True) -> ReadRates:
    """Raw read, CRC32C, their single-core ceiling, labkit's two torch mechanisms (in-process)
    and tf.data (2 parallel reads) on the same shards, timed round-robin in one run."""
    nbytes = files_bytes(paths)
    passes = {"raw read": raw_read_pass(paths), "crc32c": crc32c_pass(paths)}
    if with_torch:
        from labkit.data.torch_loader import LoaderConfig, make_loader

        for mech in ("batch", "sample"):
            loader = make_loader(paths, ReadConfig(kind=kind, batch_size=batch_size), LoaderConfig(mechanism=mech))
            passes[f"torch, mechanism={mech}"] = count_pass(lambda ld=loader: ld)
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
        passes["tf.data, 2 parallel reads"] = count_pass(lambda: ds)
    timed = compare(passes, nbytes=nbytes, repeats=repeats)
    gb = {k: t.gb_per_s for k, t in timed.items()}
    gb["ceiling 1/(1/raw+1/crc)"] = single_core_ceiling(gb["raw read"], gb["crc32c"])
    rps = {k: t.samples_per_s for k, t in timed.items() if t.samples}
    return ReadRates(gb, rps)


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


def plot_ladders(ladders: list[Ladder], path: str | os.PathLike | None = None):
    """Bars of training samples/s per rung (log scale), one group per engine; saved if `path`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / max(1, len(ladders))
    for i, lad in enumerate(ladders):
        xs = [j + i * width for j in range(len(lad.rungs))]
        ax.bar(xs, [r.samples_per_s for r in lad.rungs], width, label=lad.engine)
    ax.set_xticks([j + width * (len(ladders) - 1) / 2 for j in range(len(RUNGS))])
    ax.set_xticklabels([r.split(":")[0] for r in RUNGS])
    ax.set_yscale("log")
    ax.set_ylabel("training samples/s")
    ax.set_title("input-pipeline ladder under injected storage latency")
    ax.legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def plot_rates(rates: ReadRates, path: str | os.PathLike | None = None):
    """Horizontal bars of GB/s from the page cache, the single-core ceiling drawn as a line."""
    import matplotlib.pyplot as plt

    rows = {k: v for k, v in rates.gb_per_s.items() if not k.startswith("ceiling")}
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1))
    ax.barh(list(rows), list(rows.values()), color="tab:gray")
    ax.axvline(rates.ceiling, color="tab:red", linestyle="--", label=f"single-core ceiling {rates.ceiling:.2f} GB/s")
    ax.invert_yaxis()
    ax.set_xlabel("GB/s of shard bytes (page cache, CRC verified)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
    return fig


def corruption_demo(path: str, out_path: str) -> str:
    """Copy a shard with one payload byte flipped in its second record and read it back: the
    error message (which names the file and byte offset)."""
    from labkit.data.tfrecord import CorruptRecordError, read_records

    with open(path, "rb") as f:
        raw = bytearray(f.read())
    first_len = int.from_bytes(raw[:8], "little")
    raw[16 + first_len + 12 + 5] ^= 0x40
    with open(out_path, "wb") as f:
        f.write(bytes(raw))
    try:
        for _ in read_records(out_path):
            pass
    except CorruptRecordError as e:
        return str(e)
    raise AssertionError("a flipped byte went unnoticed")


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


def _rung(lad: Ladder, name: str) -> Rung:
    return next(r for r in lad.rungs if r.name == name)


def conclusions(ladders: list[Ladder], mechanisms: dict[str, float] | None, raw: ReadRates,
                config: LadderConfig) -> str:
    """The notebook's conclusions, as sentences over this run's measurements."""
    lines = []
    for lad in ladders:
        naive, shards = lad.rungs[0], _rung(lad, "shards")
        par, pre, cache = _rung(lad, "parallel reads"), _rung(lad, "prefetch"), _rung(lad, "cache")
        lines.append(
            f"- {lad.engine}: one file per sample trained at {naive.samples_per_s:,.0f} samples/s with "
            f"{100 * naive.data_fraction:.0f}% of the time waiting for data, each file paying "
            f"{config.open_latency_ms:g} ms to open. Shards of {config.records_per_shard} made it "
            f"{shards.samples_per_s / naive.samples_per_s:.1f}× faster; parallel reads "
            f"{par.samples_per_s / shards.samples_per_s:.2f}× on top, prefetch "
            f"{pre.samples_per_s / par.samples_per_s:.2f}×, cache {cache.samples_per_s / pre.samples_per_s:.2f}×. "
            f"Best rung: {lad.best.name} ({lad.speedup():.1f}× the naive rung, data wait "
            f"{100 * lad.best.data_fraction:.0f}%).")
        if lad.engine == "torch" and par.samples_per_s < shards.samples_per_s:
            steps = -(-config.num_samples // config.batch_size)
            lines.append(f"  The {config.num_workers} loader workers were started afresh for each epoch "
                         f"(persistent_workers=False); over an epoch of {steps} steps that start-up cost "
                         "more than the overlap saved. The prefetch rung keeps them alive.")
        gains = [(r.name, r.samples_per_s / p.samples_per_s) for p, r in zip(lad.rungs, lad.rungs[1:], strict=False)]
        flat = [n for n, g in gains if g < 1.05]
        if flat:
            lines.append(f"  Rungs that gained less than 5% here: {', '.join(flat)} (on {os.cpu_count()} "
                         "cores, extra processes compete with the training step; with more cores and "
                         "real storage they pay off).")
    if mechanisms:
        best = best_torch_mechanism(mechanisms)
        worst = min(mechanisms, key=mechanisms.get)
        lines.append(f"- torch reading mechanism, from the page cache: {best} delivered the most "
                     f"({mechanisms[best]:,.0f} samples/s), {mechanisms[best] / mechanisms[worst]:.1f}× "
                     f"{worst} ({mechanisms[worst]:,.0f} samples/s); that is the mechanism to use on this machine.")
    ceiling = raw.ceiling
    t = raw.gb_per_s.get("torch, mechanism=batch")
    f = raw.gb_per_s.get("tf.data, 2 parallel reads")
    if t:
        lines.append(f"- From the page cache, with CRCs verified, the torch path read {t:.2f} GB/s: "
                     f"{100 * t / ceiling:.0f}% of the single-core ceiling {ceiling:.2f} GB/s "
                     f"(raw read {raw.gb_per_s['raw read']:.2f}, CRC32C {raw.gb_per_s['crc32c']:.2f} GB/s)"
                     + (f", {t / f:.2f}× tf.data's TFRecordDataset ({f:.2f} GB/s)." if f else "."))
    return "\n".join(lines)
