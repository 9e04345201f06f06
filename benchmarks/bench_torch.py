"""labkit's torch engine against peer trainers of the same models, in one run.

    python benchmarks/bench_torch.py                 # GPU: GPT-2 small (batch 12, 48), ResNet-50
    python benchmarks/bench_torch.py --quick         # tiny sizes, any device: checks the script runs
    python benchmarks/bench_torch.py --json out.json

Measured in the same process on the same device: the bf16 GEMM peak (8192³, the MFU reference);
GPT-2 small (124M, block 1024, no bias, no dropout, bf16 autocast, fused AdamW, random tokens)
with the peer trainer (the minimal-GPT layout and loop of the well-known benchmark script: eager
and torch.compile, `loss.item()` every step) and labkit's engine step
(`labkit.torch.trainer.train_step` on the model `labkit train --model gpt --scale full` builds,
compiled, loss read one step late as `fit` does), also with `fp8_head` on an fp8 GPU and with the
whole step replayed as one CUDA graph (`cuda_graph_step`) on any GPU; ResNet-50
(224², batch 256) through labkit's ladder settings, with torchvision's ResNet-50 at the best
settings as the peer. Variants compared with each other are timed in alternating windows (median
of 3 windows of 20 steps after warm-up); MFU uses 6·N + attention FLOPs per token.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from labkit.core.models import GPTConfig, ResNetConfig, flops_per_sample  # noqa: E402
from labkit.core.train_config import TrainConfig  # noqa: E402
from labkit.torch import engine, fp8, peak, trainer  # noqa: E402
from labkit.torch.distributed import DistInfo  # noqa: E402


# ---- the peer: a minimal GPT trainer's model, written the way its benchmark script runs it ----
class PeerBlock(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.attn_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.gelu = nn.GELU()
        self.mlp_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.n_head = c.n_head

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp_proj(self.gelu(self.c_fc(self.ln_2(x))))


class PeerGPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList(PeerBlock(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def peer_gpt_step(cfg: GPTConfig, batch: int, compile_: bool, device):
    """One training step of the peer trainer (reads the loss every step, as its loop does)."""
    torch.manual_seed(0)
    model = PeerGPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    forward = torch.compile(model) if compile_ else model
    x = torch.randint(cfg.vocab_size, (batch, cfg.block_size), device=device)
    y = torch.randint(cfg.vocab_size, (batch, cfg.block_size), device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step():
        with ctx:
            loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the peer's loop reads the loss every step

    return step


def peer_resnet_step(batch: int, image: int, device):
    """torchvision's ResNet-50, bf16 autocast + channels_last + torch.compile, SGD with momentum:
    the fastest plain-torchvision configuration, the peer for labkit's best ResNet-50 rung."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet50().to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    forward = torch.compile(model)
    x = torch.rand(batch, 3, image, image, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(1000, (batch,), device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def labkit_step(config: TrainConfig, model_cfg, device):
    """One step of labkit's engine (`trainer.train_step` on what `engine.build` makes) on a
    device-resident batch (synthetic data costs nothing on the GPU; the input pipeline is
    benchmarked separately). The loss is read one step late, as `fit` does on one GPU."""
    c = engine.build(config, DistInfo(), device, model_cfg)
    if isinstance(model_cfg, GPTConfig):
        x = torch.randint(model_cfg.vocab_size, (config.batch_size, model_cfg.block_size), device=device)
        y = torch.randint(model_cfg.vocab_size, (config.batch_size, model_cfg.block_size), device=device)
    else:
        x = torch.rand(config.batch_size, model_cfg.channels, model_cfg.image_size, model_cfg.image_size,
                       device=device)
        y = torch.randint(model_cfg.num_classes, (config.batch_size,), device=device)
    batch = engine.to_device((x, y), c, config.channels_last)
    previous = [None]

    def step():
        loss, _ = trainer.train_step(c, [batch], config.grad_clip)
        if previous[0] is not None:
            previous[0].item()
        previous[0] = loss

    return step


def time_interleaved(steps: dict, device, warmup: int, iters: int, windows: int = 3) -> dict[str, float]:
    """Median seconds per step of each variant. Windows of `iters` steps take turns across the
    variants, so a drift of the machine (clocks, temperature, other tenants) hits all of them
    alike instead of whichever ran last."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    for step in steps.values():
        for _ in range(warmup):
            step()
        sync()
    per_step: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(windows):
        for name, step in steps.items():
            sync()
            t = time.perf_counter()
            for _ in range(iters):
                step()
            sync()
            per_step[name].append((time.perf_counter() - t) / iters)
    return {name: statistics.median(v) for name, v in per_step.items()}


def _time_per_step(step, device, warmup: int, iters: int, windows: int = 3) -> float:
    return time_interleaved({"step": step}, device, warmup, iters, windows)["step"]


def _fresh(device) -> None:
    """Forget compiled graphs (so the next model compiles for its own static shapes) and cached
    blocks between workloads."""
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


LABKIT_GPT = "labkit bf16 + compile"
LABKIT_GPT_FP8 = "labkit bf16 + compile + fp8 head"
LABKIT_GPT_BEST = "labkit best: + fp8 head + compile_mode=tuned"
LABKIT_GPT_STEP_GRAPH = "labkit + whole-step CUDA graph"
PEER_COMPILED = "peer torch.compile"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models and few steps (CPU smoke check)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--skip-gpt", action="store_true")
    p.add_argument("--best-only", action="store_true", help="GPT: the peers and labkit's best settings only")
    p.add_argument("--resnet-best-mode", default="reduce-overhead", help="compile_mode of the extra ResNet row")
    p.add_argument("--skip-resnet", action="store_true")
    p.add_argument("--batches", type=int, nargs="+", default=None,
                   help="GPT batch sizes (default 12 and 48; --quick: 4 and 8)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpt_cfg = GPTConfig(vocab_size=512, block_size=64) if args.quick else GPTConfig.gpt2_small()
    resnet_cfg = ResNetConfig() if args.quick else ResNetConfig.resnet50()
    warmup, iters = (2, 3) if args.quick else (10, 20)
    batches = tuple(args.batches) if args.batches else (4, 8) if args.quick else (12, 48)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak_flops = peak.measured_peak_flops(device, dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "command": "python " + " ".join(sys.argv),
               "peak_tflops": peak_flops / 1e12, "peak_dtype": str(dtype), "rows": []}
    print(f"{name}, torch {torch.__version__}, measured {str(dtype)} GEMM peak {peak_flops / 1e12:.3g} TFLOP/s")
    per_token = flops_per_sample(gpt_cfg) / gpt_cfg.block_size
    precision = "bf16" if device.type == "cuda" else "fp32"

    def add(workload, variant, rate, unit, flops_per_unit):
        mfu = rate * flops_per_unit / peak_flops
        results["rows"].append({"workload": workload, "variant": variant, "rate": rate, "unit": unit, "mfu": mfu})
        print(f"{workload:<16} {variant:<40} {rate:>12,.0f} {unit}  MFU {mfu:.1%}", flush=True)
        if args.json:  # after every row, so a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps(results, indent=1))

    fp8_ok = fp8.supported(device)
    for batch in () if args.skip_gpt else batches:
        _fresh(device)
        steps = {}
        if not args.skip_peer:
            if batch == batches[0]:
                steps["peer eager"] = peer_gpt_step(gpt_cfg, batch, False, device)
            if not args.quick:
                steps[PEER_COMPILED] = peer_gpt_step(gpt_cfg, batch, True, device)
        cfg = TrainConfig(model="gpt", batch_size=batch, precision=precision, compile=not args.quick,
                          grad_clip=None, progress=False)
        if not args.best_only:
            steps[LABKIT_GPT if not args.quick else "labkit (quick: fp32, eager)"] = labkit_step(cfg, gpt_cfg, device)
        if fp8_ok and not args.best_only:
            steps[LABKIT_GPT_FP8] = labkit_step(replace(cfg, fp8_head=True), gpt_cfg, device)
        if fp8_ok:
            steps[LABKIT_GPT_BEST] = labkit_step(replace(cfg, fp8_head=True, compile_mode="tuned"), gpt_cfg, device)
        if device.type == "cuda":
            # The best settings with the whole step (clipping and AdamW included) in one graph.
            steps[LABKIT_GPT_STEP_GRAPH] = labkit_step(
                replace(cfg, fp8_head=fp8_ok, compile_mode="tuned", cuda_graph_step=True), gpt_cfg, device)
        for variant, seconds in time_interleaved(steps, device, warmup, iters).items():
            add(f"GPT b={batch}", variant, batch * gpt_cfg.block_size / seconds, "tokens/s", per_token)
        del steps
    if not args.skip_resnet:
        _fresh(device)
        per_image = flops_per_sample(resnet_cfg)
        batch = 8 if args.quick else 256
        base = TrainConfig(model="resnet", batch_size=batch, grad_clip=None, progress=False)
        ladder = [("fp32", replace(base, precision="fp32")), ("tf32", replace(base, precision="tf32")),
                  ("bf16", replace(base, precision="bf16")),
                  ("bf16 + channels_last", replace(base, precision="bf16", channels_last=True)),
                  ("bf16 + channels_last + compile", replace(base, precision="bf16", channels_last=True, compile=True))]
        if args.quick:
            ladder = ladder[:-1]  # compiling takes minutes on a small CPU
        # Rungs are timed one after another: each sets the process-wide TF32 switches in build().
        for variant, cfg in ladder:
            steps = {f"labkit {variant}": labkit_step(cfg, resnet_cfg, device)}
            if variant.endswith("compile") and not args.quick:
                # labkit's best: the same rung with CUDA graphs (no launch gaps between kernels).
                steps[f"labkit {variant} ({args.resnet_best_mode})"] = labkit_step(
                    replace(cfg, compile_mode=args.resnet_best_mode), resnet_cfg, device)
                steps[f"labkit {variant} (whole-step CUDA graph)"] = labkit_step(
                    replace(cfg, cuda_graph_step=True), resnet_cfg, device)
            if variant.endswith("compile") and not args.skip_peer:
                # The peer runs under the same switches as the rung it is compared with.
                steps["peer torchvision bf16 + channels_last + compile (SGD)"] = peer_resnet_step(
                    batch, resnet_cfg.image_size, device)
            for name, seconds in time_interleaved(steps, device, warmup, iters).items():
                add(f"ResNet-50 b={batch}" if not args.quick else "ResNet (quick)", name, batch / seconds,
                    "images/s", per_image)
            del steps
            _fresh(device)
    for batch in batches:
        rows = {r["variant"]: r["rate"] for r in results["rows"] if r["workload"] == f"GPT b={batch}"}
        suffixes = {LABKIT_GPT: "", LABKIT_GPT_FP8: "_fp8_head", LABKIT_GPT_BEST: "_best",
                    LABKIT_GPT_STEP_GRAPH: "_step_graph"}
        for variant, suffix in suffixes.items():
            if PEER_COMPILED in rows and variant in rows:
                ratio = rows[variant] / rows[PEER_COMPILED]
                key = f"gpt_b{batch}_ratio_vs_compiled_peer{suffix}"
                results[key] = ratio
                print(f"GPT batch {batch}: {variant} / compiled peer = {ratio:.3f}×")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(math.isfinite(r["rate"]) for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
