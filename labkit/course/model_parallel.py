"""Notebook 10's measurements: one GPT trained in every parallel mode, each on real local
processes through `labkit train`, beside a single process at the same global batch.

`Mode` names one run (mode, processes, degrees, backend); `run_modes` trains each and returns a
`ModeResult` per run (per-step losses, what every rank held, bytes it sent per step, step time,
the pipeline's measured bubble). `mode_table`, `calculator_check` and `bubble_rows` turn them
into the notebook's tables. What the runs show comes back as numbers and verdicts, and the
notebook writes the sentences: `findings` (each mode against DDP and one process),
`bubble_findings` (each pipeline's idle share against the formula and against its stages'
work, and which way what remains went) and `offload_comparison` (ZeRO-Offload beside the same
stage without it).

The planning tables (`plan_summary`, `decision_rows`, `grid_rows`, `weighed_rows`) are views of
one answer, `labkit.core.parallelism.plan` (the calculator and planner live there), over
different grids of models, GPU counts, GPU memory and interconnects; `view_check` checks that
they agree where they meet and finds, for each cell that changes, the assumption that differs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core import parallelism, stats
from labkit.core.config import ParameterError, resolve_scale
from labkit.core.models import GPTConfig, build_config
from labkit.core.progress import track
from labkit.core.train_config import TrainConfig
from labkit.course import ladder


@dataclass(frozen=True)
class Mode:
    """One way to train: `parallel` mode on `nproc` processes (degrees and options as the
    `labkit train` flags of the same names)."""

    parallel: str = "ddp"
    nproc: int = 2
    sharding_backend: str = "torch"
    tp_degree: int | None = None
    pp_degree: int | None = None
    microbatches: int = 4
    pp_schedule: str = "1f1b"
    reshard_after_forward: bool = True
    grad_compression: str = "none"
    powersgd_rank: int = 1

    @property
    def label(self) -> str:
        name = self.parallel
        if self.sharding_backend == "deepspeed":
            name = f"deepspeed {name}"
        if self.parallel == "zero3" and not self.reshard_after_forward:
            name += " (no reshard)"
        if self.parallel == "pp":
            name += f" {self.pp_schedule} m={self.microbatches}"
        if self.grad_compression != "none":
            name += f" {self.grad_compression}" + (f" r={self.powersgd_rank}" if
                                                    self.grad_compression == "powersgd" else "")
        layout = f"{self.nproc}"
        if self.tp_degree and self.tp_degree < self.nproc:
            layout = f"{self.nproc // self.tp_degree}×{self.tp_degree}"
        if self.pp_degree and self.pp_degree < self.nproc:
            layout = f"{self.nproc // self.pp_degree}×{self.pp_degree}"
        return f"{name} [{layout}]"

    def config(self, base: TrainConfig) -> TrainConfig:
        return replace(base, parallel=self.parallel, sharding_backend=self.sharding_backend,
                       tp_degree=self.tp_degree, pp_degree=self.pp_degree,
                       microbatches=self.microbatches, pp_schedule=self.pp_schedule,
                       reshard_after_forward=self.reshard_after_forward,
                       grad_compression=self.grad_compression, powersgd_rank=self.powersgd_rank)

    def layout(self, base: TrainConfig) -> parallelism.Layout:
        return parallelism.Layout.of(self.config(base), self.nproc)


@dataclass
class ModeResult:
    """One run's measurements (from rank 0's metrics file)."""

    mode: Mode
    losses: list[float]
    step_times: list[float]
    run: dict[str, Any] = field(default_factory=dict)

    @property
    def timed_steps(self) -> list[float]:
        """The step times past the first step (which builds buckets, exchanges shapes), without
        the steps whose collectives were counted (counting slows them); all of them when that
        leaves none."""
        counted = set(self.run.get("comm_counted_steps") or [])
        times = [t for i, t in enumerate(self.step_times) if i > 0 and i not in counted]
        return times or self.step_times

    @property
    def step_time_s(self) -> float:
        """The median of `timed_steps`."""
        return statistics.median(self.timed_steps)

    @property
    def memory_by_rank(self) -> list[dict[str, int]]:
        return self.run.get("memory_by_rank") or [{}]

    def held(self, rank: int | None = None) -> int:
        """Bytes of parameters + gradients + optimizer state of `rank` (default: the largest)."""
        totals = [sum(m.values()) for m in self.memory_by_rank if m]
        return totals[rank] if rank is not None else max(totals)

    @property
    def comm_bytes_per_step(self) -> float:
        return max(b for b in self.run.get("comm_bytes_by_rank") or [0.0] if b is not None)

    def loss_gap(self, reference: list[float]) -> float:
        """Largest relative difference from `reference`'s per-step losses."""
        return max(abs(a - b) / abs(b) for a, b in zip(self.losses, reference, strict=True))


