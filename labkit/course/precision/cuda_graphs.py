"""Notebook 04's CUDA graphs (`compile_mode="reduce-overhead"`) and the whole step as one CUDA
graph (`cuda_graph_step`): GPU only, so their gains are read from the H100 benchmark results
files (device, date, file named), and the run says whether it could measure them itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.course import references

RESNET_H100 = "2026-11-22-h100-bench-torch-resnet.json"
GPT_LEVERS_H100 = "2026-11-22-h100-gpt-levers-graphs.json"


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
            "device": data["device"], "date": data["date"], "source": references.source(path)}


def cuda_graph_conclusions(rows: list[dict[str, Any]], device: str) -> list[str]:
    """What CUDA graphs bought on the reference GPU, and what this run can say about them."""
    if not rows:
        return [references.NO_RESULTS + "."]
    out = [f"{r['workload']}, {r['configuration']}: CUDA graphs took {r['without graphs']:,.0f} to "
           f"{r['with CUDA graphs']:,.0f} {r['unit']} ({r['gain']:.3f}×) on {r['device']} "
           f"({r['source']}, {r['date']}; one run each)." for r in rows]
    out.append("The whole step as one CUDA graph (labkit train --cuda-graph-step: forward, backward, "
               "clipping and the fused AdamW update replayed in one launch) has no measurement in "
               "the results files yet.")
    if not device.startswith("cuda"):
        out.append(f"This run is on {device}: CUDA graphs need a CUDA GPU, so none of this is "
                   f"measured here.")
    return out
