"""Reporting a metric to Vertex AI hyperparameter tuning from your own training script: the few
lines a script adds (marked "tuning" below).

    python -m labkit.recipes.hypertune_report --lr 0.05 --momentum 0.9 --epochs 5

The tuning service starts each trial with the trial's values as flags in its own formatting
(``--lr=0.0123``, and ``--batch-size=32.0`` for a DISCRETE value, so parse numbers as floats
first), and reads the metric from a file in the trial's container that Google's
cloudml-hypertune package writes (``pip install cloudml-hypertune``; it is in Vertex's prebuilt
training images). The tag must be the study's ``metric_id``. Report from one replica only (the
primary), once per evaluation; the service keeps the last report (or stops a trial early on
the median rule, from the reports so far).

Submit the study for this script (or run it here first) with labkit:

    labkit job --tune-metric accuracy --goal maximize --param lr=log:0.001:0.3 \\
        --param momentum=0.0,0.5,0.9 --trials 8 --parallel-trials 2 \\
        --output gs://BUCKET/study -- python -m labkit.recipes.hypertune_report --epochs 5
    labkit emulate ...same flags...
"""

from __future__ import annotations

import argparse
import os

import hypertune  # tuning: cloudml-hypertune
import torch
from torch import nn


def points(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable 3-class problem: 8 features, the label set by a few of them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    score = x[:, 0] + 0.5 * x[:, 1] - x[:, 2] + 0.25 * x[:, 3] * x[:, 4]
    return x, (score > -0.5).long() + (score > 0.5).long()


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=lambda v: int(float(v)), default=32)  # tuning: "32.0" arrives
    p.add_argument("--epochs", type=int, default=5)
    args = p.parse_args(argv)

    torch.manual_seed(0)
    x, y = points(1024, seed=0)
    x_test, y_test = points(512, seed=1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    reporter = hypertune.HyperTune()  # tuning
    primary = int(os.environ.get("RANK", "0")) == 0  # tuning: one replica reports
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        for i in range(0, len(x), args.batch_size):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + args.batch_size]), y[i:i + args.batch_size]).backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        print(f"epoch {epoch}: held-out accuracy {accuracy:.4f}", flush=True)
        if primary:  # tuning: the metric under the study's metric_id, with the step it belongs to
            reporter.report_hyperparameter_tuning_metric(hyperparameter_metric_tag="accuracy",
                                                         metric_value=accuracy, global_step=epoch)
    return accuracy


if __name__ == "__main__":
    main()
