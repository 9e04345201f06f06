"""Hyperparameter tuning: a Vertex AI HyperparameterTuningJob spec, and the same study run here.

`tuning_job(config, output_uri=..., metric="loss", goal="minimize", parameters={...},
max_trial_count=8, parallel_trial_count=2)` returns the HyperparameterTuningJob as a dict in the
proto field names (``aiplatform_v1.types.HyperparameterTuningJob(**spec)`` accepts it). Each
parameter is a `labkit train` flag: ``("linear"|"log", low, high)`` is a range (INTEGER when
both bounds are ints, else DOUBLE), a list is a set of values (DISCRETE for numbers,
CATEGORICAL for strings). Every trial runs `labkit.vertex.trial`, which trains in the trial's
own ``AIP_*`` folders and reports the metric the way the service reads it
(`labkit.core.hypertune`); Vertex passes the trial's values as ``--flag=value``. With
``early_stopping`` the service stops trials whose reports fall behind the median of the others
(``median_automated_stopping_spec``).

`run_local_tuning(spec, workdir)` runs that study on this machine: every trial is the spec's
trial job run by the local emulator (`labkit.vertex.emulator.run_local`), ``parallel_trial_count``
at a time, all sharing one stand-in bucket. Optuna suggests the values: it runs in-process with
no service to start, has the three searches Vertex offers (TPE as the Bayesian default, random,
grid), suggests from the results so far while trials run in parallel (ask/tell with a
"constant liar"), and a pruner of labkit's applies Vertex's median stopping rule, as study.proto
states it (`MedianStopping`), to the reports a trial makes while it runs. What still differs from
the service: its default search (Vertex's own Bayesian optimisation, here TPE), and
``max_failed_trial_count=0``, which lets the service decide how many failed trials end the study
(study.proto does not say how many) and here never ends it. (Open Source Vizier, the family of Vertex's own service, needs its
service or JAX-based designers and pins older dependencies: too heavy for a laptop and CI.)
It returns one `TrialRecord` per trial, with its parameters and `metric`.

`study_summary` and `study_cost` turn the records into the table, the best trial and what the
study would cost on Spot at the trial job's prices.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
import typing
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from labkit.core.cluster import is_reduction_server_image
from labkit.core.config import ParameterError, check_int
from labkit.core.frameworks import has_aiplatform, require
from labkit.core.hypertune import read_reports, reported_values
from labkit.core.progress import progress
from labkit.core.train_config import TrainConfig, flag
from labkit.vertex.emulator import SUCCEEDED, container_dir, run_local
from labkit.vertex.pricing import estimate_cost
from labkit.vertex.scheduling import check_labels
from labkit.vertex.specs import (
    check_output_uri,
    through_types,
    train_config,
    training_job,
    validate,
)
from labkit.vertex.trial import check_metric

GOALS = ("MINIMIZE", "MAXIMIZE")
ALGORITHMS = ("GRID_SEARCH", "RANDOM_SEARCH")  # None: Vertex's default, Bayesian optimisation
SCALES = {"linear": "UNIT_LINEAR_SCALE", "log": "UNIT_LOG_SCALE"}
# Each trial gets its own output folders; these cannot be tuned or shared.
_PER_TRIAL = ("checkpoint_dir", "metrics_out", "tensorboard_dir")


# ---------------------------------------------------------------- the spec

def _field_kinds() -> dict[str, tuple[type, tuple | None]]:
    """TrainConfig field -> (value type, choices)."""
    hints = typing.get_type_hints(TrainConfig)
    out = {}
    for f in fields(TrainConfig):
        args = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
        out[f.name] = (args[0] if args else hints[f.name], f.metadata.get("choices"))
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parameter_spec(name: str, value: Any, config: TrainConfig) -> dict[str, Any]:
    """One StudySpec.ParameterSpec for the `labkit train` flag of TrainConfig field `name`."""
    key = name.replace("-", "_")
    where = f"parameters[{name!r}]"
    kinds = _field_kinds()
    if key not in kinds:
        raise ParameterError(where, value, "is not a labkit train flag (known: "
                             + ", ".join(sorted(kinds)) + ")")
    kind, choices = kinds[key]
    if kind is bool:
        raise ParameterError(where, value, f"{flag(key)} is an on/off switch, which takes no "
                             "value on the command line; compare the two settings as two jobs")
    if key in _PER_TRIAL:
        raise ParameterError(where, value, "is an output location; every trial gets its own")
    spec: dict[str, Any] = {"parameter_id": flag(key)[2:]}
    if isinstance(value, tuple) and len(value) == 3 and value[0] in SCALES:
        scale, low, high = value
        if kind is str or not (_is_number(low) and _is_number(high)):
            raise ParameterError(where, value, f"a range needs numeric bounds and a numeric flag "
                                 f"({flag(key)} takes {kind.__name__})")
        if not low < high:
            raise ParameterError(where, value, "needs low < high")
        if scale == "log" and low <= 0:
            raise ParameterError(where, value, "a log scale needs low > 0")
        integer = isinstance(low, int) and isinstance(high, int)
        if kind is int and not integer:
            raise ParameterError(where, value, f"{flag(key)} takes integers: give int bounds")
        spec |= ({"integer_value_spec": {"min_value": low, "max_value": high}} if integer else
                 {"double_value_spec": {"min_value": float(low), "max_value": float(high)}})
        spec["scale_type"] = SCALES[scale]
        candidates = [low, high]
    elif isinstance(value, (list, tuple)) and value and not isinstance(value[0], str) \
            and all(_is_number(v) for v in value):
        if kind is str:
            raise ParameterError(where, value, f"{flag(key)} takes one of {choices}, not numbers")
        if kind is int and not all(float(v).is_integer() for v in value):
            raise ParameterError(where, value, f"{flag(key)} takes integers")
        spec["discrete_value_spec"] = {"values": sorted({float(v) for v in value})}
        candidates = list(value)
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        if kind is not str:
            raise ParameterError(where, value, f"{flag(key)} takes {kind.__name__} values, not strings")
        spec["categorical_value_spec"] = {"values": list(dict.fromkeys(value))}
        candidates = list(value)
    else:
        raise ParameterError(where, value, "must be ('linear'|'log', low, high) or a non-empty "
                             "list of numbers or of strings")
    for v in candidates:  # each value must make a valid run (ParameterError names the field)
        try:
            replace(config, **{key: int(v) if kind is int else v})
        except ParameterError as e:
            raise ParameterError(where, v, f"is refused by labkit train: {e}") from None
    return spec


def generic_parameter_spec(name: str, value: Any) -> dict[str, Any]:
    """One StudySpec.ParameterSpec for flag ``--NAME`` of any script: ``("linear"|"log", low,
    high)`` is an INTEGER range when both bounds are ints, else DOUBLE; a list of numbers is
    DISCRETE, a list of strings CATEGORICAL."""
    where = f"parameters[{name!r}]"
    if not isinstance(name, str) or not name.replace("-", "_").replace(".", "_").isidentifier():
        raise ParameterError(where, name, "must be a flag name (letters, digits, - and _)")
    spec: dict[str, Any] = {"parameter_id": name}
    if isinstance(value, tuple) and len(value) == 3 and value[0] in SCALES:
        scale, low, high = value
        if not (_is_number(low) and _is_number(high)):
            raise ParameterError(where, value, "a range needs numeric bounds")
        if not low < high:
            raise ParameterError(where, value, "needs low < high")
        if scale == "log" and low <= 0:
            raise ParameterError(where, value, "a log scale needs low > 0")
        integer = isinstance(low, int) and isinstance(high, int)
        spec |= ({"integer_value_spec": {"min_value": low, "max_value": high}} if integer else
                 {"double_value_spec": {"min_value": float(low), "max_value": float(high)}})
        spec["scale_type"] = SCALES[scale]
    elif isinstance(value, (list, tuple)) and value and all(_is_number(v) for v in value):
        spec["discrete_value_spec"] = {"values": sorted({float(v) for v in value})}
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        spec["categorical_value_spec"] = {"values": list(dict.fromkeys(value))}
    else:
        raise ParameterError(where, value, "must be ('linear'|'log', low, high) or a non-empty "
                             "list of numbers or of strings")
    return spec


def _study(metric: str, goal: str, params: list[dict[str, Any]], algorithm: str | None,
           early_stopping: bool) -> dict[str, Any]:
    goal_name = str(goal).upper()
    if goal_name not in GOALS:
        raise ParameterError("goal", goal, "must be 'minimize' or 'maximize'")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ParameterError("algorithm", algorithm, f"must be None or one of {', '.join(ALGORITHMS)}")
    if algorithm == "GRID_SEARCH" and any("double_value_spec" in p for p in params):
        raise ParameterError("algorithm", algorithm, "needs every parameter integer, discrete or "
                             "categorical (a DOUBLE range has no grid)")
    study: dict[str, Any] = {"metrics": [{"metric_id": metric, "goal": goal_name}], "parameters": params}
    if algorithm:
        study["algorithm"] = algorithm
    if early_stopping:
        study["median_automated_stopping_spec"] = {"use_elapsed_duration": False}
    return study


def user_tuning_job(
    trial_job: Mapping[str, Any],
    *,
    metric: str,
    goal: str,
    parameters: Mapping[str, Any],
    max_trial_count: int,
    parallel_trial_count: int,
    algorithm: str | None = None,
    early_stopping: bool = True,
    max_failed_trial_count: int = 0,
    display_name: str = "labkit-tuning",
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A HyperparameterTuningJob whose trials run `trial_job` (a CustomJobSpec of your own
    code, `labkit.vertex.userjob.user_job`) with each trial's values appended as
    ``--NAME=VALUE``; the code reports `metric` with cloudml-hypertune (see the
    ``hypertune_report`` recipe). `parameters` as in `generic_parameter_spec`."""
    if not isinstance(metric, str) or not metric:
        raise ParameterError("metric", metric, "must name the metric the script reports")
    check_int("max_trial_count", max_trial_count, minimum=1)
    check_int("parallel_trial_count", parallel_trial_count, minimum=1, maximum=max_trial_count)
    check_int("max_failed_trial_count", max_failed_trial_count, minimum=0)
    if not parameters:
        raise ParameterError("parameters", parameters, "must name at least one flag to tune")
    params = [generic_parameter_spec(name, value) for name, value in parameters.items()]
    spec = {"display_name": display_name, "study_spec": _study(metric, goal, params, algorithm, early_stopping),
            "max_trial_count": max_trial_count, "parallel_trial_count": parallel_trial_count,
            "max_failed_trial_count": max_failed_trial_count, "trial_job_spec": dict(trial_job),
            "labels": check_labels({"labkit-job": "tuning", **dict(labels or {})})}
    if has_aiplatform():
        validate_tuning_job(spec)
    return spec


