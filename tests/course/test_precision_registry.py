"""The course's precision rungs and each plan's formats come from the one registry
(`labkit.core.precisions`): a rung or format list of its own fails here, and a precision added to
the registry becomes a rung of every framework that trains in it."""

from __future__ import annotations

import pytest

from labkit.core import precisions
from labkit.core.precisions import PRECISIONS
from labkit.course import levers, sizing
from labkit.hardware import gpus


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_the_plain_rungs_are_the_registrys_precisions(framework):
    plain = [r for r in levers.RUNGS[framework] if not (r.channels_last or r.compile)]
    assert [(r.key, r.precision, r.label) for r in plain] == [
        (p.name, p.name, p.rungs[framework]) for p in precisions.precisions(framework)]
    assert levers.RUNGS[framework][:len(plain)] == tuple(plain)  # climbed first, in the registry's order


def test_a_precision_lever_takes_its_rungs_label():
    for key in ("bf16", "fp16"):
        assert levers.lever("torch", key).label == levers.rung("torch", key).label == precisions.rung_label("torch", key)


def test_a_precision_added_to_the_registry_is_a_rung(monkeypatch):
    new = precisions.Format("fp6", 1, 10.0, "Blackwell", "fp6 autocast", {"torch": "fp6 autocast"})
    monkeypatch.setattr(precisions, "FORMATS", (*precisions.FORMATS, new))
    assert levers.precision_rungs("torch")[-1] == levers.Rung("fp6", "fp6 autocast", "fp6")
    assert "fp6" not in [r.key for r in levers.precision_rungs("tf")]


@pytest.mark.parametrize("model", ["resnet", "gpt"])
@pytest.mark.parametrize("key", [None, *[g.key for g in gpus.TABLE]])
def test_the_ladder_plan_climbs_the_registrys_formats_this_gpu_runs(key, model):
    """Every training precision that changes `model`, less one that needs tensor cores this machine
    lacks (a CPU only emulates it) and, at full scale, any whose tensor cores the GPU lacks."""
    machine = sizing.Machine.planned(key)
    gpu = gpus.by_key(key) if key else None
    ladder = [p.name for p in precisions.precisions() if precisions.why_not_trains(p.name, "torch", model) is None]
    smoke = [p for p in ladder if not precisions.get(p).needs_tensor_cores or (gpu and gpu.supports(p))]
    plan = sizing.plan("04", "smoke", machine=machine, model=model)
    assert plan["formats"] == smoke and set(plan.skipped) == {f"{p} rungs" for p in PRECISIONS if p not in smoke}
    full = sizing.plan("04", "full", machine=machine, model=model)
    if key is None:
        assert full["formats"] == smoke
        if model == "gpt":  # the one model fp8 changes: left out for the machine, not the model
            assert full.skipped["fp8 rungs"].startswith("no GPU here: fp8 needs tensor cores")
        return
    assert full["formats"] == [p for p in ladder if gpu.supports(p)]
    assert set(full.skipped) == {f"{p} rungs" for p in PRECISIONS if p not in full["formats"]}
    assert all(f"{f} {'yes' if gpu.supports(f) else 'no'}" in machine.facts_line()
               for f in precisions.FORMAT_NAMES if precisions.get(f).tensor_cores_from)


def test_memory_and_time_forecasts_follow_a_formats_width():
    h100 = sizing.Machine.planned("h100")
    assert sizing.fitting_batch(h100, "gpt", "tf32") == sizing.fitting_batch(h100, "gpt", "fp32")
    assert sizing.fitting_batch(h100, "gpt", "fp16") == sizing.fitting_batch(h100, "gpt", "bf16")
    assert sizing.efficiency("gpt", "fp6") == min(v for (m, _), v in sizing.EFFICIENCY.items() if m == "gpt")
