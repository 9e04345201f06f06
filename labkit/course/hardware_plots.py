"""The plots of `labkit.hardware`'s results (the hardware package returns data; the course draws
it): rooflines with measured points and time against cost per option (notebook 01), all-reduce
bandwidth against message size (notebook 06)."""

from __future__ import annotations

import os

from labkit.course.plots import finish, new_figure
from labkit.hardware.allreduce import AllReduceReport
from labkit.hardware.cost import EstimateTable
from labkit.hardware.roofline import Roofline


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


def plot_allreduce_bandwidth(report: AllReduceReport, path: str | os.PathLike | None = None,
                             link_limit_gbps: float | None = None):
    """Algorithm and bus bandwidth against message size (log scale)."""
    fig, ax = new_figure((7, 4))
    sizes = [r.size_bytes for r in report.results]
    ax.plot(sizes, [r.busbw_gbps for r in report.results], "o-", label="bus bandwidth")
    ax.plot(sizes, [r.algbw_gbps for r in report.results], "s--", label="algorithm bandwidth")
    if link_limit_gbps:
        ax.axhline(link_limit_gbps, color="grey", linestyle=":", label="link limit")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(allreduce_title(report))
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return finish(fig, path)


def allreduce_title(report: AllReduceReport) -> str:
    """What was measured: processes, device, backend (the heading of its table and plot)."""
    return f"all-reduce, {report.world_size} x {report.device}, backend {report.backend}"
