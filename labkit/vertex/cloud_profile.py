"""Vertex AI TensorBoard Profiler for a running job, and the interactive shell beside it.

Two ways to look inside a job while it runs, both switched on in the job spec:

* **Interactive shell** (`enable_web_access` of CustomJobSpec): Vertex gives each node a web
  shell, at the URIs the job lists as ``web_access_uris`` once it runs ("one URI for each
  training node", keyed ``workerpool0-0``, ``workerpool1-0``...; the v1 ``CustomJob`` and
  ``CustomJobSpec.enable_web_access`` protos of google-cloud-aiplatform, which link "Monitor and
  debug training with an interactive shell",
  https://cloud.google.com/vertex-ai/docs/training/monitor-debug-interactive-shell; read
  2026-11-29). It is the way into a replica that hangs: ``py-spy dump --pid 1``,
  ``nvidia-smi``, the files on its disk.
* **TensorBoard Profiler** ("Enable Cloud Profiler to debug model training performance",
  `PROFILER_PAGE`): the job names a Vertex AI TensorBoard (`tensorboard` + `service_account`),
  its image has ``google-cloud-aiplatform[cloud_profiler]``, and the training process calls
  ``cloud_profiler.init()``; the TensorBoard's Profile tab then captures a trace from the running
  job on demand. The SDK's profiler has one plugin, ``tensorflow`` (TensorFlow >= 2.4), and starts
  it only when Vertex has set `PROFILER_VARIABLES` (it does so for a job with a TensorBoard).
  PyTorch jobs are profiled with ``labkit profile`` / ``torch.profiler`` traces instead.

`profiled(command)` wraps a Python training command so that the profiler starts inside the
training process: ``python -m labkit.vertex.with_profiler -- python train.py ...`` initialises
it, then runs the script (or ``-m`` module) in the same interpreter with its own arguments. On
Vertex, a missing variable or package stops the job at once on one line (exit 2), before any
training is paid for; in labkit's emulator, which has no profiler service, it says so on one line
and trains without it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from labkit.core.config import ParameterError

PROFILER_PAGE = ("https://docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/"
                 "training/tensorboard-profiler, read 2026-11-29")
PROFILER_REQUIREMENT = "google-cloud-aiplatform[cloud_profiler]"
# What the SDK's TensorFlow plugin and web server read (training_utils/environment_variables.py).
PROFILER_VARIABLES = ("AIP_TF_PROFILER_PORT", "AIP_TENSORBOARD_LOG_DIR", "AIP_TENSORBOARD_API_URI",
                      "AIP_TENSORBOARD_RESOURCE_NAME", "AIP_HTTP_HANDLER_PORT")
PROFILER_PACKAGES = {"tensorflow": "tensorflow", "tensorboard_plugin_profile": PROFILER_REQUIREMENT,
                     "werkzeug": PROFILER_REQUIREMENT}
EMULATED_ENV = "LABKIT_EMULATED_VERTEX"
PROFILER_ENTRY = "labkit.vertex.with_profiler"
_PYTHONS = ("python", "python3")


def check_profiler_job(framework: str, tensorboard: str | None, name: str = "tensorboard_profiler") -> None:
    """Refuse a profiler request the service cannot honour, naming `name`."""
    if framework != "tf":
        raise ParameterError(name, True, f"profiles TensorFlow only (the SDK's cloud_profiler has one plugin, "
                                         f"'tensorflow'; {PROFILER_PAGE}), and this job runs {framework!r}; "
                                         f"profile PyTorch with `labkit profile -- COMMAND` instead")
    if not tensorboard:
        raise ParameterError(name, True, "needs tensorboard=projects/P/locations/L/tensorboards/ID (and its "
                                         f"service account): the profile is captured from that TensorBoard "
                                         f"({PROFILER_PAGE})")


def profiled(command: Sequence[str], name: str = "command") -> list[str]:
    """`command` (``python SCRIPT ARGS`` or ``python -m MODULE ARGS``) run under the profiler
    wrapper; anything else is refused, naming `name` (the profiler lives in the process)."""
    words = [str(w) for w in command]
    if len(words) < 2 or os.path.basename(words[0]) not in _PYTHONS or (words[1] == "-m" and len(words) < 3):
        raise ParameterError(name, words, "must be `python SCRIPT ...` or `python -m MODULE ...` to run "
                                          "under the TensorBoard Profiler: it starts inside the training "
                                          "process")
    return ["python", "-m", PROFILER_ENTRY, "--", *words]