def base_config(scale: str = "smoke", *, steps: int = 8, batch_size: int = 32, seed: int = 0,
                device: str = "cpu") -> TrainConfig:
    """The run every mode repeats: labkit's GPT at `scale`, fp32, on `device` ("cpu": gloo
    processes; "cuda" only with a GPU for every process, `labkit.course.sizing` decides)."""
    return TrainConfig(model="gpt", scale=resolve_scale(scale), steps=steps, batch_size=batch_size,
                       seed=seed, device=device, progress=False,
                       eval_samples=0)  # memory, bytes and losses are compared: no held-out pass


def run_one(base: TrainConfig, mode: Mode | None, metrics_out: Path) -> ModeResult:
    """Train `base` in `mode` (None: one process, the reference)."""
    from labkit.train import run_replicas, run_training

    config = replace(base if mode is None else mode.config(base), metrics_out=str(metrics_out))
    log = run_training(config) if mode is None else run_replicas(config, mode.nproc)
    data = log.to_dict()
    return ModeResult(mode or Mode("single", 1), [s["loss"] for s in data["steps"]],
                      [s["step_time_s"] for s in data["steps"]], data["run"])


def run_modes(base: TrainConfig, modes: list[Mode], workdir: str | Path) -> tuple[ModeResult, list[ModeResult]]:
    """The single-process reference and one run per mode, in order."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    runs = [run_one(base, m, workdir / ("single.json" if m is None else f"mode-{i - 1}.json"))
            for i, m in enumerate(track([None, *modes], "parallel modes", unit="run"))]
    return runs[0], runs[1:]


def mode_table(reference: ModeResult, results: list[ModeResult]) -> list[dict[str, Any]]:
    """Per run: memory held by the largest rank and its ratio to DDP's, bytes sent per step and
    their ratio to DDP's, median step time and its ratio to DDP's (same process count), and the
    largest relative loss gap from one process."""
    ddp = next((r for r in results if r.mode.parallel == "ddp" and r.mode.grad_compression == "none"
                and r.mode.nproc == results[0].mode.nproc), None)
    rows = []
    for r in results:
        rows.append({"mode": r.mode.label, "held_KiB": r.held() / 1024,
                     "vs_ddp": r.held() / ddp.held() if ddp else None,
                     "sent_KiB_per_step": r.comm_bytes_per_step / 1024,
                     "sent_vs_ddp": r.comm_bytes_per_step / ddp.comm_bytes_per_step if ddp else None,
                     "step_ms": 1000 * r.step_time_s,
                     "step_vs_ddp": r.step_time_s / ddp.step_time_s if ddp else None,
                     "loss_gap": r.loss_gap(reference.losses)})
    return rows


def calculator_check(base: TrainConfig, results: list[ModeResult]) -> list[dict[str, Any]]:
    """Measured bytes per rank beside `labkit.core.parallelism.estimate`, for every rank of
    every torch run (DeepSpeed keeps buffers of its own and is not modelled)."""
    cfg = build_config("gpt", resolve_scale(base.scale))
    rows = []
    for r in results:
        if r.mode.sharding_backend != "torch" or r.mode.grad_compression != "none":
            continue
        layout = r.mode.layout(base)
        for rank, measured in enumerate(r.memory_by_rank):
            e = parallelism.estimate(cfg, layout, batch_size=base.batch_size, rank=rank,
                                     reshard_after_forward=r.mode.reshard_after_forward)
            total = sum(measured.values())
            rows.append({"mode": r.mode.label, "rank": rank, "measured_B": total,
                         "calculator_B": e.total_bytes, "ratio": total / e.total_bytes,
                         "sent_B": (r.run.get("comm_bytes_by_rank") or [None] * (rank + 1))[rank],
                         "sent_calculator_B": e.comm_bytes_per_step})
    return rows


# A pipeline's idle share closer than this to the expectation is called a match.
BUBBLE_TOLERANCE = 0.02
# Stages whose work is all at least this share of the busiest one's count as equal.
EQUAL_WORK_FROM = 0.95
# Which way a pipeline's measured idle share went from the one its stages' work gives
# (`BubbleFinding.verdict`).
BUBBLE_AS_EXPECTED = "as expected"
BUBBLE_ABOVE = "above the expectation"
BUBBLE_BELOW = "below the expectation"


@dataclass(frozen=True)
class BubbleFinding:
    """One pipeline run's idle share. labkit times, on every rank, its stage's schedule call
    (from the moment that stage enters it) and, inside it, the stage's forward, backward and
    loss: idle = 1 − busy/schedule, per stage the mean over its replicas (`idle_by_stage`).
    `measured` is the busiest stage's idle share (it sets the pace), `theory` (p−1)/(m+p−1),
    `expected` what the schedule gives with the stages' measured work (`stage_work`, busy shares
    relative to the busiest: the formula assumes them equal; `parallelism.busiest_stage_bubble`)."""

    mode: str
    stages: int
    microbatches: int
    theory: float
    measured: float
    expected: float
    idle_by_stage: tuple[float, ...]
    stage_work: tuple[float, ...]

    @property
    def difference(self) -> float:
        """measured − theory."""
        return self.measured - self.theory

    @property
    def unexplained(self) -> float:
        """measured − expected: sends, receives and the schedule's own work when positive; when
        negative, fill time that fell before the stage's clock started."""
        return self.measured - self.expected

    @property
    def equal_work(self) -> bool:
        """Every stage did at least `EQUAL_WORK_FROM` of the busiest stage's work."""
        return min(self.stage_work) >= EQUAL_WORK_FROM

    @property
    def verdict(self) -> str:
        """`BUBBLE_ABOVE`, `BUBBLE_BELOW` or `BUBBLE_AS_EXPECTED` (within `BUBBLE_TOLERANCE`)."""
        if self.unexplained > BUBBLE_TOLERANCE:
            return BUBBLE_ABOVE
        return BUBBLE_BELOW if self.unexplained < -BUBBLE_TOLERANCE else BUBBLE_AS_EXPECTED

    def row(self) -> dict[str, Any]:
        return {"mode": self.mode, "stages": self.stages, "microbatches": self.microbatches,
                "measured": self.measured, "theory": self.theory, "difference": self.difference,
                "per_stage": ", ".join(f"{b:.2f}" for b in self.idle_by_stage),
                "stage_work": ", ".join(f"{w:.2f}" for w in self.stage_work),
                "expected": self.expected, "unexplained": self.unexplained}


