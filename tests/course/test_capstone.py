"""Notebook 09's capstone: which levers apply where, the greedy climb's decisions, the pricing
arithmetic, the Vertex job for an epoch, and one real climb on this CPU."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from labkit.core.config import ParameterError
from labkit.core.train_config import TrainConfig
from labkit.course import capstone, capstone_target, ladder
from labkit.course.capstone import CapstoneConfig, Hardware
from labkit.hardware.machines import Price

CPU = Hardware("cpu", fp8=False, cpu_count=2)
H100 = Hardware("cuda", fp8=True, cpu_count=16)


def _labels(levers):
    return [lv.label for lv in levers]


def _why(skipped):
    return {s.key: s.why for s in skipped}


def test_levers_on_a_cpu_smoke_run():
    tried, skipped = capstone.levers("torch", "resnet", CPU, include_compile=False)
    assert _labels(tried) == ["1 loader worker", "bf16 autocast", "channels_last"]
    assert tried[0].changes == {"num_workers": 1, "pin_memory": False}
    assert _why(skipped)["compile"] == capstone.COMPILE_OFF
    assert [lv.key for lv in tried] == ["loader_workers", "bf16", "channels_last"]


def test_levers_on_an_fp8_gpu_for_gpt():
    tried, skipped = capstone.levers("torch", "gpt", H100, include_compile=True)
    assert _labels(tried) == ["8 loader workers + pinned memory", "bf16 autocast", "torch.compile",
                             "CUDA graphs + kernel tuning", "whole step as one CUDA graph", "fp8 output head"]
    assert tried[3].needs == {"compile": True} and tried[5].needs == {"precision": "bf16"}
    assert tried[4].changes == {"cuda_graph_step": True}
    assert _why(skipped)["channels_last"] == "GPT has no convolutions"
    assert tried[5].lesson == "benchmarks/RESULTS.md"


def test_levers_without_fp8_or_cuda_say_why():
    _, skipped = capstone.levers("torch", "gpt", CPU, include_compile=True)
    assert "compute capability 8.9" in _why(skipped)["fp8_head"]
    assert _why(skipped)["cuda_graphs"] == "needs a CUDA GPU"
    assert _why(skipped)["step_graph"] == "needs a CUDA GPU"


def test_tensorflow_levers():
    tried, _ = capstone.levers("tf", "resnet", H100, include_compile=True)
    assert [lv.changes for lv in tried] == [{"precision": "bf16"}, {"compile": True}]


def _speed_model(factors):
    """A deterministic stand-in for a training run's throughput, to test the climb's decisions
    (the real runs are exercised by `test_real_climb_on_this_cpu`)."""
    calls = []

    def measure(cfg: TrainConfig):
        calls.append(cfg)
        speed = 100.0
        for field, (value, factor) in factors.items():
            if getattr(cfg, field) == value:
                speed *= factor
        return {"samples_per_s": speed, "step_time_ms": 1000 * cfg.batch_size / speed,
                "data_fraction": 0.02, "peak_memory_mib": None, "final_loss": 1.0, "device": "cuda:0"}

    return measure, calls


def test_climb_keeps_what_pays_and_drops_the_rest():
    measure, calls = _speed_model({"num_workers": (8, 1.5), "precision": ("bf16", 2.0),
                                   "compile": (True, 1.01), "fp8_head": (True, 1.2)})
    cfg = CapstoneConfig(framework="torch", model="gpt", scale="full", repeats=3, min_gain=0.03)
    result = capstone.optimise(cfg, hardware=H100, measure_fn=measure)
    assert [(t["lever"], t["kept"]) for t in result.trials] == [
        ("8 loader workers + pinned memory", True), ("bf16 autocast", True), ("torch.compile", False),
        ("whole step as one CUDA graph", False), ("fp8 output head", True)]
    # compile gained 1% < min_gain, so CUDA graphs (which need it) were not tried, and it says so.
    assert _why(result.skipped)["cuda_graphs"].startswith("needs compile=True")
    assert result.kept == ["loader_workers", "bf16", "fp8_head"]
    assert result.changes() == {"num_workers": 8, "pin_memory": True, "precision": "bf16", "fp8_head": True}
    assert result.speedup == pytest.approx(1.5 * 2.0 * 1.2)
    assert [r["run"] for r in result.final] == ["baseline", "optimised"]
    assert [t["verdict"] for t in result.trials] == ["faster", "faster", "no measurable difference here",
                                                     "no measurable difference here", "faster"]
    # first a short run without the storage wait sizes it: as long as the compute step measured
    # (120 ms at batch 12 and 100 samples/s, 2% of it waiting: 117.6 ms)
    assert (calls[0].steps, calls[0].input_latency_ms) == (capstone.PROBE_STEPS, 0.0)
    assert result.baseline.input_latency_ms == 118.0 == result.optimised.input_latency_ms
    assert result.slow_input.compute_ms == pytest.approx(117.6)
    # then one short discarded run of each of the 6 configurations the first time it is seen,
    # and each of the 5 comparisons and the final one alternate 3 + 3 runs
    warm_ups = [c for c in calls if c.steps == ladder.WARM_UP_STEPS]
    assert len(warm_ups) == 6 and calls[1].steps == ladder.WARM_UP_STEPS
    assert len(calls) == 1 + 6 + 6 * 6
    assert calls[-2] == result.baseline and calls[-1] == result.optimised
    assert len(result.spread_of(result.baseline).values) == 3 + 3  # first comparison and the final one


def test_a_lever_that_fails_here_is_reported_and_the_climb_goes_on():
    speed, calls = _speed_model({"precision": ("bf16", 2.0), "fp8_head": (True, 1.2)})

    def measure(cfg: TrainConfig):
        if cfg.cuda_graph_step:
            raise RuntimeError("capturing the training step as one CUDA graph failed: boom\nmore")
        return speed(cfg)

    cfg = CapstoneConfig(framework="torch", model="gpt", scale="full", repeats=3)
    result = capstone.optimise(cfg, hardware=H100, measure_fn=measure)
    why = _why(result.skipped)["step_graph"]
    assert "RuntimeError" in why and why.endswith("boom")  # the error's first line only
    assert "step_graph" not in [t["key"] for t in result.trials]
    assert result.changes() == {"precision": "bf16", "fp8_head": True}


def test_nothing_kept_means_the_optimised_run_is_the_baseline():
    measure, _ = _speed_model({"precision": ("bf16", 0.8), "num_workers": (1, 0.9), "channels_last": (True, 1.0)})
    cfg = CapstoneConfig(framework="torch", model="resnet", scale="smoke", repeats=3)
    result = capstone.optimise(cfg, hardware=CPU, measure_fn=measure)
    assert result.optimised == result.baseline and result.kept == [] and result.kept_labels == []
    found = capstone.findings(result, capstone.cost_rows(result, None, 1000))
    assert found.nothing_kept and found.kept == () and found.epoch_dollars is None
    assert [(f.lever, f.verdict) for f in found.dropped] == [
        ("1 loader worker", "slower"), ("bf16 autocast", "slower"), ("channels_last", "no measurable difference here")]
    assert found.dropped[1].gain == pytest.approx(0.8) and found.speedup == pytest.approx(1.0)


def test_the_climb_on_a_cpu_pins_torch_threads_and_restores_them(request):
    torch = pytest.importorskip("torch")
    request.addfinalizer(functools.partial(torch.set_num_threads, torch.get_num_threads()))
    torch.set_num_threads(2)  # not the pin's one thread, so the pin shows (a test worker may run on one)
    before, seen = torch.get_num_threads(), []

    def measure(cfg: TrainConfig):
        seen.append(torch.get_num_threads())
        return {"samples_per_s": 100.0, "step_time_ms": 10.0, "data_fraction": 0.0, "peak_memory_mib": None,
                "final_loss": 1.0, "device": "cpu"}

    result = capstone.optimise(CapstoneConfig(framework="torch", model="cnn", scale="smoke", cpu_threads=1),
                               hardware=CPU, measure_fn=measure)
    assert set(seen) == {1} and result.cpu_threads == 1 and torch.get_num_threads() == before
    gpu = capstone.optimise(CapstoneConfig(framework="torch", model="cnn", scale="smoke"), hardware=H100,
                            measure_fn=lambda cfg: dict(measure(cfg), device="cuda:0"))
    assert gpu.cpu_threads is None


def test_baseline_is_fp32_eager_at_the_scale_sizes():
    smoke = CapstoneConfig(framework="torch", model="resnet", scale="smoke").baseline()
    assert (smoke.precision, smoke.compile, smoke.num_workers, smoke.batch_size, smoke.steps) == ("fp32", False, 0, 16, 20)
    full = CapstoneConfig(framework="torch", model="gpt", scale="full").baseline()
    assert (full.batch_size, full.scale) == (12, "full")


@pytest.mark.parametrize("field,value", [("min_gain", 2.0), ("steps", 1), ("framework", "jax"), ("repeats", 0),
                                         ("repeats", 2)])
def test_bad_config_names_the_parameter(field, value):
    with pytest.raises(ParameterError, match=field):
        CapstoneConfig(**{field: value})


def test_a_first_run_effect_is_not_measured_as_a_lever():
    """The baseline's first runs are slow (a cold machine); a lever that changes nothing must not
    be kept, and the findings say the same configuration swung."""
    seen = {}

    def measure(cfg: TrainConfig):
        n = seen[repr(cfg)] = seen.get(repr(cfg), 0) + 1
        speed = 20.0 if n == 1 else 480.0 + n  # only the very first run of each setting is cold
        return {"samples_per_s": speed, "step_time_ms": 10.0, "data_fraction": 0.02, "peak_memory_mib": None,
                "final_loss": 1.0, "device": "cpu"}

    cfg = CapstoneConfig(framework="torch", model="resnet", scale="smoke", repeats=3)
    result = capstone.optimise(cfg, hardware=CPU, measure_fn=measure)
    assert result.kept == [] and {t["verdict"] for t in result.trials} == {"no measurable difference here"}


def test_findings_flag_a_configuration_that_swung():
    speeds = iter([20.0, 100.0, 30.0, 100.0, 500.0, 100.0] + [100.0] * 100)

    def measure(cfg: TrainConfig):
        timed = cfg.steps not in (ladder.WARM_UP_STEPS, capstone.PROBE_STEPS)  # not a warm-up or the probe
        return {"samples_per_s": next(speeds) if timed else 1.0,
                "step_time_ms": 10.0, "data_fraction": 0.02, "peak_memory_mib": None, "final_loss": 1.0,
                "device": "cpu"}

    cfg = CapstoneConfig(framework="torch", model="cnn", scale="smoke", repeats=3)
    result = capstone.optimise(cfg, hardware=CPU, measure_fn=measure)
    found = capstone.findings(result, capstone.cost_rows(result, None, 1000))
    assert found.swung and (found.baseline_runs.low, found.baseline_runs.high) == (20.0, 500.0)  # 25× apart
    assert found.verdict == "no measurable difference here"  # the final runs, all 100 samples/s
    assert not capstone.findings(_result(), []).swung  # never ran in a climb: nothing to swing


def _result(base_sps=100.0, best_sps=250.0, device="cuda:0"):
    base = TrainConfig(model="resnet", scale="full", batch_size=256, steps=40)
    opt = replace(base, precision="bf16", channels_last=True)
    row = {"step_time_ms": 1000.0, "data_fraction": 0.0, "peak_memory_mib": None, "final_loss": 1.0,
           "device": device, "repeats": 2}
    return capstone.CapstoneResult(base, opt, [], [], [dict(row, run="baseline", samples_per_s=base_sps),
                                                       dict(row, run="optimised", samples_per_s=best_sps)])


def test_cost_per_epoch_arithmetic():
    rows = capstone.cost_rows(_result(), Price(10.0, 2.0, "test"), 3_600_000, spot_overhead=0.1)
    assert rows[0]["h/epoch"] == pytest.approx(10.0) and rows[1]["h/epoch"] == pytest.approx(4.0)
    assert rows[0]["$/epoch"] == pytest.approx(100.0) and rows[1]["$/epoch"] == pytest.approx(40.0)
    assert rows[1]["Spot $/epoch"] == pytest.approx(4.0 * 1.1 * 2.0)
    assert "$/epoch" not in capstone.cost_rows(_result(), None, 3_600_000)[0]
    found = capstone.findings(_result(), rows)
    assert found.speedup == pytest.approx(2.5) and found.cost_ratio == pytest.approx(0.4)
    assert found.epoch_dollars == pytest.approx((100.0, 40.0)) and found.spot_dollars == pytest.approx(8.8)
    assert capstone.findings(_result(), []).epoch_dollars is None


def test_findings_hold_the_final_runs_and_their_verdict():
    result = _result()
    result.final[0].update(runs_samples_per_s=[98.0, 100.0, 103.0], data_fraction=0.5, final_loss=2.0)
    result.final[1].update(runs_samples_per_s=[240.0, 250.0, 255.0], data_fraction=0.2, final_loss=2.25)
    found = capstone.findings(result, [])
    assert found.verdict == "faster" and found.device == "cuda:0" and not found.nothing_kept
    assert found.baseline.values == (98.0, 100.0, 103.0) and found.optimised.range_text() == "240–255"
    assert found.input_left and found.steps == 40 and found.loss_gap == pytest.approx(0.25)
    result.final[1]["runs_samples_per_s"] = [90.0, 250.0, 255.0]  # overlaps the baseline's runs
    assert capstone.findings(result, []).verdict == "no measurable difference here"
    result.final[1]["data_fraction"] = capstone.NEXT_LEVER_WAIT / 2
    assert not capstone.findings(result, []).input_left
    assert capstone.findings(_result(), []).verdict.endswith("no verdict")  # one run each


def test_epoch_job_runs_one_epoch_of_the_optimised_config():
    spec = capstone.epoch_job(_result(), 1_281_167, checkpoint_every_min=30.0, output_uri="gs://bkt/x",
                              machine_type="a3-highgpu-1g", accelerator_type="NVIDIA_H100_80GB",
                              accelerator_count=1, spot=True)
    args = spec["worker_pool_specs"][0]["container_spec"]["args"]
    assert args[:4] == ["python", "-m", "labkit", "train"]
    assert args[args.index("--steps") + 1] == str(-(-1_281_167 // 256))
    assert "--channels-last" in args and args[args.index("--precision") + 1] == "bf16"
    # measured on a GPU at full scale: 30 minutes of 1-second steps
    assert args[args.index("--checkpoint-every") + 1] == "1800"
    assert spec["scheduling"]["strategy"] == "SPOT"
    from labkit import vertex
    from labkit.core import frameworks

    if frameworks.has_aiplatform():
        vertex.validate(spec)


@pytest.mark.slow
def test_real_climb_on_this_cpu():
    pytest.importorskip("torch")
    cfg = CapstoneConfig(framework="torch", model="cnn", scale="smoke", steps=4, repeats=3, device="cpu")
    result = capstone.optimise(cfg)
    assert len(result.trials) == 3 and all(t["samples_per_s"] > 0 for t in result.trials)
    kept = {k: v for t in result.trials if t["kept"] for k, v in
            next(lv for lv in capstone.levers("torch", "cnn", Hardware.detect("cpu"), False)[0]
                 if lv.key == t["key"]).changes.items()}
    assert result.changes() == {k: v for k, v in kept.items() if getattr(result.baseline, k) != v}
    assert all(r["device"] == "cpu" and r["samples_per_s"] > 0 and r["final_loss"] > 0 for r in result.final)


# ---------------------------------------------------------------- the slow baseline


def test_the_baseline_says_why_it_is_slow_before_it_runs():
    measure, calls = _speed_model({})
    cfg = CapstoneConfig(framework="torch", model="resnet", scale="smoke")
    base, slow = capstone.slow_baseline(cfg, CPU, measure)
    # one probe without the wait: 160 ms at batch 16 and 100 samples/s, 2% of it waiting
    assert len(calls) == 1 and calls[0].input_latency_ms == 0.0 and calls[0].precision == "fp32"
    assert base.input_latency_ms == 157.0 and base.precision == "fp32" and base.num_workers == 0
    assert slow.expected_wait == pytest.approx(157.0 / (157.0 + 156.8))
    assert slow.injected and slow.latency_ms == 157.0 and slow.compute_ms == pytest.approx(156.8)
    given, why = capstone.slow_baseline(CapstoneConfig(framework="torch", input_latency_ms=0.0), CPU, measure)
    assert len(calls) == 1 and given.input_latency_ms == 0.0 and not why.injected and why.expected_wait == 0.0


def _bottleneck_result(latency_ms: float, data_fraction: float | None):
    result = _result()
    result.final[0]["data_fraction"] = data_fraction
    return replace(result, slow_input=capstone.SlowInput(latency_ms, 100.0 if latency_ms else None))


def test_the_stated_bottleneck_is_checked_against_the_measured_breakdown():
    shown = _bottleneck_result(100.0, 0.48).bottleneck()
    assert shown.input_bound and shown.injected and shown.shown
    assert (shown.wait, shown.runs, shown.expected) == (0.48, 2, pytest.approx(0.5))
    missing = _bottleneck_result(100.0, 0.1).bottleneck()
    assert missing.injected and not missing.input_bound and not missing.shown
    fp32_only = _bottleneck_result(0.0, 0.02).bottleneck()
    assert fp32_only.shown and not fp32_only.injected and fp32_only.expected == 0.0  # not input-bound, as stated
    unmeasured = _bottleneck_result(100.0, None).bottleneck()
    assert unmeasured.wait is None and not unmeasured.shown


def test_the_baseline_is_input_bound_when_measured_on_this_cpu():
    """A real run: the baseline's measured breakdown has the bottleneck stated for it. The wait
    is given (not sized from a probe) so that a busy shared machine, whose compute step swings
    from run to run, cannot move the share below the line."""
    torch = pytest.importorskip("torch")
    cfg = CapstoneConfig(framework="torch", model="cnn", scale="smoke", steps=6, device="cpu", input_latency_ms=200.0)
    base, slow = capstone.slow_baseline(cfg, CPU)
    assert base.input_latency_ms == 200.0 and slow.injected and slow.compute_ms is None and slow.expected_wait is None
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.cpu_threads)  # as the climb runs on a CPU
    try:
        row = capstone.measure(base)
    finally:
        torch.set_num_threads(before)
    assert row["data_fraction"] >= capstone.INPUT_BOUND, row
    assert row["data_fraction"] * row["step_time_ms"] >= 0.9 * 200.0  # the wait is where the breakdown puts it


def test_a_lever_with_no_measurable_difference_is_not_kept_and_its_headline_says_so(capsys):
    from labkit.core.stats import NO_DIFFERENCE
    from labkit.notebooks import key_comparison

    noise = iter([100.0, 104.0, 98.0, 103.0, 101.0, 99.0] * 40)

    def measure(cfg: TrainConfig):
        speed = next(noise) * (2.0 if cfg.num_workers else 1.0)
        return {"samples_per_s": speed, "step_time_ms": 10.0, "data_fraction": 0.5 if not cfg.num_workers else 0.0,
                "peak_memory_mib": None, "final_loss": 1.0, "device": "cpu"}

    cfg = CapstoneConfig(framework="torch", model="resnet", scale="smoke", repeats=3)
    result = capstone.optimise(cfg, hardware=CPU, measure_fn=measure)
    by_key = {t["key"]: t for t in result.trials}
    assert by_key["loader_workers"]["kept"] and by_key["loader_workers"]["verdict"] == "faster"
    for key in ("bf16", "channels_last"):
        assert not by_key[key]["kept"] and by_key[key]["verdict"] == NO_DIFFERENCE
    assert result.kept == ["loader_workers"]
    t = by_key["channels_last"]
    key_comparison(t["figure"], t["comparison"], "without", "with")
    shown = capsys.readouterr().out
    assert t["figure"] == "capstone lever here: channels_last, with / without"
    assert f"{t['figure']}: {NO_DIFFERENCE}" in shown and "×" not in shown.split(":", 1)[1].split("(")[0]


# ---------------------------------------------------------------- the job on the target GPU


def _ladder(fp32=(99.0, 100.0, 101.0), bf16=(240.0, 250.0, 260.0), channels_last=(490.0, 500.0, 510.0),
            device="NVIDIA H100 80GB HBM3"):
    rows = []
    for key, label, runs in (("fp32", "fp32", fp32), ("bf16", "bf16 autocast", bf16),
                             ("bf16_channels_last", "bf16 + channels_last", channels_last)):
        low, median, high = runs
        rows.append({"key": key, "rung": label, "samples_per_s": median,
                     "range": f"{low:,.0f}–{high:,.0f}" if low != high else "one run", "speedup": median / fp32[1]})
    return capstone_target.StoredLadder(tuple(rows), "benchmarks/results/x-course.json: test", "benchmarks/results/x-course.json",
                                        device, "2026-11-26")


def _cpu_result():
    """A CPU climb: the loader lever kept; bf16 slower and channels_last no different, here."""
    measure, _ = _speed_model({"num_workers": (1, 2.0), "precision": ("bf16", 0.5)})
    cfg = CapstoneConfig(framework="torch", model="resnet", scale="smoke", repeats=3)
    return capstone.optimise(cfg, hardware=CPU, measure_fn=measure)


def test_a_cpu_run_plans_the_gpu_job_with_the_stored_gpu_ladders_levers():
    result = _cpu_result()
    assert result.kept == ["loader_workers"]  # here, bf16 was slower and channels_last no different
    plan = capstone_target.plan_for_target(result, CPU, "H100 80GB", _ladder())
    assert plan.carried == ["loader_workers", "bf16", "channels_last"] and not plan.measured_here
    rows = {r["key"]: r for r in plan.rows}
    assert rows["loader_workers"]["decided by"] == "measured here on cuda:0"  # the fake's device
    assert rows["bf16"]["decided by"] == rows["channels_last"]["decided by"] == \
        "stored GPU run: benchmarks/results/x-course.json, NVIDIA H100 80GB HBM3, 2026-11-26"
    assert rows["bf16"]["here"] == "0.50×, slower" and rows["bf16"]["stored GPU run"].startswith("2.50×, faster")
    assert not rows["compile"]["carried"] and "run this notebook on a GPU" in rows["compile"]["why"]
    assert (plan.config.precision, plan.config.channels_last, plan.config.num_workers) == ("bf16", True, 1)
    assert plan.carried_by == {"measured here on cuda:0": ["1 loader worker"],
                               rows["bf16"]["decided by"]: ["bf16 autocast", "channels_last"]}
    assert plan.ladder_decides and plan.gpu_gap is None and plan.rung == "bf16_channels_last"
    assert [r["key"] for r in plan.not_carried] == ["compile", "step_graph"]
    # the epoch is priced from the ladder at the target's price, never from the CPU's runs
    costs = capstone_target.cost_rows(plan, Price(10.0, 4.0, "test"), 1_800_000, spot_overhead=0.1)
    assert [c["run"] for c in costs] == ["baseline (fp32)", "planned job"]
    assert costs[1]["h/epoch"] == pytest.approx(1.0) and costs[1]["$/epoch"] == pytest.approx(10.0)
    assert costs[1]["h/epoch range"] == "0.98–1.02" and costs[1]["Spot $/epoch"] == pytest.approx(4.4)
    assert costs[0]["h/epoch"] == pytest.approx(5.0)
    assert plan.comparison.b_is_better and plan.comparison.ratio == pytest.approx(5.0)
    spec = capstone.epoch_job(result, 1_281_167, config=plan.config, step_time_ms=plan.step_time_ms,
                              output_uri="gs://bkt/x", machine_type="a3-highgpu-1g",
                              accelerator_type="NVIDIA_H100_80GB", accelerator_count=1)
    args = spec["worker_pool_specs"][0]["container_spec"]["args"]
    assert args[args.index("--precision") + 1] == "bf16" and "--channels-last" in args
    assert args[args.index("--num-workers") + 1] == "1" and "--input-latency-ms" not in args
    assert args[args.index("--checkpoint-every") + 1] == str(round(30 * 60_000 / (1000 * 256 / 500)))


def test_the_real_stored_gpu_run_carries_bf16_and_channels_last():
    stored = capstone_target.StoredLadder.load()
    if stored is None:
        pytest.skip("benchmarks/results is not beside this labkit")
    plan = capstone_target.plan_for_target(_cpu_result(), CPU, "H100 80GB", stored)
    assert {"bf16", "channels_last"} <= set(plan.carried)
    assert stored.file.startswith("benchmarks/results/") and stored.date and stored.device.startswith("NVIDIA")


def test_a_lever_that_overlaps_on_the_stored_ladder_is_not_carried():
    plan = capstone_target.plan_for_target(_cpu_result(), CPU, "H100 80GB",
                                           _ladder(channels_last=(245.0, 255.0, 265.0)))
    rows = {r["key"]: r for r in plan.rows}
    assert plan.carried == ["loader_workers", "bf16"] and plan.rung == "bf16"
    assert "no measurable difference here" in rows["channels_last"]["stored GPU run"]
    one_run = capstone_target.plan_for_target(_cpu_result(), CPU, "H100 80GB",
                                              _ladder(fp32=(100.0,) * 3, bf16=(250.0,) * 3, channels_last=(500.0,) * 3))
    assert one_run.carried == ["loader_workers"] and "no verdict" in {r["key"]: r for r in one_run.rows}["bf16"][
        "stored GPU run"]


def test_the_plan_says_when_the_ladder_ran_on_another_gpu_or_model():
    other = capstone_target.plan_for_target(_cpu_result(), CPU, "H100 80GB", _ladder(device="NVIDIA H200"))
    gap = other.gpu_gap
    assert (gap.ran_on, gap.target, gap.ran.key, gap.wanted.key) == ("NVIDIA H200", "H100 80GB", "h200", "h100")
    assert gap.ran.memory_bw_gbs > gap.wanted.memory_bw_gbs  # the datasheets differ: an estimate, not a measurement
    same = capstone_target.plan_for_target(_cpu_result(), CPU, "H100 80GB", _ladder())
    assert same.gpu_gap is None and same.ladder_decides
    unknown = capstone_target.plan_for_target(_cpu_result(), CPU, "H100 80GB", _ladder(device="Some GPU"))
    assert unknown.gpu_gap.ran is None and unknown.gpu_gap.wanted is not None
    measure, _ = _speed_model({})
    gpt = capstone.optimise(CapstoneConfig(framework="torch", model="gpt", scale="smoke"), hardware=CPU,
                            measure_fn=measure)
    plan = capstone_target.plan_for_target(gpt, CPU, "H100 80GB", _ladder())
    assert "bf16" not in plan.carried and not plan.ladder_decides and plan.ladder is not None
    assert plan.gpu_gap is None and plan.rung is None
    none_stored = capstone_target.plan_for_target(_cpu_result(), CPU, "H100 80GB", None)
    assert none_stored.carried == ["loader_workers"] and not none_stored.ladder_decides
    assert capstone_target.cost_rows(plan, None, 1000) == []


def test_on_a_gpu_the_levers_measured_here_decide():
    measure, _ = _speed_model({"num_workers": (8, 1.5), "precision": ("bf16", 2.0)})
    result = capstone.optimise(CapstoneConfig(framework="torch", model="resnet", scale="full", repeats=3),
                               hardware=H100, measure_fn=measure)
    plan = capstone_target.plan_for_target(result, H100, "H100 80GB", _ladder(channels_last=(245.0, 255.0, 265.0)))
    assert plan.measured_here and plan.carried == result.kept == ["loader_workers", "bf16"]
    assert plan.config == result.optimised and {r["decided by"] for r in plan.rows} == {"measured here on cuda:0"}
    assert capstone_target.cost_rows(plan, None, 1000) == capstone.cost_rows(result, None, 1000)
    assert plan.comparison.ratio == pytest.approx(3.0)


def test_without_a_loader_lever_the_baseline_gets_no_wait():
    from labkit.core import frameworks

    if not frameworks.has_tf():
        pytest.skip("TensorFlow is not installed")
    measure, calls = _speed_model({})
    cfg = CapstoneConfig(framework="tf", model="resnet", scale="smoke", input_latency_ms=50.0)
    base, slow = capstone.slow_baseline(cfg, CPU, measure)
    assert calls == [] and base.input_latency_ms == 0.0 and slow.latency_ms == 0.0 and not slow.injected
