"""The preemption drill: the same `labkit train` job run twice through the local Vertex
emulator, once undisturbed and once with a replica receiving SIGTERM mid-run (as a Spot VM does
when it is reclaimed). The preempted job checkpoints, restarts as a whole, resumes from its
newest committed checkpoint, and `DrillResult` compares the two: per-step losses and final
weights must be identical, bit for bit.

Every step number here follows labkit's one numbering: the first step is step 0, as in the
metrics file's ``step`` field, the checkpoint folders (``step-00000008`` holds the state after
step 8) and `labkit train`'s "preempted during step 8". The emulator reads a replica's progress
from its bar, which counts the steps *done*: when it shows 7 done, steps 0-6 are done and step 7
is running, so its "at step 7" is "during step 7" here (`DrillResult.events` says it that way).
`DrillResult` holds the drill in that numbering, as numbers for the notebook's sentences: the
signal during step S (`signal_step`), the checkpoint of step C it restored (`checkpoint_step`,
and how that checkpoint came to be: `restored`), the resume with step C + 1, the steps computed
twice, and whether losses and weights came out identical.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from labkit.core.config import check_choice, check_float, check_int
from labkit.core.metrics import load_metrics
from labkit.core.train_config import TrainConfig
from labkit.course.plots import finish, new_figure
from labkit.vertex.emulator import Fault, LocalJob, LocalPaths, run_local
from labkit.vertex.specs import training_job

# The checkpoint the restarted job restored (`DrillResult.restored`): the one every replica agreed
# to take after the signal, a periodic one (a SIGKILL gives no warning), none at all (it started
# again with step 0), or no restart from a checkpoint.
ON_THE_SIGNAL = "taken on the signal"
PERIODIC = "a periodic one"
NONE_COMMITTED = "none committed: started again with step 0"
NOT_RESUMED = "never resumed"
# How the emulator words a step-triggered fault (labkit.vertex.faults.FaultTrigger): N is the
# count of steps the replica's progress bar showed done.
_SENT_AT_STEP = re.compile(r"sent (SIG[A-Z]+) to (\S+) at step (\d+)")


@dataclass
class DrillConfig:
    """One drill: a `replicas`-node torch DDP job of `steps` steps, checkpointing every
    `checkpoint_every` steps; `signal` goes to `target` when the job reaches `preempt_step`.
    `input_latency_ms` slows each step (injected input latency) so the signal lands mid-run."""

    replicas: int = 2
    steps: int = 16
    batch_size: int = 16
    model: str = "cnn"
    checkpoint_every: int = 4
    preempt_step: int = 9
    target: str = "workerpool1[0]"
    signal: str = "SIGTERM"
    input_latency_ms: float = 100.0
    spot: bool = True
    timeout_s: float = 600.0
    bucket: str = "gs://labkit-drill"

    def __post_init__(self) -> None:
        check_int("replicas", self.replicas, minimum=1)
        check_int("steps", self.steps, minimum=2)
        check_int("checkpoint_every", self.checkpoint_every, minimum=0)
        check_int("preempt_step", self.preempt_step, minimum=1, maximum=self.steps - 1)
        check_choice("signal", self.signal, ("SIGTERM", "SIGKILL"))
        check_float("input_latency_ms", self.input_latency_ms, minimum=0.0)

    def train_config(self) -> TrainConfig:
        return TrainConfig(framework="torch", model=self.model, steps=self.steps,
                           batch_size=self.batch_size, checkpoint_every=self.checkpoint_every,
                           input_latency_ms=self.input_latency_ms, device="cpu",
                           eval_samples=0)  # the drill's lesson is the exact resume

    def spec(self, name: str) -> dict:
        return training_job(self.train_config(), output_uri=f"{self.bucket}/{name}",
                            replica_count=self.replicas, spot=self.spot)

    @property
    def periodic_checkpoints(self) -> list[int]:
        """The steps after which the job checkpoints on its own (and after its last step)."""
        every = self.checkpoint_every
        return sorted({s for s in range(self.steps) if every and (s + 1) % every == 0} | {self.steps - 1})


@dataclass
class DrillResult:
    config: DrillConfig
    clean: LocalJob
    preempted: LocalJob
    clean_losses: list[float]
    preempted_losses: list[float]
    clean_weights: dict = field(repr=False, default_factory=dict)
    preempted_weights: dict = field(repr=False, default_factory=dict)
    resumed_at_step: int | None = None
    redone_steps: int = 0
    signal_step: int | None = None  # the step running when the signal was sent
    attempt_steps: dict[int, tuple[int, int]] = field(default_factory=dict)  # attempt -> steps it recorded

    @property
    def checkpoint_step(self) -> int | None:
        """The step whose checkpoint the restarted job restored."""
        return None if self.resumed_at_step is None else self.resumed_at_step - 1

    @property
    def losses_equal(self) -> bool:
        return self.clean_losses == self.preempted_losses and len(self.clean_losses) == self.config.steps

    @property
    def weights_equal(self) -> bool:
        import torch

        a, b = self.clean_weights, self.preempted_weights
        return bool(a) and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    @property
    def max_weight_difference(self) -> float:
        if not self.clean_weights:
            return float("nan")
        return max(float((self.clean_weights[k] - self.preempted_weights[k]).abs().max())
                   for k in self.clean_weights)

    @property
    def restored(self) -> str:
        """How the checkpoint the restarted job restored came to be: `ON_THE_SIGNAL` (a SIGTERM,
        and every replica stopped after the same step, at or after the one it arrived in, and
        checkpointed it), `PERIODIC`, `NONE_COMMITTED` or `NOT_RESUMED`."""
        if self.resumed_at_step is None:
            return NOT_RESUMED
        if self.checkpoint_step < 0:
            return NONE_COMMITTED
        on_signal = self.signal_step is not None and self.checkpoint_step >= self.signal_step
        return ON_THE_SIGNAL if self.config.signal == "SIGTERM" and on_signal else PERIODIC

    @property
    def steps_computed_twice(self) -> list[int]:
        """The steps trained in the first attempt and again after the resume."""
        start = self.resumed_at_step or 0
        return list(range(start, start + self.redone_steps))

    def events(self) -> list[str]:
        """The emulator's events, its count of steps done said as the step that was running."""
        return [_SENT_AT_STEP.sub(lambda m: f"sent {m[1]} to {m[2]} during step {m[3]} ({m[3]} steps done)", e)
                for e in self.preempted.events]

    def attempt_rows(self) -> list[dict]:
        """One row per replica run of the preempted job: how it ended, and the steps its attempt
        recorded in the metrics file (a replica killed without warning trained past them)."""
        rows = []
        for r in self.preempted.runs:
            first_last = self.attempt_steps.get(r.job_attempt)
            rows.append({"attempt": r.job_attempt, "replica": r.name, "exit": r.exit_code,
                         "signal received": r.signal_sent or "",
                         "steps recorded": "" if first_last is None else "{}-{}".format(*first_last),
                         "seconds": round(r.seconds, 1)})
        return rows