def bubble_findings(results: list[ModeResult]) -> list[BubbleFinding]:
    """A `BubbleFinding` for each pipeline run of `results` with a measurement on every stage."""
    out = []
    for r in results:
        bubble = r.run.get("pipeline_bubble")
        if not bubble:
            continue
        p, m = r.run["parallel"]["pp"], r.run["parallel"]["microbatches"]
        by_rank = bubble["measured_by_rank"]
        stages = [[b for i, b in enumerate(by_rank) if i % p == s and b is not None] for s in range(p)]
        if not all(stages):  # a stage with no measurement: nothing to compare
            continue
        idle = [statistics.mean(values) for values in stages]
        busy = [1 - x for x in idle]
        work = [b / max(busy) for b in busy]
        out.append(BubbleFinding(r.mode.label, p, m, bubble["theory"], min(idle),
                                 parallelism.busiest_stage_bubble(work, m), tuple(idle), tuple(work)))
    return out


def bubble_rows(results: list[ModeResult]) -> list[dict[str, Any]]:
    """The notebook's bubble table: each `bubble_findings` finding as a row (`BubbleFinding.row`)."""
    return [b.row() for b in bubble_findings(results)]


# The largest relative loss gap still called the same losses: the loosest the test suite holds
# a parallel mode to against one process (DeepSpeed's stages, and ZeRO-Offload against the
# same stage without it; torch's own modes stay under 1e-4). Summing in another order moves
# fp32 losses by far less.
SAME_LOSSES_BELOW = 1e-3
SAME_LOSSES = "the same losses, to float rounding"
DIFFERENT_LOSSES = "different losses"


