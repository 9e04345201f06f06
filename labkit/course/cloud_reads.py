"""Notebook 03's "Your shards in Cloud Storage": the ways a job reads its shards, measured against
the local Cloud Storage server playing a cited latency and stream rate (or a real bucket).

The ways, each timed as training epochs of a small CNN (`step_probe.torch_image_step`) fed by
`workers` reader threads, the ways taking turns (`ladder.measure_rungs`):

- ``files``: the JPEG folder in the bucket read a file per image, as a script over a folder
  does (an open and a read per file through gcsfs);
- ``gcsfs``: the shards through gcsfs as `open()` gives them (a ranged request per 5 MiB block);
- ``mount``: the shards read the way Cloud Storage FUSE (the ``/gcs`` mount) reads a file
  sequentially: one streamed request per file (its sequential reads fetch up to 200 MB at a
  time). FUSE itself does not run here: gcsfs makes those requests;
- ``staged``: `labkit.data.stage.stage` first (every file at once, checked), then the local copy.

Requests per epoch come from the server's counts; a probe of single-stream reads of objects of
several sizes shows what the request's latency costs each shard size. `rule` turns the rows
into the decisions: after how many epochs staging pays, how many reader threads a GPU needs,
which shard size. The measuring runs in a child process whose environment points every client
at the server (`LocalStorage.client_env`), so nothing in the notebook's process changes.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GCSFUSE_BENCHMARKS = ("https://github.com/GoogleCloudPlatform/gcsfuse/blob/master/docs/benchmarks.md "
                      "(gcsfuse v3.4.3 on a c4-standard-192 with 200 Gbps networking and a bucket in its region; "
                      "read 2026-11-28)")
WAYS = {"files": "JPEG files in the bucket, one per image",
        "gcsfs": "shards via gcsfs (5 MiB blocks)",
        "mount": "shards as the /gcs mount reads them (a request per file)",
        "staged": "shards staged to local disk first"}
DATA_TIME_TARGET = 0.2  # the share of a step that may wait for data


@dataclass(frozen=True)
class CloudFigures:
    """What each request waits (`request_ms`) and one stream's rate (`stream_mb_s`), with where
    they come from."""

    request_ms: float
    stream_mb_s: float
    source: str

    def text(self) -> str:
        return f"{self.request_ms:g} ms per request, {self.stream_mb_s:,.0f} MB/s per stream ({self.source})"


def cited_figures() -> CloudFigures:
    """Cloud Storage FUSE's published benchmark, per reader: sequential reads of 128 KiB files,
    one read per file, 30 readers at 9,947.74 IOPS: 30 / 9,947.74 s = 3.0 ms per file per reader
    (a request's whole cost, the transfer of 128 KiB included); of 100 MiB files, 10 readers at
    13,433.40 MB/s: 1,343 MB/s per reader. A best case: metadata cached for ever, a large VM."""
    return CloudFigures(round(30 / 9947.74 * 1e3, 1), round(13433.40 / 10), "gcsfuse benchmarks: " + GCSFUSE_BENCHMARKS)


# ------------------------------------------------------------------------ the parent's side

def compare_ways(shards: os.PathLike, photos: os.PathLike, workdir: os.PathLike, *, figures: CloudFigures,
                 image_size: int, batch_size: int, workers: int, repeats: int,
                 probe_mb: tuple[float, ...] = (0.125, 1.0, 8.0, 32.0), bucket_url: str | None = None) -> dict[str, Any]:
    """Upload `shards` and `photos` to a bucket and measure the ways (module docstring). Against
    the local server playing `figures`, or against `bucket_url` (``gs://bucket/prefix``) with
    this environment's credentials, under a new ``labkit-03-TIME-PID`` folder there (left in
    place). Returns the child's measurements."""
    from labkit.core.launcher import child_env

    if bucket_url is not None and (not bucket_url.startswith("gs://") or len(bucket_url.rstrip("/")) <= len("gs://")):
        raise ValueError(f"parameter 'bucket_url' must be gs://BUCKET[/PREFIX] (got {bucket_url!r})")
    workdir = Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    spec = {"shards": str(shards), "photos": str(photos), "local": str(workdir / "staged"),
            "image_size": image_size, "batch_size": batch_size, "workers": workers, "repeats": repeats,
            "probe_mb": list(probe_mb)}
    if bucket_url is not None:  # a folder of its own per run: nothing of yours is replaced or read twice
        url = f"{bucket_url.rstrip('/')}/labkit-03-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        return _child(spec | {"url": url, "figures": None}, child_env())
    from labkit.vertex.storage import LocalStorage
    from labkit.vertex.storage.network import Network

    (workdir / "buckets" / "course").mkdir(parents=True)
    network = Network(figures.request_ms, figures.stream_mb_s)
    with LocalStorage(workdir / "buckets", workdir / "state", network=network) as server:
        spec |= {"url": "gs://course/03", "figures": [figures.request_ms, figures.stream_mb_s]}
        return _child(spec, child_env(server.client_env()))


def _child(spec: dict, env: dict[str, str]) -> dict[str, Any]:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "labkit.course.cloud_reads", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
        raise RuntimeError(f"measuring reads from Cloud Storage failed: {' '.join(tail)}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ the child's side

def measure(spec: dict) -> dict[str, Any]:
    """In an environment that reaches the bucket: upload, stage, then every way in turns."""
    import gcsfs

    from labkit.data.images import ImageReadConfig, iter_image_batches, shard_files
    from labkit.data.stage import stage

    fs = gcsfs.GCSFileSystem()
    url = spec["url"]
    shards_url, photos_url = f"{url}/shards", f"{url}/photos"
    fs.put(spec["shards"], shards_url, recursive=True)
    fs.put(spec["photos"], photos_url, recursive=True)
    read = ImageReadConfig(image_size=spec["image_size"], batch_size=spec["batch_size"])
    workers, counts = spec["workers"], _Counts(fs)
    with counts.around("stage"):
        staged = stage(shards_url, spec["local"], workers=16)
    remote_files, _ = shard_files(shards_url)
    sizes = {f: fs.size(f) for f in remote_files}
    whole = lambda path: fs.open(path, "rb", block_size=max(1, sizes.get(path) or fs.size(path)),  # noqa: E731
                                 cache_type="readahead")
    photo_paths = sorted(p for p in fs.find(photos_url) if p.lower().endswith((".jpg", ".jpeg", ".png")))
    ways: dict[str, Any] = {
        "files": _Parallel(workers, lambda n, i: _file_batches(fs, photo_paths[i::n], read)),
        "gcsfs": _Parallel(workers, lambda n, i: iter_image_batches(shards_url, read, num_consumers=n, consumer=i)),
        "mount": _Parallel(workers, lambda n, i: iter_image_batches(shards_url, read, num_consumers=n,
                                                                    consumer=i, opener=whole)),
        "staged": _Parallel(workers, lambda n, i: iter_image_batches(spec["local"], read, num_consumers=n,
                                                                     consumer=i)),
    }
    requests = {}
    for key, batches in ways.items():  # one counted epoch each, which is also its warm-up
        with counts.around(key):
            sum(1 for _ in batches)
        requests[key] = counts.seen.get(key)
    step = _training_step(spec["local"])
    from labkit.course.input_pipeline.ladder import measure_rungs

    rungs = measure_rungs("torch", ways, step, spec["repeats"], warm_up={k: (lambda: None) for k in ways})
    return {"figures": spec["figures"], "workers": workers, "stage_s": staged.seconds, "stage_mb": staged.nbytes / 1e6,
            "stage_requests": counts.seen.get("stage"),
            "ways": {r.key: {"images": r.samples, "epochs_s": list(r.epochs_s), "data_fraction": r.data_fraction,
                             "requests": requests[r.key]} for r in rungs},
            "probe": _probe(fs, f"{url}/probe", spec["probe_mb"], spec["repeats"])}


class _Parallel:
    """Batches from `workers` reader threads, each its own share (`make(workers, i)`), in the
    order they are ready: one pass per `iter()`."""

    def __init__(self, workers: int, make: Callable[[int, int], Iterator[dict]]):
        self.workers, self.make = workers, make

    def __iter__(self) -> Iterator[dict]:
        q: queue.Queue = queue.Queue(maxsize=2 * self.workers)
        done = object()

        def work(i: int) -> None:
            try:
                for batch in self.make(self.workers, i):
                    q.put(batch)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
                q.put(e)
            q.put(done)

        for i in range(self.workers):
            threading.Thread(target=work, args=(i,), daemon=True).start()
        finished = 0
        while finished < self.workers:
            item = q.get()
            if item is done:
                finished += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item


def _file_batches(fs, paths: list[str], read) -> Iterator[dict]:
    """A file per image, as a folder dataset reads them: open, read, decode; labels from the
    class folder's name (sorted)."""
    import numpy as np

    from labkit.data.images import decode_images

    classes = sorted({p.rsplit("/", 2)[-2] for p in paths})
    for start in range(0, len(paths), read.batch_size):
        chunk = paths[start:start + read.batch_size]
        blobs = []
        for p in chunk:
            with fs.open(p, "rb") as f:
                blobs.append(f.read())
        yield {"image": decode_images(blobs, read.image_size),
               "label": np.asarray([classes.index(p.rsplit("/", 2)[-2]) for p in chunk], np.int64)}


def _training_step(local: str) -> Callable[[dict], object]:
    """The small CNN's SGD step on the batches (on the GPU when there is one), or only the
    reading where torch is not installed."""
    from labkit.core import frameworks

    if not frameworks.has_torch():
        return lambda batch: None
    import torch

    from labkit.course.input_pipeline.step_probe import torch_image_step
    from labkit.data.shards import read_manifest

    manifest = next(Path(local).glob("*-manifest.json"))
    step = torch_image_step(len(read_manifest(str(manifest)).get("classes") or [0, 1]))
    return lambda batch: step({k: torch.from_numpy(v) for k, v in batch.items()})


class _Counts:
    """Requests the local server answered around a block (None against a real bucket)."""

    def __init__(self, fs):
        self.endpoint = os.environ.get("STORAGE_EMULATOR_HOST")
        self.fs, self.seen = fs, {}

    def _now(self) -> int | None:
        if not self.endpoint:
            return None
        from labkit.vertex.storage.server import server_stats

        return server_stats(self.endpoint)["requests"]

    def around(self, key: str):
        from contextlib import contextmanager

        @contextmanager
        def counted():
            self.fs.invalidate_cache()  # a fresh listing, as a new job would have
            before = self._now()
            yield
            after = self._now()
            self.seen[key] = None if before is None else after - before

        return counted()


def _probe(fs, url: str, sizes_mb: list[float], repeats: int) -> list[dict[str, Any]]:
    """One stream reading whole objects of each size, `repeats` times: MB/s per read."""
    rows = []
    for mb in sizes_mb:
        path = f"{url}/object-{mb:g}MB"
        fs.pipe_file(path, os.urandom(int(mb * 1e6)))
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            n = len(fs.cat_file(path))
            rates.append(n / 1e6 / (time.perf_counter() - t0))
        rows.append({"mb": mb, "mb_per_s": rates})
    return rows


# ------------------------------------------------------------------------ what it says

@dataclass(frozen=True)
class Rule:
    """The decisions a learner takes away, each from this run's rows."""

    staging_pays_after: float | None  # epochs; None: streaming was no slower than local here
    readers_per_gpu: int | None        # reader threads for the reference GPU's appetite (None: no reference)
    shard_mb: float                    # smallest probed size within 10% of the best single-stream rate
    under_target: tuple[str, ...]      # the ways whose data wait stayed under DATA_TIME_TARGET

    def text(self, appetite: float | None) -> str:
        stage = ("staging paid from the first epoch here" if self.staging_pays_after is not None
                 and self.staging_pays_after <= 1 else
                 f"staging pays after {self.staging_pays_after:.1f} epochs here" if self.staging_pays_after
                 else "streaming was no slower than the staged copy here: staging does not pay at these figures")
        readers = ("" if self.readers_per_gpu is None else
                   f"; about {self.readers_per_gpu} reader threads like this run's would feed {appetite:,.0f} images/s")
        target = ", ".join(WAYS[k] for k in self.under_target) or "none"
        return (f"{stage}{readers}; shards of {self.shard_mb:g} MB or more stream within 10% of the best "
                f"single-stream rate measured; ways whose data wait stayed under "
                f"{100 * DATA_TIME_TARGET:.0f}% of the step: {target}")


def epoch_s(result: dict[str, Any], way: str) -> float:
    return statistics.median(result["ways"][way]["epochs_s"])


def images_per_s(result: dict[str, Any], way: str) -> float:
    return result["ways"][way]["images"] / epoch_s(result, way)


def rule(result: dict[str, Any], appetite: float | None) -> Rule:
    """`Rule` from `compare_ways`'s result; `appetite` is the GPU's images/s to feed (or None)."""
    stream = min(epoch_s(result, "mount"), epoch_s(result, "gcsfs"))
    gain = stream - epoch_s(result, "staged")
    pays = result["stage_s"] / gain if gain > 0 else None
    best_stream = max(images_per_s(result, "mount"), images_per_s(result, "gcsfs"))
    readers = None if appetite is None else math.ceil(appetite / (best_stream / result["workers"]))
    probe = [(row["mb"], statistics.median(row["mb_per_s"])) for row in result["probe"]]
    top = max(rate for _, rate in probe)
    shard_mb = min(mb for mb, rate in probe if rate >= 0.9 * top)
    under = tuple(k for k, w in result["ways"].items() if w["data_fraction"] < DATA_TIME_TARGET)
    return Rule(pays, readers, shard_mb, under)


def appetite() -> float | None:
    """Images/s to feed: 1.5× the reference GPU's ResNet-50 rate (`read_rates.reference_resnet`),
    None where the results that hold it are not here."""
    from labkit.course.input_pipeline.read_rates import feed_estimate

    feed = feed_estimate(1.0)
    return None if feed.reference is None else feed.images_per_s


def comparison(result: dict[str, Any], a: str, b: str):
    """Way `b` against way `a` (images/s of their epochs), a `labkit.core.stats.Comparison`, or
    None when either has fewer epochs than a verdict needs."""
    from labkit.core import stats

    rates = {k: [w["images"] / s for s in w["epochs_s"]] for k, w in result["ways"].items()}
    if min(len(rates[a]), len(rates[b])) < stats.MIN_REPEATS:
        return None
    return stats.compare(rates[a], rates[b])


def staging_line(result: dict[str, Any]) -> str:
    """What the copy to local disk took: its size, seconds and requests."""
    requests = "" if result["stage_requests"] is None else f", {result['stage_requests']} requests"
    return (f"staging (labkit data stage, 16 files at once): {result['stage_mb']:.1f} MB in "
            f"{result['stage_s']:.2f} s{requests}, once, before the first epoch")


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per way: images/s (median epoch, range), data wait, requests per epoch."""
    from labkit.core import stats

    out = []
    for key, way in result["ways"].items():
        rates = [way["images"] / s for s in way["epochs_s"]]
        out.append({"way": WAYS[key], "images/s": statistics.median(rates), "range": stats.Spread(rates).range_text(),
                    "data wait (%)": round(100 * way["data_fraction"]),
                    "requests / epoch": "n/a" if way["requests"] is None else way["requests"]})
    return out


def probe_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Single-stream reads by object size: measured MB/s, and what the figures alone predict."""
    figures = result["figures"]
    out = []
    for row in result["probe"]:
        line = {"object (MB)": row["mb"], "MB/s measured": statistics.median(row["mb_per_s"])}
        if figures:
            ms, rate = figures
            line["MB/s the figures predict"] = row["mb"] / (ms / 1e3 + row["mb"] / rate)
        out.append(line)
    return out


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((argv or sys.argv[1:])[0])
    print(json.dumps(measure(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
