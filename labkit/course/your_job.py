"""Notebook 12, "Your own job": a plain single-GPU script (`examples/your_job/step1_plain.py`)
carried step by step to a fast, Spot-safe, multi-machine Vertex job, each step a file of its
own (`STEPS`), shown as the change from the one before and run to prove it trains.

    show_step("step2_loader")                   # the file, its new lines marked
    run = run_step("step2_loader", images, epochs=4, extra=["--num-workers", "2"])
    run.rows, run.learning                       # held-out loss per epoch; first, last, chance, verdict
    timed = time_steps("step1_plain", "step2_loader", images, repeats=3)   # images/s, interleaved
    timed.findings()                             # medians, ranges, ratio and verdict (`ladder.verdict`)
    job = spot_job(workdir, images, epochs=4)   # step 5 as a 2-node Spot job, preempted once

Each returns numbers and verdicts; the notebook writes the sentences.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.course import ladder
from labkit.course.own_data import run_labkit  # noqa: F401  (the notebook runs commands through it)
from labkit.course.own_job import Learning, PreemptionComparison, example, learning, run_example
from labkit.course.tables import table
from labkit.vertex.own_job import JobRequest

STEPS = ("step1_plain", "step2_loader", "step3_bf16", "step4_spot", "step5_ddp")
WHAT = {"step1_plain": "the script as written", "step2_loader": "the input fix the profile named",
        "step3_bf16": "bf16 autocast (+ channels_last on a GPU)", "step4_spot": "checkpoints, resume, SIGTERM",
        "step5_ddp": "DistributedDataParallel over Vertex's replicas"}
_EPOCH = re.compile(r"Epoch (\d+)/(\d+): train loss ([\d.]+), test loss ([\d.]+), test accuracy ([\d.]+) \(([\d.]+)s\)")


def folder() -> Path:
    return example("your_job")


def step_path(name: str) -> Path:
    if name not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)} (got {name!r})")
    return folder() / f"{name}.py"


def show_step(name: str, base: str | None = None):
    """The step's file for the notebook, with the lines `base` does not have marked."""
    from labkit.course.recipe_view import show_file

    return show_file(step_path(name), None if base is None else step_path(base))


@dataclass
class StepRun:
    """One run of a step: the command, each epoch's losses and seconds, what it printed."""

    name: str
    command: list[str]
    rows: list[dict[str, Any]]
    output: str
    classes: int

    @property
    def chance(self) -> float:
        return math.log(self.classes)

    @property
    def learning(self) -> Learning:
        """The held-out loss after the first and the last epoch, against chance (ln classes)."""
        return learning(self.rows, self.chance)

    @property
    def learned(self) -> bool:
        """The held-out loss fell from the first epoch and ended below chance."""
        return bool(self.rows) and self.learning.learned

    def report(self) -> str:
        """The command as the learner types it and what each epoch printed."""
        return f"$ {' '.join(self.command)}\n{table(self.rows)}"


def classes(images: Path) -> int:
    """How many classes an image folder has (one subfolder of `train/` per class)."""
    return sum(1 for p in (images / "train").iterdir() if p.is_dir())


def step_command(name: str, images: Path, *, epochs: int, image_size: int, extra: tuple[str, ...] = ()) -> list[str]:
    return ["python", str(step_path(name)), "--data", str(images), "--epochs", str(epochs),
            "--image-size", str(image_size), *extra]


def run_step(name: str, images: Path, *, epochs: int, image_size: int, workdir: Path,
             extra: tuple[str, ...] = ()) -> StepRun:
    """Run a step as the learner would (`python stepN.py ...` in `workdir`)."""
    command = step_command(name, images, epochs=epochs, image_size=image_size, extra=extra)
    workdir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, *command[1:]], cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    rows = [{"epoch": int(m.group(1)), "train_loss": float(m.group(3)), "test_loss": float(m.group(4)),
             "test_accuracy": float(m.group(5)), "seconds": float(m.group(6))} for m in _EPOCH.finditer(done.stdout)]
    return StepRun(name, command, rows, done.stdout, classes(images))