def loss_verdict(gap: float) -> str:
    """`SAME_LOSSES` for a largest relative loss gap up to `SAME_LOSSES_BELOW`, else
    `DIFFERENT_LOSSES`."""
    return SAME_LOSSES if gap <= SAME_LOSSES_BELOW else DIFFERENT_LOSSES


@dataclass(frozen=True)
class ModeFigure:
    """One run's figure: its label and a value (a ratio to DDP's, or a loss gap)."""

    mode: str
    value: float


@dataclass(frozen=True)
class RunFindings:
    """What notebook 10's runs show (`findings`), against the DDP run on `nproc` processes:
    every run's per-rank memory over DDP's (`memory`, in run order) and the least of it; the run
    that sent the most per step (`most_sent_carries_activations`: it is tensor parallel, whose
    all-reduces carry activations, which grow with the batch, not with the model); the run with
    the slowest median step, its steps against DDP's (`slowest_steps`, in ms; None under 3 timed
    steps each) and `slowest_verdict` (`labkit.course.ladder.verdict`); the largest relative loss gap
    from one process and its verdict (`loss_verdict`)."""

    nproc: int
    device: str
    memory: tuple[ModeFigure, ...]
    least_memory: ModeFigure
    most_sent: ModeFigure
    most_sent_carries_activations: bool
    slowest: ModeFigure
    slowest_steps: stats.Comparison | None
    slowest_verdict: str
    largest_gap: ModeFigure
    losses_verdict: str

    @property
    def memory_floor(self) -> float:
        """The least a run could hold against DDP: every rank holding 1/`nproc` of everything."""
        return 1 / self.nproc


def findings(reference: ModeResult, results: list[ModeResult]) -> RunFindings:
    """The numbers and verdicts of `results` against the first DDP run (at the first run's
    process count, as `mode_table`) and the single-process `reference`."""
    nproc = results[0].mode.nproc if results else 0
    ddp = next((r for r in results if r.mode.parallel == "ddp" and r.mode.grad_compression == "none"
                and r.mode.nproc == nproc), None)
    if ddp is None:
        raise ParameterError("results", [r.mode.label for r in results],
                             f"no DDP run on {nproc} processes to compare the modes with")
    rows = mode_table(reference, results)

    def figures(key: str) -> list[ModeFigure]:
        return [ModeFigure(r["mode"], r[key]) for r in rows]

    def largest(key: str) -> int:
        return max(range(len(rows)), key=lambda i: rows[i][key])

    sent, slow, gap = largest("sent_vs_ddp"), largest("step_vs_ddp"), largest("loss_gap")
    try:
        steps = stats.compare([1000 * t for t in ddp.timed_steps], [1000 * t for t in results[slow].timed_steps],
                              higher_is_better=False)
    except ValueError:  # fewer than 3 timed steps on a side: no verdict
        steps = None
    memory = tuple(figures("vs_ddp"))
    return RunFindings(nproc, str(ddp.run.get("device", "cpu")), memory, min(memory, key=lambda f: f.value),
                       figures("sent_vs_ddp")[sent], results[sent].mode.parallel == "tp",
                       figures("step_vs_ddp")[slow], steps, ladder.verdict(steps),
                       figures("loss_gap")[gap], loss_verdict(rows[gap]["loss_gap"]))


