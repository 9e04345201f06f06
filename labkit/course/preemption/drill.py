"""The preemption drill: the same `labkit train` job run twice through the local Vertex
emulator, once undisturbed and once with a replica receiving SIGTERM mid-run (as a Spot VM does
when it is reclaimed). The preempted job checkpoints, restarts as a whole, resumes from its
newest committed checkpoint, and `DrillResult` compares the two: per-step losses and final
weights must be identical, bit for bit.

Every step number this module writes follows labkit's one numbering (`STEP_NUMBERING`): the
first step is step 0, as in the metrics file's ``step`` field, the checkpoint folders
(``step-00000008`` holds the state after step 8) and `labkit train`'s "preempted during step 8".
The emulator reads a replica's progress from its bar, which counts the steps *done*: when it
shows 7 done, steps 0-6 are done and step 7 is running, so its "at step 7" is "during step 7"
here (`DrillResult.events` says it that way). `DrillResult.story` tells the drill in that
numbering: the signal during step S, the checkpoint of step C, the resume with step C + 1.
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

STEP_NUMBERING = ("steps are numbered from 0, as in the metrics file's `step` field and the checkpoint "
                  "folders (step-00000008 holds the state after step 8)")
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

    def text(self) -> str:
        """The drill's plan in labkit's step numbering."""
        return (f"{self.steps} steps (0-{self.steps - 1}), a checkpoint after steps "
                f"{', '.join(map(str, self.periodic_checkpoints))}; {self.signal} to {self.target} during step "
                f"{self.preempt_step} (once {self.preempt_step} steps are done); {STEP_NUMBERING}")


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

    def text(self) -> str:
        resumed = ("never resumed" if self.resumed_at_step is None else
                   f"resumed with step {self.resumed_at_step} from the checkpoint of step {self.checkpoint_step}")
        return "\n".join([
            f"uninterrupted job: {self.clean.state}, {len(self.clean_losses)} steps (0-{len(self.clean_losses) - 1})",
            f"preempted job:     {self.preempted.state}, {self.preempted.job_restarts} job restart(s), "
            f"{resumed}, {self.redone_steps} step(s) computed twice",
            f"per-step losses identical: {self.losses_equal}",
            f"final weights identical:   {self.weights_equal} (max |difference| {self.max_weight_difference:g})",
        ])

    def story(self) -> list[str]:
        """What happened, step by step, in labkit's step numbering."""
        return drill_story(self.config.signal, self.config.target, self.signal_step, self.resumed_at_step,
                           self.redone_steps)

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


def drill_story(signal: str, target: str, signal_step: int | None, resumed_at: int | None,
                redone: int) -> list[str]:
    """The drill in labkit's step numbering (`STEP_NUMBERING`): the step the signal arrived in,
    the checkpoint the restarted job restored, and the step it continued with."""
    if signal_step is None:
        return [f"{signal} was sent to {target}; the step it arrived in was not reported."]
    done = {0: "no step was done", 1: "step 0 was done"}.get(signal_step, f"steps 0-{signal_step - 1} were done")
    out = [f"{signal} reached {target} during step {signal_step} ({done})."]
    if resumed_at is None:
        return out + ["The job never resumed from a checkpoint."]
    ckpt = resumed_at - 1
    if ckpt < 0:
        return out + [f"No checkpoint was committed: the restarted job started again with step 0, "
                      f"{redone} step(s) computed twice."]
    if signal == "SIGTERM" and ckpt >= signal_step:
        out.append(f"Every replica agreed to stop after step {ckpt} (the stop flag rides in a step's "
                   f"all-reduce), checkpointed step {ckpt} (step-{ckpt:08d}) and exited 143.")
    elif signal == "SIGTERM":
        out.append(f"No replica checkpointed on the signal; the newest committed checkpoint was step {ckpt}.")
    else:
        out.append(f"No warning, no checkpoint of its own: the newest committed checkpoint was step {ckpt} "
                   f"(step-{ckpt:08d}), a periodic one.")
    twice = f"steps {resumed_at}-{resumed_at + redone - 1}" if redone > 1 else f"step {resumed_at}"
    out.append(f"The restarted job restored the checkpoint of step {ckpt} and continued with step {resumed_at}: "
               + (f"{redone} step(s) computed twice ({twice})." if redone else "no step computed twice."))
    return out


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
