"""Notebook 02's asynchronous training: TensorFlow's ParameterServerStrategy beside
MultiWorkerMirrored on the same model and data, each as an emulated Vertex AI job, and what one
slow worker does to each.

    specs = jobs(config, StragglerConfig(delay_ms=100))  # the two CustomJob specs
    print(layout_text(specs))                            # each replica: pool, role, TF_CONFIG task
    runs = run(specs, workdir)                           # the two jobs, one after the other
    found = findings(runs); plot(runs, path)             # the numbers and verdicts; the curves

Both jobs have two replicas that compute gradients, laid out as Vertex AI lays out pools
(https://cloud.google.com/vertex-ai/docs/training/distributed-training, read 2026-11-29: one
primary replica, workers, and "Parameter server(s) [...] store model parameters and coordinate
shared model state between the workers"):

- asynchronous: workerpool0 is the chief, which only coordinates (a `ClusterCoordinator`
  schedules each step on whichever worker is free), workerpool1 two workers, workerpool2 one
  parameter server;
- synchronous: workerpool0 (the chief) and workerpool1 (one worker) both compute, and every
  step all-reduces their gradients.

Every replica runs `python -m labkit.tf.straggler`, which reads its strategy from TF_CONFIG and
measures windows of wall time, alternately with all workers at full speed and with workerpool1[0]
waiting `delay_ms` in each step. From the chief's results (`StragglerRun`): the updates per
second of each kind of window (`slowdown`; `others_slowdown` for the workers that were not
slowed), the throughput of the two strategies at full speed (`throughput`), the staleness of the
asynchronous updates (`staleness_rows`, `staleness`), the loss curves, all gathered in
`findings`; and `traffic`: the bytes a parameter server moves per update against a ring
all-reduce's, the numbers behind why the course trains PyTorch with DDP rather than with a
parameter server on its RPC framework. All are numbers and verdicts: the notebook writes the
sentences.
"""

from __future__ import annotations

import json
import shutil
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.core.config import check_choice
from labkit.core.gcs import fuse_path
from labkit.core.train_config import TrainConfig, to_argv
from labkit.course import ladder
from labkit.course.plots import finish, new_figure
from labkit.tf.straggler import ASYNC, SYNC, StragglerConfig

__all__ = ["ASYNC", "SYNC", "RecipeStaleness", "Staleness", "StragglerConfig", "StragglerFindings", "StragglerRun",
           "Traffic", "demo_config", "findings", "job_spec", "jobs", "layout_text", "others_slowdown", "plot",
           "recipe_staleness", "run", "slowdown", "staleness", "staleness_rows", "throughput", "traffic",
           "window_rows"]

LABELS = {SYNC: "MultiWorkerMirrored (synchronous)", ASYNC: "ParameterServer (asynchronous)"}
BUCKET = "gs://labkit-course"
# The emulated replicas share this machine's cores: one thread per op, and a few inter-op threads
# (the coordinator dispatches remote steps on them; one alone deadlocks it).
REPLICA_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "4"}
RESULTS = "straggler.json"


# ---------------------------------------------------------------- the two jobs


def demo_config(config: TrainConfig) -> TrainConfig:
    """The settings both jobs train with: `config`'s model, data, batch and optimizer at the
    smoke size, on the CPU (each job is 3 or 4 processes on this machine; what is measured is
    the workers' timing, not the model)."""
    return replace(config, framework="tf", device="cpu", scale="smoke", metrics_out=None,
                   checkpoint_dir=None, progress=False)


def job_spec(config: TrainConfig, straggler: StragglerConfig, strategy: str, *, output_uri: str) -> dict[str, Any]:
    """The CustomJob spec of one of the two jobs (`strategy` ASYNC or SYNC); the chief writes its
    results to ``<output_uri>/straggler.json`` through the bucket's mount."""
    from labkit.vertex import PoolConfig, custom_job_spec, default_image

    check_choice("strategy", strategy, (SYNC, ASYNC))
    out = fuse_path(f"{output_uri.rstrip('/')}/{RESULTS}")
    command = ["python", "-m", "labkit.tf.straggler", *replace(straggler, out=out).argv(), "--",
               *to_argv(config, changed_only=True)]

    def pool(replicas: int):
        return PoolConfig(replica_count=replicas, image_uri=default_image("tf"), command=command)

    if strategy == ASYNC:  # chief (coordinator), 2 workers, 1 parameter server
        return custom_job_spec(pool(1), pool(2), pool(1), output_uri=output_uri)
    return custom_job_spec(pool(1), pool(1), output_uri=output_uri)  # chief and 1 worker compute