def tuning_job(
    config: Any,
    *,
    output_uri: str,
    metric: str,
    goal: str,
    parameters: Mapping[str, Any],
    max_trial_count: int,
    parallel_trial_count: int,
    algorithm: str | None = None,
    early_stopping: bool = True,
    max_failed_trial_count: int = 0,
    display_name: str = "labkit-tuning",
    labels: Mapping[str, str] | None = None,
    **job_options: Any,
) -> dict[str, Any]:
    """A HyperparameterTuningJob dict (proto field names) whose trials train `config` with the
    values of `parameters`, optimising `metric` ("loss", or another metric labkit train
    records) toward `goal` ("minimize" or "maximize"). `algorithm`: None (Vertex's Bayesian
    optimisation), "GRID_SEARCH" or "RANDOM_SEARCH". `job_options` are `training_job`'s
    (machine_type, accelerator_type, accelerator_count, replica_count, spot, image_uri, ...)
    and shape the trial job (Spot or DWS flex-start, timeout, persistent resource, reservation,
    TensorBoard included). `labels` go on the HyperparameterTuningJob. Each trial's outputs go
    to ``<output_uri>/<trial id>/``."""
    cfg = train_config(config)
    check_output_uri(output_uri)
    check_metric(metric)
    check_int("max_trial_count", max_trial_count, minimum=1)
    check_int("parallel_trial_count", parallel_trial_count, minimum=1, maximum=max_trial_count)
    check_int("max_failed_trial_count", max_failed_trial_count, minimum=0)
    if not parameters:
        raise ParameterError("parameters", parameters, "must name at least one flag to tune")
    for name in _PER_TRIAL:
        if getattr(cfg, name) is not None:
            raise ParameterError(name, getattr(cfg, name), "must be unset in a tuning job: each "
                                 "trial writes to its own AIP_* folders")
    params = [parameter_spec(name, value, cfg) for name, value in parameters.items()]
    study = _study(metric, goal, params, algorithm, early_stopping)
    accelerators = int(job_options.get("accelerator_count") or 0)
    per_node = job_options.pop("processes_per_node", None)
    if per_node is None:
        per_node = accelerators if cfg.framework == "torch" and accelerators > 1 else 1
    command = ["python", "-m", "labkit.vertex.trial", "--tuning-metric", metric]
    if per_node > 1:
        command += ["--processes-per-node", str(per_node)]
    trial_spec = training_job(cfg, output_uri=output_uri, command=command, processes_per_node=1,
                              **job_options)
    spec = {"display_name": display_name, "study_spec": study, "max_trial_count": max_trial_count,
            "parallel_trial_count": parallel_trial_count,
            "max_failed_trial_count": max_failed_trial_count, "trial_job_spec": dict(trial_spec),
            "labels": check_labels({"labkit-job": "tuning", **dict(labels or {})})}
    if has_aiplatform():
        validate_tuning_job(spec)
    return spec


