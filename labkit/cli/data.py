"""`labkit data`: write the synthetic datasets as TFRecord shards, and verify shards.

    labkit data write images OUT_DIR --num-samples 1024 --image-size 32 --records-per-shard 256
    labkit data write tokens gs://bucket/tokens --num-samples 512 --block-size 128 --compression GZIP
    labkit data write images OUT_DIR --overwrite     # replace the shard set already there, whole
    labkit data verify OUT_DIR                       # every record's CRCs, and the shards against
                                                     # data-manifest.json: missing, extra, short,
                                                     # records out of place, contents replaced
    labkit data verify 'OUT_DIR/data-*.tfrecord'     # these files' CRCs (and counts, if listed)
    labkit data shard photos/ gs://bucket/shards     # your own images: one subfolder per class
    labkit data shard labels.csv OUT --labels csv:label   # a CSV of image paths and labels
    labkit data shard rows.parquet OUT               # a table (CSV, JSON Lines, Parquet): a record a row
    labkit data stage gs://bucket/shards /tmp/shards # a shard set to this VM's disk, 16 files at once

Exit codes: 0 done / all good; 1 (verify) problems found, one per line; 2 bad input, one line.
"""

from __future__ import annotations

import argparse
import time

# A config field that a flag sets, and the flag, so errors name what the user typed.
_FLAGS = {"num_samples": "--num-samples", "num_sequences": "--num-samples", "image_size": "--image-size",
          "num_classes": "--num-classes", "block_size": "--block-size", "vocab_size": "--vocab-size",
          "records_per_shard": "--records-per-shard", "compression": "--compression", "prefix": "--prefix",
          "seed": "--seed"}


def add_data_command(subparsers) -> None:
    p = subparsers.add_parser("data", help="shard your own data or write synthetic datasets as TFRecord "
                                           "shards; verify shards")
    sub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    w = sub.add_parser("write", help="write SyntheticImages or SyntheticTokens as TFRecord shards")
    w.add_argument("kind", choices=("images", "tokens"))
    w.add_argument("out_dir", help="local folder, /gcs/bucket/path or gs://bucket/path")
    w.add_argument("--num-samples", type=int, default=1024)
    w.add_argument("--image-size", type=int, default=32)
    w.add_argument("--num-classes", type=int, default=10)
    w.add_argument("--block-size", type=int, default=64)
    w.add_argument("--vocab-size", type=int, default=512)
    w.add_argument("--records-per-shard", type=int, default=256)
    w.add_argument("--compression", default=None, help="GZIP or ZLIB (default: none)")
    w.add_argument("--prefix", default="data")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--overwrite", action="store_true",
                   help="replace a shard set with the same prefix already in OUT_DIR (default: refuse)")
    w.set_defaults(handler=_write)
    v = sub.add_parser("verify", help="read every record, checking both CRCs, and check shard folders "
                                      "against their manifest")
    v.add_argument("paths", nargs="+", help="shard folders, files or glob patterns")
    v.add_argument("--compression", default=None,
                   help="GZIP or ZLIB (default: what the manifest says, else none)")
    v.set_defaults(handler=_verify)
    s = sub.add_parser("shard", help="your own images or table as TFRecord shards (sized by bytes, "
                                     "written in parallel, resumable)")
    s.add_argument("src", help="an image folder (one subfolder per class), a CSV of image paths and labels, "
                               "or a CSV / JSON Lines / Parquet table (file or folder); local, /gcs/... or gs://...")
    s.add_argument("out_dir", help="local folder, /gcs/bucket/path or gs://bucket/path")
    s.add_argument("--shard-mb", type=float, default=None,
                   help="target shard size in MB (default 100: a request's latency is a few percent of a "
                        "shard's transfer, and a few GB still make dozens of shards)")
    s.add_argument("--min-shards", type=int, default=None,
                   help="cut a small set into at least this many shards (default 8), one record each at least")
    s.add_argument("--labels", default="folders",
                   help="'folders' (one subfolder per class) or csv:COLUMN (SRC is a CSV of image paths, "
                        "COLUMN its labels)")
    s.add_argument("--path-column", default=None, help="the CSV's column of image paths (default: path, "
                                                       "file, filename, image, ...)")
    s.add_argument("--format", default="auto", help="images, table, or auto (default)")
    s.add_argument("--no-shuffle", action="store_true", help="keep the source's order (default: records "
                                                            "shuffled with --seed before they are cut)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--workers", type=int, default=None, help="shards written at once (default 8)")
    s.add_argument("--compression", default=None, help="GZIP or ZLIB (default: none; JPEG and PNG "
                                                       "do not compress further)")
    s.add_argument("--prefix", default="data")
    s.add_argument("--overwrite", action="store_true",
                   help="replace a shard set (or an unfinished write of other data) already in OUT_DIR")
    s.set_defaults(handler=_shard)
    g = sub.add_parser("stage", help="copy a shard set from Cloud Storage to this machine's disk, many files "
                                     "at once, each checked against its manifest (resumable)")
    g.add_argument("src", help="gs://bucket/path, /gcs/bucket/path or a folder holding a shard manifest")
    g.add_argument("dest", help="a local folder")
    g.add_argument("--workers", type=int, default=16, help="files copied at once (default 16)")
    g.add_argument("--prefix", default=None, help="only this shard set (default: every manifest in SRC)")
    g.set_defaults(handler=_stage)


