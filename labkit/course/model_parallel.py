"""Notebook 10's measurements: one GPT trained in every parallel mode, each on real local
processes through `labkit train`, beside a single process at the same global batch.

`Mode` names one run (mode, processes, degrees, backend); `run_modes` trains each and returns a
`ModeResult` per run (per-step losses, what every rank held, bytes it sent per step, step time,
the pipeline's measured bubble). `mode_table`, `calculator_check` and `bubble_rows` turn them
into the notebook's tables; `bubble_answer` explains the measured bubble in the direction it went.

The planning tables (`plan_summary`, `decision_rows`, `grid_rows`, `weighed_rows`) are views of
one answer, `labkit.core.parallelism.plan` (the calculator and planner live there), over
different grids of models, GPU counts, GPU memory and interconnects; `view_notes` checks that
they agree where they meet and names the assumption behind each cell that changes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from labkit.core import parallelism
from labkit.core.config import resolve_scale
from labkit.core.models import GPTConfig, build_config
from labkit.core.progress import track
from labkit.core.train_config import TrainConfig


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
    def step_time_s(self) -> float:
        """Median step time past the first step (which builds buckets, exchanges shapes), without
        the steps whose collectives were counted (counting slows them)."""
        counted = set(self.run.get("comm_counted_steps") or [])
        times = [t for i, t in enumerate(self.step_times) if i > 0 and i not in counted]
        return statistics.median(times or self.step_times)

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


def bubble_rows(results: list[ModeResult]) -> list[dict[str, Any]]:
    """Each pipeline run's idle share against (p-1)/(m+p-1). labkit times, on every rank, its
    stage's schedule call (`schedule_s`, from the moment that stage enters it) and, inside it,
    the stage's forward, backward and loss (`busy_s`): idle = 1 − busy/schedule. Per stage (the
    mean over the replicas): `measured` is the busiest stage's idle share (it sets the pace), and
    `expected` what the schedule gives with the stages' measured work (`stage_work`, busy shares
    relative to the busiest: the formula assumes them equal; `parallelism.busiest_stage_bubble`).
    `unexplained` = measured − expected: sends, receives and the schedule's own work when positive;
    when negative, fill time that fell before the stage's clock started."""
    rows = []
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
        measured, expected = min(idle), parallelism.busiest_stage_bubble(work, m)
        rows.append({"mode": r.mode.label, "stages": p, "microbatches": m, "measured": measured,
                     "theory": bubble["theory"], "difference": measured - bubble["theory"],
                     "per_stage": ", ".join(f"{b:.2f}" for b in idle),
                     "stage_work": ", ".join(f"{w:.2f}" for w in work),
                     "expected": expected, "unexplained": measured - expected})
    return rows


def memory_answer(rows: list[dict[str, Any]]) -> str:
    """The per-rank memory of every mode against DDP's, from `mode_table`'s rows, with the most
    a mode can save (each rank holding 1/N of everything)."""
    shares = [f"{r['mode']} {r['vs_ddp']:.2f}×" for r in rows if r["vs_ddp"] is not None]
    if not shares:
        return "no DDP run at the same process count to compare with"
    least = min((r for r in rows if r["vs_ddp"] is not None), key=lambda r: r["vs_ddp"])
    return (f"per-rank memory against DDP's: {', '.join(shares)}. Least: {least['mode']}; "
            f"section 2 splits each figure into parameters, gradients and optimizer state.")


BUBBLE_TOLERANCE = 0.02  # idle shares closer than this to the expectation are called a match


def bubble_answer(bubbles: list[dict[str, Any]]) -> str:
    """The measured idle share of each pipeline run against (p−1)/(m+p−1), from `bubble_rows`,
    explained in the direction the numbers went: unequal stages lower the busiest stage's idle
    share below the formula; what remains above the expectation is sends and the schedule's own
    work, what remains below it is fill time spent before that stage's clock started."""
    if not bubbles:
        return "no pipeline run here, so no bubble was measured"
    return " ".join(_bubble_sentence(b) for b in bubbles)


