"""Weights & Biases, optional: the scalars a run writes to TensorBoard, also sent to a W&B run.

`TrainConfig.wandb_project` (``--wandb-project NAME``) switches it on; nothing else does (a
``WANDB_PROJECT`` exported for other work does not send every labkit run to W&B). The main
process opens one run with the config as its config and gets the same values `Reporter` writes
to TensorBoard (`train/<metric>`, `system/<figure>`), with the run's step as their x-axis.
W&B's own variables keep their meaning: ``WANDB_MODE=offline`` writes the run under
``WANDB_DIR`` (default ``./wandb``) without a network, for `wandb sync` later; ``WANDB_ENTITY``,
``WANDB_API_KEY``.

- The x-axis is the metric ``step`` (W&B's custom x-axis, `WANDB_AXES`), not W&B's internal
  step counter: a run resumed from a checkpoint logs again the steps after that checkpoint,
  which W&B's own counter would refuse as going backwards.
- In a Vertex AI job the run id is the job's (``vertex-<CLOUD_ML_JOB_ID>``, the trial's id
  added in a tuning trial) with ``resume="allow"``, so a job restarted after a preemption goes
  on in the same W&B run; W&B recommends exactly this pair for resuming (`WANDB_RESUME`).
- Without the ``wandb`` package (``pip install 'labkit[wandb]'``) `open_run` says so in one line
  and returns None: training goes on without it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from labkit.core import joblog

WANDB_AXES = ("https://docs.wandb.ai/guides/track/log/customize-logging-axes/ (define_metric: a "
              "custom x-axis, set for every metric of a prefix with a glob such as 'train/*'; "
              "read 2026-11-29)")
WANDB_RESUME = ("https://docs.wandb.ai/guides/runs/resuming/ (\"W&B recommends that you use "
                "resume='allow' and specify the specific run ID you want to resume\"; read 2026-11-29)")
STEP_METRIC = "step"
PREFIXES = ("train", "system")
INSTALL_HINT = "pip install 'labkit[wandb]'"


def run_id(env: Mapping[str, str] | None = None) -> str | None:
    """The W&B run id of this Vertex AI job (and trial), None outside a job."""
    env = os.environ if env is None else env
    job = env.get(joblog.JOB_ID_ENV, "").strip()
    if not job:
        return None
    trial = env.get("CLOUD_ML_TRIAL_ID", "").strip()
    return f"vertex-{job}" + (f"-trial-{trial}" if trial else "")


class WandbScalars:
    """An open W&B run fed like `labkit.core.scalars.ScalarWriter`: `add(step, values)`, then
    `close(failed)`. `run` is the wandb Run."""

    def __init__(self, run: Any):
        self.run = run
        run.define_metric(STEP_METRIC)
        for prefix in PREFIXES:
            run.define_metric(f"{prefix}/*", step_metric=STEP_METRIC)

    def add(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({STEP_METRIC: step, **{k: float(v) for k, v in values.items()}})

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def open_run(project: str, config: Mapping[str, Any], *,
             env: Mapping[str, str] | None = None) -> WandbScalars | None:
    """A W&B run in `project` with `config`, or None (with a one-line notice) when the wandb
    package is not installed."""
    try:
        import wandb
    except ImportError:
        joblog.notice(f"wandb_project={project!r} asks for Weights & Biases, but the wandb package is "
                      f"not installed ({INSTALL_HINT}); training goes on without it", env=env)
        return None
    rid = run_id(env)
    run = wandb.init(project=project, config=dict(config), id=rid, resume="allow" if rid else None)
    return WandbScalars(run)
