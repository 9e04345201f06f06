"""What defines a run, recorded in every checkpoint, and the check a resume must pass.

A checkpoint's commit marker carries the run's fingerprint (`run_fingerprint`): the resolved
model config, the global batch, the world size and accumulation, the seed, the optimizer and its
schedule (peak LR and whether it scales with the world size, warm-up, AdamW's betas, epsilon and
weight decay, gradient clipping, the precision, the gradient compression), the data source (the synthetic generator with
what makes its samples these, such as the images' share of random labels, and its sample count)
and the framework. Resuming under another fingerprint would silently train a different run from
the restored state, so `Resume.check` refuses it, naming every field that differs, unless the
user allowed those fields to change (`TrainConfig.allow_resume_change`,
``--allow-resume-change batch_size,lr``). Allowed changes then take effect: the engines use the
new settings from the next step on, the data position is kept in samples (so a batch-size
change loses and repeats no sample), and the metrics record what changed.

The model, framework, optimizer and data source can never change on resume: the restored
weights and moments belong to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from labkit.core.config import ParameterError

# AdamW's hyper-parameters in both engines (labkit.torch.engine.build, labkit.tf.step.build;
# a test keeps them equal). Weight decay applies to matrices and kernels only.
ADAMW = {"name": "AdamW", "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
# Fields a resume may be allowed to change, and what each change does on resume.
CHANGEABLE = {
    "batch_size": "the data position is converted by samples",
    "grad_accum": "the micro-batch changes, the global batch does not",
    "world_size": "replicas without saved RNG state start from the seed",
    "seed": "the data order from the saved position on follows the new seed",
    "lr": "the new peak LR applies from the next step",
    "scale_lr_with_world_size": "the new peak LR applies from the next step",
    "warmup_steps": "the new warm-up applies from the next step",
    "grad_clip": "the new clipping applies from the next step",
    "precision": "the next steps run in the new precision",
    "num_samples": "the data order from the saved position on follows the new dataset",
    "grad_compression": "the next steps reduce gradients the new way (PowerSGD's error feedback starts afresh)",
}
FIXED = ("framework", "model", "optimizer", "data")
_SHOWN = 6  # differences named in one error line before "and N more"


class ResumeMismatch(ParameterError):
    """A checkpoint was written by a run with other settings, and the change was not allowed."""

    def __init__(self, directory: str, problem: str, differences: dict[str, tuple[Any, Any]]):
        self.differences = differences
        super().__init__("checkpoint_dir", directory, problem)


def run_fingerprint(config, *, world_size: int, data: str, model_config=None) -> dict[str, Any]:
    """The fingerprint of `config` (a `TrainConfig`) run by `world_size` data-parallel replicas
    on `data` (`labkit.data.synthetic.source_name`: the generator, and what makes its samples
    these); `model_config` is the resolved model config (built from `config.model` and
    `config.scale` when not given), so `scale="auto"` is recorded as the sizes it picked."""
    if model_config is None:
        from labkit.core.config import resolve_scale
        from labkit.core.models import build_config

        model_config = build_config(config.model, resolve_scale(config.scale))
    return {
        "framework": config.framework,
        "model": {"name": config.model, **_plain(asdict(model_config))},
        "batch_size": config.batch_size,
        "world_size": world_size,
        "grad_accum": config.grad_accum,
        "seed": config.seed,
        "lr": config.lr,
        "scale_lr_with_world_size": config.scale_lr_with_world_size,
        "warmup_steps": config.warmup_steps,
        "optimizer": dict(ADAMW),
        "grad_clip": config.grad_clip or None,  # 0 and None both mean no clipping
        "precision": config.precision,
        "data": data,  # images or tokens, as the model takes
        "num_samples": config.num_samples_or_default(),
        # None without compression, so checkpoints written before this field still match
        "grad_compression": _compression(config),
    }


def _compression(config) -> dict[str, Any] | None:
    kind = getattr(config, "grad_compression", "none")
    if kind == "none":
        return None
    return {"kind": kind, **({"rank": config.powersgd_rank} if kind == "powersgd" else {})}


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples become lists), so a fingerprint read back from a marker
    compares equal to a fresh one."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Fields whose values differ, as {"model.width": (saved, current)}; a field missing on one
    side is None there. Nested fields are named with dots."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in list(saved) + [k for k in current if k not in saved]:
        a, b = _plain(saved.get(key)), _plain(current.get(key))
        if isinstance(a, dict) and isinstance(b, dict):
            out.update({f"{key}.{k}": v for k, v in differences(a, b).items()})
        elif a != b:
            out[key] = (a, b)
    return out


def field_of(name: str) -> str:
    """The top-level fingerprint field of a (dotted) difference name: "model.width" -> "model"."""
    return name.split(".", 1)[0]


def _listed(diffs: dict[str, tuple[Any, Any]]) -> str:
    items = [f"{name} {a!r} -> {b!r}" for name, (a, b) in diffs.items()]
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


class Resume:
    """What a resume must match (`fingerprint`, and the fields `allowed` to differ) and, once
    checked against a checkpoint, what it found there: the allowed `changes` {field: (saved,
    current)}, the checkpoint's own `saved` fingerprint (None when it has none) and, where the
    engine's restore records it, the checkpoint's `data_position`."""

    def __init__(self, fingerprint: dict[str, Any], allowed: frozenset[str] = frozenset()):
        self.fingerprint = fingerprint
        self.allowed = frozenset(allowed)
        self.changes: dict[str, tuple[Any, Any]] = {}
        self.saved: dict[str, Any] | None = None
        self.data_position: dict[str, Any] | None = None

    @classmethod
    def of(cls, config, *, world_size: int, data: str, model_config=None) -> Resume:
        return cls(run_fingerprint(config, world_size=world_size, data=data, model_config=model_config),
                   config.allowed_resume_changes())

    def check(self, meta: Mapping[str, Any], where: str) -> dict[str, tuple[Any, Any]]:
        """Compare the fingerprint in a commit marker's `meta` with this run's; returns the
        allowed changes (also kept in `changes`). Raises ResumeMismatch naming the fields that
        differ when a fixed field differs or a change is not allowed, or when the checkpoint
        records no fingerprint (every engine's checkpoint does)."""
        saved = meta.get("fingerprint")
        if saved is None:
            raise ResumeMismatch(where, "holds a checkpoint that records no run fingerprint, so its "
                                 "settings cannot be checked: give a new --checkpoint-dir", {})
        self.saved = saved
        diffs = differences(saved, self.fingerprint)
        fixed = {k: v for k, v in diffs.items() if field_of(k) in FIXED}
        if fixed:
            kinds = sorted({field_of(k) for k in fixed})
            raise ResumeMismatch(where, f"holds a checkpoint of another {' and '.join(kinds)}: "
                                 f"{_listed(fixed)}; these cannot change on resume, so give a new "
                                 f"--checkpoint-dir", fixed)
        refused = {k: v for k, v in diffs.items() if k not in self.allowed}
        if refused:
            fields = ",".join(refused)
            raise ResumeMismatch(where, f"holds a checkpoint of a run with other settings: "
                                 f"{_listed(refused)}; to continue it with the new settings pass "
                                 f"--allow-resume-change {fields}, or give a new --checkpoint-dir",
                                 refused)
        self.changes = diffs
        return diffs

    def record(self) -> dict[str, Any]:
        """The metrics' account of the resume: each allowed change as [saved, current]."""
        return {name: list(pair) for name, pair in self.changes.items()}


def parse_allowed(value: str | None) -> frozenset[str]:
    """The fields of an `allow_resume_change` setting ("batch_size,lr"; dashes count as
    underscores). Raises ParameterError naming a field that is not a setting a resume may
    change."""
    if value is None:
        return frozenset()
    names = [n.strip().replace("-", "_") for n in str(value).split(",")]
    names = [n for n in names if n]
    if not names:
        raise ParameterError("allow_resume_change", value, "must name at least one field")
    for name in names:
        if name in FIXED:
            raise ParameterError("allow_resume_change", value,
                                 f"cannot include {name!r}: a checkpoint holds the state of one "
                                 f"{name}; give a new --checkpoint-dir instead")
        if name not in CHANGEABLE:
            raise ParameterError("allow_resume_change", value,
                                 f"names {name!r}, which is not a setting a resume can change "
                                 f"(one of: {', '.join(CHANGEABLE)})")
    return frozenset(names)