def validate_tuning_job(spec: Mapping[str, Any]):
    """Check `spec` against ``aiplatform_v1.types.HyperparameterTuningJob`` (and its trial job
    with `labkit.vertex.validate`); returns the message. ValueError names a refused or dropped
    field."""
    require("google.cloud.aiplatform")
    from google.cloud.aiplatform_v1.types import HyperparameterTuningJob

    validate(spec["trial_job_spec"])
    return through_types(HyperparameterTuningJob, spec)


# ---------------------------------------------------------------- the study, run here

@dataclass
class TrialRecord:
    """One trial of a local study. `state`: "SUCCEEDED", "STOPPED" (stopped early by the
    median rule) or "FAILED". `metric` is the last reported value (None when none was).
    `measurements` are the (step, value) reports. Fields read as ``r.metric`` or ``r["metric"]``."""

    trial_id: str
    parameters: dict[str, Any]
    metric: float | None
    state: str
    seconds: float
    measurements: list[tuple[int, float]] = field(default_factory=list)
    workdir: Path | None = None
    error: str = ""

    @property
    def early_stopped(self) -> bool:
        return self.state == "STOPPED"

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def to_dict(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def _distribution(p: Mapping[str, Any]):
    import optuna

    log = p.get("scale_type") == "UNIT_LOG_SCALE"
    if "double_value_spec" in p:
        d = p["double_value_spec"]
        return optuna.distributions.FloatDistribution(d["min_value"], d["max_value"], log=log)
    if "integer_value_spec" in p:
        d = p["integer_value_spec"]
        return optuna.distributions.IntDistribution(int(d["min_value"]), int(d["max_value"]), log=log)
    values = (p.get("discrete_value_spec") or p.get("categorical_value_spec"))["values"]
    return optuna.distributions.CategoricalDistribution(list(values))


def _grid(p: Mapping[str, Any]) -> list[Any]:
    if "integer_value_spec" in p:
        d = p["integer_value_spec"]
        return list(range(int(d["min_value"]), int(d["max_value"]) + 1))
    return list((p.get("discrete_value_spec") or p.get("categorical_value_spec"))["values"])


def vertex_value(parameter: Mapping[str, Any], value: Any) -> str:
    """A trial's value as the tuning service writes it on the command line: a DISCRETE value is
    a double (``32.0``, which every integer flag of `labkit train` reads), an INTEGER one an
    integer, a DOUBLE one a float, a CATEGORICAL one its string. The local study passes exactly
    this, so a flag that cannot read the service's form fails here as it would on Vertex."""
    if "discrete_value_spec" in parameter or "double_value_spec" in parameter:
        return repr(float(value))
    if "integer_value_spec" in parameter:
        return str(int(value))
    return str(value)


def trial_spec(spec: Mapping[str, Any], trial_id: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The CustomJobSpec Vertex runs for one trial: outputs under ``<base>/<trial id>``, the
    trial's values appended as ``--flag=value`` (`vertex_value`) to every pool that runs the
    training code."""
    job = copy.deepcopy(dict(spec["trial_job_spec"]))
    base = (job.get("base_output_directory") or {}).get("output_uri_prefix", "").rstrip("/")
    if base:
        job["base_output_directory"] = {"output_uri_prefix": f"{base}/{trial_id}"}
    by_id = {p["parameter_id"]: p for p in spec["study_spec"]["parameters"]}
    flags = [f"--{pid}={vertex_value(by_id.get(pid, {}), v)}" for pid, v in values.items()]
    for pool in job["worker_pool_specs"]:
        program = (pool.get("container_spec") or pool.get("python_package_spec")) if pool else None
        if program and not is_reduction_server_image(program.get("image_uri")):
            program["args"] = [*program.get("args", []), *flags]
    return job


def _metric_file(trial_dir: Path) -> Path:
    """The primary replica's hypertune file in the trial's latest job attempt."""
    attempts = sorted((trial_dir / "containers").glob("attempt*"), key=lambda p: int(p.name[7:]))
    attempt = int(attempts[-1].name[7:]) if attempts else 0
    return container_dir(trial_dir, attempt, 0, 0) / "tmp" / "hypertune" / "output.metrics"


def grid_points(params: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every combination of a grid search's values, in a fixed order (the first parameter
    varies slowest)."""
    ids = [p["parameter_id"] for p in params]
    return [dict(zip(ids, combo, strict=True)) for combo in itertools.product(*(_grid(p) for p in params))]


def tpe_startup_trials() -> int:
    """How many trials Optuna's TPE sampler suggests at random before its model guides the
    search (its `n_startup_trials` default, read from the installed Optuna): a study with no
    more trials than this is a random search."""
    import inspect

    import optuna

    return int(inspect.signature(optuna.samplers.TPESampler).parameters["n_startup_trials"].default)


def _sampler(algorithm: str | None, seed: int):
    import optuna

    # A grid is walked by enqueueing its points (`run_local_tuning`): Optuna's GridSampler
    # stops the study from inside `tell`, which raises outside an objective function.
    if algorithm in ("GRID_SEARCH", "RANDOM_SEARCH"):
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def run_local_tuning(
    spec: Mapping[str, Any],
    workdir: str | Path,
    *,
    seed: int = 0,
    trial_timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    min_trials_before_stopping: int = 2,
    image: Any = None,
    gcs_root: str | Path | None = None,
) -> list[TrialRecord]:
    """Run the study of `spec` (a `tuning_job` dict) here and return one `TrialRecord` per
    trial, in trial order. Trials run through the emulator, ``parallel_trial_count`` at a time,
    in ``<workdir>/trial-<id>`` with one stand-in bucket, ``<workdir>/gcs``. With the spec's
    median stopping rule, a running trial whose best report so far is worse than the median
    performance of the completed trials up to its last report is stopped (`MedianStopping`;
    once `min_trials_before_stopping` trials have completed). ``max_failed_trial_count`` (when
    > 0) stops the study after that many failures; 0 never does (the service decides). `seed` makes the suggestions reproducible. `image` (`labkit.vertex.programs.Image`)
    and `gcs_root` (default ``<workdir>/gcs``) are `run_local`'s."""
    require("optuna")
    import optuna

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    study_spec = spec["study_spec"]
    (metric_spec,) = study_spec["metrics"]
    tag = metric_spec["metric_id"]
    params = list(study_spec["parameters"])
    distributions = {p["parameter_id"]: _distribution(p) for p in params}
    pruner = (median_stopping(min_trials_before_stopping)
              if "median_automated_stopping_spec" in study_spec else optuna.pruners.NopPruner())
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        direction="maximize" if metric_spec["goal"] == "MAXIMIZE" else "minimize",
        sampler=_sampler(study_spec.get("algorithm"), seed), pruner=pruner)
    trials = int(spec["max_trial_count"])
    if study_spec.get("algorithm") == "GRID_SEARCH":
        points = grid_points(params)[:trials]
        for point in points:
            study.enqueue_trial(point)
        trials = len(points)
    lock = threading.Lock()  # one ask/tell at a time across the trial threads
    max_failed = int(spec.get("max_failed_trial_count") or 0)
    failures = [0]
    records: dict[int, TrialRecord] = {}

    def one_trial(_index: int) -> None:
        with lock:
            if max_failed and failures[0] >= max_failed:
                return
            trial = study.ask(distributions)
        trial_id = str(trial.number + 1)  # Vertex numbers trials from 1
        trial_dir = workdir / f"trial-{trial_id}"
        seen: set[int] = set()
        stopped = [False]

        def stop_when() -> bool:
            for step, value in reported_values(read_reports(_metric_file(trial_dir)), tag):
                if step in seen:
                    continue
                seen.add(step)
                with lock:
                    trial.report(value, step)
                    if trial.should_prune():
                        stopped[0] = True
            return stopped[0]

        started = time.monotonic()
        value, measurements, error = None, [], ""
        try:
            job = run_local(trial_spec(spec, trial_id, trial.params), trial_dir,
                            gcs_root=gcs_root or workdir / "gcs", trial=trial_id, timeout_s=trial_timeout_s,
                            env=env, stop_when=stop_when, show_progress=False, image=image)
            stop_when()  # the reports written in the last moments
            measurements = reported_values(read_reports(_metric_file(trial_dir)), tag)
            value = measurements[-1][1] if measurements else None
            succeeded, error = job.state == SUCCEEDED, job.error
        except (OSError, ValueError, RuntimeError) as e:  # the trial could not run here at all
            succeeded, error = False, f"{type(e).__name__}: {e}"
        if stopped[0]:
            state, tell = "STOPPED", {"state": optuna.trial.TrialState.PRUNED}
        elif succeeded and value is not None:
            state, tell = "SUCCEEDED", {"values": value}
        else:
            state, tell = "FAILED", {"state": optuna.trial.TrialState.FAIL}
        with lock:
            study.tell(trial, **tell)
            failures[0] += state == "FAILED"
        error = "" if state != "FAILED" else (error or f"no value of {tag!r} was reported")
        parameters = {pid.replace("-", "_"): v for pid, v in trial.params.items()}
        records[trial.number] = TrialRecord(trial_id, parameters, value, state,
                                            time.monotonic() - started, measurements, trial_dir, error)

    with ThreadPoolExecutor(max_workers=int(spec["parallel_trial_count"])) as pool, \
            progress(trials, "local study", unit="trial") as bar:
        for future in [pool.submit(one_trial, i) for i in range(trials)]:
            future.result()
            bar.update(1)
    return [records[k] for k in sorted(records)]


def median_stopping(min_completed: int = 2):
    """An Optuna pruner with the rule of study.proto's ``MedianAutomatedStoppingSpec``
    (googleapis/googleapis google/cloud/aiplatform/v1/study.proto, read 2026-11-28): "stops a
    pending Trial if the Trial's best objective_value is strictly below the median 'performance'
    of all completed Trials reported up to the Trial's last measurement", where performance is
    "the running average of the objective values reported by the Trial in each measurement"
    ("below" meaning worse: above it when minimising). Optuna's own MedianPruner compares the
    trial's latest report with the others' at the same step, which stops other trials."""
    import statistics

    import optuna

    class MedianStopping(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            step, mine = trial.last_step, trial.intermediate_values
            if step is None:
                return False
            done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            performance = [statistics.fmean(v for s, v in t.intermediate_values.items() if s <= step)
                           for t in done if any(s <= step for s in t.intermediate_values)]
            if len(performance) < max(1, min_completed):
                return False
            median = statistics.median(performance)
            if study.direction == optuna.study.StudyDirection.MAXIMIZE:
                return max(mine.values()) < median
            return min(mine.values()) > median

    return MedianStopping()


# ---------------------------------------------------------------- reading a study

@dataclass
class StudySummary:
    """The trials as table rows, the best one, and how many ended in each state."""

    goal: str
    rows: list[dict[str, Any]]
    best: TrialRecord | None
    states: dict[str, int]

    def text(self) -> str:
        lines = []
        for r in self.rows:
            values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in r["parameters"].items())
            metric = "-" if r["metric"] is None else f"{r['metric']:.4g}"
            lines.append(f"trial {r['trial']:>3}  {r['state']:<9}  metric {metric:>9}  "
                         f"{r['seconds']:6.1f}s  {values}")
        counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(self.states.items()))
        lines.append(f"{len(self.rows)} trials ({counts}); goal: {self.goal.lower()}")
        if self.best is not None:
            lines.append(f"best: trial {self.best.trial_id}, metric {self.best.metric:.4g}, "
                         f"{self.best.parameters}")
        return "\n".join(lines)


