"""The roofline: what a kernel of a given arithmetic intensity can reach on a machine.

attainable FLOP/s = min(peak FLOP/s, memory bandwidth × intensity), with intensity in FLOPs per
byte moved. Below the ridge point (peak / bandwidth) a kernel is memory-bound: a faster
accelerator with the same bandwidth does not help it, fusion and lower precision do.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.config import check_float


@dataclass(frozen=True)
class Roofline:
    name: str
    peak_tflops: float
    bandwidth_gbs: float

    def __post_init__(self) -> None:
        check_float("peak_tflops", self.peak_tflops, minimum=1e-9)
        check_float("bandwidth_gbs", self.bandwidth_gbs, minimum=1e-9)

    @property
    def ridge_flops_per_byte(self) -> float:
        return self.peak_tflops * 1e12 / (self.bandwidth_gbs * 1e9)

    def attainable_tflops(self, intensity: float) -> float:
        return min(self.peak_tflops, self.bandwidth_gbs * 1e9 * intensity / 1e12)

    def bound(self, intensity: float) -> str:
        return "memory-bound" if intensity < self.ridge_flops_per_byte else "compute-bound"


def matmul_intensity(n: int, bytes_per_element: int) -> float:
    """FLOPs per byte of an n×n×n matmul reading A, B and writing C once: 2n³ / (3n²·bytes)."""
    return 2.0 * n / (3.0 * bytes_per_element)
