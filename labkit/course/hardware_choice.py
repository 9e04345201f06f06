"""Notebook 01's measurements and plots: an MLP's training throughput timed on this machine,
turned into achieved TFLOP/s and model FLOPs utilisation (MFU); rooflines with measured points
and time against cost per option (`labkit.hardware` returns the data, this module draws it).

The profiling workload's MLP is timed unprofiled (after warm-up steps) and its FLOPs are known
exactly (matmuls: 6 × weights × batch), so achieved FLOP/s over the measured matmul ceiling is
this machine's model FLOPs utilisation for a simple, matmul-heavy model.

The run to price: `workload_flops_per_sample` (a course model's FLOPs, or yours) and `input_rate`
(what one loader process delivers here, every pass kept, or your figure). These return numbers;
notebook 01 writes the sentences.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

from labkit.core import stats
from labkit.core.config import ParameterError, check_float, check_int
from labkit.course.plots import finish, new_figure
from labkit.hardware.cost import MODEL_KINDS, Estimate, EstimateTable
from labkit.hardware.flops import mlp_training_flops
from labkit.hardware.roofline import Roofline

GPT_INPUT_SEQUENCES = 256  # token records written and read per timed pass (block 1024: about 1 MB)
JPEG_SECONDS = 0.2  # each of the repeated JPEG-decoding runs lasts at least this long


@dataclass(frozen=True)
class Throughput:
    step_s: float
    samples_per_s: float
    flops_per_step: float

    @property
    def achieved_tflops(self) -> float:
        return self.flops_per_step / self.step_s / 1e12

    def mfu(self, peak_tflops: float) -> float:
        return self.achieved_tflops / peak_tflops


def measure_mlp_throughput(width: int = 512, depth: int = 4, batch_size: int = 128, steps: int = 10,
                           warmup: int = 2, device: str = "auto", threads: int = 0) -> Throughput:
    """Time `steps` training steps of the MLP (after `warmup` untimed ones)."""
    from labkit.profiling.workload import WorkloadConfig, run_workload

    check_int("steps", steps, minimum=1)
    check_int("warmup", warmup, minimum=0)
    cfg = WorkloadConfig(batch_size=batch_size, width=width, depth=depth, device=device, threads=threads)
    if warmup:
        run_workload(WorkloadConfig(**{**cfg.__dict__, "steps": warmup}))
    timed = run_workload(WorkloadConfig(**{**cfg.__dict__, "steps": steps}))
    step_s = timed["seconds"] / steps
    return Throughput(step_s, batch_size / step_s, mlp_training_flops(width, depth, batch_size))


# ---------------------------------------------------------------- the run to be priced


def workload_flops_per_sample(model: str, given: float = 0.0) -> float:
    """Training FLOPs per sample: `given` when set (> 0), else those of course model `model`
    ("gpt", "cnn", "resnet") at full size, from its config (`labkit.core.models`). Another
    model needs its own figure (count it with `labkit.hardware.flops.count_training_flops`)."""
    from labkit.core.models import build_config
    from labkit.core.models import flops_per_sample as config_flops

    check_float("flops_per_sample", given, minimum=0.0)
    if given:
        return float(given)
    if model not in MODEL_KINDS:
        raise ParameterError("flops_per_sample", given, f"must be set for model {model!r} (labkit knows the FLOPs "
                             f"of {', '.join(sorted(MODEL_KINDS))}; count yours with count_training_flops)")
    return config_flops(build_config(model, "full"))


@dataclass(frozen=True)
class InputRate:
    """Samples per second the input pipeline delivers to one GPU (None: unknown), where the
    figure comes from, and, when it was measured here, every timed pass (`passes`: its median is
    `samples_per_s`)."""

    samples_per_s: float | None
    source: str
    passes: stats.Spread | None = None


def input_rate(model: str, samples_per_s: float | None = None, repeats: int = stats.MIN_REPEATS) -> InputRate:
    """`samples_per_s` when given (what your pipeline delivers per GPU, e.g. notebook 03's
    figure); else one loader process measured here, the median of `repeats` passes (reading
    GPT-2 token records for "gpt", decoding JPEGs for the image models); a model labkit cannot
    feed here has no rate."""
    if samples_per_s is not None:
        return InputRate(check_float("input_samples_per_s", samples_per_s, minimum=1e-9),
                         "your input_samples_per_s parameter")
    check_int("repeats", repeats, minimum=1)
    if model == "gpt":
        spread = stats.Spread(tuple(token_read_rates(repeats)))
        what = "reading GPT-2 token records of 1,024 tokens with labkit's reader (CRC checked, page cache)"
    elif model in MODEL_KINDS:
        from labkit.core.models import build_config
        from labkit.course.input_pipeline.read_rates import jpeg_decodes_per_s

        size = build_config(model, "full").image_size
        spread = stats.Spread(tuple(jpeg_decodes_per_s(JPEG_SECONDS, size, repeats=1) for _ in range(repeats)))
        what = f"decoding {size}² JPEGs with Pillow, as a loader worker does"
    else:
        return InputRate(None, f"labkit has no input to time for model {model!r}: pass input_samples_per_s")
    return InputRate(spread.median, f"measured here: one loader process {what}", spread)


def token_read_rates(repeats: int, sequences: int = GPT_INPUT_SEQUENCES, block_size: int = 1024) -> list[float]:
    """Sequences per second labkit's reader delivers from a TFRecord file of `sequences` GPT token
    records (written to a temporary folder), one value per timed pass after an untimed one."""
    from labkit.data.reader import ReadConfig, read_batches
    from labkit.data.shards import token_example
    from labkit.data.synthetic import SyntheticTokens, TokenDatasetConfig
    from labkit.data.tfrecord import RecordWriter

    tokens = SyntheticTokens(TokenDatasetConfig(num_sequences=sequences, block_size=block_size, vocab_size=50304))
    with tempfile.TemporaryDirectory(prefix="labkit-input-") as folder:
        path = os.path.join(folder, "tokens.tfrecord")
        with RecordWriter(path) as writer:
            for i, seq in enumerate(tokens.sequences(range(sequences))):
                writer.write(token_example(i, seq))
        rates = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            count = sum(len(b["tokens"]) for b in read_batches([path], ReadConfig(kind="tokens", batch_size=64)))
            rates.append(count / (time.perf_counter() - start))
        return rates[1:]


# ---------------------------------------------------------------- plots


def estimate_basis(e: Estimate, mfu: float | None = None) -> str:
    """Where an option's figures come from, for a ranking that is only as good as its MFU:
    "measured here", or the datasheet peak at `mfu` (default: the row's own, with its source)."""
    if e.measured:
        return "measured here"
    if mfu is None and e.mfu is None:
        return f"no estimate: {e.mfu_source}"
    source = f" ({e.mfu_source})" if mfu is None and e.mfu_source else ""
    return f"estimate: datasheet peak × {e.mfu if mfu is None else mfu:.0%} MFU{source}, not measured on {e.name}"


def plot_rooflines(rooflines: list[Roofline], points: list[tuple[str, float, float]] = (),
                   path: str | os.PathLike | None = None):
    """Log-log plot of each roofline, with measured points (label, intensity, TFLOP/s)."""
    import numpy as np

    fig, ax = new_figure((7, 4.5))
    xs = np.logspace(-2, 4, 200)
    for r in rooflines:
        ax.plot(xs, [r.attainable_tflops(x) for x in xs], label=f"{r.name} (ridge {r.ridge_flops_per_byte:.0f} FLOP/B)")
    for label, x, y in points:
        ax.scatter([x], [y], zorder=3)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return finish(fig, path)


def plot_time_cost(table: EstimateTable, title: str = "", path: str | os.PathLike | None = None):
    """Hours per run against $ per run for every option with a time and a cost (TPU rows without
    a TPU MFU have neither), on-demand (circles) and Spot (triangles), with the Pareto front
    drawn through the options nobody beats on both."""
    fig, ax = new_figure((7, 4.5))
    for e in table.comparable:
        ax.scatter(e.hours_per_run, e.on_demand_per_run, marker="o")
        ax.annotate(e.name, (e.hours_per_run, e.on_demand_per_run), textcoords="offset points",
                    xytext=(4, 3), fontsize=8)
        if e.spot_per_run is not None:
            ax.scatter(e.spot_hours_per_run, e.spot_per_run, marker="^", color="gray")
    front = table.pareto()
    ax.plot([p[2] for p in front], [p[3] for p in front], "k--", lw=1, label="Pareto front")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("hours per run")
    ax.set_ylabel("$ per run (o on-demand, ^ Spot)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return finish(fig, path)
