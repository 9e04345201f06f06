"""A folder of real JPEG files read three ways, same worker count, one run (images/s, epochs
interleaved, after one warm-up epoch each):

    python benchmarks/bench_jpeg.py --per-class 512 --size 256 --image-size 224 --workers 2
    python benchmarks/bench_jpeg.py ... --json benchmarks/results/DATE-cpu-jpeg-readers.json

  folder   torchvision's ImageFolder + Resize/CenterCrop/ToTensor in a DataLoader (or, where
           torchvision is not installed, labkit.course.own_data.FolderImages: the same work)
  labkit   `labkit data shard` of the folder, read by labkit.data.images.image_loader
  tf.data  the same shards through labkit.data.tf_pipeline.make_tf_image_dataset

The images are examples/your_job/make_images.py's (stripes and noise, JPEG quality 90).
Target: the labkit reader at least as fast as both peers; the ratios are printed and saved.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.core.frameworks import has_tf, has_torch  # noqa: E402
from labkit.course import own_data  # noqa: E402
from labkit.course.profiling import example_images  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-class", type=int, default=512, help="images per class (4 classes)")
    p.add_argument("--size", type=int, default=256, help="side of the JPEG files")
    p.add_argument("--image-size", type=int, default=224, help="side the readers deliver")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    frameworks = tuple(n for n, ok in (("torch", has_torch()), ("tensorflow", has_tf())) if ok)
    with tempfile.TemporaryDirectory(prefix="bench_jpeg-") as d:
        folder = example_images(Path(d) / "images", per_class=a.per_class, size=a.size) / "train"
        files, nbytes = own_data.count_files(folder)
        shard_out = own_data.run_labkit(own_data.shard_command(folder, Path(d) / "shards"))
        load_before = os.getloadavg()[0]
        rows = own_data.compare_readers(folder, Path(d) / "shards", image_size=a.image_size,
                                        batch_size=a.batch_size, workers=a.workers, repeats=a.repeats,
                                        frameworks=frameworks)
        peer = own_data.folder_dataset(folder, a.image_size)[1] if "torch" in frameworks else None
    import numpy

    versions = {"python": platform.python_version(), "numpy": numpy.__version__}
    for name in ("torch", "tensorflow", "PIL"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    results = {"date": time.strftime("%Y-%m-%d"), "device": f"CPU ({os.cpu_count()} cores, {platform.machine()})",
               "command": "python benchmarks/bench_jpeg.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "versions": versions, "files": files, "mb": nbytes / 1e6, "shard": shard_out, "folder_peer": peer,
               "load_before": load_before, "load_after": os.getloadavg()[0],
               "settings": vars(a), "rows": [{k: v for k, v in r.items()} for r in rows]}
    print(f"{files} JPEG files, {nbytes / 1e6:.1f} MB; {a.workers} workers, batch {a.batch_size}, "
          f"{a.image_size}px out; folder peer: {peer}")
    for r in rows:
        print(f"  {r['reader']:38s} {r['images_per_s']:9,.0f} images/s  ({r['low']:,.0f}–{r['high']:,.0f})")
    ours = next((r for r in rows if r["reader"] == own_data.READERS[1]), None)
    ratios = {}
    for other in (own_data.READERS[0], own_data.READERS[2]):
        c = own_data.comparison_of(rows, other, own_data.READERS[1])
        if ours is not None and c is not None:
            ratios[other] = c.ratio
            print(f"labkit reader / {other}: {c.ratio:.2f}  ({c.sentence(other, 'labkit reader', 'images/s')})")
    results["ratios"] = ratios
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
