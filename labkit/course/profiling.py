"""Notebook 05's reading of `labkit.profiling` results, as numbers and verdicts from which the
notebook writes its sentences: one stacked bar of the step breakdown per run, the labkit phase
ranges a trace holds, and the loader-worker sweep of the CPU-bound decode case with where adding
workers stopped paying off (`decode_findings`). Your own script: `profile_own_script` runs
`labkit profile -- python step1_plain.py ...` on notebook 12's first script (`examples/your_job`,
a plain script over a folder of JPEG files that does not know labkit); `own_script_change` is the
loader fix the next script makes, as removed and added lines; `hta_side_by_side` puts Holistic
Trace Analysis's reading of the same trace beside labkit's.

A profiled run is one run: good for *where* the time goes, not for *how much faster* a fix is.
The speed verdict comes from separate, unprofiled runs of both settings, taking turns after a
discarded warm-up run of each (`timed_comparison`, `labkit.core.stats`; its one word is
`labkit.course.ladder.verdict`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.core.config import ParameterError
from labkit.course import ladder
from labkit.course.plots import finish, new_figure
from labkit.profiling.hta_check import SideBySide
from labkit.profiling.phases import CATEGORIES
from labkit.profiling.run import ProfileResult
from labkit.profiling.workload import WorkloadConfig, run_workload


def training_rate(config) -> Callable[[], float]:
    """A measurement of a `labkit train` configuration: one unprofiled run of the torch engine,
    its median samples/s over the steps after the first."""
    def run() -> float:
        from labkit.torch.trainer import fit

        with warnings.catch_warnings():  # more loader workers than cores is deliberate here
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            summary = fit(dataclasses.replace(config, progress=False)).to_dict()["summary"]
        return summary.get("median_samples_per_s") or config.batch_size / summary["median_step_time_s"]
    return run


def workload_rate(config: WorkloadConfig) -> Callable[[], float]:
    """A measurement of a profiling workload: one unprofiled run, its samples/s."""
    def run() -> float:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            return run_workload(config)["samples_per_s"]
    return run


def timed_comparison(before: Callable[[], float], after: Callable[[], float],
                     repeats: int = stats.MIN_REPEATS) -> stats.Comparison:
    """`after` against `before` in samples/s: one discarded run of each, then `repeats` runs of
    each in turns."""
    a, b = stats.interleave(before, after, repeats=repeats, warmup=1)
    return stats.compare(a, b)


DECODE_IMAGE_SIZE = 224  # a photo-sized JPEG, as ImageNet-style training reads


def decode_workload(steps: int = 16, threads: int = 1) -> WorkloadConfig:
    """Notebook 05's CPU-bound input: `steps` batches of 32 JPEGs of `DECODE_IMAGE_SIZE`² decoded
    in the loader, feeding an MLP wide enough that its step costs a fraction of the decoding."""
    return WorkloadConfig(decode="jpeg", image_size=DECODE_IMAGE_SIZE, batch_size=32, width=1024, depth=2,
                          steps=steps, threads=threads)


def decode_worker_sweep(config: WorkloadConfig, workers: Sequence[int] = (0, 1, 2, 4),
                        repeats: int = stats.MIN_REPEATS) -> list[dict[str, Any]]:
    """The CPU-bound decode workload with each number of loader workers, the counts taking
    turns `repeats` times after a discarded run of each: one row per count with the median and
    range of samples/s, the speed-up over the first count, and the verdict against the count
    before it (`ladder.verdict`; "reference" for the first count)."""
    runs = stats.round_robin({w: workload_rate(dataclasses.replace(config, num_workers=w)) for w in workers},
                             repeats=repeats)
    rows: list[dict[str, Any]] = []
    for w in workers:
        spread = stats.Spread(tuple(runs[w]))
        row = {"workers": w, "samples_per_s": spread.median, "range": spread.range_text(),
               "runs": list(spread.values), "speedup": spread.median / stats.Spread(tuple(runs[workers[0]])).median}
        row["vs previous"] = ladder.verdict(stats.compare(rows[-1]["runs"], row["runs"])) if rows else "reference"
        rows.append(row)
    return rows


@dataclass(frozen=True)
class DecodeFindings:
    """Where adding loader workers stopped paying off in a `decode_worker_sweep`, on a machine
    with `cores` usable cores (the training step needs one too)."""

    first_workers: int  # the sweep's first count, the reference of every speed-up
    best_workers: int  # the count with the highest median
    best_samples_per_s: float
    best_speedup: float  # its median over the first count's
    best_range: str  # its slowest to its fastest run
    # The largest count that was measurably faster than the count before it (None: none was).
    paid_up_to: int | None
    # Each count above `paid_up_to` (above the first count when none paid), with its verdict
    # against the count before it: by construction none of them is "faster".
    beyond: tuple[tuple[int, str], ...]
    cores: int


def decode_findings(rows: Sequence[dict[str, Any]], cores: int) -> DecodeFindings:
    """What `decode_worker_sweep`'s rows show, against this machine's `cores`."""
    if not rows:
        raise ParameterError("rows", rows, "an empty sweep has no findings")
    paid = [r["workers"] for r in rows[1:] if r["vs previous"] == "faster"]
    best = max(rows, key=lambda r: r["samples_per_s"])
    last = paid[-1] if paid else rows[0]["workers"]
    return DecodeFindings(rows[0]["workers"], best["workers"], best["samples_per_s"], best["speedup"], best["range"],
                          paid[-1] if paid else None,
                          tuple((r["workers"], r["vs previous"]) for r in rows if r["workers"] > last), cores)


def plot_breakdowns(results: list[ProfileResult], title: str = "where each step's time goes",
                    path: str | os.PathLike | None = None):
    """One stacked bar per run: the fraction of the step in each category."""
    fig, ax = new_figure((7, 0.8 + 0.7 * len(results)))
    labels = [f"{r.label}\n({r.verdict.kind})" for r in results]
    left = [0.0] * len(results)
    for cat in CATEGORIES:
        widths = [r.breakdown.fractions[cat] for r in results]
        ax.barh(labels, widths, left=left, label=cat)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlim(0, 1)
    ax.set_xlabel("fraction of step time")
    ax.set_title(title)
    ax.legend(ncol=len(CATEGORIES), fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.08))
    return finish(fig, path)


def nvtx_ranges(result: ProfileResult) -> dict[str, int]:
    """How many labkit phase ranges the trace holds (the same names go to NVTX on CUDA)."""
    if result.trace_path is None:
        return {}
    counts: dict[str, int] = {}
    for ev in json.loads(result.trace_path.read_text())["traceEvents"]:
        name = str(ev.get("name", ""))
        if name.startswith("labkit/") and ev.get("ph") == "X":
            counts[name] = counts.get(name, 0) + 1
    return counts


# ---------------------------------------------------------------- your own script (section 7)

def example_images(folder: os.PathLike, *, per_class: int, size: int = 192) -> Path:
    """A folder of JPEG files (train/ and val/, one subfolder per class) for `examples/your_job`,
    written by its own make_images.py."""
    import subprocess
    import sys

    from labkit.course.own_job import example

    folder = Path(folder)
    if not (folder / "train").is_dir():
        subprocess.run([sys.executable, str(example("your_job") / "make_images.py"), str(folder),
                        "--per-class", str(per_class), "--size", str(size)], check=True, capture_output=True)
    return folder


def own_script_command(images: os.PathLike, *, num_workers: int = 0, epochs: int = 3) -> list[str]:
    """The command a learner runs on the images: the first script as written
    (`step1_plain.py`), or with `num_workers` the next one, which adds loader workers."""
    from labkit.course.own_job import example

    script, extra = ("step2_loader.py", ["--num-workers", str(num_workers)]) if num_workers else ("step1_plain.py", [])
    return ["python", str(example("your_job") / script), "--data", str(images), "--epochs", str(epochs), *extra,
            "--out", os.path.join(os.fspath(images), "model.pt")]


@dataclass(frozen=True)
class ScriptChange:
    """The code one example script changes from another (their module docstrings aside): each
    hunk as the lines of `before` it removes and the lines of `after` it adds."""

    before: str  # file names
    after: str
    hunks: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]

    def text(self) -> str:
        """As a diff: "- " before the removed lines, "+ " before the added ones, "..." between hunks."""
        return "\n...\n".join("\n".join([*(f"- {ln}" for ln in removed), *(f"+ {ln}" for ln in added)])
                              for removed, added in self.hunks)


def own_script_change(before: str = "step1_plain.py", after: str = "step2_loader.py") -> ScriptChange:
    """What `after` changes in `before` (`examples/your_job`), line by line after the module
    docstring: by default the loader fix that section 7 profiles."""
    import ast
    import difflib
    import textwrap

    from labkit.course.own_job import example

    def code(name: str) -> list[str]:
        text = (example("your_job") / name).read_text(encoding="utf-8")
        first = ast.parse(text).body[0]
        skip = first.end_lineno if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else 0
        return text.splitlines()[skip:]

    old, new = code(before), code(after)
    hunks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if tag != "equal":
            lines = textwrap.dedent("\n".join(old[i1:i2] + new[j1:j2])).splitlines()
            hunks.append((tuple(lines[:i2 - i1]), tuple(lines[i2 - i1:])))
    return ScriptChange(before, after, tuple(hunks))


def show_own_script_change(before: str = "step1_plain.py", after: str = "step2_loader.py"):
    """`own_script_change` for a notebook: a diff, highlighted, with the two file names."""
    from labkit.course.recipe_view import show_change

    return show_change(f"examples/your_job: {before} (-) and {after} (+)", own_script_change(before, after).text())


def profile_own_script(out: os.PathLike, images: os.PathLike, *, steps: int, num_workers: int = 0):
    """`labkit profile --out OUT --steps STEPS -- python step1_plain.py ...` (or step 2):
    the `labkit.profiling.command.CommandProfile`."""
    from labkit.profiling.command import profile_command

    return profile_command(own_script_command(images, num_workers=num_workers), out, steps=steps, warmup=1)


# labkit's and HTA's figures "agree" when each is within this share of the other.
HTA_TOLERANCE = 0.01
HTA_AGREE = f"agree within {HTA_TOLERANCE:.0%}"
HTA_DIFFER = f"differ by more than {HTA_TOLERANCE:.0%}"


@dataclass(frozen=True)
class HtaCheck:
    """labkit's and Holistic Trace Analysis's readings of one trace side by side (`table`: rows
    of what, labkit's value, HTA's value), or, where HTA is not installed, why not (`missing`:
    the command that installs it)."""

    table: SideBySide | None
    missing: str = ""

    @property
    def agreement(self) -> str | None:
        """`HTA_AGREE` when every figure both compute is within `HTA_TOLERANCE`, else
        `HTA_DIFFER`; None without HTA."""
        if self.table is None:
            return None
        return HTA_AGREE if self.table.agrees(HTA_TOLERANCE) else HTA_DIFFER


def hta_side_by_side(profile_out: os.PathLike) -> HtaCheck:
    """labkit's and HTA's readings of the trace `labkit profile --out PROFILE_OUT` wrote
    (`labkit.profiling.hta_check`); where HTA is not installed, the command that installs it."""
    from labkit.profiling.hta_check import side_by_side

    try:
        return HtaCheck(side_by_side(Path(profile_out) / "tensorboard"))
    except ImportError as e:
        return HtaCheck(None, str(e))


def trace_verdict(trace: os.PathLike) -> str:
    """What `labkit profile --trace FILE` says of a trace: the breakdown and the verdict."""
    from labkit.profiling.analysis import op_profile, step_breakdown
    from labkit.profiling.trace import timeline_from_chrome_trace
    from labkit.profiling.verdict import diagnose

    timeline = timeline_from_chrome_trace(trace)
    breakdown = step_breakdown(timeline)
    return breakdown.text() + "\n" + diagnose(breakdown, op_profile(timeline)).text()


def running_job_rows(spec: dict[str, Any]) -> list[dict[str, str]]:
    """What in a CustomJob spec lets you look inside the job while it runs (its REST form, as
    the console and ``gcloud`` show it): the interactive shell and the TensorBoard Profiler."""
    from labkit.vertex.specs import to_rest_json

    rest = json.loads(to_rest_json(spec))
    container = rest["workerPoolSpecs"][0].get("containerSpec", {})
    setup = (container.get("command") or ["", "", "-"])[2]
    return [
        {"field": "enableWebAccess", "value": str(rest.get("enableWebAccess", False)).lower(),
         "what it gives": "a shell into each node, at the job's webAccessUris once it runs"},
        {"field": "tensorboard", "value": rest.get("tensorboard", "-"),
         "what it gives": "the TensorBoard whose Profile tab captures from the running job"},
        {"field": "serviceAccount", "value": rest.get("serviceAccount", "-"),
         "what it gives": "the account the job uploads logs and profiles as"},
        {"field": "containerSpec.command (set-up)", "value": setup.split(" && exec")[0],
         "what it gives": "the SDK's profiler plugin in the image"},
        {"field": "containerSpec.args", "value": " ".join(container.get("args", [])[:8]) + " ...",
         "what it gives": "training started inside the profiler's process"},
    ]