@dataclass(frozen=True)
class TimingFindings:
    """What `time_steps` measured: each step's images/s over its runs, step b's median over step
    a's, and the verdict on b (`ladder.verdict`: "faster", "slower", "no measurable difference
    here", or no verdict under `stats.MIN_REPEATS` runs each)."""

    a: str
    b: str
    a_rate: stats.Spread  # images/s, one value per run
    b_rate: stats.Spread
    ratio: float  # median b / median a
    verdict: str
    decided: bool  # both steps ran the repeats a verdict needs
    pays: bool  # b measurably faster: no run of one overlaps the other's and the medians differ enough


@dataclass
class StepTiming:
    """Two steps timed the same way, interleaved: images per second of their last epochs."""

    a: str
    b: str
    runs: dict[str, list[float]]

    @property
    def comparison(self) -> stats.Comparison | None:
        a, b = self.runs[self.a], self.runs[self.b]
        return stats.compare(a, b) if min(len(a), len(b)) >= stats.MIN_REPEATS else None

    def findings(self) -> TimingFindings:
        """The two steps' images/s, b over a, and the verdict from their runs (`stats.compare`)."""
        a, b, c = stats.Spread(tuple(self.runs[self.a])), stats.Spread(tuple(self.runs[self.b])), self.comparison
        return TimingFindings(self.a, self.b, a, b, b.median / a.median if a.median else float("inf"),
                              ladder.verdict(c), c is not None, c is not None and c.b_is_better)


def time_steps(a: str, b: str, images: Path, *, epochs: int, image_size: int, workdir: Path, repeats: int,
               extra: dict[str, tuple[str, ...]] | None = None) -> StepTiming:
    """Each step run `repeats` times, interleaved after one warm-up run each; a run's figure is
    its training images per second over the epochs after the first (worker start-up excluded)."""
    extra = extra or {}
    count = sum(1 for p in (images / "train").rglob("*.jpg"))

    def measure(name: str):
        def once() -> float:
            run = run_step(name, images, epochs=epochs, image_size=image_size, workdir=workdir,
                           extra=extra.get(name, ()))
            later = run.rows[1:] or run.rows
            return count * len(later) / sum(r["seconds"] for r in later)
        return once

    runs = stats.round_robin({a: measure(a), b: measure(b)}, repeats=repeats, desc=f"{a} vs {b}")
    return StepTiming(a, b, runs)


def spot_request(workdir: Path, images: Path, name: str, *, epochs: int, image_size: int,
                 preempt_at_epoch: int | None = None) -> JobRequest:
    """Step 5 from its Dockerfile as a 2-node Spot job, the images uploaded to its bucket,
    optionally preempted when the primary prints that epoch."""
    return JobRequest(dockerfile=str(folder() / "Dockerfile"), workers=1, spot=True, output=f"gs://my-bucket/{name}",
                      workdir=str(workdir / name), upload=[f"{images}=gs://my-bucket/images"],
                      preempt_at_step=preempt_at_epoch, step_pattern=r"Epoch (\d+)/",
                      command=["--data", "/gcs/my-bucket/images", "--epochs", str(epochs), "--image-size",
                               str(image_size), "--num-workers", "0", "--batch-size", "16"])


def spot_job(workdir: Path, images: Path, *, epochs: int, image_size: int, at_epoch: int = 2) -> PreemptionComparison:
    """Step 5 on Spot twice: undisturbed, and preempted after `at_epoch`."""
    return PreemptionComparison(*[
        run_example(spot_request(workdir, images, name, epochs=epochs, image_size=image_size, preempt_at_epoch=at),
                    classes=classes(images))
        for name, at in (("undisturbed", None), ("preempted", at_epoch))])


def submit_command(images: Path, *, epochs: int) -> list[str]:
    """What the learner types to submit step 5 for real (a dry run without credentials)."""
    return ["labkit", "job", "--dry-run", "--dockerfile", str(folder() / "Dockerfile"),
            "--image", "us-docker.pkg.dev/YOUR_PROJECT/training/your-job:1", "--workers", "1",
            "--machine-type", "g2-standard-8", "--accelerator-type", "NVIDIA_L4", "--accelerator-count", "1",
            "--spot", "--output", "gs://YOUR_BUCKET/your-job", "--upload", f"{images}=gs://YOUR_BUCKET/images",
            "--", "--data", "/gcs/YOUR_BUCKET/images", "--epochs", str(epochs)]

