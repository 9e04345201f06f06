"""Notebook 01's measurements and plots: an MLP's training throughput timed on this machine,
turned into achieved TFLOP/s and model FLOPs utilisation (MFU); rooflines with measured points
and time against cost per option (`labkit.hardware` returns the data, this module draws it).

The profiling workload's MLP is timed unprofiled (after warm-up steps) and its FLOPs are known
exactly (matmuls: 6 × weights × batch), so achieved FLOP/s over the measured matmul ceiling is
this machine's model FLOPs utilisation for a simple, matmul-heavy model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from labkit.core.config import check_int
from labkit.course.plots import finish, new_figure
from labkit.hardware.cost import Estimate, EstimateTable
from labkit.hardware.flops import mlp_training_flops
from labkit.hardware.roofline import Roofline


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


# ---------------------------------------------------------------- plots


def estimate_basis(e: Estimate, mfu: float) -> str:
    """Where an option's figures come from, for a ranking that is only as good as its MFU:
    "measured here", or the datasheet peak at the assumed `mfu`."""
    return "measured here" if e.measured else f"estimate: datasheet peak × {mfu:.0%} MFU, not measured on {e.name}"


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
    """Hours per run against $ per run for every option, on-demand (circles) and Spot
    (triangles), with the Pareto front drawn through the options nobody beats on both."""
    fig, ax = new_figure((7, 4.5))
    for e in table.estimates:
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
