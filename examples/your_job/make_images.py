"""Write a folder of JPEG images to train the example on: DIR/train/<class>/*.jpg and
DIR/val/<class>/*.jpg. Each class has its own colour and stripe direction, with noise, so a
small CNN can learn it in a few epochs.

    python make_images.py images --per-class 64 --size 96
"""

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = [(200, 60, 60), (60, 180, 60), (60, 80, 200), (200, 180, 40)]


def image(rng: np.random.Generator, label: int, size: int) -> Image.Image:
    y, x = np.mgrid[0:size, 0:size]
    stripes = np.sin((x if label % 2 else y) * (0.3 + 0.1 * label) + rng.uniform(0, 6.28))
    base = np.array(COLOURS[label], dtype=np.float32)
    pixels = base * (0.75 + 0.25 * stripes[..., None]) + rng.normal(0, 25, (size, size, 3))
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out")
    p.add_argument("--per-class", type=int, default=64)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--size", type=int, default=96)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    for split, n in (("train", args.per_class), ("val", max(8, args.per_class // 4))):
        for label in range(args.classes):
            folder = Path(args.out) / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                image(rng, label, args.size).save(folder / f"{i:05d}.jpg", quality=90)
    print(f"wrote {args.classes} classes under {args.out}/train and {args.out}/val")


if __name__ == "__main__":
    main()
