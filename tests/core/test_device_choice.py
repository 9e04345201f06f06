"""One device choice and one rule for it: every `device` parameter and `--device` flag takes
`labkit.core.placement.DEVICES`, and every place that picks this process's device asks
`labkit.core.placement` (`place_here` for torch, `labkit.tf.runtime.configure` for TensorFlow).
A second copy of the choices, or a device picked by its own rule, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.core.config import ParameterError
from labkit.core.placement import DEVICES, place, place_here

REPO = Path(__file__).resolve().parents[2]
# Recipes are plain code a learner copies: they carry their own constants on purpose.
SCANNED = [p for p in [*(REPO / "labkit").rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]
           if "recipes" not in p.relative_to(REPO).parts]
CHOICES = re.compile(r"""["']auto["']\s*,\s*["']cpu["']\s*,\s*["']cuda["']""")
OWN_RULE = re.compile(r"""["']cuda["']\s+if\s+\S*(cuda\.is_available|cuda_available)\(\)""")
# Single-process benchmark scripts that pick the GPU when torch sees one (what place_here gives
# for one process), kept as they were written.
OWN_RULE_ALLOWED = {"benchmarks/bench_gpt_levers.py", "benchmarks/bench_torch.py"}


def _hits(pattern: re.Pattern) -> list[str]:
    return [f"{p.relative_to(REPO)}:{n}" for p in SCANNED
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]


def test_the_device_choices_are_written_once():
    assert _hits(CHOICES) == ["labkit/core/placement.py:" + str(_line_of_devices())]


def _line_of_devices() -> int:
    lines = (REPO / "labkit/core/placement.py").read_text(encoding="utf-8").splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith("DEVICES = "))


def test_no_module_picks_the_device_by_its_own_rule():
    found = [h for h in _hits(OWN_RULE) if h.split(":")[0] not in OWN_RULE_ALLOWED]
    assert found == [], "pick the device with labkit.core.placement.place_here: " + ", ".join(found)


def test_every_device_parameter_takes_the_placement_choices(capsys):
    from labkit.cli import build_parser
    from labkit.core import notebook_params, train_config
    from labkit.course.capstone import CapstoneConfig
    from labkit.hardware.bench import BenchConfig
    from labkit.profiling.workload import WorkloadConfig

    assert train_config.DEVICES is DEVICES and notebook_params.SHARED_DOMAINS["device"] is DEVICES
    fields = {f.name: f for f in train_config.TrainConfig.__dataclass_fields__.values()}
    assert fields["device"].metadata["choices"] is DEVICES
    parser = build_parser()
    assert [parser.parse_args(["profile", "--device", d]).device for d in DEVICES] == list(DEVICES)
    with pytest.raises(SystemExit):
        parser.parse_args(["profile", "--device", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err
    for make in (BenchConfig, WorkloadConfig, CapstoneConfig):
        for choice in DEVICES:
            make(device=choice)
        with pytest.raises(ParameterError, match="'device'"):
            make(device="tpu")


def test_place_here_is_place_on_the_gpus_torch_can_use():
    from labkit.core.devices import torch_gpu_count

    for device in ("auto", "cpu"):
        assert place_here(2, device=device) == place(2, torch_gpu_count(), device=device)


def test_torch_code_asked_for_cuda_without_a_gpu_is_refused_by_name():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("needs a machine without a GPU")
    from labkit.course.input_pipeline.step_probe import torch_image_step
    from labkit.hardware.bench import BenchConfig, measure_ceilings
    from labkit.profiling.workload import WorkloadConfig, run_workload

    for run in (lambda: run_workload(WorkloadConfig(batch_size=2, width=4, depth=1, steps=1, device="cuda")),
                lambda: measure_ceilings(BenchConfig(device="cuda", matmul_size=16, copy_mb=1)),
                lambda: torch_image_step(2, width=2, device="cuda")):
        with pytest.raises(ParameterError, match=r"'device'.*needs a CUDA GPU"):
            run()
    assert run_workload(WorkloadConfig(batch_size=2, width=4, depth=1, steps=1))["steps"] == 1  # auto: the CPU
