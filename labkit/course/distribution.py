"""Notebook 02's measurements: the same job with torch DDP and with tf.distribute, side by side.

Framework-free at import. Each run is real: `labkit.torch.launch.run_local` starts DDP
processes (gloo on CPU), `labkit.tf.launch.run_local` starts MultiWorkerMirrored workers with a
TF_CONFIG each; both engines read the same synthetic samples, use `batch_size` as the GLOBAL
batch, and write the same metrics schema, so the comparison code below is shared.

What the runs show comes back as numbers and verdicts, from which the notebook writes its
sentences: `learning` (each run's held-out loss against chance), `scaling` (N processes' step
times against one process's), `framework_race` (DDP's step times against tf.distribute's).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core import frameworks, stats
from labkit.core.metrics import MetricsLog
from labkit.core.progress import track
from labkit.core.train_config import TrainConfig
from labkit.course import ladder
from labkit.course.plots import finish, new_figure

FRAMEWORK_MODULES = {"torch": "torch", "tf": "tensorflow"}
LABELS = {"torch": "PyTorch DDP", "tf": "tf.distribute MWMS"}

# A published nccl-tests range for 8x H100 SXM5 with NVLink (bus bandwidth at large messages,
# GB/s); its source is the third entry of REFERENCES.
H100_NVLINK_ALLREDUCE_BUSBW_GBS = (460.0, 480.0)
# Public reference figures for hardware this notebook may not have: what, the figure, where it
# was published (URL where there is one) and when, and the date it was read here.
REFERENCES = (
    {"what": "PyTorch DDP, data-parallel scaling", "figure": "near-linear up to 256 GPUs",
     "source": "Li et al., 'PyTorch Distributed: Experiences on Accelerating Data Parallel "
               "Training', VLDB 2020", "date": "2020"},
    {"what": "Horovod (ring all-reduce), ResNet-101 / Inception V3", "figure":
     "90% scaling efficiency on 512 GPUs", "source": "Horovod README and Sergeev & Del Balso, "
     "arXiv:1802.05799", "date": "2018"},
    {"what": "NCCL all-reduce bus bandwidth, 8x H100 SXM5 (NVLink only, one node), large messages",
     "figure": "{:.0f}-{:.0f} GB/s".format(*H100_NVLINK_ALLREDUCE_BUSBW_GBS), "source": "a GPU cloud's published nccl-tests reference numbers "
     "(all_reduce_perf -b 8 -e 8G -f 2 -g 8), "
     "https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests, read 2026-11-23",
     "date": "2026-05-06"},
    {"what": "Vertex AI Reduction Server (multi-node all-reduce)", "figure":
     "up to 2x all-reduce bandwidth", "source": "Google Cloud blog, 'Optimize training "
     "performance with Reduction Server on Vertex AI', https://cloud.google.com/blog/topics/"
     "developers-practitioners/optimize-training-performance-reduction-server-vertex-ai, read 2026-11-23",
     "date": "2021-08-25"},
)
H100_NVLINK_ALLREDUCE_SOURCE = REFERENCES[2]["source"]


@dataclass
class DistRun:
    """One measured run: which framework, how many processes, its metrics, its wall time."""

    framework: str
    processes: int
    log: MetricsLog
    wall_s: float

    @property
    def label(self) -> str:
        return f"{LABELS[self.framework]} x{self.processes}"

    @property
    def median_step_s(self) -> float:
        times = step_times(self)
        return statistics.median(times) if times else math.nan


@dataclass
class Comparison:
    """All runs of the notebook, keyed by (framework, processes), and what was skipped why."""

    runs: dict[tuple[str, int], DistRun] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def available(framework: str) -> bool:
    return frameworks.is_installed(FRAMEWORK_MODULES[framework])


def run_job(config: TrainConfig, framework: str, processes: int, *,
            timeout_s: float | None = None) -> DistRun:
    """Train `config` with `framework` as `processes` local processes (one thread each)."""
    config = replace(config, framework=framework, metrics_out=None, progress=False)
    start = time.perf_counter()
    if framework == "torch":
        from labkit.torch.launch import run_local

        log = run_local(config, processes, timeout_s=timeout_s)
    else:
        from labkit.tf.launch import run_local

        log = run_local(config, processes, timeout_s=timeout_s)
    return DistRun(framework, processes, log, time.perf_counter() - start)


@dataclass(frozen=True)
class Learning:
    """What one run learned: its held-out loss on samples it never trained on, against chance
    (the loss of guessing uniformly); `learned` is `labkit.core.metrics.learned`'s verdict
    (held-out loss under `LEARNED_BELOW` × chance), None when no held-out loss was measured."""

    framework: str
    processes: int
    steps: int
    heldout_loss: float | None
    heldout_samples: int | None
    chance: float | None
    learned: bool | None

    @property
    def label(self) -> str:
        return f"{LABELS[self.framework]} x{self.processes}"

    @property
    def verdict(self) -> str:
        """"learned", "did not learn", or "no held-out loss measured"."""
        return {True: "learned", False: "did not learn", None: "no held-out loss measured"}[self.learned]


def learning(comp: Comparison) -> list[Learning]:
    """One `Learning` per run, so a comparison of curves is read only where the curves show a
    model learning."""
    from labkit.core.metrics import learned

    out = []
    for (fw, n), run in comp.runs.items():
        metrics = run.log.to_dict()
        heldout = metrics.get("run", {}).get("heldout") or {}
        out.append(Learning(fw, n, len(run.log.steps), heldout.get("loss"), heldout.get("samples"),
                            heldout.get("chance"), learned(metrics)))
    return out


def compare(config: TrainConfig, processes: tuple[int, ...] = (1, 2),
            frameworks_: tuple[str, ...] = ("torch", "tf")) -> Comparison:
    """Every framework that is installed, at every process count; missing ones are recorded."""
    result = Comparison()
    for fw in frameworks_:
        if not available(fw):
            result.skipped[fw] = frameworks.missing_reason(FRAMEWORK_MODULES[fw])
    jobs = [(fw, n) for fw in frameworks_ if fw not in result.skipped for n in processes]
    for fw, n in track(jobs, "distributed runs", unit="run"):
        result.runs[(fw, n)] = run_job(config, fw, n)
    return result


def step_times(run: DistRun) -> list[float]:
    """A run's step times after the first (which builds graphs and buffers)."""
    return [s["step_time_s"] for s in run.log.steps[1:] if "step_time_s" in s]


