"""Profiling: profiler contexts (torch.profiler, tf.profiler), trace analysis in code (step
breakdown, top ops), a GPU utilisation sampler, and a verdict with the fix and the notebook that
teaches it. Framework-free at import; torch and TensorFlow are imported when used."""

from labkit.profiling.analysis import Breakdown, op_profile, step_breakdown, top_ops
from labkit.profiling.gpu_sampler import GpuSampler
from labkit.profiling.phases import CATEGORIES, PhaseTimer, Timeline, phase
from labkit.profiling.run import ProfileResult, profile_workload
from labkit.profiling.torch_profiler import ProfileConfig, torch_profile
from labkit.profiling.trace import timeline_from_chrome_trace
from labkit.profiling.verdict import Verdict, diagnose
from labkit.profiling.workload import WorkloadConfig, run_workload

__all__ = [
    "Breakdown", "op_profile", "step_breakdown", "top_ops", "GpuSampler", "CATEGORIES", "PhaseTimer",
    "Timeline", "phase", "ProfileResult", "profile_workload", "ProfileConfig", "torch_profile",
    "timeline_from_chrome_trace", "Verdict", "diagnose", "WorkloadConfig", "run_workload",
]
