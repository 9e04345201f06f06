"""The verdict: what bounds this training step, the fix, and the notebook that teaches it.

The rules read the step breakdown and the shape of the ops, in order, and stop at the first
that fires (an input-bound run also looks idle on the device, so input is checked first):

1. input-bound: ≥ 30% of the step producing or waiting for the batch, or ≥ 15% copying it to
   the device;
2. communication-bound: ≥ 25% in collectives;
3. launch/overhead-bound: ≥ 50% of the step is overhead: idle host time plus compute spent in
   small ops (each under 50 µs on CPU, 20 µs on GPU), or a GPU busy < 50% with nothing else to
   blame;
4. memory-bound: most compute time in elementwise / normalisation / copy ops rather than
   matmuls and convolutions;
5. otherwise compute-bound: the arithmetic itself; make each FLOP cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.profiling.analysis import Breakdown

INPUT_FRACTION = 0.30
H2D_FRACTION = 0.15
COMM_FRACTION = 0.25
OVERHEAD_FRACTION = 0.50
GPU_BUSY_LOW = 0.50
MEMORY_SHARE = 0.50

_FIX = {
    "input-bound": (
        "Feed the step faster: more loader workers (num_workers) and prefetch, pin_memory with "
        "non_blocking copies, sharded TFRecords read in parallel, cache decoded data, "
        "tf.data AUTOTUNE.", "03_input_pipelines"),
    "communication-bound": (
        "Communicate less often or overlap it: larger per-replica batch, gradient accumulation "
        "with no_sync, bigger DDP buckets, a reduction server on Vertex, faster interconnect.",
        "02_distribution_tf_vs_ddp"),
    "launch/overhead-bound": (
        "Do more work per op: larger batch (gradient accumulation keeps the global batch), "
        "torch.compile or CUDA graphs (mode='reduce-overhead') to fuse and remove launches, "
        "fewer Python-side ops per step.", "04_mixed_precision"),
    "memory-bound": (
        "Move fewer bytes: bf16 autocast, channels_last, fused kernels (torch.compile), fused "
        "optimizers; a memory-bandwidth-rich accelerator helps more than peak FLOP/s.",
        "04_mixed_precision"),
    "compute-bound": (
        "The arithmetic is the limit (good): make each FLOP cheaper with bf16/TF32 tensor cores, "
        "check MFU against this machine's measured ceiling, or pick a faster accelerator by "
        "$ per run.", "01_hardware_choice"),
}


@dataclass(frozen=True)
class Verdict:
    kind: str
    evidence: str
    fix: str
    notebook: str
    figures: dict[str, float] = field(default_factory=dict)

    def text(self) -> str:
        return f"{self.kind}: {self.evidence}\nfix: {self.fix}\nsee notebook {self.notebook}"


def diagnose(breakdown: Breakdown, ops: dict[str, float] | None = None,
             gpu_utilization: float | None = None) -> Verdict:
    """Apply the rules of the module docstring. `ops` is `op_profile(timeline)`;
    `gpu_utilization` (0..1) from a sampler overrides the trace's GPU-busy figure."""
    f = breakdown.fractions
    ops = ops or {}
    busy = gpu_utilization if gpu_utilization is not None else breakdown.gpu_busy
    figures = {**{f"{k}_fraction": v for k, v in f.items()}, **ops}
    if busy is not None:
        figures["gpu_busy"] = busy

    def verdict(kind: str, evidence: str) -> Verdict:
        fix, nb = _FIX[kind]
        return Verdict(kind, evidence, fix, nb, figures)

    if f["input"] >= INPUT_FRACTION:
        return verdict("input-bound", f"{100 * f['input']:.0f}% of each step waits for the next batch")
    if f["h2d"] >= H2D_FRACTION:
        return verdict("input-bound", f"{100 * f['h2d']:.0f}% of each step copies the batch to the device")
    if f["communication"] >= COMM_FRACTION:
        return verdict("communication-bound", f"{100 * f['communication']:.0f}% of each step is in collectives")
    overhead = f["idle"] + f["compute"] * ops.get("small_op_share", 0.0)
    figures["overhead_fraction"] = overhead
    if overhead >= OVERHEAD_FRACTION:
        return verdict("launch/overhead-bound",
                       f"{100 * overhead:.0f}% of each step is overhead: {100 * f['idle']:.0f}% idle "
                       f"between ops and {100 * ops.get('small_op_share', 0.0):.0f}% of op time in tiny ops "
                       f"({ops.get('ops_per_step', 0):.0f} ops per step)")
    if busy is not None and busy < GPU_BUSY_LOW:
        return verdict("launch/overhead-bound", f"the GPU is busy only {100 * busy:.0f}% of each step")
    if ops.get("memory_share", 0.0) >= MEMORY_SHARE:
        return verdict("memory-bound", f"{100 * ops['memory_share']:.0f}% of op time is in elementwise, "
                                       "normalisation and copy ops")
    return verdict("compute-bound", f"{100 * f['compute']:.0f}% of each step computes, "
                                    f"{100 * ops.get('matmul_share', 0.0):.0f}% of op time in matmuls/convolutions")
