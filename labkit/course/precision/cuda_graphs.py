"""Notebook 04's CUDA graphs (`compile_mode="reduce-overhead"`) and the whole step as one CUDA
graph (`cuda_graph_step`): GPU only, so their gains are read from the H100 benchmark results
files (device, date, file named, runs counted), with a verdict where the files hold the repeated
runs one needs; the notebook says whether its own run could measure them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.course import ladder, references

RESNET_H100 = "2026-11-22-h100-bench-torch-resnet.json"
GPT_LEVERS_H100 = "2026-11-22-h100-gpt-levers-graphs.json"
# Three runs of `benchmarks/bench_torch.py --best-only --skip-resnet --batches 12`, each timing
# labkit's best GPT settings with and without the whole step as one graph, in turns.
STEP_GRAPH_H100 = tuple(f"2026-11-26-h100-bench-torch-gpt-b12-run{i}.json" for i in (1, 2, 3))
# bench_torch.py's names of the two variants (LABKIT_GPT_BEST, LABKIT_GPT_STEP_GRAPH).
BEST_GPT = "labkit best: + fp8 head + compile_mode=tuned"
STEP_GRAPH_GPT = "labkit + whole-step CUDA graph"


def cuda_graph_gains() -> list[dict[str, Any]]:
    """Throughput with and without CUDA graphs on an H100, from the results files (empty when
    they are not here)."""
    rows = []
    resnet, gpt = references.results_path(RESNET_H100), references.results_path(GPT_LEVERS_H100)
    if resnet is not None:
        data = json.loads(resnet.read_text())
        rate = {r["variant"]: r["rate"] for r in data["rows"]}
        base = "labkit bf16 + channels_last + compile"
        rows.append(_gain("ResNet-50, batch 256", base, rate[base], rate[base + " (reduce-overhead)"],
                          "images/s", data, resnet))
    if gpt is not None:
        data = json.loads(gpt.read_text())
        rate = {r["lever"]: r["tokens_per_s"] for r in data["rows"]}
        rows.append(_gain(f"GPT-2 small, batch {data['batch']}", "bf16 + compile", rate["base"],
                          rate["graphs"], "tokens/s", data, gpt))
        rows.append(_gain(f"GPT-2 small, batch {data['batch']}", "bf16 + compile + fp8 head",
                          rate["fp8-head"], rate["fp8-head+graphs"], "tokens/s", data, gpt))
    return rows


def _gain(workload: str, base: str, without: float, with_graphs: float, unit: str,
          data: dict[str, Any], path: Path) -> dict[str, Any]:
    return {"workload": workload, "configuration": base, "without graphs": without,
            "with CUDA graphs": with_graphs, "unit": unit, "gain": with_graphs / without,
            "runs": 1, "verdict": ladder.verdict(None),
            "device": data["device"], "date": data["date"], "source": references.source(path)}


def whole_step_graph() -> dict[str, Any] | None:
    """labkit's best GPT-2 settings on an H100 (bf16, compile_mode="tuned" with its CUDA graphs
    of forward and backward, the fp8 head) against the same with the whole step, optimizer
    included, as one CUDA graph, from the three results files of `STEP_GRAPH_H100`: the medians,
    ranges, gain and verdict of the runs. None when the files are not here."""
    paths = [references.results_path(name) for name in STEP_GRAPH_H100]
    if any(p is None for p in paths):
        return None
    files = [json.loads(p.read_text()) for p in paths]
    rows = [{r["variant"]: r for r in data["rows"]} for data in files]
    c = stats.compare([r[BEST_GPT]["rate"] for r in rows], [r[STEP_GRAPH_GPT]["rate"] for r in rows])
    batch = rows[0][BEST_GPT]["workload"].split("b=")[-1]  # "GPT b=12": bench_torch.py's GPT-2 small
    return {"workload": f"GPT-2 small, batch {batch}",
            "configuration": "bf16 + compile (tuned) + fp8 head", "without": c.a.median, "with": c.b.median,
            "without_low": c.a.low, "without_high": c.a.high, "with_low": c.b.low, "with_high": c.b.high,
            "unit": "tokens/s", "runs": len(files), "gain": c.ratio, "verdict": ladder.verdict(c),
            "device": files[0]["device"], "date": files[0]["date"],
            "sources": [references.source(p) for p in paths]}
