"""The course's rungs and levers, each one row: its key (what code finds it by), its label (what a
reader sees, typed only here), the `TrainConfig` settings it makes, and for a lever the notebook
that teaches it and the plain framework code that shows it (a recipe, or the line it takes).

Rungs are notebook 04's precision ladder (`labkit.course.precision`), climbed in order; levers
are notebook 09's capstone switches (`labkit.course.capstone`), tried one at a time. A lever
that is also a rung (bf16, fp16) takes the rung's label. The plain precision rungs are the
training precisions of `labkit.core.precisions` (with their labels there), so a new precision
gets its rung from that registry; a rung that adds a switch on top, or a lever, is one row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from labkit.core import precisions


@dataclass(frozen=True)
class Rung:
    """One rung of the precision ladder: `key`, `label`, and the TrainConfig switches it sets
    (`compile`: torch.compile, or XLA for TensorFlow)."""

    key: str
    label: str
    precision: str
    channels_last: bool = False
    compile: bool = False


def precision_rungs(framework: str) -> tuple[Rung, ...]:
    """One rung per training precision `framework` runs, in the registry's order."""
    return tuple(Rung(p.name, p.rungs[framework], p.name) for p in precisions.precisions(framework))


RUNGS: dict[str, tuple[Rung, ...]] = {
    "torch": (
        *precision_rungs("torch"),
        Rung("bf16_channels_last", "bf16 + channels_last", "bf16", channels_last=True),
        Rung("bf16_channels_last_compile", "bf16 + channels_last + compile", "bf16",
             channels_last=True, compile=True),
    ),
    "tf": (
        *precision_rungs("tf"),
        Rung("bf16_xla", "bf16 + XLA", "bf16", compile=True),
    ),
}


def rung(framework: str, key: str) -> Rung:
    """`framework`'s rung with this key."""
    for r in RUNGS[framework]:
        if r.key == key:
            return r
    raise KeyError(f"no {framework} rung with key {key!r}")


ENGINE_ONLY = "labkit train flag only"


@dataclass(frozen=True)
class Lever:
    """One switch of the capstone. `changes` are the TrainConfig fields it sets; `needs` are
    fields the configuration must already have (a lever built on another one that was dropped is
    not tried); `lesson` names where the course teaches it; `recipe` is the recipe that shows it
    (or None) and `code` the plain code it takes."""

    key: str
    label: str
    changes: Mapping[str, Any]
    lesson: str
    needs: Mapping[str, Any] = field(default_factory=dict)
    recipe: str | None = None
    code: str = ENGINE_ONLY


_PRECISION, _PROFILING = "04 mixed precision", "05 profiling"
LEVERS: dict[str, dict[str, Lever]] = {"torch": {lv.key: lv for lv in (
    Lever("loader_workers", "loader workers", {"num_workers": 1, "pin_memory": False}, "03 input pipelines",
          recipe="tfrecord_pipeline", code="DataLoader(..., num_workers=N, pin_memory=True)"),
    Lever("bf16", rung("torch", "bf16").label, {"precision": "bf16"}, _PRECISION, recipe="mixed_precision",
          code="with torch.autocast('cuda', dtype=torch.bfloat16): ..."),
    # For a GPU without bf16 tensor cores (a T4).
    Lever("fp16", rung("torch", "fp16").label, {"precision": "fp16"}, _PRECISION),
    Lever("channels_last", "channels_last", {"channels_last": True}, _PRECISION,
          code="model.to(memory_format=torch.channels_last); x.to(memory_format=...)"),
    Lever("compile", "torch.compile", {"compile": True}, f"{_PRECISION}, {_PROFILING}",
          code="model = torch.compile(model)"),
    Lever("cuda_graphs", "CUDA graphs + kernel tuning", {"compile_mode": "tuned"}, _PROFILING,
          needs={"compile": True}, code="torch.compile(model, mode='reduce-overhead')"),
    Lever("step_graph", "whole step as one CUDA graph", {"cuda_graph_step": True}, _PROFILING,
          code="labkit train --cuda-graph-step (engine only: the whole step, optimizer included, "
               "captured with torch.cuda.graph)"),
    Lever("fp8_head", "fp8 output head", {"fp8_head": True}, "benchmarks/RESULTS.md", needs={"precision": "bf16"},
          code="labkit train --fp8-head (engine only: labkit.torch.fp8)"),
)}, "tf": {lv.key: lv for lv in (
    Lever("bf16", rung("tf", "bf16").label, {"precision": "bf16"}, _PRECISION, recipe="keras_mixed_precision",
          code="keras.mixed_precision.set_global_policy('mixed_bfloat16')"),
    Lever("compile", "XLA (jit_compile)", {"compile": True}, _PRECISION,
          code="model.compile(..., jit_compile=True) or @tf.function(jit_compile=True)"),
)}}


def loader_workers(workers: int, pinned: bool) -> Lever:
    """The loader lever for this machine: `workers` processes, pinned memory on a GPU machine."""
    label = f"{workers} loader worker{'s' if workers > 1 else ''}" + (" + pinned memory" if pinned else "")
    return replace(LEVERS["torch"]["loader_workers"], label=label,
                   changes={"num_workers": workers, "pin_memory": pinned})


def lever(framework: str, key: str) -> Lever | None:
    """`framework`'s lever with this key, or None when the registry has none."""
    return LEVERS.get(framework, {}).get(key)
