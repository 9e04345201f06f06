"""The mixed-precision ladder of notebook 04, and its two side demos.

`ladder(LadderConfig(...))` trains the same model once per rung (fp32 → tf32 → bf16 →
fp16+GradScaler → bf16+channels_last → +torch.compile) through `labkit.torch.engine.fit` and
returns one row per rung: throughput, speed-up over the first rung, memory, final loss. Rows are
plain dicts with framework-neutral keys so a TensorFlow twin can append its own rows to the same
table. `overflow_demo` shows the GradScaler skipping steps and halving its scale;
`alignment_demo` times matmuls whose sizes are or are not multiples of the tensor-core tile.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from labkit.core.config import check_int
from labkit.core.train_config import TrainConfig
from labkit.course.precision import LadderConfig
from labkit.torch.memory import activation_bytes


@dataclass(frozen=True)
class Rung:
    name: str
    precision: str
    channels_last: bool = False
    compile: bool = False


TORCH_LADDER = (
    Rung("fp32", "fp32"),
    Rung("tf32", "tf32"),
    Rung("bf16 autocast", "bf16"),
    Rung("fp16 + GradScaler", "fp16"),
    Rung("bf16 + channels_last", "bf16", channels_last=True),
    Rung("bf16 + channels_last + compile", "bf16", channels_last=True, compile=True),
)




def rungs(include_compile: bool) -> list[Rung]:
    return [r for r in TORCH_LADDER if include_compile or not r.compile]


def ladder(config: LadderConfig) -> list[dict[str, Any]]:
    """Train once per rung; one row per rung (first rung = the speed-up reference)."""
    from labkit.torch.engine import fit

    scale, steps, batch, include_compile = config.resolved()
    rows: list[dict[str, Any]] = []
    # One short discarded run first: lazy initialisation (threads, allocator, kernels chosen on
    # first use) would otherwise be charged to the first rung and inflate every speed-up.
    fit(TrainConfig(model=config.model, scale=scale, steps=2, batch_size=batch, seed=config.seed,
                    device=config.device, progress=False))
    for rung in rungs(include_compile):
        # At full scale, loader workers keep the GPU fed (decode-free synthetic data still costs
        # host time per image); smoke runs keep everything in one process.
        cfg = TrainConfig(model=config.model, scale=scale, steps=steps, batch_size=batch,
                          num_workers=0 if scale == "smoke" else min(8, max(1, (os.cpu_count() or 2) // 2)),
                          pin_memory=scale == "full", precision=rung.precision, channels_last=rung.channels_last,
                          compile=rung.compile, seed=config.seed, device=config.device,
                          progress=False, grad_clip=None)
        log = fit(cfg)
        s = log.to_dict()["summary"]
        rows.append({"framework": "torch", "rung": rung.name, "precision": rung.precision,
                     "channels_last": rung.channels_last, "compile": rung.compile,
                     "samples_per_s": s.get("median_samples_per_s"),
                     "step_time_ms": 1000 * s["median_step_time_s"],
                     "mfu": s.get("median_mfu"),
                     "peak_memory_mib": (s["peak_memory_bytes"] / 2**20
                                         if log.run["device"].startswith("cuda") else None),
                     "activation_mib": activation_bytes(cfg) / 2**20,
                     "final_loss": s["final_loss"], "device": log.run["device"]})
    base = rows[0]["samples_per_s"]
    for r in rows:
        r["speedup"] = r["samples_per_s"] / base if base else None
    return rows


def overflow_demo(steps: int = 14, init_scale: float = 2.0**28, model: str = "cnn", batch_size: int = 8,
                  device: str = "auto", seed: int = 0) -> list[dict[str, Any]]:
    """fp16 training started with an absurd loss scale: every step whose gradients overflow is
    skipped and the scale halved, until the scale fits and training proceeds."""
    from labkit.torch import engine
    from labkit.torch.data import make_dataset
    from labkit.torch.distributed import DistInfo

    check_int("steps", steps, minimum=1)
    cfg = TrainConfig(model=model, scale="smoke", batch_size=batch_size, precision="fp16",
                      device=device, seed=seed, grad_clip=None, progress=False)
    dev = engine.resolve_device(device, DistInfo())
    c = engine.build(cfg, DistInfo(), dev)
    c.scaler = c.policy.make_scaler(init_scale=init_scale)
    data = make_dataset(c.model_config, batch_size * steps, seed)
    rows = []
    for step in range(steps):
        batch = engine.to_device(data[list(range(step * batch_size, (step + 1) * batch_size))], c, False)
        scale = c.scaler.get_scale()
        loss, skipped = engine.train_step(c, [batch], None)
        rows.append({"step": step, "loss_scale": scale, "skipped": bool(skipped), "loss": float(loss)})
    return rows


def alignment_demo(sizes: tuple[int, ...] | None = None, device: str = "auto",
                   dtype: str = "auto", repeats: int = 10) -> list[dict[str, Any]]:
    """Square matmuls at sizes that are / are not multiples of 64: tensor cores work on tiles, so
    a size one off the multiple pays for padding or falls off the fast kernels. Also GPT's vocab
    projection at 50257 (GPT-2's vocab) vs 50304 (padded to a multiple of 64)."""
    from labkit.torch.distributed import DistInfo
    from labkit.torch.engine import resolve_device

    dev = resolve_device(device, DistInfo())
    cuda = dev.type == "cuda"
    dt = {"auto": torch.bfloat16 if cuda else torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16, "fp32": torch.float32}[dtype]
    sizes = sizes or ((4096, 4095, 4097, 4160) if cuda else (512, 511, 513, 576))
    shapes = [(n, n, n, f"{n}³") for n in sizes]
    tokens = 8192 if cuda else 64
    repeats = repeats if cuda else min(repeats, 5)
    shapes += [(tokens, 768, v, f"{tokens}×768 @ 768×{v} (vocab {v})") for v in (50257, 50304)]
    rows = []
    for m, k, n, label in shapes:
        a = torch.randn(m, k, device=dev, dtype=dt)
        b = torch.randn(k, n, device=dev, dtype=dt)
        seconds = _time(lambda a=a, b=b: a @ b, dev, repeats)
        rows.append({"shape": label, "m": m, "k": k, "n": n, "multiple_of_64": all(x % 64 == 0 for x in (m, k, n)),
                     "tflops": 2 * m * k * n / seconds / 1e12, "ms": seconds * 1000, "dtype": str(dt).split(".")[-1]})
    return rows


def _time(fn, device: torch.device, repeats: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return best


# Figures measured on a GPU for readers without one (source: this project's benchmarks/RESULTS.md
# and PERFORMANCE.md, torchvision ResNet-50, batch 256, one H100 80GB, 2026-11-22).
REFERENCE_H100_RESNET50 = (
    {"rung": "fp32 (TF32 off)", "samples_per_s": 989.0},
    {"rung": "tf32", "samples_per_s": 1867.0},
    {"rung": "bf16 autocast", "samples_per_s": 2236.0},
    {"rung": "bf16 + channels_last", "samples_per_s": 3958.0},
    {"rung": "bf16 + channels_last + compile", "samples_per_s": 5534.0},
)
REFERENCE_SOURCE = "torchvision ResNet-50, batch 256, one NVIDIA H100 80GB, torch 2.11, measured 2026-11-22"


def conclusions(rows: list[dict[str, Any]]) -> list[str]:
    """Sentences computed from a ladder's rows (nothing typed in)."""
    if not rows:
        return []
    by = {r["rung"]: r for r in rows}
    base = rows[0]
    best = max(rows, key=lambda r: r["samples_per_s"] or 0)
    out = [f"Fastest here: {best['rung']} at {best['samples_per_s']:,.0f} samples/s, "
           f"{best['speedup']:.2f}× the {base['rung']} rung ({best['device']})."]
    for r in rows[1:]:
        verdict = "faster" if r["speedup"] > 1.05 else "slower" if r["speedup"] < 0.95 else "no faster"
        out.append(f"{r['rung']}: {r['speedup']:.2f}× {base['rung']} ({verdict}); final loss "
                   f"{r['final_loss']:.4f} vs {base['final_loss']:.4f}; activations "
                   f"{r['activation_mib']:.1f} MiB vs {base['activation_mib']:.1f} MiB.")
    if base["device"] == "cpu" and "tf32" in by:
        out.append("TF32 is a tensor-core mode of NVIDIA GPUs (Ampere and newer); on a CPU the tf32 "
                   "rung runs the same fp32 kernels, so its difference from fp32 is run-to-run noise.")
    return out


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A Markdown table of `columns` (numbers rounded for reading)."""
    from labkit.course.report import markdown_table

    return markdown_table(rows, columns)
