"""labkit's torch engine against the peer configurations of PERFORMANCE.md, in one run.

    python benchmarks/bench_torch.py                 # GPU: GPT-2 small (batch 12, 48), ResNet-50
    python benchmarks/bench_torch.py --quick         # tiny sizes, any device: checks the script runs
    python benchmarks/bench_torch.py --json out.json

Measured in the same process on the same device: the bf16 GEMM peak (8192³, the MFU reference),
then for GPT-2 small (124M, block 1024, no bias, no dropout, bf16 autocast, fused AdamW, random
tokens) the peer trainer (the minimal-GPT layout and loop of the well-known benchmark script:
eager and torch.compile, `loss.item()` every step) and labkit's engine step
(`labkit.torch.engine.train_step` on the model `labkit train --model gpt --scale full` builds),
and for ResNet-50 (224², batch 256) labkit's ladder settings. Tokens/s and images/s are medians
of timed windows after warm-up; MFU uses 6·N + attention FLOPs per token.
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

from labkit.models import GPTConfig, ResNetConfig  # noqa: E402
from labkit.torch import engine, peak  # noqa: E402
from labkit.torch.distributed import DistInfo  # noqa: E402
from labkit.torch.models import flops_per_sample  # noqa: E402
from labkit.train import TrainConfig  # noqa: E402


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


def peer_gpt_tokens_per_s(cfg: GPTConfig, batch: int, compile_: bool, device, warmup: int, iters: int) -> float:
    torch.manual_seed(0)
    model = PeerGPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    if compile_:
        model = torch.compile(model)
    x = torch.randint(cfg.vocab_size, (batch, cfg.block_size), device=device)
    y = torch.randint(cfg.vocab_size, (batch, cfg.block_size), device=device)
    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def step():
        with ctx:
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the peer's loop reads the loss every step

    seconds = _time_per_step(step, device, warmup, iters)
    return batch * cfg.block_size / seconds


def labkit_steps_per_s(config: TrainConfig, model_cfg, device, warmup: int, iters: int) -> float:
    """Throughput of labkit's engine step on a device-resident batch (synthetic data costs
    nothing on the GPU; the input pipeline is benchmarked separately)."""
    c = engine.build(config, DistInfo(), device, model_cfg)
    if isinstance(model_cfg, GPTConfig):
        x = torch.randint(model_cfg.vocab_size, (config.batch_size, model_cfg.block_size), device=device)
        y = torch.randint(model_cfg.vocab_size, (config.batch_size, model_cfg.block_size), device=device)
    else:
        x = torch.rand(config.batch_size, model_cfg.channels, model_cfg.image_size, model_cfg.image_size,
                       device=device)
        y = torch.randint(model_cfg.num_classes, (config.batch_size,), device=device)
    batch = engine.to_device((x, y), c, config.channels_last)

    def step():
        engine.train_step(c, [batch], config.grad_clip)  # no host sync inside: the GPU runs ahead

    seconds = _time_per_step(step, device, warmup, iters)
    return config.batch_size / seconds


def _time_per_step(step, device, warmup: int, iters: int, windows: int = 3) -> float:
    for _ in range(warmup):
        step()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *a: None)
    sync()
    per_step = []
    for _ in range(windows):
        t = time.perf_counter()
        for _ in range(iters):
            step()
        sync()
        per_step.append((time.perf_counter() - t) / iters)
    return statistics.median(per_step)


LABKIT_GPT = "labkit bf16 + compile"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny models and few steps (CPU smoke check)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--skip-peer", action="store_true")
    p.add_argument("--skip-resnet", action="store_true")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpt_cfg = GPTConfig(vocab_size=512, block_size=64) if args.quick else GPTConfig.gpt2_small()
    resnet_cfg = ResNetConfig() if args.quick else ResNetConfig.resnet50()
    warmup, iters = (2, 3) if args.quick else (15, 20)
    batches = (4, 8) if args.quick else (12, 48)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak_flops = peak.measured_peak_flops(device, dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
               "peak_tflops": peak_flops / 1e12, "peak_dtype": str(dtype), "rows": []}
    print(f"{name}, torch {torch.__version__}, measured {str(dtype)} GEMM peak {peak_flops / 1e12:.3g} TFLOP/s")
    per_token = flops_per_sample(gpt_cfg) / gpt_cfg.block_size
    precision = "bf16" if device.type == "cuda" else "fp32"

    def add(workload, variant, rate, unit, flops_per_unit):
        mfu = rate * flops_per_unit / peak_flops
        results["rows"].append({"workload": workload, "variant": variant, "rate": rate, "unit": unit, "mfu": mfu})
        print(f"{workload:<16} {variant:<40} {rate:>12,.0f} {unit}  MFU {mfu:.1%}", flush=True)

    for batch in batches:
        if not args.skip_peer:
            for compile_ in (False,) if args.quick else (False, True):
                rate = peer_gpt_tokens_per_s(gpt_cfg, batch, compile_, device, warmup, iters)
                add(f"GPT b={batch}", f"peer {'torch.compile' if compile_ else 'eager'}", rate, "tokens/s", per_token)
        cfg = TrainConfig(model="gpt", batch_size=batch, precision=precision, compile=not args.quick,
                          grad_clip=None, progress=False)
        rate = labkit_steps_per_s(cfg, gpt_cfg, device, warmup, iters) * gpt_cfg.block_size
        add(f"GPT b={batch}", LABKIT_GPT if not args.quick else "labkit (quick: fp32, eager)", rate,
            "tokens/s", per_token)
    if not args.skip_resnet:
        per_image = flops_per_sample(resnet_cfg)
        batch = 8 if args.quick else 256
        base = TrainConfig(model="resnet", batch_size=batch, grad_clip=None, progress=False)
        ladder = [("fp32", replace(base, precision="fp32")), ("tf32", replace(base, precision="tf32")),
                  ("bf16", replace(base, precision="bf16")),
                  ("bf16 + channels_last", replace(base, precision="bf16", channels_last=True)),
                  ("bf16 + channels_last + compile", replace(base, precision="bf16", channels_last=True, compile=True))]
        if args.quick:
            ladder = ladder[:-1]  # compiling takes minutes on a small CPU
        for variant, cfg in ladder:
            rate = labkit_steps_per_s(cfg, resnet_cfg, device, warmup, iters)
            add(f"ResNet-50 b={batch}" if not args.quick else "ResNet (quick)", f"labkit {variant}", rate,
                "images/s", per_image)
    for batch in batches:
        rows = {r["variant"]: r["rate"] for r in results["rows"] if r["workload"] == f"GPT b={batch}"}
        if "peer torch.compile" in rows:
            ratio = rows[LABKIT_GPT] / rows["peer torch.compile"]
            results[f"gpt_b{batch}_ratio_vs_compiled_peer"] = ratio
            print(f"GPT batch {batch}: labkit / compiled peer = {ratio:.3f}×")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(math.isfinite(r["rate"]) for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
