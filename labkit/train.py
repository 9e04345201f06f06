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

import os

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
        from labkit.torch.trainer import fit
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
    check_sample_memory(config)
    check_open_files(config, world_size)
    steps = checkpoint.committed_steps(config.checkpoint_dir) if config.checkpoint_dir else []
    if main and steps and config.metrics_out:
        check_metrics_continue(config, config.metrics_out, world_size)
    if not config.checkpoint_dir:
        return
    if main:  # the process that will take the lease (others may start after it took it)
        check_free(config.checkpoint_dir)
    # TF's replica count depends on the GPUs it finds: its engine checks the fingerprint itself.
    if steps and config.framework == "torch":
        try:
            meta = checkpoint.read_marker(config.checkpoint_dir, steps[-1]).get("meta", {})
        except checkpoint.CheckpointError:
            return  # the engine falls back past it, and checks the step it restores
        if "fingerprint" in meta:  # without one the engine's restore refuses it, saying why
            data = synthetic.source_name(build_config(config.model, resolve_scale(config.scale)))
            Resume.of(config, world_size=world_size, data=data).check(meta, config.checkpoint_dir)


def earlier_metrics(path: str) -> dict | None:
    """The metrics file already at `path` (None: there is none). A file that is not a labkit
    metrics file is refused, naming it: a run would replace it."""
    from labkit.core.metrics import load_metrics

    if not os.path.isfile(path):
        return None
    try:
        return load_metrics(path)
    except (OSError, ValueError) as e:
        raise ParameterError("metrics_out", path, f"exists and is not a labkit metrics file ({e}); a run "
                             "would replace it: give another path, or remove it") from None


def check_metrics_continue(config: TrainConfig, path: str, world_size: int) -> None:
    """A resumed run appends to its metrics file: refuse one that another run wrote (a run whose
    settings differ in what defines it, beyond the changes `allow_resume_change` allows), since
    its first steps would be that run's losses under this run's name."""
    earlier = earlier_metrics(path)
    saved = ((earlier or {}).get("run") or {}).get("config")
    if not isinstance(saved, dict):
        return
    try:
        theirs = TrainConfig(**{k: v for k, v in saved.items() if k in TrainConfig.__dataclass_fields__})
    except (TypeError, ValueError):
        return  # written by another labkit version: nothing to compare against
    from labkit.core.fingerprint import differences, run_fingerprint

    allowed = config.allowed_resume_changes()
    diff = {k: v for k, v in differences(run_fingerprint(theirs, world_size=world_size, data=""),
                                         run_fingerprint(config, world_size=world_size, data="")).items()
            if k.split(".")[0] not in allowed}
    if diff:
        shown = ", ".join(f"{k} {a!r} → {b!r}" for k, (a, b) in list(diff.items())[:4])
        raise ParameterError("metrics_out", path, f"holds the steps of another run ({shown}); a resumed "
                             "run would continue them under its own settings: give another path")


def check_fresh_metrics(config: TrainConfig, overwrite: bool = False) -> None:
    """A run that starts afresh (no committed checkpoint to resume) would replace the metrics
    file at `metrics_out`: refused, naming the run it holds, unless `overwrite`."""
    path = config.metrics_out
    if overwrite or not path or (config.checkpoint_dir and os.path.isdir(config.checkpoint_dir)
                                 and os.listdir(config.checkpoint_dir)):
        return  # a folder with state to resume from (either engine's): the run continues its file
    earlier = earlier_metrics(path)
    if earlier is None:
        return
    steps = len(earlier.get("steps") or [])
    model = ((earlier.get("run") or {}).get("config") or {}).get("model", "?")
    raise ParameterError("metrics_out", path, f"already holds a run ({model}, {steps} steps); a fresh run "
                         "would replace it: give --overwrite to replace it, another path, or the run's "
                         "--checkpoint-dir to resume it")


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_sample_memory(config: TrainConfig, available: int | None = None) -> None:
    """Refuse sizes whose samples alone cannot fit in this machine's memory, before any work:
    a batch and the held-out set are made in host memory (float32 images, or int64 token
    inputs and targets), so `batch_size` or `eval_samples` of a hundred million fails only once
    the run is under way, with an allocator's traceback."""
    model_config = build_config(config.model, resolve_scale(config.scale))
    if hasattr(model_config, "image_size"):
        per_sample = 4 * model_config.image_size ** 2 * model_config.channels
    else:
        per_sample = 2 * 8 * model_config.block_size
    available = available_memory() if available is None else available
    if available is None:
        return
    for name in ("batch_size", "eval_samples"):
        count = getattr(config, name) or 0
        need = count * per_sample
        if need > available:
            raise ParameterError(name, count, f"needs {need / 1e9:,.1f} GB of memory for its samples alone "
                                 f"({per_sample:,} bytes each); this machine has {available / 1e9:,.1f} GB "
                                 "available")


# Open files a run needs: the framework's libraries and sockets, a few per loader worker (its
# pipes and shared-memory batches) and per local replica (gloo's sockets to each peer).
FILES_BASE, FILES_PER_WORKER, FILES_PER_REPLICA = 128, 32, 32


def check_open_files(config: TrainConfig, world_size: int = 1) -> None:
    """Raise this process's soft limit on open files to what the run needs when the hard limit
    allows (children inherit it), else refuse naming `num_workers`: past the limit the loader's
    workers fail with tracebacks in the middle of the run."""
    try:
        import resource
    except ImportError:  # not on every platform
        return
    if not config.num_workers and world_size <= 1:
        return  # one process, no workers: what the machine's default limit is made for
    need = FILES_BASE + FILES_PER_WORKER * (config.num_workers or 0) + FILES_PER_REPLICA * max(1, world_size)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    name, value = ("num_workers", config.num_workers) if config.num_workers else ("world_size", world_size)
    raise ParameterError(name, value, f"needs about {need} open files ({config.num_workers or 0} loader "
                         f"workers, {world_size} process(es)) and this process may open {hard} at most "
                         "(ulimit -n): raise the limit, or use fewer workers or processes")

