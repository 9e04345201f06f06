"""Each notebook's plan is a pure function of the machine (GPU facts, GPU count, cores), the scale,
the notebook's parameters and a time budget: checked here for every GPU in the table without a
GPU, through `Machine.planned`."""

from __future__ import annotations

import pytest

from labkit.core.config import ParameterError
from labkit.core.precisions import PRECISIONS, why_not_trains
from labkit.course import sizing
from labkit.hardware import gpus

KEYS = [g.key for g in gpus.TABLE]
NOTEBOOKS = sizing.notebooks()


def test_every_notebook_has_a_plan():
    from tests.conftest import NOTEBOOK_DIR

    on_disk = tuple(sorted(p.name[:2] for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")))
    assert NOTEBOOKS == on_disk == tuple(f"{i:02d}" for i in range(13))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("nb", NOTEBOOKS)
def test_full_sizes_fit_the_gpu_and_forecast_a_time(key, nb):
    machine = sizing.Machine.planned(key)
    plan = sizing.plan(nb, "full", machine=machine)
    assert plan.scale == "full" and 0 < plan.expected_s < 3600
    text = plan.text()
    assert machine.gpu.label in text and "expected: about" in text
    for name in ("batch_size", "recipe_batch"):
        if name in plan.sizes and nb in ("04", "09"):
            model = "resnet"
            fmt = "fp32" if name == "batch_size" else plan["recipe_precision"]
            per = sizing.ACTIVATION_BYTES[(model, "fp32" if fmt == "fp32" else "16bit")]
            assert plan[name] * per + sizing.FIXED_BYTES[model] <= sizing.MEMORY_HEADROOM * machine.memory_bytes()


@pytest.mark.parametrize("model", ["resnet", "gpt"])
@pytest.mark.parametrize("key", KEYS)
def test_rungs_the_gpu_cannot_run_are_skipped_with_the_reason(key, model):
    """A rung is left out for the GPU's tensor cores, or for the model (fp8 changes only the GPT)."""
    facts = gpus.by_key(key)
    plan = sizing.plan("04", "full", machine=sizing.Machine.planned(key), model=model)
    for fmt in PRECISIONS:
        changes_model = why_not_trains(fmt, "torch", model) is None
        assert (fmt in plan["formats"]) == (facts.supports(fmt) and changes_model)
        if not changes_model:
            assert f"in model {model!r} it would change nothing" in plan.skipped[f"{fmt} rungs"]
        elif not facts.supports(fmt):
            assert facts.label in plan.skipped[f"{fmt} rungs"]
    assert plan["recipe_precision"] == ("bf16" if facts.supports("bf16") else "fp16")


def test_a_small_gpu_gets_a_smaller_batch():
    batches = {k: sizing.plan("04", "full", machine=sizing.Machine.planned(k))["batch_size"] for k in KEYS}
    assert batches["t4"] < batches["l4"] < batches["a100-40gb"] <= batches["h100"] == batches["h200"] == 256
    assert "fits" in " ".join(sizing.plan("04", "full", machine=sizing.Machine.planned("t4")).notes)


@pytest.mark.parametrize("nb, param", [("02", "processes"), ("06", "replicas"), ("10", "processes")])
def test_multi_process_demos_use_the_cpu_unless_each_process_has_a_gpu(nb, param):
    one = sizing.plan(nb, "full", machine=sizing.Machine.planned("h100"), **{param: 2})
    four = sizing.plan(nb, "full", machine=sizing.Machine.planned("h100", gpus=4), **{param: 2})
    device = {"02": "device", "06": "nodes_device", "10": "device"}[nb]
    assert (one[device], one["model_scale"]) == ("cpu", "smoke")
    assert "NCCL refuses two ranks on one GPU" in " ".join(one.notes)
    assert (four[device], four["model_scale"]) == ("cuda", "full")


def test_smoke_sizes_do_not_depend_on_the_machine():
    for nb in NOTEBOOKS:
        on = {k: sizing.plan(nb, "smoke", machine=sizing.Machine.planned(k)).sizes for k in (None, "t4", "h100")}
        assert on[None] == on["t4"] == on["h100"], nb
    assert sizing.plan("04", "smoke", machine=sizing.Machine.planned(None)).sizes["batch_size"] == 16


@pytest.mark.parametrize("nb", ["02", "03", "04", "06", "07", "08"])
def test_notebooks_that_show_a_curve_plan_the_learning_rate_for_their_model_size(nb):
    """10^-2 where the small smoke models train (at 10^-3 their curves barely fall in a dozen
    steps), 10^-3 for the full-size models on a GPU."""
    smoke = sizing.plan(nb, "smoke", machine=sizing.Machine.planned(None))
    full = sizing.plan(nb, "full", machine=sizing.Machine.planned("h100", gpus=4))
    assert smoke["lr"] == 1e-2 and full["lr"] == 1e-3
    assert "lr=0.01" in smoke.text()  # printed with the sizes, so the page says what it used


def test_a_time_budget_trims_what_buys_precision_and_says_so():
    machine = sizing.Machine.planned("l4")
    full = sizing.plan("09", "full", machine=machine)
    tight = sizing.plan("09", "full", machine=machine, time_budget_s=120)
    assert tight.expected_s < full.expected_s
    assert tight["steps"] < full["steps"] and tight.trimmed["steps"] == (full["steps"], tight["steps"])
    assert tight["steps"] >= 6  # never below the floor
    assert "trimmed to fit time_budget_s=120" in tight.text()
    assert tight.record()["trimmed"]["steps"] == [full["steps"], tight["steps"]]
    roomy = sizing.plan("09", "full", machine=machine, time_budget_s=100 * full.expected_s)
    assert roomy.sizes == full.sizes and not roomy.trimmed


def test_optional_rungs_go_last_and_are_listed_as_skipped():
    plan = sizing.plan("04", "full", machine=sizing.Machine.planned("t4"), time_budget_s=30)
    assert plan["include_compile"] is False
    assert "time_budget_s=30" in plan.skipped["the torch.compile rung"]


def test_bad_requests_name_the_parameter():
    with pytest.raises(ParameterError, match="'time_budget_s'"):
        sizing.plan("04", "full", machine=sizing.Machine.planned("h100"), time_budget_s=-1)
    with pytest.raises(ParameterError, match="'notebook'"):
        sizing.plan("99_nothing", "full", machine=sizing.Machine.planned("h100"))


def test_a_probe_slower_than_an_h100_plans_slower():
    fast = sizing.Machine.planned("h100")
    throttled = sizing.Machine(1, fast.gpu, 8, probe_tflops={"bf16": 200.0})
    assert throttled.tflops("bf16") < fast.tflops("bf16")
    assert sizing.plan("04", "full", machine=throttled).expected_s > sizing.plan("04", "full", machine=fast).expected_s


def test_the_course_table_has_a_row_per_notebook():
    rows = sizing.course_table(sizing.Machine.planned("l4"))
    assert [r["notebook"] for r in rows] == list(NOTEBOOKS)
    assert all(r["expected_min"] > 0 for r in rows)


def test_a_plan_says_when_the_machine_is_busy_and_how_much_timings_may_stretch(monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (7.0, 0.0, 0.0))
    plan = sizing.plan("00_tour", "smoke")
    cores = plan.machine.cpu_cores
    if 7.0 < sizing.BUSY_SHARE * cores:
        pytest.skip("this machine has too many cores for a load of 7 to count as busy")
    assert plan.busy and plan.load == 7.0 and plan.stretch == pytest.approx(max(1.0, 8 / cores))
    assert "busy: this machine's load average is 7.0" in plan.text() and plan.record()["load"] == 7.0
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    quiet = sizing.plan("00_tour", "smoke")
    assert not quiet.busy and "busy" not in quiet.text()
