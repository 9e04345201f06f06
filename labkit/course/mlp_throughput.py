"""Notebook 01's measured training throughput: an MLP timed on this machine, turned into
achieved TFLOP/s and model FLOPs utilisation (MFU).

The profiling workload's MLP is timed unprofiled (after warm-up steps) and its FLOPs are known
exactly (matmuls: 6 × weights × batch), so achieved FLOP/s over the measured matmul ceiling is
this machine's model FLOPs utilisation for a simple, matmul-heavy model.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.config import check_int
from labkit.hardware.flops import mlp_training_flops


@dataclass(frozen=True)
class Throughput:
    step_s: float
    samples_per_s: float
    flops_per_step: float

    @property
    def achieved_tflops(self) -> float:
        return self.flops_per_step / self.step_s / 1e12

    def mfu(self, peak_tflops: float) -> float:
        return self.achieved_tflops / peak_tflops


def measure_mlp_throughput(width: int = 512, depth: int = 4, batch_size: int = 128, steps: int = 10,
                           warmup: int = 2, device: str = "auto", threads: int = 0) -> Throughput:
    """Time `steps` training steps of the MLP (after `warmup` untimed ones)."""
    from labkit.profiling.workload import WorkloadConfig, run_workload

    check_int("steps", steps, minimum=1)
    check_int("warmup", warmup, minimum=0)
    cfg = WorkloadConfig(batch_size=batch_size, width=width, depth=depth, device=device, threads=threads)
    if warmup:
        run_workload(WorkloadConfig(**{**cfg.__dict__, "steps": warmup}))
    timed = run_workload(WorkloadConfig(**{**cfg.__dict__, "steps": steps}))
    step_s = timed["seconds"] / steps
    return Throughput(step_s, batch_size / step_s, mlp_training_flops(width, depth, batch_size))