@dataclass
class _JobSteps:
    losses: list[float]
    resumed_at: int | None
    redone: int
    by_attempt: dict[int, tuple[int, int]]


def _losses(job: LocalJob, metrics: str) -> _JobSteps:
    """Per-step losses of the whole job, attempt after attempt (a later attempt's value for a
    step replaces an earlier one: that step was recomputed after a restart). A resumed
    attempt's file also carries the steps before its resume, copied from the earlier file:
    only the steps it trained count as its own."""
    by_step: dict[int, float] = {}
    resumed_at, redone, by_attempt = None, 0, {}
    files = [(a, job.snapshots[a][metrics]) for a in sorted(job.snapshots) if metrics in job.snapshots[a]]
    for i, (attempt, path) in enumerate(files):
        data = load_metrics(path)
        steps = data["steps"]
        first = 0
        if i and steps:
            before = (data.get("run") or {}).get("resumed_from_step")
            first = before + 1 if isinstance(before, int) else steps[0]["step"]
            resumed_at = first if resumed_at is None else resumed_at
        own = [s for s in steps if s["step"] >= first]
        for s in own:
            redone += s["step"] in by_step
            by_step[s["step"]] = s["loss"]
        if own:
            by_attempt[attempt] = (own[0]["step"], own[-1]["step"])
    return _JobSteps([by_step[k] for k in sorted(by_step)], resumed_at, redone, by_attempt)


def _signal_step(job: LocalJob) -> int | None:
    """The step that was running when the fault's signal was sent (the emulator's count of
    steps done, which is that step's number when the first step is step 0)."""
    for event in job.events:
        m = _SENT_AT_STEP.search(event)
        if m:
            return int(m[3])
    return None


def _final_weights(job: LocalJob, checkpoints: str) -> dict:
    from labkit.core import checkpoint
    from labkit.torch.state import from_bytes

    ckpt = checkpoint.load(LocalPaths(job.workdir)(checkpoints))
    return from_bytes(ckpt.files["model.pt"]) if ckpt else {}


def preemption_drill(config: DrillConfig, workdir: str | os.PathLike) -> DrillResult:
    """Run the uninterrupted job and the preempted one; compare losses and weights."""
    workdir = Path(workdir)
    out = {}
    for name, fault in (("clean", None),
                        ("preempted", Fault(config.target, config.preempt_step, config.signal))):
        spec = config.spec(name)
        metrics = f"{config.bucket}/{name}/metrics.json"
        job = run_local(spec, workdir / name, fault=fault, timeout_s=config.timeout_s, snapshot=[metrics])
        if fault is not None and not job.faults_sent:
            # Without the signal the two jobs are the same run: "identical" would prove nothing.
            raise RuntimeError(f"preemption drill: {config.signal} never reached {config.target}: the job "
                               f"({job.state}) ended before any replica reported step {config.preempt_step}; "
                               f"give it more steps or a larger input_latency_ms")
        out[name] = (job, _losses(job, metrics), _final_weights(job, f"{config.bucket}/{name}/checkpoints"))
    (cj, clean, cw), (pj, hit, pw) = out["clean"], out["preempted"]
    sent = _signal_step(pj)
    # A replica killed without warning trained past the last metrics write: the steps from the
    # resume up to the one it died in were computed twice, whatever the files show.
    redone = hit.redone if sent is None or hit.resumed_at is None else max(hit.redone, sent - hit.resumed_at)
    return DrillResult(config, cj, pj, clean.losses, hit.losses, cw, pw, hit.resumed_at, redone, sent,
                       hit.by_attempt)


def plot_losses(result: DrillResult, path: str | os.PathLike | None = None):
    """Per-step loss of both jobs; the resume point is marked."""
    fig, ax = new_figure((7, 3.5))
    ax.plot(result.clean_losses, "o-", label="uninterrupted")
    ax.plot(result.preempted_losses, "x--", label="preempted + resumed")
    if result.signal_step is not None:
        ax.axvline(result.signal_step, color="tab:red", linestyle=":",
                   label=f"{result.config.signal} (during step {result.signal_step})")
    if result.resumed_at_step is not None:
        ax.axvline(result.resumed_at_step - 0.5, color="grey", linestyle="--",
                   label=f"checkpoint of step {result.checkpoint_step} / resume with step {result.resumed_at_step}")
    ax.set_xlabel("step (the first is step 0)")
    ax.set_ylabel("loss")
    ax.legend()
    return finish(fig, path)
