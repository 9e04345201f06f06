"""Rungs and levers are found by key; labels are only for display. Relabelling every rung of a
ladder and every lever of the capstone changes what a reader sees, never what the findings and
conclusions compute."""

from __future__ import annotations

from dataclasses import replace

import pytest

from labkit.course import capstone, levers, precision
from labkit.course.input_pipeline import findings as input_findings
from labkit.course.input_pipeline import ladder as input_ladder


def _precision_rows(relabel: str) -> list[dict]:
    speed = {"fp32": 100.0, "tf32": 101.0, "bf16": 180.0, "fp16": 170.0, "bf16_channels_last": 200.0}
    return [{"key": k, "rung": relabel + k, "samples_per_s": v, "speedup": v / 100.0, "final_loss": 2.0,
             "activation_mib": 10.0, "device": "cpu", "range": f"{v - 5:g}–{v + 5:g}", "repeats": 3,
             "runs_samples_per_s": [v - 5, v, v + 5]} for k, v in speed.items()]


def test_precision_findings_and_lookups_survive_new_labels():
    plain, renamed = _precision_rows(""), _precision_rows("renamed ")
    assert precision.find(renamed, "bf16")["speedup"] == pytest.approx(1.8)
    found = precision.findings(renamed, frozenset())
    assert found.best.rung == "renamed bf16_channels_last" and found.best.verdict == "faster"
    assert found.rung("tf32").rung == "renamed tf32" and found.rung("tf32").verdict == "no measurable difference here"
    assert found.rung("bf16").speedup == pytest.approx(1.8) and found.rung("bf16").verdict == "faster"
    assert found.tf32_on_cpu  # found by key, whatever the tf32 rung is called
    unlabelled = precision.findings(plain, frozenset())
    assert [f.verdict for f in found.others] == [f.verdict for f in unlabelled.others]
    with pytest.raises(KeyError, match="fp8"):
        precision.find(renamed, "fp8")
    with pytest.raises(KeyError, match="fp8"):
        found.rung("fp8")


def test_input_findings_survive_new_labels(monkeypatch):
    for key in input_ladder.INPUT_RUNGS:
        monkeypatch.setitem(input_ladder.INPUT_RUNGS, key, f"renamed {key}")
    lad = input_ladder.InputLadder("torch", [input_ladder.InputRung("torch", key, 100, 100 / r, 0.5) for key, r in
                                             zip(input_ladder.INPUT_RUNGS, [10, 50, 60, 100, 150], strict=True)])
    found = input_findings.ladder_findings(lad, input_ladder.InputLadderConfig())
    assert found.step("shards").ratio == pytest.approx(5) and found.step("shards").before.label == "renamed naive"
    assert found.best.label == "renamed cache" and found.speedup == pytest.approx(15)
    assert lad.rows()[1]["rung"] == "renamed shards"


def test_capstone_climb_and_conclusions_survive_new_labels(monkeypatch):
    for key, lever in list(levers.LEVERS["torch"].items()):
        monkeypatch.setitem(levers.LEVERS["torch"], key, replace(lever, label=f"renamed {key}"))

    def measure(cfg):
        speed = 100.0 * (2.0 if cfg.precision == "bf16" else 1.0) * (0.9 if cfg.channels_last else 1.0)
        return {"samples_per_s": speed, "step_time_ms": 10.0, "data_fraction": 0.0, "peak_memory_mib": None,
                "final_loss": 1.0, "device": "cpu"}

    cfg = capstone.CapstoneConfig(framework="torch", model="resnet", scale="smoke", repeats=3)
    result = capstone.optimise(cfg, hardware=capstone.Hardware("cpu", cpu_count=2), measure_fn=measure)
    assert result.kept == ["bf16"] and result.kept_labels == ["renamed bf16"]
    assert {s.key for s in result.skipped} == {"compile", "step_graph"}
    found = capstone.findings(result, capstone.cost_rows(result, None, 1000))
    assert [(f.lever, f.gain, f.before_range, f.after_range) for f in found.kept] == [
        ("renamed bf16", pytest.approx(2.0), "100–100", "200–200")]
    assert ("renamed channels_last", pytest.approx(0.9), "slower") in [(f.lever, f.gain, f.verdict) for f in found.dropped]


def test_a_new_rung_is_one_row(monkeypatch):
    """A rung added to the registry is climbed by the ladder, and a lever that is also a rung
    shows the rung's label."""
    extra = levers.Rung("bf16_new", "bf16 + something new", "bf16", channels_last=True)
    monkeypatch.setitem(levers.RUNGS, "torch", (*levers.RUNGS["torch"], extra))
    assert precision.rungs("torch", include_compile=False)[-1] == extra
    assert levers.lever("torch", "bf16").label == levers.rung("torch", "bf16").label == "bf16 autocast"
    assert levers.lever("tf", "bf16").label == levers.rung("tf", "bf16").label
    assert levers.lever("torch", "no such lever") is None


def test_a_slow_16_bit_rung_on_a_cpu_comes_with_the_cpus_flags():
    rows = [{**r, "precision": r["key"].split("_")[0]} for r in _precision_rows("")]
    rows[3] = {**rows[3], "samples_per_s": 7.0, "speedup": 0.07}  # fp16, as on a CPU without AVX-512 FP16
    [without] = precision.slow_16_bit_on_cpu(rows, frozenset({"avx2"}))
    assert without.precision == "fp16" and [(r.key, r.speedup) for r in without.rungs] == [("fp16", 0.07)]
    assert without.native_flags == ("avx512_fp16", "amx_fp16") and without.cpu_has == ()
    assert precision.slow_16_bit_on_cpu(rows, frozenset({"avx512_fp16"}))[0].cpu_has == ("avx512_fp16",)
    assert precision.slow_16_bit_on_cpu([{**r, "device": "cuda:0"} for r in rows], frozenset()) == []
    assert precision.findings(rows, frozenset()).slow_on_cpu == (without,)


def test_the_ladder_climbs_only_rungs_that_change_the_model_on_this_hardware():
    keys = [r.precision for r in precision.rungs("torch", include_compile=False)]
    assert "fp8" not in keys  # no plan: no format that needs its own tensor cores
    planned = [r.precision for r in precision.rungs("torch", False, ("fp32", "bf16", "fp8"), model="gpt")]
    assert {"fp32", "bf16", "fp8"} <= set(planned) and set(planned) <= {"fp32", "bf16", "fp8"}
    assert "fp8" not in [r.precision for r in precision.rungs("torch", False, ("fp32", "fp8"), model="cnn")]