def _bubble_sentence(b: dict[str, Any]) -> str:
    out = (f"{b['mode']}: p={b['stages']}, m={b['microbatches']}, (p−1)/(m+p−1) = {b['theory']:.2f}, "
           f"measured {b['measured']:.2f} on the busiest stage ({b['difference']:+.2f}).")
    work = [float(w) for w in b["stage_work"].split(", ")]
    if min(work) < 0.95:
        out += (f" The stages did unequal work ({b['stage_work']} of the busiest; the last also runs the output "
                f"head and the loss), so the busiest one waits only for the others' shorter fill and drain: "
                f"expected {b['expected']:.2f}.")
    else:
        out += f" The stages did nearly equal work ({b['stage_work']}): expected {b['expected']:.2f}."
    gap = b["unexplained"]
    if gap > BUBBLE_TOLERANCE:
        out += (f" The remaining {gap:+.2f} is time inside the schedule spent neither in forward, backward nor "
                f"loss: sends and receives between the stages and the schedule's own launches, which labkit "
                f"counts as idle.")
    elif gap < -BUBBLE_TOLERANCE:
        out += (f" It came out {gap:+.2f} below even that: labkit starts each stage's clock when that stage "
                f"enters the schedule, and a stage that enters later (still finishing the previous step's "
                f"optimizer update and gradient reduction) finds its first micro-batch waiting, so part of its "
                f"fill fell outside the timed window.")
    else:
        out += f" The measurement matches that within ±{BUBBLE_TOLERANCE:.2f}."
    return out


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


def offload_comparison(argv: list[str], results: list[ModeResult], nproc: int) -> dict[str, Any]:
    """Run the deepspeed_zero recipe with `argv` (optimizer offloaded) on `nproc` processes and
    set it beside the run of the same stage without offload in `results` (`labkit train
    --sharding-backend deepspeed`, same settings): `rows` per step (both losses, relative gap),
    `gap` (the largest), `held` (each rank's optimizer bytes by the device holding them, offloaded)
    and `without` (each rank's optimizer bytes without offload, on the training device)."""
    from labkit.course import recipe_view

    stage = int(argv[argv.index("--stage") + 1])
    plain = next(r for r in results if r.mode.sharding_backend == "deepspeed"
                 and r.mode.parallel == f"zero{stage}" and r.mode.nproc == nproc)
    run = recipe_view.run("deepspeed_zero", argv, nproc=nproc)
    rows = [{"step": i, "loss without offload": a, "loss with offload": b, "relative gap": abs(b - a) / abs(a)}
            for i, (a, b) in enumerate(zip(plain.losses, run.losses, strict=True))]
    return {"rows": rows, "gap": max(r["relative gap"] for r in rows), "device": run.run.get("device", "cpu"),
            "held": run.run["optimizer_bytes_by_device"],
            "without": [m["optimizer_bytes"] for m in plain.memory_by_rank if m]}


def offload_lines(offload: dict[str, Any]) -> list[str]:
    """What `offload_comparison` showed, in sentences computed from it."""
    out = [f"largest relative loss gap, offload vs none: {offload['gap']:.1e} "
           f"({'within' if offload['gap'] <= 1e-3 else 'OUTSIDE'} DeepSpeed's 1e-3)"]
    for rank, (held, without) in enumerate(zip(offload["held"], offload["without"], strict=True)):
        where = ", ".join(f"{b / 1024:,.1f} KiB on {d}" for d, b in sorted(held.items()))
        out.append(f"rank {rank} optimizer state: offloaded {where}; without offload {without / 1024:,.1f} KiB "
                   f"on the training device")
    device = str(offload["device"])
    if device.startswith("cuda"):
        on_gpu = sum(h.get("cuda", 0) for h in offload["held"])
        out.append(f"the GPUs kept {on_gpu / 1024:,.1f} KiB of optimizer state with offload "
                   f"(vs {sum(offload['without']) / 1024:,.1f} KiB without)")
    else:
        out.append(f"these processes trained on {device}: the 'device' is host memory too, so offload moved "
                   f"nothing here; on a GPU the GPU's share of these bytes drops to ~0")
    return out


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


