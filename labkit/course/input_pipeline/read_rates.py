"""Notebook 03's reading rates from the page cache: how fast one core reads and verifies shards,
which torch reading mechanism delivers the most, how many loader processes would feed a GPU,
and the checksums every read verifies (a flipped bit on disk is an error naming the file and
byte offset: `corruption_demo`).

Readers are found by key (`READERS`); their labels are for display.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any

from labkit.core import stats
from labkit.core.config import check_int
from labkit.course.input_pipeline.ladder import LadderData
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


def reference_resnet():
    """The appetite of one GPU: the fastest ResNet-50 rung of notebook 04 in the newest full-size
    course run on a GPU in the repository's results, else labkit's fastest ResNet-50 rate in its
    H100 benchmark (batch 256, synthetic 224² images); a `labkit.hardware.results.Reference`
    (value, what was measured, file, device, date)."""
    from labkit.hardware.results import best_resnet, course_run

    course = course_run("04")
    rungs = [f for f in (course.figures("04") if course else []) if f.label.startswith("ladder rung ")]
    return max(rungs, key=lambda f: f.value) if rungs else best_resnet()


def __getattr__(name: str):
    # Older names, now read from the results file rather than typed in.
    if name == "REFERENCE_RESNET50_IMAGES_PER_S":
        return reference_resnet().value
    if name == "REFERENCE_SOURCE":
        ref = reference_resnet()
        return f"ResNet-50 {ref.label}, batch 256; {ref.source.provenance()}"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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


def compare_mechanisms(data: LadderData, *, repeats: int | None = None) -> dict[str, stats.Spread]:
    """Samples/s delivered from the page cache by each torch reading mechanism (no training
    step, so only reading is compared): the textbook per-sample DataLoader with workers, whole
    batches in-process, whole batches in workers, whole batches on a background thread. Timed
    round-robin after a discarded pass of each (which also starts the persistent workers); each
    mechanism's passes as a `labkit.core.stats.Spread` of samples/s."""
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
    runs = stats.round_robin({name: (lambda run=run: _rate(run)) for name, run in passes.items()},
                             repeats=max(repeats, stats.MIN_REPEATS))
    return {name: stats.Spread(tuple(values)) for name, values in runs.items()}


def _rate(run) -> float:
    t0 = time.perf_counter()
    samples = run()
    return samples / max(time.perf_counter() - t0, 1e-9)


def _median(value: stats.Spread | float) -> float:
    return value.median if isinstance(value, stats.Spread) else float(value)


def best_torch_mechanism(mechanisms: dict[str, stats.Spread] | dict[str, float]) -> str:
    """The mechanism with the highest median samples/s."""
    return max(mechanisms, key=lambda name: _median(mechanisms[name]))


def mechanism_rows(mechanisms: dict[str, stats.Spread]) -> list[dict[str, Any]]:
    """One row per mechanism: median samples/s and the range of its passes."""
    return [{"mechanism": name, "samples/s": spread.median, "range": spread.range_text(), "passes": len(spread.values)}
            for name, spread in mechanisms.items()]


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


@dataclass(frozen=True)
class FeedEstimate:
    """How many loader processes like this machine's would feed 1.5× a GPU's appetite (labkit's
    best ResNet-50 rate on one H100, from the benchmark results), `reference` None (with `why`)
    when the results are not here."""

    gb_per_s: float
    reference: Any = None
    why: str = ""
    margin: float = 1.5
    image_bytes: int = 224 * 224 * 3
    # 224² JPEGs one process decodes per second here (None: not measured)
    decodes_per_s: float | None = None

    @property
    def images_per_s(self) -> float:
        return self.margin * self.reference.value

    @property
    def reading_workers(self) -> int:
        return workers_to_feed(images_per_s=self.images_per_s, image_bytes=self.image_bytes, gb_per_s=self.gb_per_s)

    @property
    def decoding_workers(self) -> int | None:
        return math.ceil(self.images_per_s / self.decodes_per_s) if self.decodes_per_s else None

    @property
    def workers(self) -> int:
        """The loader processes the appetite needs: the more of reading and decoding."""
        return max(self.reading_workers, self.decoding_workers or 0)


def feed_estimate(gb_per_s: float, decodes_per_s: float | None = None) -> FeedEstimate:
    """`FeedEstimate` for one loader process reading `gb_per_s` and decoding `decodes_per_s`
    224² JPEGs a second (`jpeg_decodes_per_s`; None leaves decoding out, and says so)."""
    from labkit.hardware.results import ResultsUnavailable

    try:
        return FeedEstimate(gb_per_s, reference_resnet(), decodes_per_s=decodes_per_s)
    except ResultsUnavailable as e:
        return FeedEstimate(gb_per_s, None, str(e), decodes_per_s=decodes_per_s)


def jpeg_decodes_per_s(seconds: float = 0.3, size: int = 224, repeats: int = stats.MIN_REPEATS) -> float:
    """224² JPEGs (quality 90, photo-like) one process decodes to RGB pixels per second here:
    the median of `repeats` runs of at least `seconds` each, with Pillow, as a loader worker
    would."""
    import io

    from PIL import Image

    from labkit.profiling.workload import encoded_images

    images = encoded_images("jpeg", size)

    def one_run() -> float:
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for data in images:
                Image.open(io.BytesIO(data)).convert("RGB").load()
            done += len(images)
        return done / (time.perf_counter() - start)

    return statistics.median(one_run() for _ in range(repeats))


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


# ---------------------------------------------------------------- checksums


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
