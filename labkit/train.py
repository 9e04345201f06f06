"""Train with either engine: the public entry point for a run.

`TrainConfig` (defined in `labkit.core.train_config`) describes a run; `run_training(config)`
trains it in this process with the engine it names, and `run_replicas(config, n)` as `n` local
DDP processes (torch, gloo on loopback). Both return the run's `MetricsLog` and raise `Preempted`
after a checkpointed preemption.
"""

from __future__ import annotations

from labkit.core.metrics import MetricsLog
from labkit.core.train_config import (
    COMPILE_MODES,
    FRAMEWORKS,
    PRECISIONS,
    PREEMPTED_EXIT_CODE,
    Preempted,
    TrainConfig,
    from_argv,
    to_argv,
)

__all__ = ["COMPILE_MODES", "FRAMEWORKS", "PRECISIONS", "PREEMPTED_EXIT_CODE", "Preempted",
           "TrainConfig", "from_argv", "run_replicas", "run_training", "to_argv"]


def run_training(config: TrainConfig) -> MetricsLog:
    """Train with the configured framework in this process; returns the engine's MetricsLog."""
    if config.framework == "torch":
        from labkit.torch.engine import fit
    else:
        from labkit.tf.engine import fit
    return fit(config)


def run_replicas(config: TrainConfig, nproc: int, **options) -> MetricsLog:
    """Train `config` as `nproc` local replicas: DDP processes for torch, MultiWorkerMirrored
    workers for TensorFlow (one thread each by default); returns rank 0's MetricsLog."""
    if config.framework == "torch":
        from labkit.torch.launch import run_local
    else:
        from labkit.tf.launch import run_local
    return run_local(config, nproc, **options)
