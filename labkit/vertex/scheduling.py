"""When and on what capacity a job runs, and the guards on what it costs: the ``scheduling``
block (Spot, Dynamic Workload Scheduler flex-start, a timeout), a persistent resource, a
reservation, labels and Vertex AI TensorBoard. Each rule is from Vertex AI's pages (read
2026-11-26):

* Spot: ``scheduling.strategy = SPOT`` (`SPOT_PAGE`).
* Dynamic Workload Scheduler: ``scheduling.strategy = FLEX_START``; ``scheduling.maxWaitDuration``
  bounds the wait for capacity ("0 means that the job waits indefinitely", default 1 day); the
  job must request "L4, A100, H100, H200, or B200 GPUs", have "a maximum timeout of 7 days or
  less" and use "the same machine configuration for all worker pools" (`DWS_PAGE`). It runs on
  preemptible quota but its resources "aren't preemptible".
* ``scheduling.timeout``: the job's longest running time; the service's default is 7 days
  (``aiplatform_v1.Scheduling``), so labkit sets `DEFAULT_TIMEOUT_S` unless told otherwise: a
  hung job should not bill for a week.
* A persistent resource (``persistentResourceId``) skips the minutes of provisioning a job
  otherwise waits for (`PERSISTENT_PAGE`); a reservation (``machineSpec.reservationAffinity``)
  guarantees capacity, and "Flex Start [...] and running training jobs on a persistent resource
  are both supported except when using Compute Engine reservations" (`RESERVATIONS_PAGE`).
* Labels (on the CustomJob or HyperparameterTuningJob) attribute billing: keys and values "no
  longer than 64 characters", "lowercase letters, numeric characters, underscores and dashes";
  and, as for every Google Cloud label, "keys must start with a lowercase letter or
  international character" (`LABELS_PAGE`).
* TensorBoard: ``CustomJobSpec.tensorboard`` names a Vertex AI TensorBoard instance
  (``projects/P/locations/L/tensorboards/ID``) that receives what the job writes to
  ``AIP_TENSORBOARD_LOG_DIR``; a service account is "required when running with TensorBoard",
  and a base output directory too (`TENSORBOARD_PAGE`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from labkit.core.config import ParameterError, check_int
from labkit.hardware import facts
from labkit.vertex.fields import field_of

READ_ON = "2026-11-26"
_BASE = "https://docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/"
SPOT_PAGE = _BASE + "training/use-spot-vms"
DWS_PAGE = _BASE + "training/schedule-jobs-dws"
PERSISTENT_PAGE = _BASE + "training/persistent-resource-train"
RESERVATIONS_PAGE = _BASE + "training/use-reservations"
TENSORBOARD_PAGE = _BASE + "experiments/tensorboard-training"
LABELS_PAGE = "https://docs.cloud.google.com/resource-manager/docs/labels-overview#requirements"

DEFAULT_TIMEOUT_S = 24 * 3600
SERVICE_DEFAULT_TIMEOUT_S = 7 * 24 * 3600
DWS_MAX_TIMEOUT_S = int(facts.DWS_MAX_TIMEOUT_DAYS.value) * 24 * 3600
DWS_GPUS = ("NVIDIA_L4", "NVIDIA_TESLA_A100", "NVIDIA_A100_80GB", "NVIDIA_H100_80GB",
            "NVIDIA_H100_MEGA_80GB", "NVIDIA_H200_141GB", "NVIDIA_B200")
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
MAX_LABELS = 64
_LABEL = re.compile(r"^[\w-]{0,64}$")
_RESERVATION_NAME = re.compile(r"^projects/[^/]+/zones/[^/]+/reservations/[^/]+$")
_TENSORBOARD_NAME = re.compile(r"^projects/[^/]+/locations/[^/]+/tensorboards/[^/]+$")


def cite(url: str) -> str:
    return f"{url}, read {READ_ON}"


def seconds(value: Any) -> float | None:
    """A proto Duration as the spec holds it ("3600s", "1.5s", or a number) -> seconds."""
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return float(str(value).rstrip("s"))


def scheduling(*, spot: bool, flex_start: bool, timeout_s: int | None, max_wait_s: int | None,
               restart_job_on_worker_restart: bool) -> dict[str, Any]:
    """The ``scheduling`` block: strategy, timeout (default `DEFAULT_TIMEOUT_S`), the wait for
    flex-start capacity, and whether a worker restart restarts the whole job."""
    check_int("timeout_s", timeout_s, minimum=1, allow_none=True)
    check_int("max_wait_s", max_wait_s, minimum=0, allow_none=True)
    if spot and flex_start:
        raise ParameterError("flex_start", flex_start, "and spot are two scheduling strategies; "
                             "choose one (scheduling.strategy is SPOT or FLEX_START)")
    if max_wait_s is not None and not flex_start:
        raise ParameterError("max_wait_s", max_wait_s, "applies to flex_start=True only "
                             f"(scheduling.maxWaitDuration; {cite(DWS_PAGE)})")
    out: dict[str, Any] = {"timeout": f"{DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s}s"}
    if restart_job_on_worker_restart:
        out["restart_job_on_worker_restart"] = True
    if spot:
        out["strategy"] = "SPOT"
    if flex_start:
        out["strategy"] = "FLEX_START"
        if max_wait_s is not None:
            out["max_wait_duration"] = f"{max_wait_s}s"
    return out


def reservation_affinity(reservation: str | None) -> dict[str, Any] | None:
    """``machineSpec.reservationAffinity`` for `reservation`: "any" (any matching reservation)
    or a reservation's full name ``projects/P/zones/Z/reservations/R``; None: none."""
    if reservation is None:
        return None
    if reservation == "any":
        return {"reservation_affinity_type": "ANY_RESERVATION"}
    if not isinstance(reservation, str) or not _RESERVATION_NAME.match(reservation):
        raise ParameterError("reservation", reservation, "must be 'any' or a reservation's full name "
                             f"projects/PROJECT/zones/ZONE/reservations/NAME ({cite(RESERVATIONS_PAGE)})")
    return {"reservation_affinity_type": "SPECIFIC_RESERVATION", "key": RESERVATION_KEY,
            "values": [reservation]}


