"""`labkit data`: write the synthetic datasets as TFRecord shards, and verify shards.

    labkit data write images OUT_DIR --num-samples 1024 --image-size 32 --records-per-shard 256
    labkit data write tokens gs://bucket/tokens --num-samples 512 --block-size 128 --compression GZIP
    labkit data write images OUT_DIR --overwrite     # replace the shard set already there, whole
    labkit data verify OUT_DIR                       # every record's CRCs, and the shards against
                                                     # data-manifest.json: missing, extra, short,
                                                     # records out of place, contents replaced
    labkit data verify 'OUT_DIR/data-*.tfrecord'     # these files' CRCs (and counts, if listed)

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
    p = subparsers.add_parser("data", help="write synthetic datasets as TFRecord shards; verify shards")
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


def _flag_message(e: ValueError) -> str:
    name = getattr(e, "name", None)
    if name in _FLAGS:
        return str(e).replace(f"parameter {name!r}", f"{_FLAGS[name]}", 1)
    return str(e)


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
