"""Notebook 06's measurements beyond the library's: all-reduce bandwidth against message size
(the plot of `labkit.hardware.allreduce`'s report), and gradient compression: what DDP's fp16,
bf16 and PowerSGD communication hooks save in bytes, what they cost in compute and in loss, and
the interconnect bandwidth below which they pay off.

`compare(base, nproc)` trains `base` once per hook (`labkit train --grad-compression ...` on
`nproc` local processes) and reads back the bytes each rank sent per step (counted from the
collectives) and the losses. `compression_cost(base)` times the hooks' arithmetic on tensors
shaped like the model's gradients (interleaved repeats). Compression pays when the seconds the
saved bytes take on the link exceed that cost: break-even bandwidth = saved bytes / cost.

The Reduction Server plan: `reducer_job(plan, config, output_uri=...)` builds the training job
a `labkit.vertex.reduction.plan_reducers` plan describes (the plan has printed its own warning),
and `reducer_rows(nodes)` sets the plan and its price side by side for machines where reducers
help and where they do not (`REDUCER_EXAMPLES`).

Watching a job: `tensorboard_spec_rows(spec)` shows the fields Vertex AI TensorBoard needs,
`tensorboard_rows(logdir)` the event files a job left under AIP_TENSORBOARD_LOG_DIR and their
scalar tags, `nccl_log_lines(job)` how many lines NCCL logged in an emulated job's replicas.

Everything here returns numbers and rows; notebook 06 writes the sentences.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

from labkit.core.train_config import TrainConfig
from labkit.course.plots import finish, new_figure
from labkit.hardware.allreduce import AllReduceReport


@dataclass(frozen=True)
class Hook:
    """One `--grad-compression` setting."""

    kind: str = "none"
    rank: int = 1

    @property
    def label(self) -> str:
        return f"powersgd r={self.rank}" if self.kind == "powersgd" else self.kind


HOOKS = (Hook("none"), Hook("fp16"), Hook("bf16"), Hook("powersgd", 1), Hook("powersgd", 4))


def compare(base: TrainConfig, nproc: int = 2, hooks: tuple[Hook, ...] = HOOKS) -> list[dict[str, Any]]:
    """One run per hook: bytes each rank sent per step (the busiest rank), final loss, and the
    largest gap from the uncompressed run's per-step losses."""
    from labkit.train import run_replicas

    out = []
    for h in hooks:
        log = run_replicas(replace(base, grad_compression=h.kind, powersgd_rank=h.rank), nproc)
        sent = [b for b in log.run.get("comm_bytes_by_rank") or [] if b is not None]
        out.append({"hook": h.label, "sent_KiB_per_step": max(sent) / 1024 if sent else None,
                    "losses": log.losses, "final_loss": log.losses[-1]})
    plain = out[0]["losses"]
    for row in out:
        row["vs_none"] = row["sent_KiB_per_step"] / out[0]["sent_KiB_per_step"]
        row["max_loss_gap"] = max(abs(a - b) for a, b in zip(row["losses"], plain, strict=True))
    return out


