"""Profile a run end to end: train under the profiler, analyse the trace, give the verdict.

`profile_workload(WorkloadConfig(...), ProfileConfig(out_dir=...))` is what `labkit profile` and
notebook 05 call. The result carries the breakdown, the top ops, the verdict and where the
trace files are, so a notebook can show them and compare two runs.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from labkit.profiling.analysis import Breakdown, OpStat, op_profile, step_breakdown, top_ops
from labkit.profiling.gpu_sampler import GpuSampler
from labkit.profiling.torch_profiler import ProfileConfig, torch_profile
from labkit.profiling.verdict import Verdict, diagnose
from labkit.profiling.workload import WorkloadConfig, run_workload


@dataclass
class ProfileResult:
    label: str
    batch_size: int
    breakdown: Breakdown
    ops: dict[str, float]
    top: list[OpStat]
    verdict: Verdict
    trace_path: Path | None
    tensorboard_dir: Path | None
    gpu: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        return self.breakdown.mean_step_s

    @property
    def samples_per_s(self) -> float:
        return self.batch_size / self.step_s

    def speedup_over(self, other: ProfileResult) -> float:
        """Throughput ratio (samples/s) of this run over `other`."""
        return self.samples_per_s / other.samples_per_s

    def summary(self) -> dict[str, object]:
        return {
            "label": self.label, "step_ms": 1e3 * self.step_s, "samples_per_s": self.samples_per_s,
            "fractions": self.breakdown.fractions, "verdict": self.verdict.kind,
            "evidence": self.verdict.evidence, "fix": self.verdict.fix, "notebook": self.verdict.notebook,
            "top_ops": [dataclasses.asdict(o) for o in self.top], "ops": self.ops, "gpu": self.gpu,
            "trace": str(self.trace_path) if self.trace_path else None,
            "tensorboard": str(self.tensorboard_dir) if self.tensorboard_dir else None,
        }

    def write_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.summary(), indent=2, default=str))
        return path

    def text(self) -> str:
        lines = [f"[{self.label}] {self.breakdown.text()} ({self.samples_per_s:,.0f} samples/s)"]
        lines += [f"  {o.share:5.1%}  {o.name} (x{o.count})" for o in self.top[:5]]
        lines.append(self.verdict.text())
        if self.trace_path:
            lines.append(f"trace (open in https://ui.perfetto.dev): {self.trace_path}")
        return "\n".join(lines)


def profile_workload(workload: WorkloadConfig, profile: ProfileConfig, label: str = "run",
                     sample_gpu: bool = True) -> ProfileResult:
    """Run `workload` under torch.profiler with `profile`'s schedule and analyse it."""
    steps = max(workload.steps, profile.steps_needed)
    workload = dataclasses.replace(workload, steps=steps)
    sampler = GpuSampler() if sample_gpu else None
    with (sampler or _Null()), torch_profile(profile) as prof:
        run_workload(workload, on_step=prof.step)
    return _analyse(prof, profile, label, workload.batch_size, sampler)


def profile_training(config, profile: ProfileConfig, label: str = "labkit train",
                     sample_gpu: bool = True) -> ProfileResult:
    """Profile a real `labkit train` run: the torch engine's `fit(config, on_step=...)` under
    torch.profiler (the engine's DataLoader, model and optimizer, as configured by TrainConfig)."""
    from labkit.torch.trainer import fit

    config = dataclasses.replace(config, steps=max(config.steps, profile.steps_needed), progress=False)
    sampler = GpuSampler() if sample_gpu else None
    with (sampler or _Null()), torch_profile(profile) as prof, warnings.catch_warnings():
        if config.input_latency_ms:  # loader workers that mostly wait on storage may outnumber cores
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        fit(config, on_step=lambda step, metrics: prof.step())
    return _analyse(prof, profile, label, config.batch_size, sampler)


def _analyse(prof, profile: ProfileConfig, label: str, batch_size: int,
             sampler: GpuSampler | None) -> ProfileResult:
    timeline = prof.timeline()
    breakdown = step_breakdown(timeline)
    ops = op_profile(timeline)
    gpu = sampler.summary() if sampler else None
    verdict = diagnose(breakdown, ops, gpu["mean_utilization"] if gpu else None)
    notes = [] if gpu or not sampler else [sampler.reason]
    return ProfileResult(label, batch_size, breakdown, ops, top_ops(timeline, 10), verdict,
                         prof.trace_path, prof.tensorboard_dir if profile.tensorboard else None, gpu, notes)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def set_cpu_threads(threads: int) -> int:
    """Limit torch's CPU intra-op threads (0 leaves the default); returns the count in effect.
    One thread keeps small CPU runs steady on a shared machine; GPUs are unaffected."""
    import torch

    from labkit.core.config import check_int

    check_int("cpu_threads", threads, minimum=0)
    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
