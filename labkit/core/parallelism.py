"""How several processes split a model, and what each then holds and sends: framework-free.

`Layout.of(config, world_size)` is the one reading of a run's parallelism settings
(`TrainConfig.parallel`, `tp_degree`, `pp_degree`, `microbatches`): the data-parallel, tensor-
and pipeline-parallel degrees, checked against the process count and the batch (one-line
`ParameterError` naming the field). `check_config` refuses combinations no engine runs.

The calculator (`estimate`, `plan_table`, `decide`) gives, for a GPT of any size, the bytes of
parameters, gradients and optimizer state one rank holds in each mode, the bytes it sends per
optimizer step (ring collectives: all-reduce 2(N-1)/N of the tensor, reduce-scatter and
all-gather (N-1)/N of the full tensor each), whether the mode fits a GPU, and which mode to
choose for a model, a GPU size and an interconnect. On the CPU runs of `labkit train` the
engine measures the same quantities (`labkit.torch.parallel`); the two agree within a few
percent (ZeroRedundancyOptimizer partitions whole tensors, so its shards are only nearly equal).

Modes (what each rank keeps between steps, for P parameters over N processes):

| mode  | parameters | gradients | optimizer state | per step it sends                         |
|-------|------------|-----------|-----------------|-------------------------------------------|
| ddp   | P          | P         | P               | all-reduce of the gradients               |
| zero1 | P          | P         | P/N             | all-reduce + the updated shards broadcast  |
| zero2 | P          | P/N       | P/N             | reduce-scatter + all-gather                |
| zero3 | P/N        | P/N       | P/N             | all-gather (forward, again in backward) + reduce-scatter |
| tp    | P/t (matrices of the blocks) | same | same | 4 all-reduces of the activations per layer |
| pp    | P/p (its stage's layers)     | same | same | activations forward, their gradients back  |
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from labkit.core.config import ParameterError
from labkit.core.frameworks import is_installed
from labkit.core.models import GPTConfig, ModelConfig

MODES = ("ddp", "zero1", "zero2", "zero3", "tp", "pp")
SHARDED = ("zero1", "zero2", "zero3")


class ParallelSettings(Protocol):
    """The `TrainConfig` fields this module reads."""

    framework: str
    model: str
    parallel: str
    sharding_backend: str
    tp_degree: int | None
    pp_degree: int | None
    microbatches: int
    batch_size: int
    grad_accum: int
    precision: str
    compile: bool
    fp8_head: bool
    grad_compression: str


def check_config(c: ParallelSettings) -> None:
    """Refuse settings no engine runs, before any process starts (ParameterError naming the field)."""
    mode = c.parallel
    if c.framework != "torch" and (mode != "ddp" or c.grad_compression != "none"):
        field, value = ("parallel", mode) if mode != "ddp" else ("grad_compression", c.grad_compression)
        raise ParameterError(field, value, "is a torch engine setting (use --framework torch)")
    if mode in ("tp", "pp") and c.model != "gpt":
        what = "attention and MLP blocks to split" if mode == "tp" else "a stack of blocks to cut into stages"
        raise ParameterError("parallel", mode, f"needs --model gpt ({what}); {c.model} has none")
    if c.sharding_backend == "deepspeed" and mode not in SHARDED:
        raise ParameterError("sharding_backend", "deepspeed", f"runs zero1, zero2 or zero3 (got --parallel {mode})")
    if c.tp_degree is not None and mode != "tp":
        raise ParameterError("tp_degree", c.tp_degree, f"needs --parallel tp (got {mode})")
    if c.pp_degree is not None and mode != "pp":
        raise ParameterError("pp_degree", c.pp_degree, f"needs --parallel pp (got {mode})")
    if c.grad_compression != "none" and mode != "ddp":
        raise ParameterError("grad_compression", c.grad_compression,
                             f"compresses DDP's all-reduce: needs --parallel ddp (got {mode})")
    if mode == "pp" and c.grad_accum != 1:
        raise ParameterError("grad_accum", c.grad_accum, "pp splits the batch with --microbatches; "
                             "use that instead of --grad-accum")
    if mode in ("ddp", "zero1") and c.sharding_backend == "torch":
        return
    if c.precision == "fp16":
        raise ParameterError("precision", "fp16", f"needs --parallel ddp or zero1 (fp16's loss scaler); "
                             f"use bf16 with {mode}")
    if c.compile:
        raise ParameterError("compile", True, f"is supported with --parallel ddp or zero1 (got {mode})")
    if c.fp8_head:
        raise ParameterError("fp8_head", True, f"is supported with --parallel ddp or zero1 (got {mode})")
    if c.sharding_backend == "deepspeed" and c.grad_accum != 1:
        raise ParameterError("grad_accum", c.grad_accum, "is not supported with --sharding-backend deepspeed")


@dataclass(frozen=True)
class Layout:
    """The process grid of one run: `dp` data-parallel replicas × `tp` tensor-parallel ranks ×
    `pp` pipeline stages = `world`. Rank r sits at dp index r // (tp·pp) and, inside its
    replica, at tp or pp index r % (tp·pp) (consecutive ranks share a model: on GPUs, a node)."""

    mode: str = "ddp"
    world: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    def dp_rank(self, rank: int) -> int:
        return rank // self.model_parallel

    def mp_rank(self, rank: int) -> int:
        """Index inside the replica: the tp rank or the pipeline stage."""
        return rank % self.model_parallel

    @classmethod
    def of(cls, c: ParallelSettings, world_size: int) -> Layout:
        """The layout of `c` on `world_size` processes; ParameterError when a degree does not
        divide the processes, the batch does not split evenly, or DeepSpeed is asked for and
        not installed."""
        if getattr(c, "sharding_backend", "torch") == "deepspeed" and not is_installed("deepspeed"):
            raise ParameterError("sharding_backend", "deepspeed", "DeepSpeed is not installed here "
                                 "(pip install 'labkit[deepspeed]')")
        tp = pp = 1
        if c.parallel != "ddp" and world_size == 1:
            raise ParameterError("parallel", c.parallel, "needs several processes (--nproc-per-node N)")
        if c.parallel == "tp":
            tp = c.tp_degree or world_size
            _divides("tp_degree", tp, world_size)
        if c.parallel == "pp":
            pp = c.pp_degree or world_size
            _divides("pp_degree", pp, world_size)
        layout = cls(c.parallel, world_size, tp, pp, c.microbatches if c.parallel == "pp" else 1)
        parts = layout.dp * c.grad_accum
        if c.batch_size % parts:
            raise ParameterError("batch_size", c.batch_size, f"must be divisible by the {layout.dp} "
                                 f"data-parallel replica(s) × grad_accum {c.grad_accum}")
        if c.parallel == "pp" and (c.batch_size // layout.dp) % c.microbatches:
            raise ParameterError("microbatches", c.microbatches,
                                 f"must divide the per-replica batch {c.batch_size // layout.dp}")
        return layout

    def check_model(self, cfg: ModelConfig) -> None:
        """Model-dependent limits: tp must divide the heads, pp at most one stage per block."""
        if self.mode in ("tp", "pp") and not isinstance(cfg, GPTConfig):
            raise ParameterError("parallel", self.mode, "needs a GPT model")
        if self.tp > 1 and cfg.n_head % self.tp:
            raise ParameterError("tp_degree", self.tp, f"must divide the model's {cfg.n_head} heads")
        if self.pp > 1 and cfg.n_layer < self.pp:
            raise ParameterError("pp_degree", self.pp, f"exceeds the model's {cfg.n_layer} blocks")


def _divides(name: str, degree: int, world: int) -> None:
    if world % degree:
        raise ParameterError(name, degree, f"must divide the {world} processes")


def pipeline_bubble(stages: int, microbatches: int) -> float:
    """Idle fraction of a GPipe or 1F1B step with equal stages: (p-1)/(m+p-1)."""
    return (stages - 1) / (microbatches + stages - 1)


# ---------------------------------------------------------------- the calculator


@dataclass(frozen=True)
class Bytes:
    """Bytes per parameter: the weights, their gradients, the optimizer state (AdamW's two
    moments, plus an fp32 master copy when the weights are 16-bit)."""

    param: int
    grad: int
    optimizer: int
    name: str = ""


FP32 = Bytes(4, 4, 8, "fp32")
MIXED = Bytes(2, 2, 12, "bf16 weights + fp32 master and moments")


@dataclass(frozen=True)
class GPTShape:
    """A GPT's parameter counts as the modes split them: `embedding` (tied token table and
    positions), per block the `block_matrices` (attention and MLP linears: what tensor
    parallelism shards) and `block_other` (norms, the row-parallel biases), and `final` (last norm)."""

    embedding: int
    block_matrices: int
    block_other: int
    layers: int
    final: int
    vocab_embedding: int  # the token table alone (pipeline: the last stage's head copy)

    @classmethod
    def of(cls, cfg: GPTConfig) -> GPTShape:
        d, bias = cfg.n_embd, cfg.bias
        matrices = 12 * d * d + (3 * d + 4 * d if bias else 0)
        other = 2 * d + (2 * d + 2 * d if bias else 0)
        return cls(cfg.vocab_size * d + cfg.block_size * d, matrices, other, cfg.n_layer,
                   d * (2 if bias else 1), cfg.vocab_size * d)

    @property
    def total(self) -> int:
        return self.embedding + self.layers * (self.block_matrices + self.block_other) + self.final


@dataclass(frozen=True)
class Estimate:
    """One rank of one mode: bytes held and sent per step."""

    mode: str
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    comm_bytes_per_step: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "params_bytes": self.params_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes, "total_bytes": self.total_bytes,
                "comm_bytes_per_step": self.comm_bytes_per_step}


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def stage_params(shape: GPTShape, stages: int, stage: int) -> int:
    """Parameters of pipeline stage `stage`: its share of the blocks (the first stages take one
    more when they do not divide), the embeddings on the first, the final norm and a copy of the
    tied token table (the output head) on the last."""
    base, extra = divmod(shape.layers, stages)
    n = (base + (stage < extra)) * (shape.block_matrices + shape.block_other)
    if stage == 0:
        n += shape.embedding
    if stage == stages - 1:
        n += shape.final + (shape.vocab_embedding if stages > 1 else 0)
    return n


def estimate(cfg: GPTConfig, layout: Layout, *, batch_size: int = 1, precision: Bytes = FP32,
             rank: int | None = None, reshard_after_forward: bool = True,
             activation_bytes: int = 4) -> Estimate:
    """Bytes that `rank` (default: the rank holding the most) holds and sends per optimizer step
    when `cfg` trains in `layout` with global batch `batch_size` sequences."""
    shape = GPTShape.of(cfg)
    if rank is None:
        ranks = [estimate(cfg, layout, batch_size=batch_size, precision=precision, rank=r,
                          reshard_after_forward=reshard_after_forward, activation_bytes=activation_bytes)
                 for r in range(layout.model_parallel)]
        return max(ranks, key=lambda e: (e.total_bytes, e.comm_bytes_per_step))
    p, n, dp = shape.total, layout.world, layout.dp
    b = precision
    act = batch_size / dp * cfg.block_size * cfg.n_embd * activation_bytes  # one replica's (B, s, d)
    mode = layout.mode
    if mode == "ddp":
        return Estimate(mode, p * b.param, p * b.grad, p * b.optimizer, 2 * _ring(n) * p * b.grad)
    if mode == "zero1":
        return Estimate(mode, p * b.param, p * b.grad, p * b.optimizer / n,
                        2 * _ring(n) * p * b.grad + _ring(n) * p * b.param)
    if mode == "zero2":
        return Estimate(mode, p * b.param, p * b.grad / n, p * b.optimizer / n,
                        _ring(n) * p * (b.grad + b.param))
    if mode == "zero3":
        # all-gather before each block's forward and, resharded, again before its backward
        gathers = p * (2 if reshard_after_forward else 1)
        return Estimate(mode, p * b.param / n, p * b.grad / n, p * b.optimizer / n,
                        _ring(n) * (gathers * b.param + p * b.grad))
    if mode == "tp":
        t = layout.tp
        local = p - shape.layers * shape.block_matrices * (1 - 1 / t)
        # forward: the row-parallel outputs of attention and MLP; backward: the column-parallel
        # inputs' gradients. Four all-reduces of (B/dp, s, d) per block.
        comm = 4 * shape.layers * 2 * _ring(t) * act + 2 * _ring(dp) * local * b.grad
        return Estimate(mode, local * b.param, local * b.grad, local * b.optimizer, comm)
    if mode == "pp":
        stages = layout.pp
        stage = layout.mp_rank(rank)
        local = stage_params(shape, stages, stage)
        comm = 0.0
        if stage < stages - 1:
            comm += act  # activations to the next stage, all micro-batches
        if stage > 0:
            comm += act  # their gradients back to the previous one
        if stages > 1 and stage in (0, stages - 1):
            comm += 2 * _ring(2) * shape.vocab_embedding * b.grad  # the tied table's two copies agree
        comm += 2 * _ring(dp) * local * b.grad
        return Estimate(mode, local * b.param, local * b.grad, local * b.optimizer, comm)
    raise ParameterError("parallel", mode, "must be one of " + ", ".join(MODES))


def activation_estimate(cfg: GPTConfig, layout: Layout, micro_batch: int = 1, bytes_per: int = 2) -> float:
    """Activation bytes per rank with full activation checkpointing: every block's input kept
    (s·d per sequence), plus one block's working set recomputed in backward (34·s·d + 5·a·s²
    per sequence, Korthikanti et al. 2022), split by tp; a pipeline stage holds its layers for
    up to p micro-batches in flight (1F1B)."""
    s, d, a = cfg.block_size, cfg.n_embd, cfg.n_head
    layers = math.ceil(cfg.n_layer / layout.pp)
    in_flight = layout.pp
    kept = layers * s * d * bytes_per * micro_batch * in_flight
    working = (34 * s * d + 5 * a * s * s) * bytes_per / 2 * micro_batch / layout.tp
    return kept + working


GIB = 2**30


def reference_models() -> dict[str, GPTConfig]:
    """GPT-2 small, and GPT-style 7B- and 70B-class decoders (the layer counts and widths of
    Llama 2 7B and 70B, with a plain 4×d MLP and full attention)."""
    return {"GPT-2 small": GPTConfig.gpt2_small(),
            "7B": GPTConfig(vocab_size=32000, block_size=4096, n_layer=32, n_head=32, n_embd=4096),
            "70B": GPTConfig(vocab_size=32000, block_size=4096, n_layer=80, n_head=64, n_embd=8192)}


def layouts_for(gpus: int, gpus_per_node: int = 8, stages: int | None = None,
                batch: int | None = None) -> dict[str, Layout]:
    """The six modes on `gpus` GPUs: tp within a node (degree min(gpus, gpus_per_node)), pp over
    all GPUs up to `stages`, with `pipeline_microbatches` of the `batch` sequences (global)."""
    t = min(gpus, gpus_per_node)
    p = min(gpus, stages or gpus)
    while gpus % p:
        p -= 1
    m = pipeline_microbatches(p, None if batch is None else batch // (gpus // p))
    return {mode: Layout(mode, gpus, tp=t if mode == "tp" else 1, pp=p if mode == "pp" else 1,
                         microbatches=m if mode == "pp" else 1) for mode in MODES}


def pipeline_microbatches(stages: int, sequences: int | None = None) -> int:
    """Micro-batches per step for `stages` pipeline stages: 8 per stage (a bubble of
    (p-1)/(m+p-1), under 12%), but no more than the `sequences` one pipeline replica gets per
    step, and a divisor of them (every micro-batch the same size)."""
    m = 8 * stages
    if sequences is None:
        return m
    if sequences < 1:
        raise ValueError(f"a pipeline replica needs at least one sequence per step (got {sequences})")
    m = min(m, sequences)
    while sequences % m:
        m -= 1
    return m


def plan_table(models: dict[str, GPTConfig] | None = None, gpus: tuple[int, ...] = (8, 64),
               gpu_gib: float = 80, precision: Bytes = MIXED, tokens_per_gpu: int = 8192) -> list[dict[str, Any]]:
    """Per model, GPU count and mode: GiB per rank (weights, gradients, optimizer state, and
    checkpointed activations of one sequence), whether it fits `gpu_gib`, and GB sent per rank
    per step at `tokens_per_gpu` tokens per GPU per step."""
    rows = []
    for name, cfg in (models or reference_models()).items():
        for n in gpus:
            batch = max(1, tokens_per_gpu * n // cfg.block_size)
            for mode, layout in layouts_for(n, stages=cfg.n_layer, batch=batch).items():
                if layout.mode == "tp" and cfg.n_head % layout.tp:
                    continue
                e = estimate(cfg, layout, batch_size=batch, precision=precision, activation_bytes=2)
                acts = activation_estimate(cfg, layout)
                total = e.total_bytes + acts
                rows.append({"model": name, "params_B": GPTShape.of(cfg).total / 1e9, "gpus": n,
                             "mode": mode, "layout": f"dp{layout.dp}·tp{layout.tp}·pp{layout.pp}"
                             + (f" ×{layout.microbatches} micro-batches" if layout.pp > 1 else ""),
                             "weights_GiB": e.params_bytes / GIB, "grads_GiB": e.grads_bytes / GIB,
                             "optimizer_GiB": e.optimizer_bytes / GIB, "activations_GiB": acts / GIB,
                             "total_GiB": total / GIB, "fits": total <= gpu_gib * GIB,
                             "sent_GB_per_step": e.comm_bytes_per_step / 1e9})
    return rows


@dataclass(frozen=True)
class Grid:
    """One TP × PP × DP layout of a model on `tp·pp·dp` GPUs: `microbatches` per pipeline step,
    and the optimizer state sharded over the `dp` replicas (ZeRO-1, Megatron's distributed
    optimizer) when there are several."""

    tp: int
    pp: int
    dp: int
    microbatches: int

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    @property
    def bubble(self) -> float:
        return pipeline_bubble(self.pp, self.microbatches)

    def label(self) -> str:
        return f"tp{self.tp}·pp{self.pp}·dp{self.dp}" + (f" ×{self.microbatches} micro-batches" if self.pp > 1 else "")


def grids(cfg: GPTConfig, gpus: int, batch: int, gpus_per_node: int = 8) -> list[Grid]:
    """Every feasible TP × PP × DP layout of `cfg` on `gpus` GPUs for a global batch of `batch`
    sequences: tp within a node (≤ `gpus_per_node`: its all-reduces need NVLink) and dividing
    the heads, pp at most one stage per block, dp the rest and dividing the batch, and
    `pipeline_microbatches` of each replica's sequences (never more micro-batches than it has)."""
    out = []
    for tp in range(1, min(gpus, gpus_per_node) + 1):
        if gpus % tp or cfg.n_head % tp:
            continue
        for pp in range(1, min(gpus // tp, cfg.n_layer) + 1):
            if (gpus // tp) % pp:
                continue
            dp = gpus // (tp * pp)
            if batch % dp:
                continue
            out.append(Grid(tp, pp, dp, pipeline_microbatches(pp, batch // dp) if pp > 1 else 1))
    return out


def grid_bytes(cfg: GPTConfig, grid: Grid, precision: Bytes = MIXED) -> float:
    """Bytes the fullest rank of `grid` holds: its pipeline stage's parameters (the blocks, and
    the token table on the first and last stages, split by tp as Megatron's vocabulary-parallel
    embedding is), their gradients, its 1/dp of the optimizer state, and checkpointed
    activations (`activation_estimate`)."""
    shape = GPTShape.of(cfg)
    worst = 0.0
    for stage in range(grid.pp):
        base, extra = divmod(shape.layers, grid.pp)
        n = (base + (stage < extra)) * (shape.block_matrices / grid.tp + shape.block_other)
        if stage == 0:
            n += shape.embedding / grid.tp
        if stage == grid.pp - 1:
            n += shape.final + (shape.vocab_embedding / grid.tp if grid.pp > 1 else 0)
        worst = max(worst, n)
    states = worst * (precision.param + precision.grad + precision.optimizer / grid.dp)
    acts = activation_estimate(cfg, Layout("pp", grid.model_parallel, tp=grid.tp, pp=grid.pp))
    return states + acts


def choose_grid(cfg: GPTConfig, gpus: int, gpu_gib: float, *, tokens_per_gpu: int = 8192,
                gpus_per_node: int = 8, precision: Bytes = MIXED) -> dict[str, Any]:
    """The layout to start from, by the rules of Narayanan et al. 2021 (Megatron-LM at scale,
    https://arxiv.org/abs/2104.04473, read 2026-11-26): among the feasible `grids` that fit
    `gpu_gib`, (1) the smallest model-parallel size tp·pp (the rest is data parallelism, whose
    all-reduce overlaps the backward pass), (2) then tensor parallelism before pipeline stages
    (tp inside a node on NVLink; pp across nodes, where only activations cross), (3) then the
    smallest bubble. Returns the chosen row with its `rule`, and how many layouts fit."""
    batch = max(1, tokens_per_gpu * gpus // cfg.block_size)
    feasible = grids(cfg, gpus, batch, gpus_per_node)
    fitting = [(g, grid_bytes(cfg, g, precision)) for g in feasible]
    fitting = [(g, b) for g, b in fitting if b <= gpu_gib * GIB]
    out = {"gpus": gpus, "gpu_GiB": gpu_gib, "layouts_feasible": len(feasible), "layouts_fit": len(fitting)}
    if not fitting:
        least = min((grid_bytes(cfg, g, precision) for g in feasible), default=math.inf)
        return {**out, "layout": "none fits", "GiB_per_rank": None, "bubble": None,
                "rule": f"no TP × PP × DP layout of {gpus} GPUs fits {gpu_gib:g} GiB (the leanest needs "
                        f"{least / GIB:,.0f} GiB per GPU): more GPUs, or ZeRO-3 / offload"}
    grid, used = min(fitting, key=lambda gb: (gb[0].model_parallel, -gb[0].tp, gb[0].bubble))
    smallest = grid.model_parallel
    if smallest == 1:
        rule = f"fits on one GPU's memory: pure data parallelism over {grid.dp} (ZeRO-1 shards the optimizer)"
    else:
        parts = [f"the smallest tp·pp that fits is {smallest}"]
        if grid.tp > 1:
            parts.append(f"tp {grid.tp} inside a node (its all-reduces need NVLink)")
        if grid.pp > 1:
            parts.append(f"pp {grid.pp} " + ("across nodes" if grid.model_parallel > gpus_per_node else "stages")
                         + f", {grid.microbatches} micro-batches: bubble {grid.bubble:.0%}")
        parts.append(f"dp {grid.dp} for the rest")
        rule = "; ".join(parts)
    return {**out, "layout": grid.label(), "tp": grid.tp, "pp": grid.pp, "dp": grid.dp,
            "GiB_per_rank": used / GIB, "bubble": grid.bubble, "rule": rule}


@dataclass(frozen=True)
class Interconnect:
    """A link between the GPUs of a data-parallel or pipeline group (GB/s per GPU, one way),
    and the faster link inside a node that tensor parallelism needs."""

    name: str
    gb_per_s: float
    node_gb_per_s: float


INTERCONNECTS = (Interconnect("NVLink node + 3.2 Tb/s RDMA (A3)", 50.0, 450.0),
                 Interconnect("NVLink node + 100 Gb/s Ethernet", 12.5, 450.0),
                 Interconnect("PCIe node + 100 Gb/s Ethernet", 12.5, 16.0))


def _comm_seconds(cfg: GPTConfig, layout: Layout, e: Estimate, batch: int, precision: Bytes,
                  link: Interconnect) -> float:
    """Seconds per step the bytes of `e` take: inside one node (8 GPUs) on the node's link;
    across nodes on the network, except tp's all-reduces, which stay inside a node."""
    if layout.world <= 8:
        return e.comm_bytes_per_step / (link.node_gb_per_s * 1e9)
    if layout.mode == "tp":
        inside = estimate(cfg, Layout("tp", layout.tp, tp=layout.tp), batch_size=batch // layout.dp,
                          precision=precision, activation_bytes=2).comm_bytes_per_step
        return inside / (link.node_gb_per_s * 1e9) + (e.comm_bytes_per_step - inside) / (link.gb_per_s * 1e9)
    return e.comm_bytes_per_step / (link.gb_per_s * 1e9)


def decide(cfg: GPTConfig, gpus: int, gpu_gib: float, link: Interconnect, *, precision: Bytes = MIXED,
           tokens_per_gpu: int = 8192, effective_tflops: float) -> dict[str, Any]:
    """The mode to choose: among those whose states and activations fit, the one with the
    shortest step = compute (6·N FLOPs per token at `effective_tflops` per GPU, a planning rate
    the caller names, e.g. a measured one, the same in every mode), stretched by the pipeline bubble for pp, plus the
    time its bytes take on `link` (`_comm_seconds`; no overlap assumed). Ties keep the simpler
    mode (the order of `MODES`). None fits: says so."""
    compute = 6 * GPTShape.of(cfg).total * tokens_per_gpu / (effective_tflops * 1e12)
    best = None
    batch = max(1, tokens_per_gpu * gpus // cfg.block_size)
    for mode, layout in layouts_for(gpus, stages=cfg.n_layer, batch=batch).items():
        if mode == "tp" and cfg.n_head % layout.tp:
            continue
        e = estimate(cfg, layout, batch_size=batch, precision=precision, activation_bytes=2)
        total = e.total_bytes + activation_estimate(cfg, layout)
        if total > gpu_gib * GIB:
            continue
        comm = _comm_seconds(cfg, layout, e, batch, precision, link)
        stretch = 1 / (1 - pipeline_bubble(layout.pp, layout.microbatches)) if mode == "pp" else 1.0
        step = compute * stretch + comm
        if best is None or step < best[1]:
            best = (mode, step, comm, total)
    out = {"gpus": gpus, "gpu_GiB": gpu_gib, "interconnect": link.name, "compute_s": compute}
    if best is None:
        return {**out, "mode": "none fits", "step_s": None, "comm_s_per_step": None, "GiB_per_rank": None}
    return {**out, "mode": best[0], "step_s": best[1], "comm_s_per_step": best[2], "GiB_per_rank": best[3] / GIB}