def study_summary(records: Sequence[TrialRecord], goal: str = "minimize") -> StudySummary:
    """Rows for display and the best finished trial toward `goal` (stopped and failed trials
    are never best: a stopped trial's metric is from before it finished)."""
    goal = str(goal).upper()
    if goal not in GOALS:
        raise ParameterError("goal", goal, "must be 'minimize' or 'maximize'")
    done = [r for r in records if r.state == "SUCCEEDED" and r.metric is not None]
    pick = min if goal == "MINIMIZE" else max
    best = pick(done, key=lambda r: r.metric) if done else None
    rows = [{"trial": r.trial_id, "state": r.state, "metric": r.metric, "seconds": r.seconds,
             "parameters": dict(r.parameters)} for r in records]
    states: dict[str, int] = {}
    for r in records:
        states[r.state] = states.get(r.state, 0) + 1
    return StudySummary(goal, rows, best, states)


@dataclass
class StudyCost:
    """What a study's trials cost at the trial job's hourly price: `usd_per_hour` (Spot or
    on-demand), the machine-hours the trials took, and the total. `notes` say what the price
    leaves out (host VMs) and that trial times measured on another machine scale with it."""

    spot: bool
    usd_per_hour: float
    trial_hours: float
    total_usd: float
    per_trial_usd: dict[str, float]
    notes: list[str]
    sources: list[str]

    def text(self) -> str:
        kind = "Spot" if self.spot else "on-demand"
        lines = [f"{len(self.per_trial_usd)} trials, {self.trial_hours * 60:.1f} trial-minutes at "
                 f"${self.usd_per_hour:,.2f}/h ({kind}): ${self.total_usd:,.4f}"]
        lines += ["  note: " + n for n in self.notes]
        lines += ["  prices: " + s for s in self.sources]
        return "\n".join(lines)


