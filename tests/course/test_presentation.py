"""The course's one table formatter and one plot finish, and the plots of `labkit.hardware`'s
results (drawn from hand-built data: the measurements themselves are tested with their modules)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import pytest

from labkit.course import hardware_choice, multinode, plots
from labkit.course.tables import cell, table
from labkit.hardware.allreduce import AllReduceReport, AllReduceResult
from labkit.hardware.catalog import load_catalog
from labkit.hardware.cost import CostAssumptions, Workload, estimate_costs
from labkit.hardware.roofline import Roofline


def test_cells_round_for_reading():
    assert [cell(v) for v in (1234.5, 0.012345, 2.0, 0.0, 1_281_167, None, True, math.nan, "x")] == [
        "1,234", "0.0123", "2", "0", "1,281,167", "–", "True", "n/a", "x"]


def test_text_table_aligns_numbers_right_and_text_left():
    lines = table([{"run": "a", "v": 1.5}, {"run": "bbb", "v": 12.25}], title="runs").splitlines()
    assert lines == ["runs", "run     v", "---  ----", "a     1.5", "bbb  12.2"]


def test_markdown_table_marks_missing_values_and_keeps_its_shape():
    text = table([{"a": 1234.5, "b": 0.012345, "c": None}, {"a": 2, "b": "x|y\nz"}], markdown=True)
    assert text.splitlines() == ["| a | b | c |", "|---|---|---|", "| 1,234 | 0.0123 | – |", "| 2 | x\\|y z | – |"]
    assert table([]) == "(no rows)"


def test_dollars_in_a_markdown_table_are_not_math():
    # JupyterLab typesets "$/epoch | Spot $/epoch" as one formula: the header lost a column and
    # the table was not drawn.
    text = table([{"$/epoch": 4.36, "Spot $/epoch": 2.53, "price": "$11.06/h"}], markdown=True)
    assert re.search(r"(?<!\\)\$", text) is None, text
    assert text.splitlines()[0] == "| \\$/epoch | Spot \\$/epoch | price |"


def test_literal_markdown_escapes_every_dollar():
    from labkit.notebooks.markdown import literal

    assert literal("cost: $4.36 on-demand, $2.53 Spot") == "cost: \\$4.36 on-demand, \\$2.53 Spot"


def test_rows_may_be_dataclasses_or_one_mapping():
    @dataclass
    class Row:
        size: int
        seconds: float

    assert table([Row(4096, 0.25)]).splitlines()[2] == "4,096     0.25"
    assert table({"raw read": 2.0}, ["reader", "GB/s"]).splitlines()[2] == "raw read     2"
    with pytest.raises(ValueError, match="columns"):
        table({"raw read": 2.0})


def test_finish_lays_out_and_saves(tmp_path):
    fig, ax = plots.new_figure((3, 2))
    ax.plot([1, 2], [3, 4])
    assert plots.finish(fig, tmp_path / "x.png") is fig and (tmp_path / "x.png").stat().st_size > 0


def test_hardware_plots(tmp_path):
    report = AllReduceReport("gloo", 2, "CPU process", [AllReduceResult(4096, 3, 1e-4, 0.04, 0.04),
                                                        AllReduceResult(1 << 20, 3, 1e-3, 1.0, 1.0)])
    fig = multinode.plot_allreduce_bandwidth(report, tmp_path / "bw.png", link_limit_gbps=2.0)
    assert (tmp_path / "bw.png").stat().st_size > 0 and fig.axes[0].get_xscale() == "log"
    assert multinode.allreduce_title(report) in table(report.results, title=multinode.allreduce_title(report))
    roof = hardware_choice.plot_rooflines([Roofline("here", 1.0, 10.0)], [("matmul", 100.0, 0.9)])
    assert roof.axes[0].get_yscale() == "log"
    estimates = estimate_costs(Workload(1e15, 8, 1000), load_catalog(), CostAssumptions())
    cost = hardware_choice.plot_time_cost(estimates, title="t", path=tmp_path / "cost.png")
    assert cost.axes[0].get_title() == "t" and (tmp_path / "cost.png").stat().st_size > 0


def test_compression_break_even_only_from_a_cost_above_its_noise():
    rows = [{"hook": "none", "sent_KiB_per_step": 100.0, "max_loss_gap": 0.0},
            {"hook": "fp16", "sent_KiB_per_step": 50.0, "max_loss_gap": 1e-4},
            {"hook": "powersgd r=1", "sent_KiB_per_step": 5.0, "max_loss_gap": 1e-2},
            {"hook": "bf16", "sent_KiB_per_step": 100.0, "max_loss_gap": 1e-3}]
    costs = {"fp16": {"cost_ms": 1.0, "spread_ms": 0.2}, "powersgd r=1": {"cost_ms": 0.028, "spread_ms": 0.88},
             "bf16": {"cost_ms": 1.0, "spread_ms": 0.1}}
    fp16, psgd, bf16 = multinode.break_even(rows, costs)
    assert fp16["break_even_MB_per_s"] == pytest.approx(50 * 1024 / 1e-3 / 1e6) and fp16["note"] == ""
    assert psgd["break_even_MB_per_s"] is None and psgd["note"] == multinode.COST_IN_NOISE
    assert bf16["break_even_MB_per_s"] is None and bf16["note"] == multinode.SAVED_NOTHING


def test_an_estimate_says_whether_it_was_measured():
    from labkit.hardware.cost import Estimate

    guess = Estimate("TPU v6e", 1.0, 1.0, 1.0, 1.0, 1.0, None, None, None)
    assert hardware_choice.estimate_basis(guess, 0.43) == \
        "estimate: datasheet peak × 43% MFU, not measured on TPU v6e"
    assert hardware_choice.estimate_basis(replace(guess, measured=True), 0.43) == "measured here"


def test_nccl_lines_say_what_each_pool_gets_and_how_many_lines_nccl_logged():
    spec = {"worker_pool_specs": [{"container_spec": {"env": [{"name": "NCCL_DEBUG", "value": "INFO"}]}}, {},
                                  {"container_spec": {}}]}
    assert multinode.pool_env_lines(spec) == ["workerpool0.container_spec.env: NCCL_DEBUG=INFO",
                                              "workerpool2.container_spec.env: "]

    class Run:
        def __init__(self, text):
            self.text = text

        def log(self):
            return self.text

    class Job:
        runs = [Run("x NCCL INFO a\nNCCL INFO b"), Run("NCCL WARN c")]

    assert multinode.nccl_log_lines(Job()) == 3