def deepspeed_equivalents(base: TrainConfig, nproc: int) -> list[dict[str, Any]]:
    """The DeepSpeed config of each torch mode (what `--sharding-backend deepspeed` passes to
    `deepspeed.initialize`): ZeRO stage 0 is DDP; tp and pp have no config-only equivalent
    (DeepSpeed's PipelineModule and AutoTP change the model code)."""
    from labkit.torch.parallel.deepspeed import deepspeed_config

    rows = []
    for mode, stage in (("ddp", 0), ("zero1", 1), ("zero2", 2), ("zero3", 3)):
        cfg = deepspeed_config("zero1", base.batch_size, base.batch_size // nproc, base.grad_clip)
        cfg["zero_optimization"] = {"stage": stage}
        rows.append({"torch mode": mode, "deepspeed config": cfg})
    for mode in ("tp", "pp"):
        rows.append({"torch mode": mode, "deepspeed config": None})
    return rows


def offload_argv(base: TrainConfig, stage: int = 2) -> list[str]:
    """The deepspeed_zero recipe's flags for `base` at ZeRO `stage` with the optimizer offloaded
    to the CPU (`--offload-optimizer cpu`)."""
    from labkit.course import recipe_view

    return recipe_view.flags(base, stage=stage, offload_optimizer="cpu")


@dataclass(frozen=True)
class OffloadComparison:
    """The deepspeed_zero recipe with the optimizer offloaded beside `labkit train
    --sharding-backend deepspeed` at the same stage without it: `rows` per step (both losses,
    relative gap), the training `device`, `held` (each rank's optimizer bytes by the device
    holding them, offloaded) and `without` (each rank's optimizer bytes without offload, on the
    training device)."""

    rows: tuple[dict[str, Any], ...]
    device: str
    held: tuple[dict[str, int], ...]
    without: tuple[int, ...]

    @property
    def gap(self) -> float:
        """The largest relative loss gap, offload against none."""
        return max(r["relative gap"] for r in self.rows)

    @property
    def verdict(self) -> str:
        """`loss_verdict` of `gap`: `SAME_LOSSES` up to `SAME_LOSSES_BELOW`."""
        return loss_verdict(self.gap)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def gpu_bytes(self) -> int:
        """Optimizer bytes the ranks kept on a GPU with offload (all ranks)."""
        return sum(h.get("cuda", 0) for h in self.held)


def offload_comparison(argv: list[str], results: list[ModeResult], nproc: int) -> OffloadComparison:
    """Run the deepspeed_zero recipe with `argv` (optimizer offloaded) on `nproc` processes and
    set it beside the run of the same stage without offload in `results` (`labkit train
    --sharding-backend deepspeed`, same settings)."""
    from labkit.course import recipe_view

    stage = int(argv[argv.index("--stage") + 1])
    plain = next(r for r in results if r.mode.sharding_backend == "deepspeed"
                 and r.mode.parallel == f"zero{stage}" and r.mode.nproc == nproc)
    run = recipe_view.run("deepspeed_zero", argv, nproc=nproc)
    rows = [{"step": i, "loss without offload": a, "loss with offload": b, "relative gap": abs(b - a) / abs(a)}
            for i, (a, b) in enumerate(zip(plain.losses, run.losses, strict=True))]
    return OffloadComparison(tuple(rows), str(run.run.get("device", "cpu")),
                             tuple(run.run["optimizer_bytes_by_device"]),
                             tuple(m["optimizer_bytes"] for m in plain.memory_by_rank if m))


def measured_effective_tflops() -> tuple[float, str]:
    """The compute rate the decision table plans with, per GPU: what labkit's own GPT-2 small
    run reached on one H100 (bf16, compiled, batch 48), read from benchmarks/results, and a line
    saying where it comes from."""
    from labkit.hardware.cost import default_mfu_reference

    ref = default_mfu_reference()
    return ref.of_datasheet * ref.datasheet_tflops, ref.text()


def decision_rows(models: dict[str, GPTConfig] | None = None, gpus: tuple[int, ...] = (8, 64),
                  gpu_gib: tuple[float, ...] = (40, 80), effective_tflops: float | None = None
                  ) -> list[dict[str, Any]]:
    """`parallelism.decide` for each model, GPU count, GPU memory and interconnect, planning
    compute at `effective_tflops` per GPU (default: `measured_effective_tflops`)."""
    if effective_tflops is None:
        effective_tflops, _ = measured_effective_tflops()
    rows = []
    for name, cfg in (models or parallelism.reference_models()).items():
        for n in gpus:
            for mem in gpu_gib:
                for link in parallelism.INTERCONNECTS:
                    d = parallelism.decide(cfg, n, mem, link, effective_tflops=effective_tflops)
                    rows.append({"model": name, "gpus": n, "GiB": mem, "interconnect": link.name,
                                 "mode": d["mode"], "layout": d["layout"], "GiB_per_rank": d["GiB_per_rank"],
                                 "usable_GiB": d["usable_GiB"], "step_s": d["step_s"], "comm_s": d["comm_s_per_step"],
                                 "exposed_comm_s": d["exposed_comm_s"], "micro_batches": d["micro_batches"],
                                 "smallest_tp_pp": d["smallest_tp_pp"], "rule": d["rule"]})
    return rows


def plan_summary(plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per model and GPU count of `parallelism.plan_table`: the modes with a layout that
    fits within the margin, the leanest layout, and the planner's choice (the `decide` answer for
    the same arguments), with why the two differ when they do."""
    rows = []
    for key in dict.fromkeys((r["model"], r["gpus"]) for r in plan):
        mine = [r for r in plan if (r["model"], r["gpus"]) == key]
        leanest = min(mine, key=lambda r: r["total_GiB"])
        chosen = next((r for r in mine if r["chosen"]), None)
        fit = ", ".join(dict.fromkeys(r["mode"] for r in mine if r["fits"])) or "none"
        row = {"model": key[0], "params_B": mine[0]["params_B"], "gpus": key[1], "usable_GiB": mine[0]["usable_GiB"],
               "modes that fit": fit, "leanest": leanest["layout"], "leanest_GiB": leanest["total_GiB"],
               "chosen": chosen["layout"] if chosen else "none fits" if fit == "none" else "not timed (no rate)",
               "chosen_GiB": chosen["total_GiB"] if chosen else None, "step_s": chosen["step_s"] if chosen else None}
        row["why not the leanest"] = _leaner_note(leanest, chosen)
        rows.append(row)
    return rows


def _leaner_note(leanest: dict[str, Any], chosen: dict[str, Any] | None) -> str:
    if chosen is None or chosen is leanest:
        return ""
    if not leanest["fits"]:
        return f"the leanest needs {leanest['total_GiB']:.1f} GiB: over the margin"
    if not leanest["considered"]:
        return "the leanest splits the model further than memory needs"
    return f"the leanest takes {leanest['step_s']:.2f} s/step: more communication left exposed"


def decision_summary(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`decision_rows` with one column per interconnect: the layout chosen there and its step."""
    rows: dict[tuple, dict[str, Any]] = {}
    for d in decisions:
        row = rows.setdefault((d["model"], d["gpus"], d["GiB"]), {"model": d["model"], "gpus": d["gpus"], "GiB": d["GiB"]})
        row[d["interconnect"]] = d["layout"] + (f" ({d['step_s']:.3g} s/step)" if d["step_s"] is not None else "")
    return list(rows.values())


def grid_rows(models: dict[str, GPTConfig] | None = None, gpus: tuple[int, ...] = (8, 64),
              gpu_gib: tuple[float, ...] = (40, 80), link: parallelism.Interconnect | None = None,
              effective_tflops: float | None = None) -> list[dict[str, Any]]:
    """The chosen layout's TP × PP × DP degrees (`parallelism.plan`, the `decide` call) for each
    model, GPU count and GPU memory on `link` (default: the first of `parallelism.INTERCONNECTS`),
    with the rule that chose it."""
    link = link or parallelism.INTERCONNECTS[0]
    if effective_tflops is None:
        effective_tflops, _ = measured_effective_tflops()
    rows = []
    for name, cfg in (models or parallelism.reference_models()).items():
        for n in gpus:
            for mem in gpu_gib:
                d = parallelism.decide(cfg, n, mem, link, effective_tflops=effective_tflops)
                rows.append({"model": name, "gpus": n, "GiB": mem, "interconnect": link.name, "layout": d["layout"],
                             "tp": d["tp"], "pp": d["pp"], "dp": d["dp"], "micro_batches": d["micro_batches"],
                             "bubble": d["bubble"], "GiB_per_rank": d["GiB_per_rank"],
                             "fit / weighed": f"{d['layouts_fit']} / {d['layouts_weighed']}", "rule": d["rule"]})
    return rows


def weighed_rows(model: str, gpus: int, gpu_gib: float, link: parallelism.Interconnect | None = None,
                 effective_tflops: float | None = None) -> list[dict[str, Any]]:
    """Every layout `parallelism.plan` weighed for one reference model on `gpus` × `gpu_gib`: the
    fitting ones fastest first, then the rest by GiB; `weighed` says whether the choice was made
    among it (pure data parallelism, or the smallest tp·pp that fits)."""
    link = link or parallelism.INTERCONNECTS[0]
    if effective_tflops is None:
        effective_tflops, _ = measured_effective_tflops()
    p = parallelism.plan(parallelism.reference_models()[model], gpus, gpu_gib, link, effective_tflops=effective_tflops)
    considered = set(map(id, p.considered()))
    order = sorted(p.candidates, key=lambda c: (not c.fits, c.step_s if c.fits else c.total_bytes))
    return [{"layout": c.label(), "mode": c.mode, "GiB_per_rank": c.total_bytes / parallelism.GIB,
             "fits": c.fits, "weighed": id(c) in considered, "step_s": c.step_s, "bubble": c.bubble,
             "exposed_comm_s": c.exposed_s, "of_comm_s": c.comm_s, "chosen": c is p.choice} for c in order]


@dataclass(frozen=True)
class Clash:
    """A cell where `table` gives another layout than the decision table (`decided`)."""

    table: str
    model: str
    gpus: int
    gib: float
    interconnect: str
    layout: str
    decided: str


# Why a chosen layout changes across a row of the decision table (`LayoutChange.reason`).
STEP_TIMES = "the interconnect changes only the step times"
OVER_MEMORY = "the larger GPU's layout needs more than the smaller GPU has usable"
ANOTHER_SPLIT = "another smallest tp·pp fits the smaller GPU"
SMALLER_MICRO_BATCHES = "the same layouts with smaller micro-batches"


@dataclass(frozen=True)
class LayoutChange:
    """One model on one GPU count whose chosen layout changes across `cells` (its decision rows,
    one per value of what varies, the rest held), and why (`reason`)."""

    model: str
    gpus: int
    cells: tuple[dict[str, Any], ...]
    reason: str

    @property
    def smaller(self) -> dict[str, Any]:
        """The cell with the least GPU memory."""
        return min(self.cells, key=lambda r: r["GiB"])

    @property
    def larger(self) -> dict[str, Any]:
        """The cell with the most GPU memory."""
        return max(self.cells, key=lambda r: r["GiB"])


@dataclass(frozen=True)
class ViewCheck:
    """How the page's tables relate (`view_check`): how many cells the memory and layout tables
    share with the decision table, those where they give another layout (none: they are one
    planner's answer), and the changes across interconnects and across GPU memory."""

    shared: int
    clashes: tuple[Clash, ...]
    by_interconnect: tuple[LayoutChange, ...]
    by_memory: tuple[LayoutChange, ...]


def view_check(plan: list[dict[str, Any]], decisions: list[dict[str, Any]],
               grid: list[dict[str, Any]]) -> ViewCheck:
    """Where the memory table (`plan`) or the layout table (`grid`) shares a model, GPU count,
    GPU memory and interconnect with the decision table (`decisions`) they must give the same
    layout (one `plan` call); where the decision table's layout changes with the interconnect or
    the GPU memory, the assumption that differs."""
    answer = {(d["model"], d["gpus"], d["GiB"], d["interconnect"]): d for d in decisions}
    views = [((r["model"], r["gpus"], r["gpu_GiB"], r["interconnect"]), r["layout"], "memory table")
             for r in plan if r["chosen"]]
    views += [((g["model"], g["gpus"], g["GiB"], g["interconnect"]), g["layout"], "layout table") for g in grid]
    shared = [(k, layout, name) for k, layout, name in views if k in answer]
    clashes = tuple(Clash(name, *k, layout, answer[k]["layout"])
                    for k, layout, name in shared if layout != answer[k]["layout"])
    return ViewCheck(len(shared), clashes, tuple(_changes(decisions, "GiB", lambda rows: STEP_TIMES)),
                     tuple(_changes(decisions, "interconnect", _memory_reason)))


def _changes(decisions: list[dict[str, Any]], fixed: str, why: Any) -> list[LayoutChange]:
    """One change per model, GPU count and `fixed` value whose layout changes across the rest."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for d in decisions:
        groups.setdefault((d["model"], d["gpus"], d[fixed]), []).append(d)
    return [LayoutChange(model, gpus, tuple(rows), why(rows)) for (model, gpus, _), rows in groups.items()
            if len({r["layout"] for r in rows}) > 1]


def _memory_reason(rows: list[dict[str, Any]]) -> str:
    big = max(rows, key=lambda r: r["GiB"])
    small = min(rows, key=lambda r: r["GiB"])
    if big["GiB_per_rank"] is not None and big["GiB_per_rank"] > small["usable_GiB"]:
        return OVER_MEMORY
    if (small["smallest_tp_pp"] or 0) > (big["smallest_tp_pp"] or 0):
        return ANOTHER_SPLIT
    return SMALLER_MICRO_BATCHES


def course_modes(processes: int = 2, four: bool = True, deepspeed: bool = True,
                 microbatches: int = 4) -> list[Mode]:
    """The runs of notebook 10: every torch mode on `processes` processes (zero3 with and
    without resharding, the pipeline under both schedules), the three DeepSpeed stages when
    DeepSpeed is installed, and with `four` the 2 × 2 layouts (tp and pp beside data parallelism)."""
    modes = [Mode("ddp", processes), Mode("zero1", processes), Mode("zero2", processes),
             Mode("zero3", processes), Mode("zero3", processes, reshard_after_forward=False),
             Mode("tp", processes), Mode("pp", processes, pp_schedule="gpipe", microbatches=microbatches),
             Mode("pp", processes, pp_schedule="1f1b", microbatches=microbatches)]
    if deepspeed:
        modes += [Mode(f"zero{s}", processes, sharding_backend="deepspeed") for s in (1, 2, 3)]
    if four:
        modes += [Mode("tp", 4, tp_degree=2), Mode("pp", 4, pp_degree=2, microbatches=microbatches)]
    return modes
