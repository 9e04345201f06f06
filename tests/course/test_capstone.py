"""Notebook 09's capstone: which levers apply where, the greedy climb's decisions, the pricing
arithmetic, the Vertex job for an epoch, and one real climb on this CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from labkit.core.config import ParameterError
from labkit.core.train_config import TrainConfig
from labkit.course import capstone, ladder
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
    # one short discarded run of each of the 6 configurations the first time it is seen, then
    # each of the 5 comparisons and the final one alternate 3 + 3 runs
    warm_ups = [c for c in calls if c.steps == ladder.WARM_UP_STEPS]
    assert len(warm_ups) == 6 and calls[0].steps == ladder.WARM_UP_STEPS
    assert len(calls) == 6 + 6 * 6
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
    text = " ".join(capstone.conclusions(result, capstone.cost_rows(result, None, 1000)))
    assert "optimised run is the baseline itself" in text and "Dropped" in text


def test_the_climb_on_a_cpu_pins_torch_threads_and_restores_them():
    torch = pytest.importorskip("torch")
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
    be kept, and the conclusions say the same configuration swung."""
    seen = {}

    def measure(cfg: TrainConfig):
        n = seen[repr(cfg)] = seen.get(repr(cfg), 0) + 1
        speed = 20.0 if n == 1 else 480.0 + n  # only the very first run of each setting is cold
        return {"samples_per_s": speed, "step_time_ms": 10.0, "data_fraction": 0.02, "peak_memory_mib": None,
                "final_loss": 1.0, "device": "cpu"}

    cfg = CapstoneConfig(framework="torch", model="resnet", scale="smoke", repeats=3)
    result = capstone.optimise(cfg, hardware=CPU, measure_fn=measure)
    assert result.kept == [] and {t["verdict"] for t in result.trials} == {"no measurable difference here"}


def test_conclusions_flag_a_configuration_that_swung():
    speeds = iter([20.0, 100.0, 30.0, 100.0, 500.0, 100.0] + [100.0] * 100)

    def measure(cfg: TrainConfig):
        return {"samples_per_s": next(speeds) if cfg.steps != ladder.WARM_UP_STEPS else 1.0,
                "step_time_ms": 10.0, "data_fraction": 0.02, "peak_memory_mib": None, "final_loss": 1.0,
                "device": "cpu"}

    cfg = CapstoneConfig(framework="torch", model="cnn", scale="smoke", repeats=3)
    result = capstone.optimise(cfg, hardware=CPU, measure_fn=measure)
    text = " ".join(capstone.conclusions(result, capstone.cost_rows(result, None, 1000)))
    assert "swing for the same settings" in text


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
    text = "\n".join(capstone.conclusions(_result(), rows))
    assert "2.50×" in text and "0.40×" in text and "$100.00 → $40.00" in text


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