def view_notes(plan: list[dict[str, Any]], decisions: list[dict[str, Any]],
               grid: list[dict[str, Any]]) -> list[str]:
    """How the page's tables relate: where two share a model, GPU count, GPU memory and
    interconnect they must give the same layout (one `plan` call); where cells differ, the
    assumption that differs between them."""
    answer = {(d["model"], d["gpus"], d["GiB"], d["interconnect"]): d for d in decisions}
    views = [((r["model"], r["gpus"], r["gpu_GiB"], r["interconnect"]), r["layout"], "memory table")
             for r in plan if r["chosen"]]
    views += [((g["model"], g["gpus"], g["GiB"], g["interconnect"]), g["layout"], "layout table") for g in grid]
    shared = [(k, layout, name) for k, layout, name in views if k in answer]
    clash = [f"{name} says {layout} for {k[0]} on {k[1]} × {k[2]:g} GiB, {k[3]}; the decision table says "
             f"{answer[k]['layout']}" for k, layout, name in shared if layout != answer[k]["layout"]]
    out = clash or [f"the memory, decision and layout tables share {len(shared)} cells and give the same layout in "
                    f"every one: they are one planner's answer"]
    out += _differences(decisions, "interconnect", "GiB", lambda rows: (
        "the interconnect differs: it changes only the step times, so a layout whose communication hides on "
        "the faster link can lose on the slower one"))
    out += _differences(decisions, "GiB", "interconnect", _memory_reason)
    return out


def _differences(decisions: list[dict[str, Any]], varying: str, fixed: str, why: Any) -> list[str]:
    """One line per model, GPU count and `fixed` value whose layout changes with `varying`."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for d in decisions:
        groups.setdefault((d["model"], d["gpus"], d[fixed]), []).append(d)
    out = []
    for (model, gpus, held), rows in groups.items():
        if len({r["layout"] for r in rows}) > 1:
            where = "; ".join(f"{r[varying]}{' GiB' if varying == 'GiB' else ''}: {r['layout']}" for r in rows)
            out.append(f"{model} on {gpus} GPUs, {held}{' GiB' if fixed == 'GiB' else ''}: {where}. {why(rows)}")
    return out


def _memory_reason(rows: list[dict[str, Any]]) -> str:
    big = max(rows, key=lambda r: r["GiB"])
    small = min(rows, key=lambda r: r["GiB"])
    if big["GiB_per_rank"] is not None and big["GiB_per_rank"] > small["usable_GiB"]:
        return (f"the GPU memory differs: {big['layout']} needs {big['GiB_per_rank']:.1f} GiB per GPU, over the "
                f"{small['usable_GiB']:.1f} usable on the {small['GiB']:g} GiB one")
    if (small["smallest_tp_pp"] or 0) > (big["smallest_tp_pp"] or 0):
        return (f"the GPU memory differs: on {small['GiB']:g} GiB the smallest tp·pp that fits is "
                f"{small['smallest_tp_pp']}, so other layouts are weighed")
    return ("the GPU memory differs: the same layouts are weighed, but with less memory each holds smaller "
            "micro-batches (more accumulation steps), which changes their step times")


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


def conclusions(reference: ModeResult, results: list[ModeResult]) -> list[str]:
    """What this run showed, in sentences computed from it."""
    rows = {r["mode"]: r for r in mode_table(reference, results)}
    out = []
    worst = max(rows.values(), key=lambda r: r["loss_gap"])
    out.append(f"Every mode reproduced the single process's losses: the largest relative gap was "
               f"{worst['loss_gap']:.1e} ({worst['mode']}).")
    sharded = [r for r in rows.values() if r["vs_ddp"] is not None]
    least = min(sharded, key=lambda r: r["vs_ddp"])
    out.append(f"{least['mode']} held the least per rank: {least['vs_ddp']:.2f}× of DDP's bytes.")
    most = max(sharded, key=lambda r: r["sent_vs_ddp"])
    why = (": its all-reduces carry activations, which grow with the batch, not with the model"
           if most["mode"].startswith("tp") else "")
    out.append(f"{most['mode']} sent the most per step, {most['sent_vs_ddp']:.2f}× DDP's bytes{why}.")
    slowest = max(sharded, key=lambda r: r["step_vs_ddp"])
    out.append(f"{slowest['mode']} had the slowest step here, {slowest['step_vs_ddp']:.2f}× DDP's "
               f"(CPU processes on a shared machine: an order, not a GPU forecast).")
    return out
