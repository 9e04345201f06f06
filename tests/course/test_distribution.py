"""Notebook 02's comparison of DDP and tf.distribute runs."""

from __future__ import annotations

from labkit.course import distribution


def _run(fw: str, n: int, times: list[float]) -> distribution.DistRun:
    from labkit.core.metrics import MetricsLog

    log = MetricsLog()
    log.steps = [{"step": i, "loss": 2.0, "step_time_s": t} for i, t in enumerate([9.9, *times])]
    return distribution.DistRun(fw, n, log, 1.0)


def test_the_faster_framework_is_a_verdict_on_the_spread_of_its_steps():
    comp = distribution.Comparison({("torch", 2): _run("torch", 2, [0.10, 0.11, 0.10, 0.12]),
                                    ("tf", 2): _run("tf", 2, [0.20, 0.21, 0.19, 0.22])})
    faster, sentence = distribution.framework_verdict(comp, 2)
    assert faster == "torch" and "slower" in sentence and "n=4" in sentence  # the first step left out
    comp.runs[("tf", 2)] = _run("tf", 2, [0.09, 0.13, 0.10, 0.12])  # ranges overlap
    assert distribution.framework_verdict(comp, 2) == (None, distribution.framework_verdict(comp, 2)[1])
    assert "no measurable difference" in distribution.framework_verdict(comp, 2)[1]
    comp.runs[("tf", 2)] = _run("tf", 2, [0.2, 0.2])
    assert distribution.framework_verdict(comp, 2) == (
        None, "fewer than 3 timed steps per framework at 2 processes: no verdict")


def test_the_scaling_answer_compares_step_times_with_one_process():
    comp = distribution.Comparison({("torch", 1): _run("torch", 1, [0.10, 0.11, 0.10, 0.12]),
                                    ("torch", 2): _run("torch", 2, [0.20, 0.21, 0.19, 0.22]),
                                    ("tf", 1): _run("tf", 1, [0.1, 0.1])})
    (line,) = distribution.scaling_answer(comp, 2)
    assert line.startswith("PyTorch DDP x2: 0.51× x1") and "slower" in line
    assert "ideal strong scaling would take 52.5 ms" in line  # half the median of 105 ms
    comp.runs[("tf", 2)] = _run("tf", 2, [0.1, 0.1])
    assert "tf.distribute MWMS: fewer than 3 timed steps: no verdict" in distribution.scaling_answer(comp, 2)