def jobs(config: TrainConfig, straggler: StragglerConfig, bucket: str = BUCKET) -> dict[str, dict[str, Any]]:
    """Both jobs, synchronous first, on the same model, data and global batch (`config`)."""
    return {s: job_spec(config, straggler, s, output_uri=f"{bucket}/02-straggler/{s}") for s in (SYNC, ASYNC)}


def results_uri(spec: dict[str, Any]) -> str:
    return f"{spec['base_output_directory']['output_uri_prefix'].rstrip('/')}/{RESULTS}"


def layout_text(specs: dict[str, dict[str, Any]]) -> str:
    """Each job's replicas as the emulator gives them their environment: pool, role, TF_CONFIG
    task (addresses are loopback ports here)."""
    from labkit.vertex import describe_environments

    return "\n\n".join(f"{LABELS[s]}:\n{describe_environments(spec)}" for s, spec in specs.items())


@dataclass
class StragglerRun:
    """One job's outcome: the chief's results (`labkit.tf.straggler`) and the emulated job."""

    strategy: str
    result: dict[str, Any]
    job: Any = None  # labkit.vertex.LocalJob

    @property
    def label(self) -> str:
        return LABELS[self.strategy]

    @property
    def delay_ms(self) -> float:
        return float(self.result["straggler"]["delay_ms"])

    @property
    def slow_worker(self) -> int:
        return int(self.result["straggler"]["slow_worker"])

    @property
    def batch_size(self) -> int:
        return int(self.result["config"]["batch_size"])

    @property
    def updates(self) -> list[dict[str, Any]]:
        return self.result["updates"]

    @property
    def losses(self) -> list[float]:
        return [u["loss"] for u in self.updates]

    def windows(self, slowed: bool) -> list[dict[str, Any]]:
        return [w for w in self.result["windows"] if w["slowed"] == slowed]

    def rates(self, slowed: bool) -> list[float]:
        """Updates per second of each window of one kind."""
        return [w["updates"] / w["seconds"] for w in self.windows(slowed)]

    def worker_rates(self, slowed: bool, *, slow: bool) -> list[float]:
        """Asynchronous runs: per window of one kind, the updates per second computed by the
        slowed worker (`slow=True`) or by all the others."""
        out = []
        for w in self.windows(slowed):
            mine = [u for u in self.updates if u["window"] == w["index"]
                    and (u.get("worker") == self.slow_worker) == slow]
            out.append(len(mine) / w["seconds"])
        return out

    def staleness(self, slowed: bool, slow: bool | None = None) -> list[int]:
        """The staleness of the updates applied in windows of one kind (of the slowed worker's
        updates, or of the others', when `slow` is given)."""
        kinds = {w["index"] for w in self.windows(slowed)}
        return [u["staleness"] for u in self.updates if u["window"] in kinds
                and (slow is None or (u.get("worker") == self.slow_worker) == slow)]


def run(specs: dict[str, dict[str, Any]], workdir: str | Path, *, timeout_s: float = 600.0) -> dict[str, StragglerRun]:
    """Run each job on this machine (`labkit.vertex.run_local`), one after the other, and read
    back its chief's results. Workers and parameter servers serve until the chief is done and are
    then stopped, as Vertex AI stops them. Raises RuntimeError with the failing replica's last
    lines when a job fails."""
    from labkit.vertex import run_local

    out = {}
    for strategy, spec in specs.items():
        shutil.rmtree(Path(workdir) / strategy, ignore_errors=True)  # no earlier run's results
        job = run_local(spec, Path(workdir) / strategy, env=REPLICA_ENV, worker_grace_s=2.0,
                        show_progress=False, timeout_s=timeout_s)
        if not job.succeeded:
            failing = job.failing()
            tail = "\n".join(failing.log().splitlines()[-15:]) if failing else ""
            raise RuntimeError(f"the {LABELS[strategy]} job failed: {job.error}\n{tail}")
        result = json.loads(job.local(results_uri(spec)).read_text(encoding="utf-8"))
        out[strategy] = StragglerRun(strategy, result, job)
    return out


# ---------------------------------------------------------------- what the windows say


def slowdown(run: StragglerRun) -> stats.Comparison:
    """Updates per second: windows with one worker slowed (b) against windows at full speed (a)."""
    return stats.compare(run.rates(False), run.rates(True))