@dataclass(frozen=True)
class StepRace:
    """The step times (ms, each run's steps after its first) of run `b` against run `a`: the
    medians and ranges, and the verdict on `b` ("faster", "slower", `stats.NO_DIFFERENCE`, or
    no verdict with fewer than `stats.MIN_REPEATS` timed steps on either side)."""

    a: DistRun
    b: DistRun

    @property
    def a_ms(self) -> tuple[float, ...]:
        return tuple(1e3 * t for t in step_times(self.a))

    @property
    def b_ms(self) -> tuple[float, ...]:
        return tuple(1e3 * t for t in step_times(self.b))

    @property
    def a_median_ms(self) -> float:
        return statistics.median(self.a_ms)

    @property
    def b_median_ms(self) -> float:
        return statistics.median(self.b_ms)

    @property
    def comparison(self) -> stats.Comparison | None:
        if min(len(self.a_ms), len(self.b_ms)) < stats.MIN_REPEATS:
            return None
        return stats.compare(self.a_ms, self.b_ms, higher_is_better=False)

    @property
    def speedup(self) -> float:
        """How many times faster b's median step is than a's."""
        return self.a_median_ms / self.b_median_ms

    @property
    def verdict(self) -> str:
        c = self.comparison
        if c is None:
            return f"fewer than {stats.MIN_REPEATS} timed steps: no verdict"
        return ladder.verdict(c)

    @property
    def faster(self) -> DistRun | None:
        """The run whose steps were measurably faster; None for no verdict or no measurable
        difference."""
        return {"faster": self.b, "slower": self.a}.get(self.verdict)

    @property
    def ideal_ms(self) -> float:
        """Strong scaling's ideal for b: a's median step over b's share of a's work (b's process
        count over a's), the same global batch."""
        return self.a_median_ms * self.a.processes / self.b.processes

    @property
    def efficiency(self) -> float:
        """The ideal step over b's median step: 1 when N processes take 1/N of the time."""
        return self.ideal_ms / self.b_median_ms


def scaling(comp: Comparison, processes: int) -> dict[str, StepRace]:
    """Per framework with both runs: `processes` processes' steps (b) against one process's (a),
    the same global batch."""
    return {fw: StepRace(comp.runs[(fw, 1)], comp.runs[(fw, processes)]) for fw in ("torch", "tf")
            if processes > 1 and {(fw, 1), (fw, processes)} <= set(comp.runs)}