def _flag_message(e: Exception, flags: dict[str, str] | None = None) -> str:
    """The error's message with each parameter it names (`parameter 'x'`) said as the flag."""
    message = str(e)
    for field, flag in (flags or _FLAGS).items():
        message = message.replace(f"parameter {field!r}", flag)
    return message


def _write(args: argparse.Namespace) -> int:
    from labkit.data import shards, synthetic

    t0 = time.perf_counter()
    try:
        cfg = shards.ShardConfig(records_per_shard=args.records_per_shard, compression=args.compression,
                                 prefix=args.prefix)
        if args.kind == "images":
            ds = synthetic.SyntheticImages(synthetic.ImageDatasetConfig(
                num_samples=args.num_samples, image_size=args.image_size, num_classes=args.num_classes,
                seed=args.seed))
            write = shards.write_image_shards
        else:
            ds = synthetic.SyntheticTokens(synthetic.TokenDatasetConfig(
                num_sequences=args.num_samples, block_size=args.block_size, vocab_size=args.vocab_size,
                seed=args.seed))
            write = shards.write_token_shards
        out = write(args.out_dir, ds, cfg, if_exists="replace" if args.overwrite else "error")
    except shards.ShardSetExistsError as e:
        advice = "pass --overwrite to replace it whole, or choose another folder or --prefix"
        print(f"labkit data write: {shards.ShardSetExistsError(e.folder, e.prefix, set(e.names), advice)}")
        return 2
    except (ValueError, OSError) as e:
        print(f"labkit data write: {_flag_message(e)}")
        return 2
    print(f"labkit data: wrote {out.num_records} {args.kind} records in {len(out.paths)} shards "
          f"({out.bytes_written / 1e6:.1f} MB, {time.perf_counter() - t0:.1f}s) under {args.out_dir}")
    return 0


_SHARD_FLAGS = {"shard_mb": "--shard-mb", "min_shards": "--min-shards", "labels": "--labels",
                "format": "--format", "seed": "--seed", "workers": "--workers", "compression": "--compression",
                "prefix": "--prefix", "shard_bytes": "--shard-mb"}


def _shard(args: argparse.Namespace) -> int:
    from labkit.data import own_shards, shards

    kwargs = {k: v for k, v in (("shard_mb", args.shard_mb), ("min_shards", args.min_shards)) if v is not None}
    try:
        out = own_shards.shard_source(
            args.src, args.out_dir, labels=args.labels, path_column=args.path_column, format=args.format,
            shuffle=not args.no_shuffle, seed=args.seed, workers=args.workers, compression=args.compression,
            prefix=args.prefix, overwrite=args.overwrite, **kwargs)
    except shards.ShardSetExistsError as e:
        print(f"labkit data shard: {str(e).replace('overwrite=True (--overwrite)', '--overwrite')}")
        return 2
    except (ValueError, OSError) as e:
        print(f"labkit data shard: {_flag_message(e, _SHARD_FLAGS)}")
        return 2
    kept = f", {out.kept} kept from the interrupted run" if out.kept else ""
    what = _count(len(out.classes), "class", "classes") if out.classes else f"columns {', '.join(f'{k}:{v}' for k, v in out.columns.items())}"
    print(f"labkit data shard: {_count(out.num_records, 'record')} ({what}) in {_count(len(out.paths), 'shard')}{kept}, "
          f"{out.bytes_written / 1e6:.1f} MB written in {out.seconds:.1f}s under {args.out_dir}; "
          f"check them with: labkit data verify {args.out_dir}")
    return 0


def _stage(args: argparse.Namespace) -> int:
    from labkit.data.stage import stage

    try:
        report = stage(args.src, args.dest, workers=args.workers, prefix=args.prefix)
    except (ValueError, OSError) as e:
        print(f"labkit data stage: {_flag_message(e, {'workers': '--workers', 'dest': 'DEST'})}")
        return 2
    print(f"labkit data stage: {report.text()} to {args.dest}")
    return 0


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _verify(args: argparse.Namespace) -> int:
    from labkit.data.shards import verify_shards

    try:
        report = verify_shards(args.paths, compression=args.compression)
    except (ValueError, OSError) as e:
        print(f"labkit data verify: {_flag_message(e)}")
        return 2
    for problem in report.problems:
        print(problem)
    checked = f"{report.files} files, {report.records} records, {report.nbytes / 1e6:.1f} MB"
    against = f" against {len(report.manifests)} manifest(s)" if report.manifests else ""
    if report.problems:
        print(f"labkit data verify: {len(report.problems)} problem(s); {checked} read with good CRCs{against}")
        return 1
    print(f"labkit data verify: {checked}, all CRCs good{against}")
    return 0
