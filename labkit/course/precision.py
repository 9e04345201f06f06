"""Notebook 04's mixed-precision ladder, for both frameworks: the rungs, one training run per
rung, and the conclusions computed from the rows.

    rows = run_ladder(PrecisionLadderConfig(model="resnet"), "torch")
    find(rows, "bf16")["speedup"]           # rungs are found by key; labels are for display
    conclusions(rows)

Both frameworks climb fp32 → tf32 → bf16 → fp16 with loss scaling, then their own rungs: torch
adds channels_last and torch.compile; TensorFlow, channels last natively, adds XLA
(`jit_compile`). Each rung is a full run of the engine `labkit train` uses (`labkit.torch.engine`,
`labkit.tf.engine`), and both give rows with the same keys, so one table holds them.
Framework-free at import: a framework is imported only when its ladder runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from labkit.core.config import by_scale, check_bool, check_choice, check_int, resolve_scale
from labkit.core.models import MODEL_NAMES
from labkit.core.progress import track
from labkit.core.train_config import TrainConfig


@dataclass(frozen=True)
class PrecisionLadderConfig:
    """One ladder run, the same for both frameworks. Sizes default by scale. `include_compile`
    (torch.compile for torch, XLA `jit_compile` for TensorFlow) None means only at full scale:
    compiling takes minutes on a small CPU and would dominate a smoke run."""

    model: str = "resnet"
    scale: str = "auto"
    steps: int | None = None
    batch_size: int | None = None
    include_compile: bool | None = None
    device: str = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("model", self.model, MODEL_NAMES)
        check_int("steps", self.steps, minimum=2, allow_none=True)
        check_int("batch_size", self.batch_size, minimum=1, allow_none=True)
        if self.include_compile is not None:
            check_bool("include_compile", self.include_compile)

    def resolved(self) -> tuple[str, int, int, bool]:
        """(scale, steps, batch size, include the compile rung) with the defaults filled in."""
        scale = resolve_scale(self.scale)
        steps = self.steps or by_scale(scale, smoke=5, full=30)
        batch = self.batch_size or default_batch(self.model, scale)
        return scale, steps, batch, compile_included(self.include_compile, scale)


def default_batch(model: str, scale: str) -> int:
    """Smoke: 16. Full: the peer batches of benchmarks/RESULTS.md (GPT-2 small 12, ResNet-50 256)."""
    return by_scale(scale, smoke=16, full=12 if model == "gpt" else 256)


def compile_included(include_compile: bool | None, scale: str) -> bool:
    """None means only at full scale: compiling takes minutes on a small CPU."""
    return include_compile if include_compile is not None else scale == "full"


@dataclass(frozen=True)
class PrecisionRung:
    """One rung: `key` is what code finds it by, `label` what a reader sees; the rest are the
    TrainConfig switches it sets (`compile`: torch.compile, or XLA for TensorFlow)."""

    key: str
    label: str
    precision: str
    channels_last: bool = False
    compile: bool = False


RUNGS = {
    "torch": (
        PrecisionRung("fp32", "fp32", "fp32"),
        PrecisionRung("tf32", "tf32", "tf32"),
        PrecisionRung("bf16", "bf16 autocast", "bf16"),
        PrecisionRung("fp16", "fp16 + GradScaler", "fp16"),
        PrecisionRung("bf16_channels_last", "bf16 + channels_last", "bf16", channels_last=True),
        PrecisionRung("bf16_channels_last_compile", "bf16 + channels_last + compile", "bf16",
                      channels_last=True, compile=True),
    ),
    "tf": (
        PrecisionRung("fp32", "fp32", "fp32"),
        PrecisionRung("tf32", "tf32", "tf32"),
        PrecisionRung("bf16", "bf16 (mixed_bfloat16)", "bf16"),
        PrecisionRung("fp16", "fp16 + loss scaling", "fp16"),
        PrecisionRung("bf16_xla", "bf16 + XLA", "bf16", compile=True),
    ),
}
# The columns each framework's table shows (TensorFlow has no activation count).
COLUMNS = {
    "torch": ("framework", "rung", "samples_per_s", "speedup", "step_time_ms", "activation_mib",
              "peak_memory_mib", "final_loss", "device"),
    "tf": ("framework", "rung", "samples_per_s", "speedup", "step_time_ms", "peak_memory_mib",
           "final_loss", "device"),
}


def rungs(framework: str, include_compile: bool) -> list[PrecisionRung]:
    check_choice("framework", framework, tuple(RUNGS))
    return [r for r in RUNGS[framework] if include_compile or not r.compile]


def run_ladder(config: PrecisionLadderConfig, framework: str = "torch") -> list[dict[str, Any]]:
    """Train once per rung with `framework`'s engine; one row per rung, the first rung the
    speed-up reference."""
    scale, steps, batch, include_compile = config.resolved()
    climb = rungs(framework, include_compile)  # checks `framework` before anything runs
    _warm_up(config, framework, scale, batch)
    train = _train_torch if framework == "torch" else _train_tf
    rows = [train(config, rung, scale, steps, batch)
            for rung in track(climb, f"precision ladder ({framework})", unit="rung")]
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base if base else None
    return rows


def _warm_up(config: PrecisionLadderConfig, framework: str, scale: str, batch: int) -> None:
    """One short discarded run: lazy initialisation (thread pools, allocator, kernels chosen on
    first use) would otherwise be charged to the first rung and inflate every speed-up."""
    short = dict(model=config.model, scale=scale, steps=2, batch_size=batch, seed=config.seed,
                 device=config.device, progress=False)
    if framework == "torch":
        from labkit.torch.engine import fit

        fit(TrainConfig(**short))
    else:
        from labkit.tf.engine import fit

        fit(TrainConfig(framework="tf", grad_clip=None, **short))


def _row(framework: str, rung: PrecisionRung, log: Any, **extra: Any) -> dict[str, Any]:
    s = log.to_dict()["summary"]
    return {"framework": framework, "key": rung.key, "rung": rung.label, "precision": rung.precision,
            "channels_last": rung.channels_last, "compile": rung.compile,
            "samples_per_s": s.get("median_samples_per_s"), "step_time_ms": 1000 * s["median_step_time_s"],
            "final_loss": s["final_loss"], "device": log.run["device"], **extra}


def _train_torch(config: PrecisionLadderConfig, rung: PrecisionRung, scale: str, steps: int,
                 batch: int) -> dict[str, Any]:
    from labkit.torch.engine import fit
    from labkit.torch.memory import activation_bytes

    # At full scale, loader workers keep the GPU fed (decode-free synthetic data still costs
    # host time per image); smoke runs keep everything in one process.
    cfg = TrainConfig(model=config.model, scale=scale, steps=steps, batch_size=batch,
                      num_workers=0 if scale == "smoke" else min(8, max(1, (os.cpu_count() or 2) // 2)),
                      pin_memory=scale == "full", precision=rung.precision, channels_last=rung.channels_last,
                      compile=rung.compile, seed=config.seed, device=config.device,
                      progress=False, grad_clip=None)
    log = fit(cfg)
    s = log.to_dict()["summary"]
    return _row("torch", rung, log, mfu=s.get("median_mfu"),
                peak_memory_mib=(s["peak_memory_bytes"] / 2**20 if log.run["device"].startswith("cuda") else None),
                activation_mib=activation_bytes(cfg) / 2**20)


def _train_tf(config: PrecisionLadderConfig, rung: PrecisionRung, scale: str, steps: int,
              batch: int) -> dict[str, Any]:
    from labkit.tf.engine import fit

    log = fit(TrainConfig(framework="tf", model=config.model, scale=scale, batch_size=batch, seed=config.seed,
                          device=config.device, progress=False, grad_clip=None, steps=steps,
                          precision=rung.precision, compile=rung.compile))
    s = log.to_dict()["summary"]
    row = _row("tf", rung, log, mfu=None, activation_mib=None,
               peak_memory_mib=s["peak_memory_bytes"] / 2**20 if log.run["device"] == "gpu" else None)
    return row | {"channels_last": True}  # TensorFlow's layout is channels last natively


def find(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The row of the rung with this key (a `PrecisionRung.key`, or a reference row's key)."""
    for r in rows:
        if r["key"] == key:
            return r
    raise KeyError(f"no rung with key {key!r} in these rows (keys: {', '.join(r['key'] for r in rows)})")