def framework_race(comp: Comparison, processes: int) -> StepRace | None:
    """tf.distribute's steps (b) against DDP's (a) at `processes` processes; None unless both ran."""
    if not {("torch", processes), ("tf", processes)} <= set(comp.runs):
        return None
    return StepRace(comp.runs[("torch", processes)], comp.runs[("tf", processes)])


def batch_semantics(global_batch: int, world_sizes: tuple[int, ...], grad_accum: int = 1
                    ) -> list[dict[str, Any]]:
    """What each replica sees for a fixed global batch, and what each API is handed."""
    rows = []
    for w in world_sizes:
        parts = w * grad_accum
        micro = global_batch / parts
        rows.append({
            "replicas": w, "grad_accum": grad_accum, "global batch": global_batch,
            "per-replica micro-batch": micro if not micro.is_integer() else int(micro),
            "DDP DataLoader batch_size": f"{micro:g} (per process)",
            "tf: experimental_distribute_dataset": f"{global_batch // grad_accum} (global, split)",
            "tf: ctx.get_per_replica_batch_size": f"{micro:g}",
            "valid": micro.is_integer(),
        })
    return rows


def curve_gap(a: MetricsLog | list[float], b: MetricsLog | list[float]) -> float:
    """Largest absolute per-step loss difference over the common steps."""
    la = a.losses if isinstance(a, MetricsLog) else a
    lb = b.losses if isinstance(b, MetricsLog) else b
    n = min(len(la), len(lb))
    return max((abs(x - y) for x, y in zip(la[:n], lb[:n], strict=True)), default=math.nan)


def scaling_rows(comp: Comparison) -> list[dict[str, Any]]:
    """Per framework: step time, samples/s and strong-scaling efficiency against 1 process
    (same global batch, so N processes ideally take 1/N of the time)."""
    rows = []
    for (fw, n), run in sorted(comp.runs.items()):
        one = comp.runs.get((fw, 1))
        speedup = one.median_step_s / run.median_step_s if one else math.nan
        rows.append({"run": run.label, "median step (ms)": 1000 * run.median_step_s,
                     "samples/s": run.log.to_dict()["summary"].get("median_samples_per_s"),
                     "speed-up vs 1": speedup, "efficiency": speedup / n,
                     "vs 1 process": StepRace(one, run).verdict if one and n > 1 else "",
                     "final loss": run.log.losses[-1] if run.log.steps else math.nan})
    return rows


def lr_scaling_rows(base_lr: float, base_batch: int, world_sizes: tuple[int, ...]
                    ) -> list[dict[str, Any]]:
    """LR when the global batch grows with the replica count (per-replica batch fixed): the
    linear rule (Goyal et al. 2017, SGD; with warm-up) and the square-root rule often used
    with Adam. `scale_lr_with_world_size=True` makes both engines apply the linear rule."""
    return [{"replicas": w, "global batch": base_batch * w, "linear rule lr": base_lr * w,
             "sqrt rule lr": base_lr * math.sqrt(w)} for w in world_sizes]


def accumulation_loss_gap(config: TrainConfig, grad_accum: int) -> dict[str, float]:
    """Train in this process with and without accumulation at the same global batch, per
    installed framework; returns the largest loss-curve gap (0 up to float summation order).
    (`labkit.course.memory.accumulation_gradient_gap` compares the gradients themselves.)"""
    gaps = {}
    for fw in ("torch", "tf"):
        if not available(fw):
            continue
        base = replace(config, framework=fw, metrics_out=None, progress=False, device="cpu")
        if fw == "torch":
            from labkit.torch.trainer import fit
        else:
            from labkit.tf.engine import fit
        plain = fit(replace(base, grad_accum=1))
        accum = fit(replace(base, grad_accum=grad_accum))
        gaps[fw] = curve_gap(plain, accum)
    return gaps


def plot_losses(comp: Comparison, path: str | Path | None = None):
    """All loss curves on one axis (solid: 1 process, dashed: more); saved when `path` given."""
    fig, ax = new_figure((7, 4))
    for (_, n), run in sorted(comp.runs.items()):
        steps = [s["step"] for s in run.log.steps]
        ax.plot(steps, run.log.losses, "-" if n == 1 else "--", marker=".", label=run.label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss (global batch mean)")
    ax.set_title("Same model, data and global batch: DDP vs tf.distribute")
    ax.legend()
    return finish(fig, path)
