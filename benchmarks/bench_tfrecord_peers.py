"""TFRecord reading: labkit against its peers on the same shards, in one command.

    python benchmarks/bench_tfrecord_peers.py                  # 5 alternating runs, both sizes
    python benchmarks/bench_tfrecord_peers.py --runs 7 --json benchmarks/results/DATE-cpu-tfrecord-peers.json
    python benchmarks/bench_tfrecord_peers.py --baseline /path/to/older/checkout   # + labkit then vs now

Peers: tf.data's `TFRecordDataset` (verifies CRCs), the `tfrecord` package from PyPI (reads
without checking any CRC; `pip install tfrecord`, in the `dev` extra) and the machine itself (a
plain `read()` of the same files, CRC-32C over them). Each reader lives in its own process (the
`tfrecord` package and TensorFlow register the same protobuf names, and a process of its own
keeps one reader's threads and caches from slowing another); the readers take turns, one timed
pass each per run, the order rotated every run, so a noisy neighbour hurts all of them alike.
Reported: the median GB/s over the runs and the spread (min-max), and GB per CPU-second of the
reader's own process (all its threads; not loader worker processes), which a busy machine
disturbs far less than wall-clock rates.

The shards: `--shards` files of `tf.train.Example` records (`index`, `label`, `image` bytes),
about 100 KB and about 1 KB per record, uncompressed and GZIP. Pixels are random values in
0..15 (GZIP halves them, as it does raw pixels of natural images), from a pool of images large
enough that no image repeats within GZIP's 32 KB window. GB/s is always bytes of the
uncompressed record stream per second, so plain and GZIP rows compare directly. All files are
read from the page cache (every reader warms up with one untimed pass).

Rows:
  records        each record's bytes handed to Python, nothing decoded
  DataLoader     decoded Examples as torch batches of 64 (the path training uses)
  ceilings       what one core can do on these bytes: read() alone, CRC-32C alone (C extension,
                 on cache-sized pieces), and read()+CRC-32C of each piece (the fastest possible
                 CRC-verifying reader: no framing, no Python per record)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if "--serve" not in sys.argv:  # a reader process imports labkit from its PYTHONPATH (here or a baseline)
    sys.path.insert(0, str(REPO))

SIZES = {"100KB": 182, "1KB": 18}  # image side: 182x182x3 = 99,372 B, 18x18x3 = 972 B per record
BATCH = 64
PIECE = 512 << 10  # the ceiling rows read and checksum 512 KiB at a time, as labkit reads

# reader name -> (group, framework the process imports, compression)
READERS = {
    "read() only, 512 KiB pieces": ("ceiling", None, ""),
    "crc32c only, 512 KiB pieces in memory": ("ceiling", None, ""),
    "read() + crc32c of each piece": ("ceiling", None, ""),
    "labkit iter_views (CRC verified)": ("records", None, ""),
    "labkit read_records (CRC verified)": ("records", None, ""),
    "tfrecord pkg tfrecord_iterator (no CRC)": ("records", "tfrecord", ""),
    "tf.data TFRecordDataset, batch 64, 2 reads (CRC verified)": ("records", "tf", ""),
    "labkit make_loader, in-process": ("DataLoader", "torch", ""),
    "labkit make_loader, 2 workers": ("DataLoader", "torch", ""),
    "tfrecord pkg TFRecordDataset + DataLoader, in-process": ("DataLoader", "tfrecord", ""),
    "tfrecord pkg TFRecordDataset + DataLoader, 2 workers": ("DataLoader", "tfrecord", ""),
    "tf.data parse_example pipeline, AUTOTUNE": ("DataLoader", "tf", ""),
    "GZIP: zlib decompress only": ("ceiling", None, "GZIP"),
    "GZIP: labkit iter_views": ("records", None, "GZIP"),
    "GZIP: tfrecord pkg tfrecord_iterator (no CRC)": ("records", "tfrecord", "GZIP"),
    "GZIP: tf.data TFRecordDataset, batch 64, 2 reads": ("records", "tf", "GZIP"),
    "GZIP: labkit make_loader, in-process": ("DataLoader", "torch", "GZIP"),
    "GZIP: labkit make_loader, 2 workers": ("DataLoader", "torch", "GZIP"),
    "GZIP: tf.data parse_example pipeline, AUTOTUNE": ("DataLoader", "tf", "GZIP"),
}

# (labkit row, peer row) pairs whose ratio the summary prints
RATIOS = [
    ("labkit iter_views (CRC verified)", "tfrecord pkg tfrecord_iterator (no CRC)"),
    ("labkit iter_views (CRC verified)", "tf.data TFRecordDataset, batch 64, 2 reads (CRC verified)"),
    ("labkit iter_views (CRC verified)", "read() + crc32c of each piece"),
    ("labkit read_records (CRC verified)", "tfrecord pkg tfrecord_iterator (no CRC)"),
    ("labkit make_loader, in-process", "tfrecord pkg TFRecordDataset + DataLoader, in-process"),
    ("labkit make_loader, 2 workers", "tfrecord pkg TFRecordDataset + DataLoader, 2 workers"),
    ("labkit make_loader, in-process", "tf.data parse_example pipeline, AUTOTUNE"),
    ("GZIP: labkit iter_views", "GZIP: tf.data TFRecordDataset, batch 64, 2 reads"),
    ("GZIP: labkit iter_views", "GZIP: tfrecord pkg tfrecord_iterator (no CRC)"),
    ("GZIP: labkit make_loader, in-process", "GZIP: tf.data parse_example pipeline, AUTOTUNE"),
    ("GZIP: labkit make_loader, 2 workers", "GZIP: tf.data parse_example pipeline, AUTOTUNE"),
]


# ---------------------------------------------------------------------------------------------
# The reader processes


def _labkit_pass(name: str, files: list[str], comp: str):
    from labkit.data.tfrecord import iter_views, read_records

    if "iter_views" in name:
        def run() -> int:
            n = 0
            for p in files:
                for _ in iter_views(p, compression=comp):
                    n += 1
            return n
        return run
    if "read_records" in name:
        return lambda: sum(1 for _ in read_records(files, comp))
    from labkit.data import ReadConfig
    from labkit.data.torch_loader import LoaderConfig, make_loader

    workers = 2 if "2 workers" in name else 0
    loader = make_loader(files, ReadConfig(kind="images", batch_size=BATCH, compression=comp or None),
                         LoaderConfig(num_workers=workers, persistent_workers=workers > 0,
                                      prefetch_factor=4 if workers else None))
    return lambda: sum(len(b["index"]) for b in loader)


def _tfrecord_pkg_pass(name: str, files: list[str], comp: str):
    import tfrecord

    ctype = "gzip" if comp else None
    if "tfrecord_iterator" in name:
        def run() -> int:
            n = 0
            for p in files:
                for _ in tfrecord.tfrecord_iterator(p, compression_type=ctype):
                    n += 1
            return n
        return run
    import torch
    from tfrecord.torch.dataset import TFRecordDataset

    workers = 2 if "2 workers" in name else 0
    # Without an index file the package cannot split a file among workers (each would read all
    # of it): its documented way is an index per file, made by its own tfrecord2idx tool.
    index = [str(Path(p).with_suffix(".tfindex")) if workers else None for p in files]
    description = {"index": "int", "label": "int", "image": "byte"}
    ds = torch.utils.data.ChainDataset(
        [TFRecordDataset(p, i, description, compression_type=ctype) for p, i in zip(files, index, strict=True)])
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers,
                                         persistent_workers=workers > 0)
    return lambda: sum(len(b["index"]) for b in loader)


def _tf_pass(name: str, files: list[str], comp: str, side: int):
    import tensorflow as tf

    if "parse_example" not in name:
        ds = tf.data.TFRecordDataset(files, compression_type=comp, num_parallel_reads=2).batch(BATCH)
        return lambda: sum(int(b.shape[0]) for b in ds)
    spec = {"index": tf.io.FixedLenFeature([], tf.int64), "label": tf.io.FixedLenFeature([], tf.int64),
            "image": tf.io.FixedLenFeature([], tf.string)}

    def parse(records):  # parse whole batches: tf.data's own advice for small records
        ex = tf.io.parse_example(records, spec)
        image = tf.reshape(tf.io.decode_raw(ex["image"], tf.uint8), (-1, side, side, 3))
        return {"index": ex["index"], "image": image, "label": ex["label"]}

    ds = (tf.data.TFRecordDataset(files, compression_type=comp, num_parallel_reads=tf.data.AUTOTUNE)
          .batch(BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
    return lambda: sum(int(b["index"].shape[0]) for b in ds)


def _ceiling_pass(name: str, files: list[str]):
    import zlib

    import crc32c

    buf = bytearray(PIECE)
    view = memoryview(buf)
    if name.startswith("GZIP"):
        blobs = [Path(p).read_bytes() for p in files]

        def inflate() -> int:
            for b in blobs:
                d = zlib.decompressobj(31)
                for i in range(0, len(b), 1 << 20):
                    d.decompress(b[i:i + (1 << 20)])
            return 0
        return inflate
    if name.startswith("crc32c"):
        pieces = []
        for p in files:
            raw = Path(p).read_bytes()
            pieces.append([raw[i:i + PIECE] for i in range(0, len(raw), PIECE)])

        def crc_only() -> int:
            for file_pieces in pieces:  # each piece's CRC from cache, as a reader sees it
                for piece in file_pieces:
                    crc32c.crc32c(piece)
            return 0
        return crc_only
    with_crc = "crc32c" in name

    def read() -> int:
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while n := f.readinto(view):
                    if with_crc:
                        crc32c.crc32c(view[:n])
        return 0
    return read


def _spec(name: str) -> tuple[str, str | None, str]:
    return READERS[name.removeprefix(BASELINE)]


def serve(name: str, shard_dir: str, size: str) -> int:
    """One reader: build it, warm it up, then time one pass per line read from stdin."""
    group, framework, comp = READERS[name]
    ext = ".tfrecord.gz" if comp else ".tfrecord"
    files = sorted(str(p) for p in Path(shard_dir).glob(f"*{ext}"))
    if framework == "tf":
        run = _tf_pass(name, files, comp, SIZES[size])
    elif framework == "tfrecord":
        run = _tfrecord_pkg_pass(name, files, comp)
    elif group == "ceiling":
        run = _ceiling_pass(name, files)
    else:
        run = _labkit_pass(name, files, comp)
    run()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t0, c0 = time.perf_counter(), time.process_time()
        records = run()
        print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                          "records": records}), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The orchestrator


def write_shards(out: Path, size: str, total_mb: int, shards: int) -> dict:
    import numpy as np

    from labkit.data.shards import ShardConfig, image_example
    from labkit.data.shards import write_shards as write

    side = SIZES[size]
    pool = np.random.default_rng(0).integers(0, 16, (max(64, 2 * 32_768 // (3 * side * side)), side, side, 3),
                                             dtype=np.uint8)
    record = len(image_example(0, pool[0], 0)) + 16
    n = shards * max(1, total_mb * 1_000_000 // record // shards)
    info = {}
    for comp, sub in (("", "plain"), ("GZIP", "gzip")):
        s = write(out / sub, n, lambda i: image_example(i, pool[i % len(pool)], i % 10),
                  ShardConfig(records_per_shard=n // shards, compression=comp or None), kind="images")
        info[sub] = {"dir": str(out / sub), "files": len(s.paths),
                     "bytes_on_disk": sum(os.path.getsize(p) for p in s.paths)}
    try:
        from tfrecord.tools.tfrecord2idx import create_index

        for p in sorted((out / "plain").glob("*.tfrecord")):
            create_index(str(p), str(p.with_suffix(".tfindex")))
    except ImportError:
        pass
    info.update(records=n, stream_bytes=sum(os.path.getsize(p) for p in (out / "plain").glob("*.tfrecord")),
                record_bytes=record)
    return info


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git_describe(path: str) -> str:
    """The commit of a checkout ("abc1234 subject"), else the folder's name (never a full path)."""
    try:
        r = subprocess.run(["git", "-C", path, "log", "-1", "--format=%h %s"], capture_output=True, text=True,
                           timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()[:80]
    except OSError:
        pass
    return Path(path).name


def _available(framework: str | None) -> bool:
    dist = {"torch": "torch", "tf": "tensorflow", "tfrecord": "tfrecord"}.get(framework)
    if dist is None:
        return True
    if dist == "tensorflow" and _version("tensorflow") is None:
        return _version("tensorflow-cpu") is not None
    if framework == "tfrecord" and _version("torch") is None:
        return False
    return _version(dist) is not None


BASELINE = "baseline: "


def start(name: str, shard_dir: str, size: str, baseline: str | None) -> subprocess.Popen:
    """A reader process. A `BASELINE` reader runs the same code with labkit imported from the
    baseline checkout (this script itself always comes from this checkout)."""
    code = baseline if name.startswith(BASELINE) else str(REPO)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([code, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="3")
    log = tempfile.TemporaryFile()  # the framework's start-up chatter; shown if the reader fails
    proc = subprocess.Popen([sys.executable, __file__, "--serve", name.removeprefix(BASELINE), "--dir", shard_dir,
                             "--size", size], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                            env=env)
    proc.log = log
    return proc


def _reply(proc: subprocess.Popen, name: str) -> dict:
    line = proc.stdout.readline()
    if not line:
        code = proc.wait()
        proc.log.seek(0)
        tail = proc.log.read().decode(errors="replace")[-3000:]
        raise RuntimeError(f"reader {name!r} exited (code {code}):\n{tail}")
    return json.loads(line)


def bench_size(size: str, info: dict, names: list[str], runs: int, baseline: str | None) -> dict:
    procs = {}
    try:
        for name in names:  # start and warm up one at a time, so warm-ups do not overlap
            comp = _spec(name)[2]
            procs[name] = start(name, info["gzip" if comp else "plain"]["dir"], size, baseline)
            _reply(procs[name], name)
        seconds: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        for r in range(runs):
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                procs[name].stdin.write("run\n")
                procs[name].stdin.flush()
                out = _reply(procs[name], name)
                if _spec(name)[0] != "ceiling" and out["records"] != info["records"]:
                    raise RuntimeError(f"{name} delivered {out['records']} records, not {info['records']}")
                seconds[name].append(out["seconds"])
                cpu[name].append(out["cpu_seconds"])
    finally:
        for p in procs.values():
            try:
                p.stdin.close()
                p.wait(timeout=60)
            except Exception:  # a reader that hangs must not hang the benchmark
                p.kill()
    rows = {}
    for name, ts in seconds.items():
        rates = [info["stream_bytes"] / t / 1e9 for t in ts]
        rows[name] = {"group": _spec(name)[0], "gb_per_s": rates, "median_gb_per_s": statistics.median(rates),
                      "min_gb_per_s": min(rates), "max_gb_per_s": max(rates),
                      "median_records_per_s": info["records"] / statistics.median(ts),
                      # CPU time of the reader's own process (all its threads): GB per CPU-second
                      # is steadier than GB/s on a shared machine; loader workers are other
                      # processes, so their rows have none
                      "median_gb_per_cpu_s": (None if "workers" in name else
                                              info["stream_bytes"] / statistics.median(cpu[name]) / 1e9)}
    return rows


def report(results: dict) -> str:
    lines = []
    for size, r in results["sizes"].items():
        info = r["shards"]
        lines.append(f"\n{size} records ({info['record_bytes']:,} B framed), {info['plain']['files']} shards, "
                     f"{info['records']:,} records, {info['stream_bytes'] / 1e6:,.0f} MB "
                     f"(GZIP: {info['gzip']['bytes_on_disk'] / 1e6:,.0f} MB on disk), page cache")
        lines.append(f"| {'reader':60s} | GB/s median | min-max | records/s | GB per CPU-s |")
        lines.append(f"|{'-' * 62}|---|---|---|---|")
        for name, row in r["rows"].items():
            per_cpu = row.get("median_gb_per_cpu_s")
            lines.append(f"| {name:60s} | {row['median_gb_per_s']:.2f} | {row['min_gb_per_s']:.2f}-"
                         f"{row['max_gb_per_s']:.2f} | {row['median_records_per_s']:,.0f} | "
                         f"{'n/a' if per_cpu is None else f'{per_cpu:.2f}'} |")
        lines.append("ratios of medians:")
        pairs = RATIOS + [(n.removeprefix(BASELINE), n) for n in r["rows"] if n.startswith(BASELINE)]
        for a, b in pairs:
            if a in r["rows"] and b in r["rows"]:
                ratio = r["rows"][a]["median_gb_per_s"] / r["rows"][b]["median_gb_per_s"]
                lines.append(f"  {a} / {b}: {ratio:.2f}x")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, help="timed passes per reader (alternating)")
    p.add_argument("--large-mb", type=int, default=240, help="MB of ~100 KB records (default 240)")
    p.add_argument("--small-mb", type=int, default=60, help="MB of ~1 KB records (default 60)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--sizes", default="100KB,1KB")
    p.add_argument("--only", default="", help="comma-separated substrings: run only matching readers")
    p.add_argument("--json", help="write the results file here")
    p.add_argument("--baseline", help="a checkout of another labkit version: its readers run too, alternating")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--size", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve:
        return serve(a.serve, a.dir, a.size)
    if a.runs < 1 or a.shards < 1:
        p.error("--runs and --shards must be >= 1")
    selected = [n for n in READERS if not a.only or any(s.strip() in n for s in a.only.split(","))]
    names = [n for n in selected if _available(READERS[n][1])]
    skipped = [n for n in selected if n not in names]
    if a.baseline:
        a.baseline = str(Path(a.baseline).resolve())
        names = [m for n in names for m in ([n, BASELINE + n] if _spec(n)[0] != "ceiling" and _spec(n)[1] in (None, "torch")
                                             else [n])]
    args = list(argv if argv is not None else sys.argv[1:])
    if a.baseline:  # the results name the baseline by its commit, not by where it sat on this machine
        args = [Path(x).name if x == a.baseline or x.startswith("--baseline=") else x for x in args]
    # Imported here, not at the top: the readers' own processes import nothing of the parent's.
    from labkit.core import devices

    results = {
        "command": "python benchmarks/bench_tfrecord_peers.py " + shlex.join(args),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "device": {"cpu": devices.cpu_model(), "cores": os.cpu_count(), "kernel": platform.release()},
        "versions": {"python": platform.python_version(),
                     **{d: _version(d) for d in ("numpy", "crc32c", "torch", "tensorflow", "tensorflow-cpu",
                                                 "tfrecord", "protobuf")}},
        "baseline": a.baseline and _git_describe(a.baseline), "this_checkout": _git_describe(str(REPO)),
        "runs": a.runs, "batch": BATCH, "skipped": skipped, "load_before": os.getloadavg()[0], "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench_tfrecord-") as d:
        for size in a.sizes.split(","):
            mb = a.large_mb if size == "100KB" else a.small_mb
            info = write_shards(Path(d) / size, size, mb, a.shards)
            print(f"{size}: {info['records']:,} records written; timing {len(names)} readers x {a.runs} runs",
                  flush=True)
            rows = bench_size(size, info, names, a.runs, a.baseline)
            shards = {k: ({kk: vv for kk, vv in v.items() if kk != "dir"} if isinstance(v, dict) else v)
                      for k, v in info.items()}  # the temporary folders are no part of the result
            results["sizes"][size] = {"shards": shards, "rows": rows}
    results["load_after"] = os.getloadavg()[0]
    print(f"{results['device']['cpu']}, {results['device']['cores']} cores; load average "
          f"{results['load_before']:.1f} before / {results['load_after']:.1f} after; {results['date']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items() if v))
    if skipped:
        print("skipped (not installed): " + "; ".join(skipped))
    print(report(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