def compression_cost(base: TrainConfig, hooks: tuple[Hook, ...] = HOOKS, *, repeats: int = 5,
                     iterations: int = 20) -> dict[str, dict[str, float]]:
    """Milliseconds per step of each hook's arithmetic on tensors shaped like the model's
    gradients, timed on their own (a whole backward pass varies more than the hooks cost):
    fp16/bf16 cast the flat gradients down and back; PowerSGD of rank r runs, per matrix M,
    P = M·Q, orthogonalises P, Q = Mᵀ·P, rebuilds P·Qᵀ and keeps the error for the next step.
    Median and spread over `repeats` interleaved repeats of `iterations` steps, after one
    discarded round."""
    import torch

    from labkit.core.config import resolve_scale
    from labkit.core.models import build_config
    from labkit.torch.models import build_model

    torch.manual_seed(base.seed)
    grads = [torch.randn_like(p) for p in build_model(build_config(base.model, resolve_scale(base.scale))).parameters()]
    matrices = [g.reshape(g.shape[0], -1) for g in grads if g.dim() >= 2]
    flat = torch.cat([g.reshape(-1) for g in grads])

    def cast(dtype):
        def run() -> None:
            flat.copy_(flat.to(dtype).div_(2).to(torch.float32))
        return run

    def powersgd(rank: int):
        qs = [torch.randn(m.shape[1], min(rank, *m.shape)) for m in matrices]

        def run() -> None:
            for m, q in zip(matrices, qs, strict=True):
                p, _ = torch.linalg.qr(m @ q)
                q.copy_(m.T @ p)
                error = m - p @ q.T  # error feedback, added to the next step's gradient
                del error
        return run

    work = {h: (lambda: None) if h.kind == "none" else cast(torch.float16) if h.kind == "fp16"
            else cast(torch.bfloat16) if h.kind == "bf16" else powersgd(h.rank) for h in hooks}
    samples: dict[Hook, list[float]] = {h: [] for h in hooks}
    for round_ in range(repeats + 1):  # round 0 warms up (first allocations, thread pools): discarded
        for h, run in work.items():
            start = time.perf_counter()
            for _ in range(iterations):
                run()
            if round_:
                samples[h].append((time.perf_counter() - start) / iterations)
    return {h.label: {"cost_ms": 1000 * statistics.median(s), "spread_ms": 1000 * (max(s) - min(s))}
            for h, s in samples.items()}


# Why a hook has no break-even bandwidth (`break_even`'s `note`; "" when it has one).
SAVED_NOTHING = "saved no bytes"
COST_IN_NOISE = "cost within the spread of its repeats: no break-even"


def break_even(rows: list[dict[str, Any]], costs: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """Per hook: bytes saved per step, its measured cost, and the bandwidth below which the
    saved bytes take longer to send than the hook takes to compute. None, with the reason in
    `note`, when it saved nothing or its cost is not larger than the spread of its repeats (a
    break-even from a cost lost in the noise would be a guess)."""
    plain = rows[0]["sent_KiB_per_step"] * 1024
    out = []
    for row in rows[1:]:
        saved = plain - row["sent_KiB_per_step"] * 1024
        cost = costs[row["hook"]]
        measurable = cost["cost_ms"] > max(cost["spread_ms"], 0.0)
        note = "" if measurable and saved > 0 else SAVED_NOTHING if saved <= 0 else COST_IN_NOISE
        out.append({"hook": row["hook"], "saved_KiB_per_step": saved / 1024,
                    "cost_ms_per_step": cost["cost_ms"], "spread_ms": cost["spread_ms"],
                    "break_even_MB_per_s": saved / (cost["cost_ms"] / 1000) / 1e6 if not note else None,
                    "note": note, "max_loss_gap": row["max_loss_gap"]})
    return out


# ---------------------------------------------------------------- all-reduce bandwidth


def plot_allreduce_bandwidth(report: AllReduceReport, path: str | os.PathLike | None = None,
                             link_limit_gbps: float | None = None):
    """Algorithm and bus bandwidth against message size (log scale)."""
    fig, ax = new_figure((7, 4))
    sizes = [r.size_bytes for r in report.results]
    ax.plot(sizes, [r.busbw_gbps for r in report.results], "o-", label="bus bandwidth")
    ax.plot(sizes, [r.algbw_gbps for r in report.results], "s--", label="algorithm bandwidth")
    if link_limit_gbps:
        ax.axhline(link_limit_gbps, color="grey", linestyle=":", label="link limit")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(allreduce_title(report))
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return finish(fig, path)


def allreduce_title(report: AllReduceReport) -> str:
    """What was measured: processes, device, backend (the heading of its table and plot)."""
    return f"all-reduce, {report.world_size} x {report.device}, backend {report.backend}"


# ---------------------------------------------------------------- the Reduction Server

# (machine type, GPU, GPUs per node): A100 nodes where reducers help, then the H100 and H200
# machines: A3 High (no GPUDirect stack on Vertex), A3 Mega (TCPXO) and A3 Ultra (RDMA).
REDUCER_EXAMPLES = (("a2-highgpu-8g", "NVIDIA_TESLA_A100", 8), ("a3-highgpu-8g", "NVIDIA_H100_80GB", 8),
                    ("a3-megagpu-8g", "NVIDIA_H100_MEGA_80GB", 8), ("a3-ultragpu-8g", "NVIDIA_H200_141GB", 8))


def reducer_job(plan: Any, config: dict[str, Any], *, output_uri: str, **options: Any) -> Any:
    """`labkit.vertex.training_job` for `plan`'s training nodes and its reducers (none when the
    plan proposes none). The plan's own text already carries its warning, so the job builder's
    `ReductionServerWarning` is not issued a second time."""
    from labkit.vertex import training_job
    from labkit.vertex.reduction import ReductionServerWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReductionServerWarning)
        return training_job(config, output_uri=output_uri, machine_type=plan.machine_type,
                            accelerator_type=plan.accelerator_type, accelerator_count=plan.accelerator_count,
                            replica_count=plan.nodes, reduction_server_count=plan.count,
                            reduction_server_machine_type=plan.reducer_machine_type, **options)


