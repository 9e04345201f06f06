"""Write the small "points" dataset the example trainers read: 8 numeric features per row and a
label (0, 1 or 2) that depends on them, as CSV files with a header.

    python examples/make_points.py examples/ddp_trainer/data
"""

import csv
import random
import sys
from pathlib import Path


def rows(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        x = [round(rng.gauss(0.0, 1.0), 3) for _ in range(8)]
        score = x[0] + 0.5 * x[1] - x[2] + 0.25 * x[3] * x[4]
        label = 0 if score < -0.5 else 1 if score < 0.5 else 2
        if rng.random() < 0.05:  # a little label noise, as real data has
            label = rng.randrange(3)
        yield [*x, label]


def main(folder: str) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train.csv", 768, 0), ("test.csv", 256, 1)):
        with open(out / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow([*(f"x{i}" for i in range(8)), "label"])
            writer.writerows(rows(n, seed))
    print(f"wrote {out}/train.csv and {out}/test.csv")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data")
