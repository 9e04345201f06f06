"""What a hyperparameter-tuning trial runs: ``labkit train`` in the trial's own folders, with
its objective reported to the tuning service.

``python -m labkit.vertex.trial --tuning-metric loss [labkit train flags]`` is the command of
every trial of a `labkit.vertex.tuning_job`. Vertex appends the trial's values as more flags
(``--lr=0.003``); the last of a repeated flag wins, so they override the job's own. Then:

* the checkpoint, TensorBoard and metrics locations default to the trial's ``AIP_*`` folders
  (Vertex gives each trial ``<base>/<trial id>/``) through the ``/gcs/`` mount
  (`labkit.core.gcs.aip_mount_paths`), so trials never share a checkpoint;
* ``labkit train`` runs as a child process (SIGTERM and SIGINT are passed on to it), with
  ``LABKIT_TUNING_METRIC`` naming the metric (`labkit.core.hypertune.tuning_metric`);
* on the primary replica, each time the metrics file gains a step (the engines write it at
  every checkpoint and at the end), the step's value of the tuning metric is reported with
  `labkit.core.hypertune.report_metric`, unless that step was already reported (by an engine
  that reports itself), so the service and the local tuner see one measurement per evaluation.

The exit status is ``labkit train``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from labkit.core.cluster import from_env
from labkit.core.config import ParameterError, parse_int
from labkit.core.gcs import aip_mount_paths
from labkit.core.hypertune import METRICS, TUNING_METRIC_ENV, report_latest
from labkit.core.train_config import TrainConfig, from_argv, to_argv

POLL_S = 0.5


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ParameterError("metric", metric, f"must be a metric labkit train records: {', '.join(METRICS)}")
    return metric


def trial_config(train_args: list[str], env=None) -> TrainConfig:
    """The trial's TrainConfig: its flags, with unset output locations in the trial's AIP_*
    folders (through the mount), and a metrics file always (the objective is read from it)."""
    cfg = from_argv(train_args)
    aip = aip_mount_paths(env)
    updates: dict[str, Any] = {}
    if cfg.checkpoint_dir is None and aip.get("AIP_CHECKPOINT_DIR"):
        updates["checkpoint_dir"] = aip["AIP_CHECKPOINT_DIR"]
    if cfg.tensorboard_dir is None and aip.get("AIP_TENSORBOARD_LOG_DIR"):
        updates["tensorboard_dir"] = aip["AIP_TENSORBOARD_LOG_DIR"]
    if cfg.metrics_out is None:
        model_dir = aip.get("AIP_MODEL_DIR") or tempfile.mkdtemp(prefix="labkit-trial-")
        updates["metrics_out"] = os.path.join(model_dir, "metrics.json")
    return replace(cfg, **updates)


def _read(path: str) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None  # not written yet (the engine replaces it whole, so never half)


def report_new(metrics_out: str, metric: str) -> int | None:
    """Report the metric of the newest step in `metrics_out` unless that step was reported."""
    content = _read(metrics_out)
    return report_latest(content, metric) if content else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labkit.vertex.trial", allow_abbrev=False)
    parser.add_argument("--tuning-metric", required=True, help="the StudySpec's metric_id")
    parser.add_argument("--processes-per-node", type=parse_int, default=1,
                        help="torch processes per node (torchrun), one per GPU")
    args, train_args = parser.parse_known_args(argv)
    try:
        check_metric(args.tuning_metric)
        cfg = trial_config(train_args)
    except (ParameterError, argparse.ArgumentError, SystemExit) as e:
        print(f"labkit trial: {e}", file=sys.stderr)
        return 2
    flags = to_argv(cfg)
    if args.processes_per_node > 1:
        command = [sys.executable, "-m", "labkit.vertex.entry", "torchrun", "--nproc-per-node",
                   str(args.processes_per_node), "--", "train", *flags]
    else:
        command = [sys.executable, "-m", "labkit", "train", *flags]
    reports = from_env().is_chief
    # The engines read the metric's name here, to report it themselves once per evaluation.
    child = subprocess.Popen(command, env={**os.environ, TUNING_METRIC_ENV: args.tuning_metric})
    for sig in (signal.SIGTERM, signal.SIGINT):  # a preemption notice reaches the trainer
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            code = child.wait(timeout=POLL_S)
            break
        except subprocess.TimeoutExpired:
            if reports:
                report_new(cfg.metrics_out, args.tuning_metric)
    if reports:
        report_new(cfg.metrics_out, args.tuning_metric)
    return code


if __name__ == "__main__":
    sys.exit(main())
