"""Input-pipeline benchmark: labkit's TFRecord reading paths against the machine's ceilings and
against tf.data's TFRecordDataset, on the same shards from page cache, in one run.

    python benchmarks/bench_input.py                 # 100 KB and 1 KB records, CPU table
    python benchmarks/bench_input.py --images 224    # + decoded 224x224 images/s vs a GPU's appetite
    python benchmarks/bench_input.py --images 224 --step-ms 46   # ... while "training" 46 ms/batch

Rows (100 KB records, CRC verified everywhere):
  raw read       sequential read of the shard bytes into one buffer (no parsing, no CRC)
  crc32c         the C extension over the same bytes
  ceiling        1 / (1/raw + 1/crc32c): one core reading and checksumming every byte once
  labkit records labkit.data.tfrecord.iter_views, all shards, one core
  labkit torch   make_loader(kind="raw", batch 64, mechanism="batch"): uint8 (64, L) tensors
  tf.data        TFRecordDataset(files, num_parallel_reads=2).batch(64) (and one record at a time)
Ratios printed at the end are the course's targets: labkit torch / ceiling >= 0.70 and
labkit torch / tf.data >= 1.0. With --images, the decoded image rate of the torch loader with
workers is compared to 1.5x labkit's best ResNet-50 training rate measured on one H100, read from
benchmarks/results (`labkit.course.input_pipeline.read_rates.reference_resnet()`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.core.frameworks import has_tf, has_torch, missing_reason  # noqa: E402
from labkit.course.input_pipeline.read_rates import reference_resnet  # noqa: E402
from labkit.data import ReadConfig, ShardConfig, write_raw_shards  # noqa: E402
from labkit.data.tfrecord import iter_views  # noqa: E402
from labkit.data.throughput import (  # noqa: E402
    compare,
    count_pass,
    crc32c_pass,
    files_bytes,
    measure,
    raw_read_pass,
    single_core_ceiling,
)


def write_fixed(out: str, record_bytes: int, total_mb: int, shards: int) -> list[str]:
    n = max(shards, total_mb * 1_000_000 // record_bytes)
    payload = os.urandom(record_bytes)
    return write_raw_shards(out, (payload for _ in range(n)), n,
                            ShardConfig(records_per_shard=-(-n // shards), prefix=f"r{record_bytes}")).paths


def labkit_records(paths):
    def run():
        for p in paths:
            for v in iter_views(p):
                yield (v,)  # one record
    return run


def torch_loader(paths, batch: int, workers: int):
    from labkit.data.torch_loader import LoaderConfig, make_loader

    loader = make_loader(paths, ReadConfig(kind="raw", batch_size=batch),
                         LoaderConfig(num_workers=workers, persistent_workers=workers > 0,
                                      prefetch_factor=4 if workers else None))
    return lambda: loader


def tf_records(paths, batch: int, reads: int):
    from labkit.data.tf_pipeline import tf_record_batches

    ds = tf_record_batches(paths, batch, reads)

    def run():
        for b in ds:
            yield b if batch > 1 else [b]
    return run


def bench_size(record_bytes: int, total_mb: int, shards: int, repeats: int, workdir: str) -> dict:
    paths = write_fixed(workdir, record_bytes, total_mb, shards)
    nbytes = files_bytes(paths)
    passes = {"raw read": raw_read_pass(paths), "crc32c": crc32c_pass(paths),
              "labkit records (1 core)": count_pass(labkit_records(paths))}
    if has_torch():
        passes["labkit torch, batch 64, 0 workers"] = count_pass(torch_loader(paths, 64, 0))
        passes["labkit torch, batch 64, 2 workers"] = count_pass(torch_loader(paths, 64, 2))
    else:
        print("torch rows skipped:", missing_reason("torch"))
    if has_tf():
        passes["tf.data TFRecordDataset, batch 64, 2 reads"] = count_pass(tf_records(paths, 64, 2))
        passes["tf.data TFRecordDataset, 1 record at a time"] = count_pass(tf_records(paths, 1, 1))
    else:
        print("tf.data rows skipped:", missing_reason("tensorflow"))
    timed = compare(passes, nbytes=nbytes, repeats=repeats)
    rows = {name: {"gb_per_s": t.gb_per_s, **({"records_per_s": t.samples_per_s} if t.samples else {})}
            for name, t in timed.items()}
    ceiling = single_core_ceiling(timed["raw read"].gb_per_s, timed["crc32c"].gb_per_s)
    rows = {"raw read": rows.pop("raw read"), "crc32c": rows.pop("crc32c"),
            "ceiling 1/(1/raw+1/crc)": {"gb_per_s": ceiling}, **rows}
    return {"record_bytes": record_bytes, "files": len(paths), "bytes": nbytes, "rows": rows}


def bench_images(size: int, num: int, workers: int, step_ms: float, workdir: str) -> dict:
    """Decoded images/s through each torch mechanism; with `step_ms`, the consumer spends that
    long per batch outside the GIL (as a training loop waiting on the GPU does), so the rate
    shows how well reading overlaps with training."""
    from labkit.data import ImageDatasetConfig, SyntheticImages, write_image_shards
    from labkit.data.torch_loader import LoaderConfig, make_loader

    ds = SyntheticImages(ImageDatasetConfig(num_samples=num, image_size=size, num_classes=1000))
    paths = write_image_shards(workdir, ds, ShardConfig(records_per_shard=max(1, num // 16), prefix="img")).paths
    import torch

    pin = torch.cuda.is_available()
    configs = {"in-process": LoaderConfig(pin_memory=pin),
               "thread": LoaderConfig(mechanism="thread", pin_memory=pin, prefetch_factor=2),
               f"{workers} workers": LoaderConfig(num_workers=workers, pin_memory=pin, persistent_workers=True,
                                                  prefetch_factor=4)}

    def consume(loader):
        def run():
            for b in loader:
                if step_ms:
                    time.sleep(step_ms / 1e3)
                yield b
        return run

    rates = {}
    for name, cfg in configs.items():
        loader = make_loader(paths, ReadConfig(kind="images", batch_size=256), cfg)
        rates[name] = measure(name, consume(loader), repeats=2).samples_per_s
    return {"image_size": size, "pin_memory": pin, "step_ms": step_ms, "images_per_s": rates,
            "target_images_per_s": 1.5 * reference_resnet().value}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=200, help="MB of 100 KB records (default 200)")
    p.add_argument("--small-mb", type=int, default=20, help="MB of 1 KB records (default 20)")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--images", type=int, default=0, help="also measure decoded images of this size")
    p.add_argument("--image-count", type=int, default=4096)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="with --images: time per batch the consumer spends outside the GIL")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_input-") as d:
        results = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "load_before": os.getloadavg()[0],
                   "large": bench_size(100_000, a.mb, a.shards, a.repeats, d + "/large"),
                   "small": bench_size(1_000, a.small_mb, a.shards, a.repeats, d + "/small")}
        if a.images:
            results["images"] = bench_images(a.images, a.image_count, a.workers, a.step_ms, d + "/images")
    results["load_after"] = os.getloadavg()[0]
    print(f"{results['cpus']} CPUs, load average {results['load_before']:.1f} before / "
          f"{results['load_after']:.1f} after (a busy machine makes every row noisier)")
    for key in ("large", "small"):
        r = results[key]
        print(f"\n{r['record_bytes']:,}-byte records: {r['files']} shards, {r['bytes'] / 1e6:,.0f} MB, page cache")
        print(f"  {'path':46s} {'GB/s':>7s} {'records/s':>12s}")
        for name, row in r["rows"].items():
            rps = f"{row['records_per_s']:12,.0f}" if "records_per_s" in row else " " * 12
            print(f"  {name:46s} {row['gb_per_s']:7.2f} {rps}")
    rows = results["large"]["rows"]
    ceiling = rows["ceiling 1/(1/raw+1/crc)"]["gb_per_s"]
    torch0 = rows.get("labkit torch, batch 64, 0 workers", {}).get("gb_per_s")
    tfb = rows.get("tf.data TFRecordDataset, batch 64, 2 reads", {}).get("gb_per_s")
    print("\nratios (100 KB records, same run):")
    print(f"  labkit records / ceiling                 {rows['labkit records (1 core)']['gb_per_s'] / ceiling:.2f}")
    if torch0:
        print(f"  labkit torch (0 workers) / ceiling       {torch0 / ceiling:.2f}   target >= 0.70")
    if torch0 and tfb:
        print(f"  labkit torch (0 workers) / tf.data       {torch0 / tfb:.2f}   target >= 1.00")
    if "images" in results:
        im = results["images"]
        print(f"\ndecoded {im['image_size']}px images, batch 256, pin_memory={im['pin_memory']}, "
              f"consumer step {im['step_ms']:g} ms (target 1.5x best ResNet-50 on one H100 = "
              f"{im['target_images_per_s']:,.0f} images/s):")
        for name, rate in im["images_per_s"].items():
            print(f"  {name:14s} {rate:10,.0f} images/s")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
