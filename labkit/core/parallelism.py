"""How several processes split a model, and what each then holds and sends: framework-free.

`Layout.of(config, world_size)` is the one reading of a run's parallelism settings
(`TrainConfig.parallel`, `tp_degree`, `pp_degree`, `microbatches`): the data-parallel, tensor-
and pipeline-parallel degrees, checked against the process count and the batch (one-line
`ParameterError` naming the field). `check_config` refuses combinations no engine runs.

The calculator (`estimate`) gives, for a GPT of any size, the bytes of parameters, gradients
and optimizer state one rank holds in each mode and the bytes it sends per optimizer step (ring
collectives: all-reduce 2(N-1)/N of the tensor, reduce-scatter and all-gather (N-1)/N of the
full tensor each). On the CPU runs of `labkit train` the engine measures the same quantities
(`labkit.torch.parallel`); the two agree within a few percent (ZeroRedundancyOptimizer
partitions whole tensors, so its shards are only nearly equal).

The planner (`plan`; `decide` is its answer as a dict, `plan_table` every layout it weighed)
answers "which layout for this model on these GPUs": every TP × PP × DP grid (`grids`) with DDP
or a ZeRO stage, the fullest rank's bytes against the GPU's memory less `MARGIN` (CUDA context,
allocator fragmentation), and a step time in which bucketed gradient reduction and ZeRO-3's
gathers overlap compute (`exposed_seconds`; the sources are cited beside the constants).

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
from dataclasses import dataclass, replace
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


def busiest_stage_bubble(stage_work: list[float], microbatches: int) -> float:
    """Idle fraction of the busiest stage when the stages' work per micro-batch differs
    (`stage_work`, any unit): the step lasts about Σt + (m−1)·max t (every stage once while the
    pipeline fills and drains, the slowest one for the other m−1 micro-batches) and the busiest
    stage computes m·max t of it. Equal stages give (p-1)/(m+p-1); unequal ones less, since the
    busiest stage then waits only for the others' shorter fill and drain."""
    slowest = max(stage_work)
    return 1 - microbatches * slowest / (sum(stage_work) + (microbatches - 1) * slowest)


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
    up to p micro-batches in flight (1F1B), and never more than the step has."""
    s, d, a = cfg.block_size, cfg.n_embd, cfg.n_head
    layers = math.ceil(cfg.n_layer / layout.pp)
    in_flight = min(layout.pp, layout.microbatches) if layout.pp > 1 else 1
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
    """The six modes on `gpus` GPUs, one technique each (as `labkit train --parallel` runs them):
    tp within a node (degree min(gpus, gpus_per_node)), pp over all GPUs up to `stages`, with
    `pipeline_microbatches` of the `batch` sequences (global). The planner weighs `grids` instead."""
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


@dataclass(frozen=True)
class Grid:
    """One TP × PP × DP layout of a model on `tp·pp·dp` GPUs, with `microbatches` per pipeline
    step (`plan` adds how the `dp` replicas share their state: DDP or a ZeRO stage)."""

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



# ---------------------------------------------------------------- the planner
#
# `plan` is the one answer to "which layout for this model on these GPUs". It weighs every
# TP × PP × DP grid (`grids`) with each data-parallel mode that runs on it, keeps those that fit
# the GPU's memory within `MARGIN`, times each step with the overlap model below, and picks the
# fastest. `decide` (its dict), `plan_table` (every layout weighed) and the notebook's tables
# are views of it.


@dataclass(frozen=True)
class Margin:
    """GPU memory the training state may not use: `context_gib` for the CUDA context and the
    libraries' workspaces, then a `fragmentation` share of the rest that the caching allocator
    loses between blocks. A layout fits only within `usable_gib`."""

    context_gib: float = 1.0
    fragmentation: float = 0.15

    def usable_gib(self, gpu_gib: float) -> float:
        return max(0.0, (gpu_gib - self.context_gib) * (1 - self.fragmentation))

    def text(self) -> str:
        return (f"{self.context_gib:g} GiB for the CUDA context, cuBLAS workspaces and NCCL buffers, then "
                f"{self.fragmentation:.0%} of the rest for allocator fragmentation: an 80 GiB GPU holds "
                f"{self.usable_gib(80):.1f} GiB of training state, a 40 GiB one {self.usable_gib(40):.1f}")


# Context: ~300 MB with CUDA's lazy module loading (11.7 and later), over 1,000 MB before (ptrblck,
# https://github.com/pytorch/pytorch/issues/107667, read 2026-11-29); 1 GiB leaves room for the
# cuBLAS workspaces and NCCL buffers no tensor count sees. Fragmentation: GMLake (Guo et al.,
# ASPLOS 2024, https://arxiv.org/abs/2401.08156, read 2026-11-29) removed on average 15% (up to
# 33%) fragmentation from PyTorch's caching allocator over eight LLM trainings on 80 GB A100s.
MARGIN = Margin()

# Overlap. DDP puts gradients in buckets (25 MiB: `bucket_cap_mb`'s default) in roughly reverse
# order of use and starts each bucket's all-reduce as soon as the backward pass has filled it
# ("Internal Design", https://docs.pytorch.org/docs/stable/notes/ddp.html, read 2026-11-29; Li et
# al., VLDB 2020, https://arxiv.org/abs/2006.15704, "overlapping computation with communication").
# Only the last bucket waits for the end of backward; a parameter is never split, so the token
# embedding's gradient (complete last: the tied table is used first in forward) is that bucket
# when larger. ZeRO-2's reduce-scatter is bucketed the same way; ZeRO-1 and ZeRO-2 then gather the
# updated parameters after the optimizer step, where no compute hides them (torch's
# ZeroRedundancyOptimizer, DeepSpeed stages 1 and 2). ZeRO-3 (FSDP) all-gathers each unit (a block,
# or the embeddings) just before it runs, behind the previous unit's compute, and reduce-scatters
# its gradients behind the next unit's backward (`fully_shard`, https://docs.pytorch.org/docs/
# stable/distributed.fsdp.fully_shard.html, read 2026-11-29); its volume is 1.5× DDP's (Rajbhandari
# et al. 2020, https://arxiv.org/abs/1910.02054, read 2026-11-29): only the first unit's gather (and
# the last unit's reduce-scatter) is exposed. Tensor-parallel all-reduces and pipeline sends sit on
# the critical path and are counted whole.
DDP_BUCKET_BYTES = 25 * 2**20
BACKWARD_SHARE = 2 / 3  # of the 6·N FLOPs per token: 2N forward, 4N backward
TIE = 0.01  # a more elaborate layout must be more than 1% faster to be chosen
DP_MODES = ("ddp", "zero1", "zero2", "zero3")
# Beside tensor or pipeline parallelism only DDP and ZeRO-1 (Megatron's distributed optimizer):
# DeepSpeed's pipeline engine integrates ZeRO stage 1 only; the later stages would add data-parallel
# traffic to every micro-batch (https://github.com/deepspeedai/DeepSpeed/issues/4164, read 2026-11-29).
MP_DP_MODES = ("ddp", "zero1")


def exposed_seconds(comm_s: float, compute_s: float, tail: float) -> float:
    """Seconds of `comm_s` of communication left on the step when it runs in pieces beside
    `compute_s` of compute that releases them one by one: every piece but the `tail` share (the
    last bucket, the first unit) hides while compute lasts. max(tail·comm, comm − (1−tail)·compute)."""
    if comm_s <= 0:
        return 0.0
    return max(tail * comm_s, comm_s - (1 - tail) * compute_s)


@dataclass(frozen=True)
class Candidate:
    """One layout `plan` weighed: `dp_mode` over the `grid.dp` replicas of a tp × pp model, each
    replica's sequences in `micro_batches` of `sequences` (pipeline micro-batches, or gradient
    accumulation steps); the bytes its fullest rank holds and, given a compute rate, its step."""

    dp_mode: str
    grid: Grid
    micro_batches: int
    sequences: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    working: float  # ZeRO-3: the gathered units and one unit's unsharded gradients
    usable: float
    sent_bytes: float  # per rank per step, every collective and send
    compute_s: float | None = None
    bubble: float = 0.0
    tp_s: float | None = None
    pp_s: float | None = None
    dp_s: float | None = None
    dp_exposed_s: float | None = None

    @property
    def total_bytes(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.working

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable

    @property
    def model_parallel(self) -> int:
        return self.grid.model_parallel

    @property
    def mode(self) -> str:
        t, p = self.grid.tp, self.grid.pp
        return "tp+pp" if t > 1 and p > 1 else "tp" if t > 1 else "pp" if p > 1 else self.dp_mode

    @property
    def comm_s(self) -> float | None:
        return None if self.dp_s is None else self.tp_s + self.pp_s + self.dp_s

    @property
    def exposed_s(self) -> float | None:
        return None if self.dp_exposed_s is None else self.tp_s + self.pp_s + self.dp_exposed_s

    @property
    def step_s(self) -> float | None:
        if self.compute_s is None:
            return None
        return self.compute_s / (1 - self.bubble) + self.exposed_s

    def label(self) -> str:
        g = self.grid
        if g.model_parallel == 1:
            out = f"{self.dp_mode} over {g.dp} GPU{'s' if g.dp > 1 else ''}"
        else:
            out = f"tp{g.tp}·pp{g.pp}·dp{g.dp}" + (f", {self.dp_mode} over dp" if g.dp > 1 else "")
        if g.pp > 1:
            return out + f", {self.micro_batches} micro-batches"
        return out + (f", {self.micro_batches} accumulation steps" if self.micro_batches > 1 else "")

    def rank(self) -> tuple:
        """Simpler first: less model parallelism, then the plainer data-parallel mode, then tp
        before pp (inside a node), then the smaller bubble."""
        return (self.model_parallel, DP_MODES.index(self.dp_mode), -self.grid.tp, self.bubble)


def _rank_params(shape: GPTShape, grid: Grid) -> tuple[float, float, float]:
    """The fullest rank's parameters, the embedding part of them and one block's (what a tp
    rank of a stage holds; the token table split by tp, as Megatron's vocabulary-parallel one)."""
    block = shape.block_matrices / grid.tp + shape.block_other
    worst = (0.0, 0.0)
    for stage in range(grid.pp):
        base, extra = divmod(shape.layers, grid.pp)
        emb = shape.embedding / grid.tp if stage == 0 else 0.0
        n = (base + (stage < extra)) * block
        if stage == grid.pp - 1:
            n += shape.final
            emb += shape.vocab_embedding / grid.tp if grid.pp > 1 else 0.0
        worst = max(worst, (n + emb, emb))
    return worst[0], worst[1], block


def _held(cfg: GPTConfig, grid: Grid, dp_mode: str, micro_batches: int, sequences: int,
          precision: Bytes) -> tuple[float, float, float, float, float]:
    """(weights, gradients, optimizer state, activations, ZeRO-3 working set) of the fullest rank."""
    n, emb, block = _rank_params(GPTShape.of(cfg), grid)
    b, dp = precision, grid.dp
    shard = {"ddp": (1, 1, 1), "zero1": (1, 1, dp), "zero2": (1, dp, dp), "zero3": (dp, dp, dp)}[dp_mode]
    # FSDP: one unit gathered, the next prefetched, and one unit's full gradients before the reduce-scatter
    working = max(block, emb) * (2 * b.param + b.grad) if dp_mode == "zero3" and dp > 1 else 0.0
    layout = Layout("pp", grid.model_parallel, tp=grid.tp, pp=grid.pp, microbatches=micro_batches)
    return (n * b.param / shard[0], n * b.grad / shard[1], n * b.optimizer / shard[2],
            activation_estimate(cfg, layout, micro_batch=sequences), working)


def _sent_and_seconds(cfg: GPTConfig, c: Candidate, link: Interconnect, gpus: int, gpus_per_node: int,
                      precision: Bytes, compute_s: float | None) -> dict[str, float | None]:
    """Bytes `c`'s fullest rank sends per step and, with `compute_s`, the seconds of tensor
    parallelism, pipeline sends and data parallelism (all of it, and what the overlap model leaves
    exposed). Links: tp inside a node; pp inside a node when tp·pp fits one; dp inside a node when
    all GPUs do, else on the network."""
    shape, g, b, k = GPTShape.of(cfg), c.grid, precision, c.micro_batches
    node, net = link.node_gb_per_s * 1e9, link.gb_per_s * 1e9
    act = c.sequences * k * cfg.block_size * cfg.n_embd * 2  # the replica's (B, s, d) in bf16, per step
    layers = math.ceil(shape.layers / g.pp)
    tp_bytes = 4 * layers * 2 * _ring(g.tp) * act  # 4 all-reduces per block, forward and backward
    pp_bytes = 0.0
    if g.pp > 1:  # activations on, their gradients back, and the tied table's two copies agreeing
        pp_bytes = 2 * act + 2 * _ring(2) * shape.vocab_embedding / g.tp * b.grad
    n, emb, block = _rank_params(shape, g)
    r = _ring(g.dp)
    red = (2 if c.dp_mode in ("ddp", "zero1") else 1) * r * n * b.grad  # all-reduce or reduce-scatter
    gather = r * n * b.param
    dp_bytes = {"ddp": red, "zero1": red + gather, "zero2": k * red + gather,
                "zero3": k * (2 * gather + red)}[c.dp_mode]
    out: dict[str, float | None] = {"sent_bytes": tp_bytes + pp_bytes + dp_bytes,
                                    "tp_s": None, "pp_s": None, "dp_s": None, "dp_exposed_s": None}
    if compute_s is None:
        return out
    dp_bw = node if gpus <= gpus_per_node else net
    fwd, bwd = compute_s * (1 - BACKWARD_SHARE) / k, compute_s * BACKWARD_SHARE / k  # one micro-batch
    if c.dp_mode == "zero3":
        unit = min(1.0, max(block, emb) / n)
        ag, rs = gather / dp_bw, red / dp_bw
        exposed = k * (exposed_seconds(ag, fwd, unit) + exposed_seconds(ag + rs, bwd, unit))
    else:  # gradients reduced behind the last micro-batch's backward (earlier ones only accumulate)
        bucket = min(1.0, max(DDP_BUCKET_BYTES, emb * b.grad) / (n * b.grad))
        times = k if c.dp_mode == "zero2" else 1
        exposed = times * exposed_seconds(red / dp_bw, bwd, bucket)
        exposed += gather / dp_bw if c.dp_mode in ("zero1", "zero2") else 0.0
    pp_bw = node if g.model_parallel <= gpus_per_node else net
    return {**out, "tp_s": tp_bytes / node, "pp_s": pp_bytes / pp_bw, "dp_s": dp_bytes / dp_bw,
            "dp_exposed_s": exposed if g.dp > 1 else 0.0}


def _weigh(cfg: GPTConfig, grid: Grid, dp_mode: str, batch: int, gpus: int, usable: float, link: Interconnect,
           precision: Bytes, compute_s: float | None, gpus_per_node: int) -> Candidate:
    """`dp_mode` on `grid`: a pipeline runs its `grid.microbatches`; otherwise the replica's
    sequences go in the largest micro-batch that fits (the rest as accumulation steps)."""
    per_replica = batch // grid.dp
    if grid.pp > 1:
        options = [grid.microbatches]
    else:
        options = [k for k in range(1, per_replica + 1) if per_replica % k == 0]
    for k in options:
        held = _held(cfg, grid, dp_mode, k, per_replica // k, precision)
        if sum(held) <= usable or k == options[-1]:
            break
    c = Candidate(dp_mode, grid, k, per_replica // k, *held, usable=usable, sent_bytes=0.0,
                  compute_s=compute_s, bubble=grid.bubble if grid.pp > 1 else 0.0)
    return replace(c, **_sent_and_seconds(cfg, c, link, gpus, gpus_per_node, precision, compute_s))


@dataclass(frozen=True)
class Plan:
    """What `plan` weighed and chose: every `candidates` layout, the smallest model-parallel size
    tp·pp that fits (`needed_mp`), and the `choice` (None when nothing fits or no rate was given)."""

    gpus: int
    gpu_gib: float
    usable_gib: float
    link: Interconnect
    candidates: list[Candidate]
    needed_mp: int | None
    choice: Candidate | None
    compute_s: float | None
    margin: Margin = MARGIN

    def considered(self) -> list[Candidate]:
        """The fitting layouts the choice is made among: pure data parallelism, and model
        parallelism only at the smallest tp·pp that fits."""
        return [c for c in self.candidates if c.fits and c.model_parallel in (1, self.needed_mp)]

    def rule(self) -> str:
        c = self.choice
        if c is None:
            fitting = [x for x in self.candidates if x.fits]
            if fitting:
                return f"{len(fitting)} layouts fit; no compute rate given, so none is timed"
            least = min((x.total_bytes for x in self.candidates), default=math.inf)
            return (f"no layout of {self.gpus} GPUs fits {self.usable_gib:.1f} usable GiB of {self.gpu_gib:g} "
                    f"(the leanest needs {least / GIB:,.1f} GiB per GPU): more GPUs, or offload")
        parts = [f"fits in {c.total_bytes / GIB:.1f} of {self.usable_gib:.1f} usable GiB"]
        if c.model_parallel == 1:
            parts.append("no tensor or pipeline split needed")
        else:
            parts.append(f"the smallest tp·pp that fits is {self.needed_mp}")
        parts.append(f"fastest of {len(self.considered())} weighed: {c.step_s:.3g} s/step = "
                     f"{c.compute_s:.3g} compute" + (f" ÷ (1 − bubble {c.bubble:.0%})" if c.grid.pp > 1 else "")
                     + f" + {c.exposed_s:.2g} exposed of {c.comm_s:.2g} s communication")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """`decide`'s answer: the choice, its layout and timing, and the rule that chose it."""
        out = {"gpus": self.gpus, "gpu_GiB": self.gpu_gib, "usable_GiB": self.usable_gib,
               "interconnect": self.link.name, "compute_s": self.compute_s,
               "layouts_weighed": len(self.candidates), "layouts_fit": sum(c.fits for c in self.candidates),
               "smallest_tp_pp": self.needed_mp, "rule": self.rule()}
        c = self.choice
        if c is None:
            return {**out, "mode": "none fits", "dp_mode": None, "layout": "none fits", "tp": None, "pp": None,
                    "dp": None, "micro_batches": None, "step_s": None, "comm_s_per_step": None,
                    "exposed_comm_s": None, "bubble": None, "GiB_per_rank": None}
        return {**out, "mode": c.mode, "dp_mode": c.dp_mode, "layout": c.label(), "tp": c.grid.tp, "pp": c.grid.pp,
                "dp": c.grid.dp, "micro_batches": c.micro_batches, "step_s": c.step_s, "comm_s_per_step": c.comm_s,
                "exposed_comm_s": c.exposed_s, "bubble": c.bubble, "GiB_per_rank": c.total_bytes / GIB}


def plan(cfg: GPTConfig, gpus: int, gpu_gib: float, link: Interconnect, *, effective_tflops: float | None,
         precision: Bytes = MIXED, tokens_per_gpu: int = 8192, gpus_per_node: int = 8,
         margin: Margin = MARGIN) -> Plan:
    """The layout for `cfg` on `gpus` GPUs of `gpu_gib` joined by `link`, at `tokens_per_gpu`
    tokens per GPU per step. Weighs every `grids` layout with DDP, ZeRO-1, -2, -3 (pure data
    parallelism) or DDP, ZeRO-1 (beside tp or pp); keeps those whose fullest rank fits `margin`'s
    usable memory; among pure data parallelism and the smallest tp·pp that fits (Narayanan et al.
    2021, https://arxiv.org/abs/2104.04473, read 2026-11-26: model parallelism only as far as memory
    needs it, since one compute rate is assumed and splitting matrices further only shrinks them)
    chooses the shortest step: compute (6·N FLOPs per token at `effective_tflops` per GPU, the same
    in every layout) stretched by the pipeline bubble, plus the communication the overlap model
    leaves exposed (`exposed_seconds`). Within `TIE` the simpler layout wins (`Candidate.rank`).
    `effective_tflops=None`: memory only, nothing chosen."""
    batch = max(1, tokens_per_gpu * gpus // cfg.block_size)
    compute = (None if effective_tflops is None else
               6 * GPTShape.of(cfg).total * batch * cfg.block_size / gpus / (effective_tflops * 1e12))
    usable = margin.usable_gib(gpu_gib)
    candidates = [_weigh(cfg, grid, mode, batch, gpus, usable * GIB, link, precision, compute, gpus_per_node)
                  for grid in grids(cfg, gpus, batch, gpus_per_node)
                  for mode in (DP_MODES if grid.model_parallel == 1 else MP_DP_MODES)
                  if mode == "ddp" or grid.dp > 1]  # sharding over one replica is DDP
    needed = min((c.model_parallel for c in candidates if c.fits and c.dp_mode in MP_DP_MODES), default=None)
    out = Plan(gpus, gpu_gib, usable, link, candidates, needed, None, compute, margin)
    pool = out.considered()
    if compute is None or not pool:
        return out
    fastest = min(c.step_s for c in pool)
    return replace(out, choice=min((c for c in pool if c.step_s <= fastest * (1 + TIE)), key=Candidate.rank))


def decide(cfg: GPTConfig, gpus: int, gpu_gib: float, link: Interconnect, *, effective_tflops: float,
           precision: Bytes = MIXED, tokens_per_gpu: int = 8192, gpus_per_node: int = 8,
           margin: Margin = MARGIN) -> dict[str, Any]:
    """`plan`'s answer as a dict (`Plan.as_dict`): `mode` ("ddp", "zero1", "zero2", "zero3",
    "tp", "pp", "tp+pp" or "none fits"), `layout`, `step_s`, `GiB_per_rank`, `rule`, ..."""
    return plan(cfg, gpus, gpu_gib, link, effective_tflops=effective_tflops, precision=precision,
                tokens_per_gpu=tokens_per_gpu, gpus_per_node=gpus_per_node, margin=margin).as_dict()


def plan_table(models: dict[str, GPTConfig] | None = None, gpus: tuple[int, ...] = (8, 64),
               gpu_gib: float = 80, precision: Bytes = MIXED, tokens_per_gpu: int = 8192, *,
               link: Interconnect | None = None, effective_tflops: float | None = None,
               margin: Margin = MARGIN) -> list[dict[str, Any]]:
    """Every layout `plan` weighs, per model and GPU count: GiB per rank by kind, the usable GiB
    (`margin`), whether it fits, whether the choice was made among it (`considered`), its step
    and exposed communication, and `chosen`. The same call as `decide` with the same arguments:
    the `chosen` row is its answer. Without `effective_tflops`, memory only."""
    link = link or INTERCONNECTS[0]
    rows = []
    for name, cfg in (models or reference_models()).items():
        for n in gpus:
            p = plan(cfg, n, gpu_gib, link, effective_tflops=effective_tflops, precision=precision,
                     tokens_per_gpu=tokens_per_gpu, margin=margin)
            considered = set(map(id, p.considered()))
            for c in p.candidates:
                rows.append({"model": name, "params_B": GPTShape.of(cfg).total / 1e9, "gpus": n,
                             "gpu_GiB": gpu_gib, "interconnect": link.name, "mode": c.mode, "dp_mode": c.dp_mode,
                             "layout": c.label(), "weights_GiB": c.weights / GIB, "grads_GiB": c.grads / GIB,
                             "optimizer_GiB": c.optimizer / GIB, "activations_GiB": c.activations / GIB,
                             "working_GiB": c.working / GIB, "total_GiB": c.total_bytes / GIB,
                             "usable_GiB": p.usable_gib, "fits": c.fits, "considered": id(c) in considered,
                             "sent_GB_per_step": c.sent_bytes / 1e9, "step_s": c.step_s,
                             "exposed_comm_s": c.exposed_s, "chosen": c is p.choice})
    return rows