def study_cost(records: Sequence[TrialRecord], spec: Mapping[str, Any], *, spot: bool = True,
               seconds_scale: float = 1.0) -> StudyCost:
    """The study's cost from its trial times: each trial's seconds (times `seconds_scale`, e.g.
    the target machine's speed relative to the one that ran the trials) at the hourly price of
    the trial job's machines (`labkit.vertex.estimate_cost`), Spot or on-demand. Every trial
    is billed, stopped and failed ones included, for the time it ran."""
    if seconds_scale <= 0:
        raise ParameterError("seconds_scale", seconds_scale, "must be > 0")
    estimate = estimate_cost(spec["trial_job_spec"])
    rate = estimate.spot_usd_hr if spot else estimate.on_demand_usd_hr
    if estimate.unpriced or not estimate.lines or rate != rate:  # NaN: a machine without a Spot price
        raise ValueError("study_cost: the trial job has no price: " + estimate.text().splitlines()[0])
    per_trial = {r.trial_id: r.seconds * seconds_scale / 3600 * rate for r in records}
    hours = sum(r.seconds for r in records) * seconds_scale / 3600
    notes = list(estimate.notes)
    if seconds_scale == 1.0:
        notes.append("trial times as measured where the study ran; on the job's machines they differ")
    return StudyCost(spot, rate, hours, sum(per_trial.values()), per_trial, notes, list(estimate.sources))