# Figures measured on a GPU for readers without one: torchvision ResNet-50, batch 256, one NVIDIA
# H100 80GB, torch 2.11, 2026-11-22 (REFERENCE_SOURCE).
REFERENCE_H100_RESNET50 = (
    {"key": "fp32", "rung": "fp32 (TF32 off)", "samples_per_s": 989.0},
    {"key": "tf32", "rung": "tf32", "samples_per_s": 1867.0},
    {"key": "bf16", "rung": "bf16 autocast", "samples_per_s": 2236.0},
    {"key": "bf16_channels_last", "rung": "bf16 + channels_last", "samples_per_s": 3958.0},
    {"key": "bf16_channels_last_compile", "rung": "bf16 + channels_last + compile", "samples_per_s": 5534.0},
)
REFERENCE_SOURCE = "torchvision ResNet-50, batch 256, one NVIDIA H100 80GB, torch 2.11, measured 2026-11-22"


def conclusions(rows: list[dict[str, Any]]) -> list[str]:
    """Sentences computed from a ladder's rows (nothing typed in)."""
    if not rows:
        return []
    base = rows[0]
    best = max(rows, key=lambda r: r["samples_per_s"] or 0)
    out = [f"Fastest here: {best['rung']} at {best['samples_per_s']:,.0f} samples/s, "
           f"{best['speedup']:.2f}× the {base['rung']} rung ({best['device']})."]
    for r in rows[1:]:
        verdict = "faster" if r["speedup"] > 1.05 else "slower" if r["speedup"] < 0.95 else "no faster"
        line = (f"{r['rung']}: {r['speedup']:.2f}× {base['rung']} ({verdict}); final loss "
                f"{r['final_loss']:.4f} vs {base['final_loss']:.4f}")
        if r.get("activation_mib") is not None and base.get("activation_mib") is not None:
            line += f"; activations {r['activation_mib']:.1f} MiB vs {base['activation_mib']:.1f} MiB"
        out.append(line + ".")
    if base["device"] == "cpu" and any(r["key"] == "tf32" for r in rows):
        out.append("TF32 is a tensor-core mode of NVIDIA GPUs (Ampere and newer); on a CPU the tf32 "
                   "rung runs the same fp32 kernels, so its difference from fp32 is run-to-run noise.")
    return out