def reducer_rows(nodes: int, examples: tuple[tuple[str, str, int], ...] = REDUCER_EXAMPLES) -> list[dict[str, Any]]:
    """One row per machine: whether reducers help on `nodes` of it, the bandwidth they can use,
    the reducers "auto" proposes, and what they and the training nodes cost per hour."""
    from labkit.vertex.machines import network_gbps
    from labkit.vertex.reduction import plan_reducers, price_plan

    rows = []
    for machine, gpu, count in examples:
        plan = plan_reducers("auto", nodes, machine, gpu, accelerator_count=count)
        cost = price_plan(plan)
        usable = plan.sizing.worker_gbps if plan.sizing else None
        rows.append({"machine": f"{nodes} x {machine}", "helps": "yes" if plan.helps else "no",
                     "Gbps per node (all NICs)": network_gbps(machine, gpu, count),
                     "Gbps the reducers can use": usable, "reducers (auto)": plan.count,
                     "reducers $/h": cost.reducers_usd_hr, "training $/h": cost.training_usd_hr})
    return rows


# ---------------------------------------------------------------- Vertex AI TensorBoard, NCCL variables

def tensorboard_rows(logdir: str | os.PathLike) -> list[dict[str, Any]]:
    """One row per TensorBoard event file under `logdir`: its name, the steps it holds and the
    scalar tags in it, read back with the `tensorboard` package's reader."""
    from labkit.core.scalars import event_files, read_scalars

    rows = []
    for path in event_files(logdir):
        scalars = read_scalars(path)
        steps = sorted({s for values in scalars.values() for s, _ in values})
        rows.append({"event file": str(path).rsplit("/", 1)[-1],
                     "steps": f"{steps[0]}..{steps[-1]}" if steps else "none",
                     "scalar tags": ", ".join(sorted(scalars))})
    return rows


def tensorboard_spec_rows(spec: dict[str, Any]) -> list[dict[str, str]]:
    """The CustomJobSpec fields Vertex AI TensorBoard needs, as the spec has them."""
    base = (spec.get("base_output_directory") or {}).get("output_uri_prefix", "")
    return [{"field": "tensorboard", "value": spec.get("tensorboard", "(not set)")},
            {"field": "service_account", "value": spec.get("service_account", "(not set)")},
            {"field": "base_output_directory", "value": base or "(not set)"},
            {"field": "AIP_TENSORBOARD_LOG_DIR (set by Vertex)", "value": f"{base.rstrip('/')}/logs/" if base else "-"}]


def nccl_log_lines(job: Any) -> int:
    """Lines NCCL logged (``NCCL INFO``/``NCCL WARN``) across every replica of an emulated job."""
    return sum(line.count("NCCL INFO") + line.count("NCCL WARN") for r in job.runs for line in [r.log()])


def pool_env_lines(spec: dict[str, Any]) -> list[str]:
    """One line per worker pool of a job spec: the environment its container gets."""
    return [f"workerpool{i}.container_spec.env: "
            + ", ".join(f"{e['name']}={e['value']}" for e in pool["container_spec"].get("env", []))
            for i, pool in enumerate(spec["worker_pool_specs"]) if pool]
