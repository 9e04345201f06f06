"""The preemption drill: the same `labkit train` job run twice through the local Vertex
emulator, once undisturbed and once with a replica receiving SIGTERM mid-run (as a Spot VM does
when it is reclaimed). The preempted job checkpoints, restarts as a whole, resumes from its
newest committed checkpoint, and `DrillResult` compares the two: per-step losses and final
weights must be identical, bit for bit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from labkit.core.config import check_choice, check_float, check_int
from labkit.core.metrics import load_metrics
from labkit.core.train_config import TrainConfig
from labkit.course.plots import finish, new_figure
from labkit.vertex.emulator import Fault, LocalJob, LocalPaths, run_local
from labkit.vertex.specs import training_job


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
        return "\n".join([
            f"uninterrupted job: {self.clean.state}, {len(self.clean_losses)} steps",
            f"preempted job:     {self.preempted.state}, {self.preempted.job_restarts} job restart(s), "
            f"resumed at step index {self.resumed_at_step} (0-based), "
            f"{self.redone_steps} step(s) computed twice",
            f"per-step losses identical: {self.losses_equal}",
            f"final weights identical:   {self.weights_equal} (max |difference| {self.max_weight_difference:g})",
        ])


def _losses(job: LocalJob, metrics: str) -> tuple[list[float], int | None, int]:
    """Per-step losses of the whole job, attempt after attempt (a later attempt's value for a
    step replaces an earlier one: that step was recomputed after a restart). A resumed
    attempt's file also carries the steps before its resume, copied from the earlier file:
    only the steps it trained count as its own."""
    by_step: dict[int, float] = {}
    resumed_at, redone = None, 0
    files = [job.snapshots[a][metrics] for a in sorted(job.snapshots) if metrics in job.snapshots[a]]
    for i, path in enumerate(files):
        data = load_metrics(path)
        steps = data["steps"]
        first = 0
        if i and steps:
            before = (data.get("run") or {}).get("resumed_from_step")
            first = before + 1 if isinstance(before, int) else steps[0]["step"]
            resumed_at = first if resumed_at is None else resumed_at
        for s in steps:
            if s["step"] < first:
                continue
            redone += s["step"] in by_step
            by_step[s["step"]] = s["loss"]
    return [by_step[k] for k in sorted(by_step)], resumed_at, redone


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
        losses, resumed, redone = _losses(job, metrics)
        out[name] = (job, losses, _final_weights(job, f"{config.bucket}/{name}/checkpoints"), resumed, redone)
    (cj, cl, cw, _, _), (pj, pl, pw, resumed, redone) = out["clean"], out["preempted"]
    return DrillResult(config, cj, pj, cl, pl, cw, pw, resumed, redone)


def plot_losses(result: DrillResult, path: str | os.PathLike | None = None):
    """Per-step loss of both jobs; the resume point is marked."""
    fig, ax = new_figure((7, 3.5))
    ax.plot(result.clean_losses, "o-", label="uninterrupted")
    ax.plot(result.preempted_losses, "x--", label="preempted + resumed")
    if result.resumed_at_step is not None:
        ax.axvline(result.resumed_at_step - 0.5, color="grey", linestyle=":", label="SIGTERM / resume")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    return finish(fig, path)