def check_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """Labels for billing, as the service accepts them (ParameterError naming the label)."""
    if labels is None:
        return {}
    if not isinstance(labels, Mapping):
        raise ParameterError("labels", labels, "must be a mapping of label keys to values")
    if len(labels) > MAX_LABELS:
        raise ParameterError("labels", len(labels), f"must be at most {MAX_LABELS} labels")
    for key, value in labels.items():
        for what, text in (("key", key), ("value", value)):
            if not isinstance(text, str) or not _LABEL.match(text) or text != text.lower() \
                    or (what == "key" and not text):
                raise ParameterError(f"labels[{key!r}]", value, f"{what} {text!r} must be at most 64 "
                                     "lowercase letters, digits, underscores or dashes"
                                     + (" (and not empty)" if what == "key" else ""))
        if not key[0].isalpha() or key[0].isupper():  # a digit, _ or - first is refused at create
            raise ParameterError(f"labels[{key!r}]", value, f"key {key!r} must start with a lowercase letter "
                                 f"({cite(LABELS_PAGE)})")
    return dict(labels)


def check_tensorboard(tensorboard: str | None, service_account: str | None) -> None:
    if tensorboard is None:
        return
    if not isinstance(tensorboard, str) or not _TENSORBOARD_NAME.match(tensorboard):
        raise ParameterError("tensorboard", tensorboard, "must name a Vertex AI TensorBoard instance: "
                             f"projects/PROJECT/locations/REGION/tensorboards/ID ({cite(TENSORBOARD_PAGE)})")
    if not service_account:
        raise ParameterError("service_account", service_account, "is required with tensorboard: the "
                             f"job uploads its logs as that account ({cite(TENSORBOARD_PAGE)})")


def _pool_machine(pool: Mapping[str, Any]) -> dict[str, Any]:
    machine = field_of(pool, "machine_spec") or {}
    return {k: field_of(machine, k) for k in ("machine_type", "accelerator_type", "accelerator_count",
                                              "tpu_topology")}


def check_scheduling(spec: Mapping[str, Any], pools: Sequence[Mapping[str, Any]]) -> None:
    """The rules between scheduling, capacity and TensorBoard, on a spec (proto or REST names)."""
    sched = field_of(spec, "scheduling") or {}
    strategy = str(field_of(sched, "strategy") or "")
    timeout = seconds(field_of(sched, "timeout"))
    used = [p for p in pools if p]
    affinities = [field_of(field_of(p, "machine_spec") or {}, "reservation_affinity") for p in used]
    reserved = any(a and str(field_of(a, "reservation_affinity_type")) not in ("", "NO_RESERVATION",
                                                                              "TYPE_UNSPECIFIED")
                   for a in affinities)
    persistent = field_of(spec, "persistent_resource_id")
    if strategy == "FLEX_START":
        machines = [_pool_machine(p) for p in used]
        gpus = {str(m["accelerator_type"]) for m in machines if m["accelerator_type"]}
        if not gpus or not gpus <= set(DWS_GPUS):
            raise ParameterError("scheduling.strategy", strategy, "needs every pool on L4, A100, H100, "
                                 f"H200 or B200 GPUs (got {', '.join(sorted(gpus)) or 'none'}) "
                                 f"({cite(DWS_PAGE)})")
        if any(m != machines[0] for m in machines[1:]):
            raise ParameterError("scheduling.strategy", strategy, "needs the same machine configuration "
                                 "in every worker pool (a Reduction Server pool cannot be added) "
                                 f"({cite(DWS_PAGE)})")
        if (timeout or SERVICE_DEFAULT_TIMEOUT_S) > DWS_MAX_TIMEOUT_S:
            raise ParameterError("scheduling.timeout", field_of(sched, "timeout"),
                                 f"must be at most 7 days with FLEX_START ({cite(DWS_PAGE)})")
        if reserved:
            raise ParameterError("reservation", "set", "cannot be combined with FLEX_START "
                                 f"({cite(RESERVATIONS_PAGE)})")
    elif field_of(sched, "max_wait_duration") not in (None, ""):
        raise ParameterError("scheduling.max_wait_duration", field_of(sched, "max_wait_duration"),
                             f"applies to the FLEX_START strategy only ({cite(DWS_PAGE)})")
    if persistent and reserved:
        raise ParameterError("persistent_resource_id", persistent, "cannot be combined with a "
                             f"reservation ({cite(RESERVATIONS_PAGE)})")
    board = field_of(spec, "tensorboard")
    if board:
        check_tensorboard(board, field_of(spec, "service_account"))
        if not field_of(spec, "base_output_directory"):
            raise ParameterError("base_output_directory", None, "is required with tensorboard: "
                                 f"the logs are read from AIP_TENSORBOARD_LOG_DIR ({cite(TENSORBOARD_PAGE)})")
