"""Train with either engine: the public entry point for a run.

`TrainConfig` (defined in `labkit.core.train_config`) describes a run; `run_training(config)`
trains it in this process with the engine it names, and `run_replicas(config, n)` as `n` local
DDP processes (torch, gloo on loopback). Both return the run's `MetricsLog` and raise `Preempted`
after a checkpointed preemption. Both check first, before any framework or process starts, what
would otherwise fail later or inside a replica: the outputs can be written, no other run holds
the checkpoint folder, and its newest checkpoint was written with these settings (or the changes
are allowed). The engines check the same again on start.
"""

from __future__ import annotations

from labkit.core import checkpoint
from labkit.core.cluster import from_env
from labkit.core.config import ParameterError, resolve_scale
from labkit.core.fingerprint import Resume
from labkit.core.lease import check_free
from labkit.core.metrics import MetricsLog
from labkit.core.models import build_config
from labkit.core.outputs import check_run_outputs
from labkit.core.train_config import (
    COMPILE_MODES,
    FRAMEWORKS,
    PRECISIONS,
    PREEMPTED_EXIT_CODE,
    Preempted,
    TrainConfig,
    from_argv,
    to_argv,
    with_vertex_dirs,
)
from labkit.data import synthetic

__all__ = ["COMPILE_MODES", "FRAMEWORKS", "PRECISIONS", "PREEMPTED_EXIT_CODE", "Preempted",
           "TrainConfig", "check_before_start", "from_argv", "run_replicas", "run_training", "to_argv"]


def run_training(config: TrainConfig) -> MetricsLog:
    """Train with the configured framework in this process; returns the engine's MetricsLog."""
    here = from_env()  # a replica of a multi-process run learns its place from the environment
    check_before_start(config, here.global_world_size, main=here.global_rank in (0, None))
    if config.framework == "torch":
        from labkit.torch.engine import fit
    else:
        from labkit.tf.engine import fit
    return fit(config)


def describe_device(config: TrainConfig, nproc: int = 1) -> str:
    """Where the run's processes will train, in one line (`labkit train` prints it when
    `--device auto` chose): `labkit.core.placement`'s rule for `nproc` processes on this
    machine's GPUs, with a warning when a GPU is present that torch cannot use. Raises
    ParameterError naming `device` when `--device cuda` cannot be honoured, before anything
    starts."""
    from labkit.core import devices
    from labkit.core.placement import place

    info = devices.detect()
    usable = len(info.gpus) if devices.cuda_available() or config.framework == "tf" else 0
    warning = devices.unusable_gpus() if config.framework == "torch" else None
    if config.device == "cuda" and warning:
        raise ParameterError("device", config.device, warning.replace("; training would run on the CPU", ""))
    where = place(nproc, usable, device=config.device)
    if where.on_gpu:
        names = sorted({g.name for g in info.gpus[:nproc]})
        line = f"device {config.device}: {'GPU 0' if nproc == 1 else f'GPUs 0-{nproc - 1}'} ({', '.join(names)}); {where.reason}"
    else:
        line = f"device {config.device}: the CPU; {where.reason}"
    return line + (f". WARNING: {warning}" if warning and config.device == "auto" else "")


def run_replicas(config: TrainConfig, nproc: int, **options) -> MetricsLog:
    """Train `config` as `nproc` local replicas: DDP processes for torch, MultiWorkerMirrored
    workers for TensorFlow (one thread each by default); returns rank 0's MetricsLog."""
    check_before_start(config, nproc)
    if config.framework == "torch":
        from labkit.torch.launch import run_local
    else:
        from labkit.tf.launch import run_local
    return run_local(config, nproc, **options)


def check_before_start(config: TrainConfig, world_size: int, *, main: bool = True) -> None:
    """What can be checked before anything starts, for a run of `world_size` processes (`main`:
    this is the one writing metrics): writable outputs, a drill with somewhere to save, no live
    writer holding the checkpoint folder, and (torch) the newest checkpoint's fingerprint.
    Raises a ValueError or OSError subclass whose one-line message names the setting."""
    config = with_vertex_dirs(config)
    check_run_outputs(config, main=main)
    if not config.checkpoint_dir:
        return
    if main:  # the process that will take the lease (others may start after it took it)
        check_free(config.checkpoint_dir)
    steps = checkpoint.committed_steps(config.checkpoint_dir)
    # TF's replica count depends on the GPUs it finds: its engine checks the fingerprint itself.
    if steps and config.framework == "torch":
        try:
            meta = checkpoint.read_marker(config.checkpoint_dir, steps[-1]).get("meta", {})
        except checkpoint.CheckpointError:
            return  # the engine falls back past it, and checks the step it restores
        if "fingerprint" in meta:  # without one the engine's restore refuses it, saying why
            data = synthetic.source_name(build_config(config.model, resolve_scale(config.scale)))
            Resume.of(config, world_size=world_size, data=data).check(meta, config.checkpoint_dir)