def others_slowdown(run: StragglerRun) -> stats.Comparison:
    """Asynchronous: the updates per second of the workers that were never slowed, in the slowed
    windows (b) against the full-speed ones (a)."""
    return stats.compare(run.worker_rates(False, slow=False), run.worker_rates(True, slow=False))


def throughput(runs: dict[str, StragglerRun]) -> stats.Comparison:
    """Samples per second with every worker at full speed: asynchronous (b) against synchronous
    (a); one update trains on one global batch in both."""
    return stats.compare(*[[r * runs[s].batch_size for r in runs[s].rates(False)] for s in (SYNC, ASYNC)])


def window_rows(runs: dict[str, StragglerRun]) -> list[dict[str, Any]]:
    """One row per measured window of each job."""
    rows = []
    for strategy, r in runs.items():
        for w in r.result["windows"]:
            row = {"job": r.label, "window": w["index"],
                   f"workerpool1[{r.slow_worker}]": f"+{r.delay_ms:g} ms per step" if w["slowed"] else "full speed",
                   "seconds": w["seconds"], "updates": w["updates"], "updates/s": w["updates"] / w["seconds"]}
            if strategy == ASYNC:
                mine = [u for u in r.updates if u["window"] == w["index"]]
                row["by the slowed worker"] = sum(1 for u in mine if u["worker"] == r.slow_worker)
            rows.append(row)
    return rows


def staleness_rows(run: StragglerRun) -> list[dict[str, Any]]:
    """Asynchronous: how many updates other workers applied between a step's read of the weights
    and its own update, by kind of window and worker."""
    rows = []
    for slowed in (False, True):
        for slow in (True, False):
            values = run.staleness(slowed, slow)
            who = f"workerpool1[{run.slow_worker}]" + (" (the slowed one)" if slowed and slow else "")
            rows.append({"windows": "one worker slowed" if slowed else "full speed",
                         "updates of": who if slow else "the other worker(s)", "updates": len(values),
                         "median staleness": statistics.median(values) if values else None,
                         "mean": statistics.fmean(values) if values else None,
                         "max": max(values) if values else None})
    return rows


@dataclass(frozen=True)
class Staleness:
    """How old the weights of the asynchronous updates were (updates other workers applied
    between a step's read of the weights and its own update): at full speed, and in the slowed
    windows for the slowed worker's updates and the other worker's."""

    full_speed: tuple[int, ...]
    slowed_worker: tuple[int, ...]
    other_worker: tuple[int, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.full_speed)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.full_speed)

    @property
    def max(self) -> int:
        return max(self.full_speed)

    @property
    def slowed_mean(self) -> float:
        return statistics.fmean(self.slowed_worker)

    @property
    def other_mean(self) -> float:
        return statistics.fmean(self.other_worker)


def staleness(run: StragglerRun) -> Staleness | None:
    """The asynchronous run's `Staleness`; None when a kind of window has no updates."""
    found = Staleness(tuple(run.staleness(False)), tuple(run.staleness(True, True)), tuple(run.staleness(True, False)))
    return found if found.full_speed and found.slowed_worker and found.other_worker else None


