"""A torch.profiler context for training loops: a wait/warmup/active schedule, a Chrome trace
(open it in https://ui.perfetto.dev or chrome://tracing) and TensorBoard profiler logs.

    with torch_profile(ProfileConfig(out_dir=d)) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()
    breakdown = step_breakdown(prof.timeline())

Only the `active` steps are recorded; `wait` steps run unprofiled and `warmup` steps are traced
but discarded (the first steps pay one-off costs: allocator growth, cuDNN autotuning, compile).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.core.config import check_bool, check_int, check_str
from labkit.profiling.phases import Timeline
from labkit.profiling.trace import timeline_from_chrome_trace


@dataclass
class ProfileConfig:
    """Schedule and outputs of one profiling session."""

    out_dir: str = "profile"
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    tensorboard: bool = True

    def __post_init__(self) -> None:
        check_str("out_dir", str(self.out_dir))
        check_int("wait", self.wait, minimum=0)
        check_int("warmup", self.warmup, minimum=0)
        check_int("active", self.active, minimum=1)
        check_int("repeat", self.repeat, minimum=1)
        for name in ("record_shapes", "profile_memory", "with_stack", "tensorboard"):
            check_bool(name, getattr(self, name))

    @property
    def steps_needed(self) -> int:
        """Training steps the loop must run for the schedule to finish."""
        return (self.wait + self.warmup + self.active) * self.repeat


class TorchProfile:
    """Handle yielded by `torch_profile`: call `.step()` after every training step."""

    def __init__(self, prof, config: ProfileConfig, out: Path):
        self._prof = prof
        self.config = config
        self.out_dir = out
        self.trace_paths: list[Path] = []
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        self._prof.step()

    @property
    def trace_path(self) -> Path:
        one_cycle = self.config.wait + self.config.warmup + self.config.active
        if not self.trace_paths or self.steps < one_cycle:
            # torch flushes whatever it holds when the context closes, even mid-warmup; a
            # trace without its active steps would be analysed as if it were the real one.
            raise RuntimeError(
                f"no trace was written: the loop ran {self.steps} steps but the schedule needs "
                f"{self.config.steps_needed} (wait {self.config.wait} + warmup {self.config.warmup} "
                f"+ active {self.config.active})")
        return self.trace_paths[-1]

    @property
    def tensorboard_dir(self) -> Path:
        return self.out_dir / "tensorboard"

    def timeline(self) -> Timeline:
        return timeline_from_chrome_trace(self.trace_path)


@contextlib.contextmanager
def torch_profile(config: ProfileConfig | None = None):
    """Profile the enclosed loop (CPU, plus CUDA when available); see the module docstring."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    cfg = config or ProfileConfig()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    handle: TorchProfile | None = None

    def on_ready(prof) -> None:
        assert handle is not None
        path = out / f"trace_{len(handle.trace_paths)}.json"
        prof.export_chrome_trace(str(path))
        handle.trace_paths.append(path)
        if cfg.tensorboard:
            # The PyTorch TensorBoard profiler plugin reads <logdir>/<worker>.<time>.pt.trace.json,
            # the names torch.profiler.tensorboard_trace_handler writes.
            tb = out / "tensorboard"
            tb.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, tb / f"{socket.gethostname()}_{os.getpid()}.{time.time_ns() // 1_000_000}.pt.trace.json")

    prof = profile(
        activities=activities,
        schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat),
        on_trace_ready=on_ready,
        record_shapes=cfg.record_shapes,
        profile_memory=cfg.profile_memory,
        with_stack=cfg.with_stack,
    )
    handle = TorchProfile(prof, cfg, out)
    with prof:
        yield handle
    (out / "profile_config.json").write_text(json.dumps(cfg.__dict__, default=str, indent=2))
