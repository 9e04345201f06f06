"""Trace analysis on hand-built timelines and traces: every instant goes to one category (so
the fractions sum to one), overlaps resolve by priority, self times and the verdict rules."""

from __future__ import annotations

import json

import pytest

from labkit.profiling.analysis import (
    Breakdown,
    StepBreakdown,
    _self_times,
    op_profile,
    step_breakdown,
    top_ops,
)
from labkit.profiling.phases import CATEGORIES, Event, PhaseTimer, Timeline
from labkit.profiling.trace import timeline_from_chrome_trace
from labkit.profiling.verdict import diagnose


def tl(steps, events):
    return Timeline(steps=[Event(f"ProfilerStep#{i}", s, e, "step") for i, (s, e) in enumerate(steps)],
                    events=[Event(n, s, e, k) for n, s, e, k in events])


def test_fractions_sum_to_one_and_priorities():
    t = tl([(0, 100)], [
        ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 30, "annotation"),
        ("aten::copy_", 20, 35, "cpu_op"),          # 20-30 is inside input: input wins
        ("labkit/h2d", 30, 40, "annotation"),
        ("labkit/forward", 40, 80, "annotation"),   # a container: claims nothing itself
        ("aten::mm", 45, 60, "cpu_op"),
        ("aten::relu", 65, 70, "cpu_op"),
        ("Optimizer.step#SGD.step", 85, 95, "annotation"),
        ("aten::add_", 86, 90, "cpu_op"),           # inside the optimizer range
    ])
    b = step_breakdown(t)
    s = b.steps[0].seconds
    assert s["input"] == pytest.approx(30e-6)
    assert s["h2d"] == pytest.approx(10e-6)
    assert s["compute"] == pytest.approx(20e-6)
    assert s["optimizer"] == pytest.approx(10e-6)
    assert s["idle"] == pytest.approx(30e-6)        # 40-45, 60-65, 70-85, 95-100
    assert sum(b.fractions.values()) == pytest.approx(1.0)
    assert list(b.fractions) == list(CATEGORIES)


def test_fractions_sum_to_one_per_step_with_events_crossing_steps():
    t = tl([(0, 50), (50, 120)], [("aten::mm", 40, 70, "cpu_op"), ("nccl:all_reduce", 100, 130, "cpu_op")])
    b = step_breakdown(t)
    for step in b.steps:
        assert sum(step.fractions.values()) == pytest.approx(1.0)
    assert b.steps[1].seconds["communication"] == pytest.approx(20e-6)
    assert b.steps[0].seconds["compute"] == pytest.approx(10e-6)


def test_gpu_busy_is_union_of_device_events():
    t = tl([(0, 100)], [("k1", 10, 30, "gpu"), ("k2", 20, 40, "gpu"), ("k3", 90, 110, "gpu")])
    assert step_breakdown(t).gpu_busy == pytest.approx(0.4)


def test_self_times_subtract_children():
    evs = [Event("outer", 0, 100, "cpu_op"), Event("inner", 10, 40, "cpu_op"), Event("inner", 50, 60, "cpu_op")]
    assert _self_times(evs) == {0: 60, 1: 30, 2: 10}
    ops = top_ops(Timeline(steps=[Event("s", 0, 100, "step")], events=evs))
    assert ops[0].name == "outer" and ops[0].self_us == 60 and ops[1].count == 2


def test_phase_timer_timeline():
    timer = PhaseTimer()
    for _ in range(2):
        with timer.step():
            with timer.phase("input"):
                pass
            with timer.phase("forward"):
                sum(range(10_000))
    b = step_breakdown(timer.timeline)
    assert len(b.steps) == 2 and sum(b.fractions.values()) == pytest.approx(1.0)
    assert b.fractions["compute"] > 0
    with pytest.raises(ValueError, match="unknown phase"):
        with timer.phase("lunch"):
            pass


def _bd(**fractions):
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    seconds.update(fractions)
    return Breakdown([StepBreakdown("s", 1e6, seconds)])


@pytest.mark.parametrize("fractions,ops,kind,notebook", [
    ({"input": 0.6, "compute": 0.4}, {}, "input-bound", "03_input_pipelines"),
    ({"h2d": 0.3, "compute": 0.7}, {}, "input-bound", "03_input_pipelines"),
    ({"communication": 0.4, "compute": 0.6}, {}, "communication-bound", "02_distribution_tf_vs_ddp"),
    ({"idle": 0.6, "compute": 0.4}, {}, "launch/overhead-bound", "04_mixed_precision"),
    ({"idle": 0.1, "compute": 0.9}, {"small_op_share": 0.8}, "launch/overhead-bound", "04_mixed_precision"),
    ({"compute": 0.95, "idle": 0.05}, {"memory_share": 0.7}, "memory-bound", "04_mixed_precision"),
    ({"compute": 0.95, "idle": 0.05}, {"matmul_share": 0.9}, "compute-bound", "01_hardware_choice"),
])
def test_verdict_rules(fractions, ops, kind, notebook):
    v = diagnose(_bd(**fractions), ops)
    assert v.kind == kind
    assert v.notebook == notebook and v.fix
    assert kind in v.text()


def test_low_gpu_utilisation_is_overhead():
    v = diagnose(_bd(compute=0.9, idle=0.1), {"matmul_share": 0.9}, gpu_utilization=0.3)
    assert v.kind == "launch/overhead-bound" and "30%" in v.evidence


def test_chrome_trace_parsing(tmp_path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 50, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "ts": 20, "dur": 50, "pid": 0, "tid": 7},
        {"ph": "i", "name": "marker", "ts": 5},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    t = timeline_from_chrome_trace(path)
    assert len(t.steps) == 1 and t.has_gpu
    b = step_breakdown(t)
    assert b.gpu_busy == pytest.approx(0.5) and b.fractions["compute"] == pytest.approx(0.5)
    assert top_ops(t)[0].name == "sm90_xmma_gemm"
    assert op_profile(t)["matmul_share"] == pytest.approx(1.0)


def test_chrome_trace_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        timeline_from_chrome_trace(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON"):
        timeline_from_chrome_trace(bad)
    nosteps = tmp_path / "nosteps.json"
    nosteps.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="ProfilerStep"):
        timeline_from_chrome_trace(nosteps)