@dataclass(frozen=True)
class RecipeStaleness:
    """A run of the tf_parameter_server recipe, from its metrics file's steps: the updates each
    worker applied and their staleness."""

    by_worker: dict[int, int]
    values: tuple[int, ...]

    @property
    def updates(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def max(self) -> int:
        return max(self.values)

    @property
    def stale_share(self) -> float:
        """The share of updates applied to weights another worker had changed since they were read."""
        return sum(1 for v in self.values if v) / len(self.values)


def recipe_staleness(steps: list[dict[str, Any]]) -> RecipeStaleness:
    workers = sorted({s["worker"] for s in steps})
    return RecipeStaleness({w: sum(1 for s in steps if s["worker"] == w) for w in workers},
                           tuple(s["staleness"] for s in steps))


def _tail_loss(run: StragglerRun, n: int) -> float:
    """Mean loss of the updates `n - tail` … `n - 1` (a tenth of them, at least 5)."""
    k = max(5, n // 10)
    return statistics.fmean(run.losses[max(0, n - k):n])


@dataclass(frozen=True)
class StragglerFindings:
    """What the two jobs' windows say. The slowdowns are updates per second in the slowed
    windows (b) against the full-speed ones (a); `others` the same for the asynchronous workers
    that were never slowed; `throughput` the asynchronous job's samples per second (b) against
    the synchronous one's (a), all at full speed. `sync_tail_loss` and `async_tail_loss`: the
    mean training loss of updates `compared_updates` − a tenth (at least 5) … `compared_updates`."""

    delay_ms: float
    slow_worker: int
    sync: stats.Comparison
    asynchronous: stats.Comparison
    others: stats.Comparison
    throughput: stats.Comparison
    staleness: Staleness | None
    compared_updates: int
    sync_tail_loss: float
    async_tail_loss: float

    @property
    def sync_verdict(self) -> str:
        return ladder.verdict(self.sync)

    @property
    def async_verdict(self) -> str:
        return ladder.verdict(self.asynchronous)

    @property
    def others_verdict(self) -> str:
        return ladder.verdict(self.others)

    @property
    def others_kept_pace(self) -> bool:
        """Whether the workers that were never slowed kept their rate beside the straggler."""
        return self.others.winner != "a"

    @property
    def throughput_verdict(self) -> str:
        return ladder.verdict(self.throughput)


def findings(runs: dict[str, StragglerRun]) -> StragglerFindings:
    """The numbers and verdicts of both jobs' windows."""
    sync, asyn = runs[SYNC], runs[ASYNC]
    n = min(len(sync.losses), len(asyn.losses))
    return StragglerFindings(sync.delay_ms, sync.slow_worker, slowdown(sync), slowdown(asyn), others_slowdown(asyn),
                             throughput(runs), staleness(asyn), n, _tail_loss(sync, n), _tail_loss(asyn, n))


def plot(runs: dict[str, StragglerRun], path: str | Path | None = None):
    """Loss per update, updates per second per window, and the staleness of the asynchronous
    updates by kind of window and worker."""
    fig, first = new_figure((13, 3.8))
    first.remove()
    loss_ax, rate_ax, stale_ax = fig.subplots(1, 3)
    for r in runs.values():
        loss_ax.plot(range(1, len(r.losses) + 1), r.losses, ".-" if r.strategy == SYNC else ".", ms=3,
                     alpha=0.8, label=r.label)
        windows = r.result["windows"]
        rate_ax.plot([w["index"] for w in windows], [w["updates"] / w["seconds"] for w in windows], "o-", label=r.label)
    for w in next(iter(runs.values())).result["windows"]:
        if w["slowed"]:
            rate_ax.axvspan(w["index"] - 0.5, w["index"] + 0.5, color="0.9", zorder=0)
    loss_ax.set(xlabel="update (in the order applied)", ylabel="training loss", title="Same model, data and batch")
    loss_ax.legend(fontsize=8)
    rate_ax.set(xlabel="window (grey: one worker slowed)", ylabel="updates per second",
                title=f"+{next(iter(runs.values())).delay_ms:g} ms per step on one worker")
    rate_ax.set_ylim(bottom=0)
    if ASYNC in runs:
        r = runs[ASYNC]
        groups = {"full speed": r.staleness(False), "slowed worker, slowed": r.staleness(True, True),
                  "other worker, slowed": r.staleness(True, False)}
        top = max([0, *[max(v) for v in groups.values() if v]])
        for label, values in groups.items():
            if values:
                stale_ax.hist(values, bins=range(top + 2), alpha=0.5, density=True, label=label)
        stale_ax.set(xlabel="staleness (updates applied meanwhile)", ylabel="share of updates",
                     title="Asynchronous updates")
        stale_ax.legend(fontsize=8)
    return finish(fig, path)


# ---------------------------------------------------------------- PyTorch's parameter server


@dataclass(frozen=True)
class Traffic:
    """What one update moves: through the parameter server, the whole fp32 gradient in and the
    whole fp32 weights out; in a ring all-reduce over `workers`, 2 (workers − 1) / workers of the
    gradient sent by each worker, over every link at once. `updates_per_s`: the asynchronous job's
    median rate at full speed."""

    params: int
    workers: int
    updates_per_s: float

    @property
    def server_bytes_per_update(self) -> int:
        return 2 * 4 * self.params

    @property
    def server_bytes_per_s(self) -> float:
        return self.server_bytes_per_update * self.updates_per_s

    @property
    def ring_bytes_per_worker(self) -> float:
        return 2 * (self.workers - 1) / self.workers * 4 * self.params


def traffic(runs: dict[str, StragglerRun]) -> Traffic:
    """The parameter server's bytes per update against a ring all-reduce's, for this model."""
    asyn, sync = runs[ASYNC], runs[SYNC]
    return Traffic(int(asyn.result["params"]), int(sync.result["workers_computing"]),
                   statistics.median(asyn.rates(False)))
