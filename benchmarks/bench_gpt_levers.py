"""What each speed lever buys on GPT-2 small, against the compiled peer, in one run.

    python benchmarks/bench_gpt_levers.py                       # GPU: batch 12, every lever
    python benchmarks/bench_gpt_levers.py --batch 48 --levers base fp8-head
    python benchmarks/bench_gpt_levers.py --quick               # tiny model on CPU: checks the script

Every variant starts from the same initial weights and trains on the same fixed batch for the
same number of steps; its final loss shows that it trains, no more (on an H100, repeats of one
variant differed by about ±0.5 after 76 steps; tests/torch/test_fp8.py checks the fp8 maths).
One profiled step per variant splits GPU time into matmuls, attention, fused Triton kernels
(Inductor), the optimizer and the rest.

Levers (each is labkit's engine step, bf16 autocast + torch.compile + fused AdamW, plus):
  base        nothing more; the loss is read one step late, as `fit` does on one GPU; measured
              again as "sync", reading the loss every step (the peer's loop): what the late read buys
  graphs      CUDA graphs (`compile_mode="reduce-overhead"`): no launch gaps between kernels
  fp8-head    the output projection and the loss in one fp8 function (`TrainConfig.fp8_head`)
  fp8-head+graphs, fp8-head+tuned   fp8-head with CUDA graphs; and with CUDA graphs plus
              coordinate-descent tuning of Inductor's Triton kernels (`compile_mode="tuned"`)
  fp8-all     every Linear in fp8 with per-tensor dynamic scaling (`labkit.torch.fp8.Float8Linear`)
  step-graph, fp8-head+step-graph   the whole step (forward, backward, clipping, AdamW) replayed as
              one CUDA graph (`TrainConfig.cuda_graph_step`); with the fp8 head, Triton tuning kept
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_torch import _time_per_step, peer_gpt_step  # noqa: E402

from labkit.core.models import GPTConfig, flops_per_sample  # noqa: E402
from labkit.core.train_config import TrainConfig  # noqa: E402
from labkit.torch import engine, fp8, peak, trainer  # noqa: E402
from labkit.torch.distributed import DistInfo  # noqa: E402

# lever -> TrainConfig settings on top of bf16 + compile; fp8-all switches every Linear instead.
LEVERS = {"base": {}, "graphs": {"compile_mode": "reduce-overhead"}, "fp8-head": {"fp8_head": True},
          "fp8-head+graphs": {"fp8_head": True, "compile_mode": "reduce-overhead"},
          "fp8-head+tuned": {"fp8_head": True, "compile_mode": "tuned"},
          "fp8-all": {}, "step-graph": {"cuda_graph_step": True},
          "fp8-head+step-graph": {"fp8_head": True, "compile_mode": "tuned", "cuda_graph_step": True}}


def kernel_category(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "cudnn", "sdpa")):
        return "attention"
    if any(k in n for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul")):
        return "matmul"
    if "adam" in n:
        return "optimizer"
    if n.startswith("triton"):
        return "fused (Triton)"
    return "other"


def profile_step(step, device) -> dict[str, float]:
    """GPU milliseconds per kernel category over one step (empty if the profiler fails: the
    timings above it still stand)."""
    try:
        return _profile_step(step, device)
    except Exception as e:  # noqa: BLE001
        return {"categories": {}, "top": [], "profile_error": f"{type(e).__name__}: {e}"[:200]}


def _profile_step(step, device) -> dict:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    top = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", 0.0) if device.type == "cuda" else e.self_cpu_time_total
        if us <= 0 or (device.type == "cuda" and e.device_type.name != "CUDA"):
            continue
        totals[kernel_category(e.key)] += us / 1000
        top.append((us / 1000, e.key[:90]))
    top.sort(reverse=True)
    return {"categories": dict(totals), "top": top[:8]}


def run_lever(lever: str, cfg: GPTConfig, batch: int, device, warmup: int, iters: int) -> list[dict]:
    gpu = device.type == "cuda"
    settings = LEVERS[lever] if gpu else {}  # on CPU (--quick) only the script's plumbing is checked
    config = TrainConfig(model="gpt", batch_size=batch, precision="bf16" if gpu else "fp32", compile=gpu,
                         grad_clip=None, progress=False, seed=0, **settings)
    torch._dynamo.reset()
    c = engine.build(config, DistInfo(), device, cfg)
    switched = []
    if lever == "fp8-all":  # before the first call: torch.compile traces lazily
        switched = fp8.convert_linears(c.model, "all")
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randint(cfg.vocab_size, (batch, cfg.block_size), generator=g).to(device)
    y = torch.randint(cfg.vocab_size, (batch, cfg.block_size), generator=g).to(device)
    last = [None]
    sync = [False]

    def step():
        loss, _ = trainer.train_step(c, [(x, y)], None)
        if sync[0]:
            loss.item()
        elif last[0] is not None:  # fit's late read: the previous loss, once this step is queued
            last[0].item()
        last[0] = loss

    rows = []
    # "sync" reuses base's compiled model (one compile fewer): only the loss read differs.
    for name in ("base", "sync") if lever == "base" else (lever,):
        sync[0] = name == "sync"
        seconds = _time_per_step(step, device, warmup, iters)
        prof = profile_step(step, device)
        # Only base's loss compares across levers: "sync" keeps training base's model.
        final_loss = float(last[0].item()) if name != "sync" else float("nan")
        rows.append({"lever": name, "tokens_per_s": batch * cfg.block_size / seconds,
                     "step_ms": 1000 * seconds, "final_loss": final_loss,
                     "fp8_layers": len(switched) or int(config.fp8_head), **prof})
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def peer(cfg: GPTConfig, batch: int, device, warmup: int, iters: int) -> dict:
    torch._dynamo.reset()
    step = peer_gpt_step(cfg, batch, device.type == "cuda", device)
    seconds = _time_per_step(step, device, warmup, iters)
    prof = profile_step(step, device)
    del step
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"lever": "peer torch.compile", "tokens_per_s": batch * cfg.block_size / seconds,
            "step_ms": 1000 * seconds, **prof}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--levers", nargs="+", choices=list(LEVERS), default=list(LEVERS))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = GPTConfig(vocab_size=512, block_size=64) if args.quick else GPTConfig.gpt2_small()
    warmup, iters = (2, 3) if args.quick else (15, 20)
    peak_flops = peak.measured_peak_flops(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    per_token = flops_per_sample(cfg) / cfg.block_size
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
           "batch": args.batch, "peak_tflops": peak_flops / 1e12, "rows": []}
    print(f"{name}, torch {torch.__version__}, peak {peak_flops / 1e12:.0f} TFLOP/s, batch {args.batch}", flush=True)
    rows = [peer(cfg, args.batch, device, warmup, iters)]
    for lever in args.levers:
        if lever == "sync":
            continue  # measured with base
        try:
            new = run_lever(lever, cfg, args.batch, device, warmup, iters)
        except Exception as e:  # one lever failing must not hide the others
            new = [{"lever": lever, "error": f"{type(e).__name__}: {e}"[:300]}]
        rows += new
        for r in new:
            print(json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(out | {"rows": rows}, indent=1))
    ref = rows[0]["tokens_per_s"]
    print(f"\n{'variant':<20} {'tokens/s':>10} {'MFU':>6} {'vs peer':>8} {'final loss':>10}  GPU ms: matmul/attn/fused/optim/other")
    for r in rows:
        if "error" in r:
            print(f"{r['lever']:<20} failed: {r['error']}")
            continue
        cat = r["categories"]
        split = "/".join(f"{cat.get(k, 0):.1f}" for k in ("matmul", "attention", "fused (Triton)", "optimizer", "other"))
        print(f"{r['lever']:<20} {r['tokens_per_s']:>10,.0f} {r['tokens_per_s'] * per_token / peak_flops:>6.1%} "
              f"{r['tokens_per_s'] / ref:>8.3f} {r.get('final_loss', float('nan')):>10.4f}  {split}")
    for r in rows[:2]:
        print(f"top kernels, {r['lever']}:")
        for ms, k in r.get("top", []):
            print(f"  {ms:7.2f} ms  {k}")
    out["rows"] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
