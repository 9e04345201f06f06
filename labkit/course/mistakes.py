"""Mistakes that guides commonly make, each measured beside its fix in the run that shows it,
and the plots that put the mistake beside the fix. Notebooks 02, 04, 06, 07 and 08 each show
theirs. Each returns numbers and verdicts, from which the notebook writes its sentences.

- `softmax_into_cross_entropy`: probabilities fed to `F.cross_entropy` (which applies its own
  log-softmax), trained with the mixed_precision recipe's `--mistake softmax` line: the loss
  curves, the gradients at the first step, and the floor the logged loss can never go below.
- `save_to_bucket_url`: `torch.save` to a ``gs://`` string writes a local folder named ``gs:``;
  the same bytes through fsspec land in the bucket. Both are the preemptible recipe's `save`,
  with and without its `--mistake save-to-url` lines; the numbers only, for notebook 07.
- `tf32_defaults`: what PyTorch and TensorFlow actually do with TF32, read from a fresh process.
- `embedding_gradient_traffic`: the bytes DDP all-reduces for an embedding gradient against the
  rows a batch touches, and which sends fewer per rank; the numbers only, for notebook 06.
- `per_process_batch`: a per-process batch taken for the global batch (the ddp recipe's
  `--mistake per-process-batch` line), against the single-process curve; the numbers only, for
  notebook 02.
- `training_memory`: parameter, gradient, optimizer-state and activation bytes of a 110M-parameter
  model, counted from the tensors themselves, against the "parameters x 4 bytes" guess; the
  numbers only, for notebook 08.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.core.config import ParameterError
from labkit.core.models import GPTConfig
from labkit.core.train_config import TrainConfig
from labkit.course.plots import finish, new_figure

# A BERT-base-sized decoder (BERT's 30522-token vocabulary, 512 positions): 109M parameters.
MODEL_110M = GPTConfig(vocab_size=30522, block_size=512, n_layer=12, n_head=12, n_embd=768)


# ---------------------------------------------------------------- softmax into cross_entropy


# A curve counts as having fallen when its last loss is this much below its first.
FELL_BY = 0.01


def trend(curve: list[float]) -> str:
    """"fell" when the last loss is more than `FELL_BY` below the first, else "stayed flat"."""
    return "fell" if curve[-1] < curve[0] - FELL_BY else "stayed flat"


@dataclass(frozen=True)
class SoftmaxRun:
    """`softmax_into_cross_entropy`'s two runs with one optimizer. `right` and `mistaken` are the
    true cross-entropy of each run's predictions per step; `mistaken_logged` is what the
    mistaken code logs."""

    model: str
    optimizer: str
    lr: float
    classes: int
    right: list[float]
    mistaken: list[float]
    mistaken_logged: list[float]
    first_grad_norm_right: float  # the gradient's norm at the first step, from logits
    first_grad_norm_mistaken: float  # ... and from probabilities

    @property
    def gradient_shrink(self) -> float:
        """How many times smaller the first gradient was with probabilities than with logits."""
        return self.first_grad_norm_right / self.first_grad_norm_mistaken

    @property
    def final_gap(self) -> float:
        """True loss of the mistaken run minus the right run's, after the last step."""
        return self.mistaken[-1] - self.right[-1]

    @property
    def logged_floor(self) -> float:
        """The lowest loss the mistaken code can log: log(1 + (classes - 1) / e), reached when
        the probabilities are one-hot on the right class."""
        return math.log(1 + (self.classes - 1) / math.e)

    @property
    def right_trend(self) -> str:
        return trend(self.right)

    @property
    def mistaken_trend(self) -> str:
        return trend(self.mistaken)

    @property
    def logged_trend(self) -> str:
        return trend(self.mistaken_logged)


def softmax_into_cross_entropy(model: str = "gpt", steps: int = 30, batch_size: int = 32,
                               optimizer: str = "sgd", lr: float | None = None,
                               seed: int = 0) -> SoftmaxRun:
    """Train the same model from the same weights on the same batches twice, with the loss of the
    mixed_precision recipe (`labkit.recipes.mixed_precision.cross_entropy`): logits into
    `F.cross_entropy` (right) and, as `--mistake softmax` trains, probabilities into it (the
    mistake). `optimizer`: "sgd" (lr 0.1 unless given), whose steps scale with the gradient, or
    "adamw" (labkit train's, lr 1e-3), which divides the gradient by its own running size."""
    if optimizer not in ("sgd", "adamw"):
        raise ParameterError("optimizer", optimizer, "must be 'sgd' or 'adamw'")
    lr = lr if lr is not None else (0.1 if optimizer == "sgd" else 1e-3)
    import torch
    import torch.nn.functional as F

    from labkit.recipes import common
    from labkit.recipes.mixed_precision import cross_entropy

    args = argparse.Namespace(model=model, scale="smoke", steps=steps, batch_size=batch_size, lr=lr,
                              warmup_steps=0, grad_clip=None, seed=seed, num_samples=None,
                              metrics_out=None)
    dataset = common.torch_dataset(args)
    curves: dict[str, list[float]] = {"right": [], "mistaken": [], "mistaken_logged": []}
    first_grad_norm = {}
    for name, mistake in (("right", None), ("mistaken", "softmax")):
        net = common.torch_model(args)
        opt = (torch.optim.SGD(net.parameters(), lr=lr) if optimizer == "sgd"
               else common.adamw(net, args)[0])
        data = common.batches(dataset, batch_size, seed)
        for step in range(steps):
            x, y = common.to_device(next(data), torch.device("cpu"))
            logits = net(x).flatten(0, -2).float()
            y = y.flatten()
            loss = cross_entropy(logits, y, mistake)  # the recipe's line, right or mistaken
            loss.backward()
            if step == 0:
                first_grad_norm[name] = math.sqrt(sum(float(p.grad.pow(2).sum())
                                                      for p in net.parameters()))
            opt.step()
            opt.zero_grad(set_to_none=True)
            curves[name].append(float(F.cross_entropy(logits.detach(), y)))
            if mistake:
                curves["mistaken_logged"].append(loss.item())
    return SoftmaxRun(model, optimizer, lr, logits.shape[-1], curves["right"], curves["mistaken"],
                      curves["mistaken_logged"], first_grad_norm["right"], first_grad_norm["mistaken"])


def plot_softmax(sgd: SoftmaxRun, adamw: SoftmaxRun, path: str | os.PathLike | None = None):
    """True loss of the correct and the mistaken run, and the mistaken run's logged loss, for
    each optimiser."""
    fig, ax = new_figure((10, 3.5))
    ax.remove()
    for ax, (name, r) in zip(fig.subplots(1, 2), (("SGD", sgd), ("AdamW", adamw)), strict=True):
        ax.plot(r.right, label="logits (right): true loss")
        ax.plot(r.mistaken, label="softmax first: true loss")
        ax.plot(r.mistaken_logged, "--", label="softmax first: logged loss")
        ax.axhline(r.logged_floor, color="grey", lw=0.8, ls=":", label="floor of the logged loss")
        ax.set_title(f"{name} (lr {r.lr:g}), {r.model}, {r.classes} classes")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
    ax.legend(fontsize=8)
    return finish(fig, path)


# ---------------------------------------------------------------- torch.save to gs://

# The preemptible recipe's `save`, with and without its `--mistake save-to-url` lines, in a process
# of its own whose working folder is the job's disk, with a local Cloud Storage server standing in
# for the bucket; after each save, the files it left on the disk and in the bucket, and the
# checkpoint a restarted job finds there (`newest_committed`), read back.
_SAVE_TO_URL = """
import json, os, sys, fsspec, torch
from labkit.recipes.preemptible import newest_committed, save

def disk():
    return {os.path.relpath(os.path.join(d, f)) for d, _, files in os.walk(".") for f in files}

state, out = {"w": torch.arange(1000.0)}, {}
fs, root = fsspec.core.url_to_fs(sys.argv[1])
for name, mistake in (("mistake", "save-to-url"), ("fix", None)):
    disk_before, bucket_before = disk(), set(fs.find(root))
    fs.invalidate_cache()
    save(fs, root, 0, state, mistake)
    fs.invalidate_cache()
    found = newest_committed(fs, root)
    equal = None
    if found:
        with fs.open(f"{found}/state.pt", "rb") as f:
            equal = bool(torch.equal(torch.load(f, weights_only=True)["w"], state["w"]))
    out[name] = {"disk": sorted(disk() - disk_before),
                 "bucket": sorted(fs.unstrip_protocol(p) for p in set(fs.find(root)) - bucket_before),
                 "found": found and fs.unstrip_protocol(found), "equal": equal}
out["handler"] = f"{type(fs).__module__}.{type(fs).__name__}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Saved:
    """One save of step 0's checkpoint by the recipe's `save`: the files it left on the job's
    disk (relative to its working folder) and in the bucket, the checkpoint a restarted job
    finds (None: none, so it starts again with step 0), and whether that read back equal."""

    disk_files: tuple[str, ...]
    bucket_files: tuple[str, ...]
    resumes_from: str | None
    read_back_equal: bool | None

    @property
    def local_folder(self) -> str | None:
        """The top folder of the files left on the disk ("gs:" after the mistake)."""
        return self.disk_files[0].split("/")[0] if self.disk_files else None


@dataclass(frozen=True)
class SaveToUrl:
    """`save_to_bucket_url`: the same checkpoint saved to `address` with the mistake and with the
    fix; `gs_handler` is the fsspec class that opened the ``gs://`` address."""

    address: str
    mistake: Saved
    fix: Saved
    gs_handler: str


def save_to_bucket_url(workdir: str | os.PathLike, bucket_path: str = "labkit-demo/run1/checkpoints") -> SaveToUrl:
    """Save a checkpoint to ``gs://BUCKET_PATH`` with the preemptible recipe's `save`, first with
    its `--mistake save-to-url` lines (`torch.save` given the address: a path), then without them
    (fsspec opens the address, `torch.save` writes into the file object, the commit marker last).
    Both run in one process whose working folder is `workdir`/job (the job's disk), against a
    local Cloud Storage server whose buckets are folders of `workdir`/buckets (`LocalStorage`),
    reached through gcsfs as on Vertex. `workdir` is emptied first."""
    import shutil

    from labkit.core import frameworks
    from labkit.core.launcher import child_env
    from labkit.vertex.storage import LocalStorage

    frameworks.require("gcsfs")  # what opens gs:// addresses for fsspec
    bucket = bucket_path.strip("/").split("/")[0]
    if not bucket or bucket == bucket_path.strip("/"):
        raise ParameterError("bucket_path", bucket_path, "must be BUCKET/PATH (a folder inside a bucket)")
    workdir = Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "buckets" / bucket).mkdir(parents=True)
    (workdir / "job").mkdir()
    address = f"gs://{bucket_path.strip('/')}"
    with LocalStorage(workdir / "buckets", workdir / "storage") as server:
        r = subprocess.run([sys.executable, "-c", _SAVE_TO_URL, address], cwd=workdir / "job",
                           env=child_env(server.client_env()), capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"the save-to-url measurement failed:\n{r.stderr[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    saved = {name: Saved(tuple(out[name]["disk"]), tuple(out[name]["bucket"]), out[name]["found"],
                         out[name]["equal"]) for name in ("mistake", "fix")}
    return SaveToUrl(address, saved["mistake"], saved["fix"], out["handler"])


# ---------------------------------------------------------------- TF32 defaults

_READ_TF32 = """
import json, importlib.util
import torch
out = {"matmul": torch.backends.cuda.matmul.allow_tf32, "convolutions": torch.backends.cudnn.allow_tf32,
       "matmul_precision": torch.get_float32_matmul_precision(), "cuda": torch.cuda.is_available(),
       "tensorflow": None, "matmul_error_default": None, "matmul_error_tf32": None}
if torch.cuda.is_available():
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(2048, 2048, device="cuda", generator=g) for _ in range(2))
    exact = (a.double() @ b.double())
    def err():
        return float(((a @ b).double() - exact).abs().max() / exact.abs().max())
    out["matmul_error_default"] = err()
    torch.backends.cuda.matmul.allow_tf32 = True
    out["matmul_error_tf32"] = err()
if importlib.util.find_spec("tensorflow"):
    import os
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    out["tensorflow"] = tf.config.experimental.tensor_float_32_execution_enabled()
print(json.dumps(out))
"""


@dataclass(frozen=True)
class TF32Defaults:
    """The TF32 settings of a fresh Python process (`tf32_defaults`)."""

    matmul: bool  # torch.backends.cuda.matmul.allow_tf32: float32 matmuls on TF32 tensor cores
    convolutions: bool  # torch.backends.cudnn.allow_tf32: the same for cuDNN convolutions
    matmul_precision: str  # torch.get_float32_matmul_precision()
    cuda: bool  # a CUDA GPU was there to measure the error on
    tensorflow: bool | None  # tf.config.experimental.tensor_float_32_execution_enabled(); None: no TF
    # The largest relative error of a 2048² float32 matmul with the default setting and with
    # TF32 on (None without a CUDA GPU).
    matmul_error_default: float | None
    matmul_error_tf32: float | None

    @property
    def error_ratio(self) -> float | None:
        """How many times larger the matmul's error was with TF32 on (None without a GPU)."""
        if self.matmul_error_default is None or self.matmul_error_tf32 is None:
            return None
        return self.matmul_error_tf32 / self.matmul_error_default

    def settings(self) -> dict[str, Any]:
        """The settings under the names a learner types, for a table."""
        out = {"torch.backends.cuda.matmul.allow_tf32": self.matmul,
               "torch.backends.cudnn.allow_tf32": self.convolutions,
               "torch.get_float32_matmul_precision()": self.matmul_precision}
        if self.tensorflow is not None:
            out["tf.config.experimental.tensor_float_32_execution_enabled()"] = self.tensorflow
        return out


def tf32_defaults() -> TF32Defaults:
    """TF32 settings of a fresh Python process (labkit sets them explicitly in every run, so
    this process's flags say nothing about the defaults): PyTorch's matmul and cuDNN switches
    and, when installed, TensorFlow's. On a CUDA GPU, the largest relative error of a 2048^2
    float32 matmul with the default setting and with TF32 on."""
    r = subprocess.run([sys.executable, "-c", _READ_TF32], capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"reading the TF32 defaults failed:\n{r.stderr[-2000:]}")
    return TF32Defaults(**json.loads(r.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------- embedding gradients


# The verdicts of `EmbeddingTraffic.fewer_bytes`: which way sends fewer bytes per rank.
SPARSE_FEWER = "the touched rows send fewer bytes than the dense all-reduce"
DENSE_FEWER = "the dense all-reduce sends fewer bytes than the touched rows"
SAME_BYTES = "both send the same bytes"


@dataclass(frozen=True)
class EmbeddingTraffic:
    """`embedding_gradient_traffic`: the rows one batch's gradient touches, and the bytes each of
    `world_size` ranks sends for it, dense (ring all-reduce) or as rows (gathered from every rank).
    A row sent alone is its float32 values and an int64 row id. The bytes per rank are nccl-tests'
    (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md, read 2026-11-29): an
    all-reduce of S bytes needs 2(n-1)/n x S through each rank's link, an all-gather of n ranks'
    shares (n-1)/n of the gathered total, which is each rank's share n-1 times."""

    vocab_size: int
    dim: int
    tokens: int
    rows_touched: int
    sparse_grad_rows_uncoalesced: int  # rows of an nn.Embedding(sparse=True) gradient: one per token
    world_size: int
    tied_rows_touched: int  # non-zero rows of a tied GPT embedding's gradient (its output layer's too)

    @property
    def rows_touched_fraction(self) -> float:
        return self.rows_touched / self.vocab_size

    @property
    def tied_rows_touched_fraction(self) -> float:
        return self.tied_rows_touched / self.vocab_size

    @property
    def dense_gradient_bytes(self) -> int:
        return self.vocab_size * self.dim * 4

    @property
    def touched_rows_bytes(self) -> int:
        return self.rows_touched * (self.dim * 4 + 8)

    @property
    def dense_allreduce_bytes_per_rank(self) -> float:
        """A ring all-reduce sends 2 (N - 1) / N × the gradient from each rank."""
        n = self.world_size
        return 2 * (n - 1) / n * self.dense_gradient_bytes

    @property
    def touched_rows_allgather_bytes_per_rank(self) -> int:
        """Gathering every rank's touched rows: each rank sends its rows to the N - 1 others."""
        return (self.world_size - 1) * self.touched_rows_bytes

    @property
    def sparse_over_dense(self) -> float | None:
        """Bytes per rank of the row gather over the dense all-reduce (None with one rank: neither sends)."""
        dense = self.dense_allreduce_bytes_per_rank
        return self.touched_rows_allgather_bytes_per_rank / dense if dense else None

    @property
    def sparse_sends_more_from(self) -> int:
        """The fewest ranks at which the row gather sends more than the ring: (N - 1) t > 2 (N - 1) D / N,
        that is N > 2 D / t, for t bytes of touched rows and D of dense gradient."""
        return math.floor(2 * self.dense_gradient_bytes / self.touched_rows_bytes) + 1

    @property
    def fewer_bytes(self) -> str:
        """`SPARSE_FEWER`, `DENSE_FEWER` or `SAME_BYTES`, at `world_size` ranks (bytes are counted, not timed)."""
        rows, dense = self.touched_rows_allgather_bytes_per_rank, self.dense_allreduce_bytes_per_rank
        return SAME_BYTES if rows == dense else SPARSE_FEWER if rows < dense else DENSE_FEWER


def embedding_gradient_traffic(vocab_size: int = 50304, dim: int = 768, batch_size: int = 8,
                               block_size: int = 1024, world_size: int = 8, seed: int = 0) -> EmbeddingTraffic:
    """One backward pass through an `nn.Embedding(vocab_size, dim)` on a batch of labkit's
    synthetic token sequences: how many rows of the gradient are non-zero, and the rows an
    `nn.Embedding(sparse=True)` gradient carries before coalescing; also the non-zero rows of a
    tied GPT embedding's gradient (the output layer touches every row). The bytes per rank follow
    from these counts (`EmbeddingTraffic`)."""
    import torch
    from torch import nn

    from labkit.data.synthetic import SyntheticTokens, TokenDatasetConfig
    from labkit.torch.models import build_model

    if world_size < 1:
        raise ParameterError("world_size", world_size, "must be at least 1")
    tokens, _ = SyntheticTokens(TokenDatasetConfig(num_sequences=batch_size, block_size=block_size,
                                                   vocab_size=vocab_size, seed=seed)).batch(range(batch_size))
    ids = torch.from_numpy(tokens)
    dense = nn.Embedding(vocab_size, dim)
    dense(ids).pow(2).sum().backward()
    touched = int((dense.weight.grad != 0).any(dim=1).sum())
    sparse = nn.Embedding(vocab_size, dim, sparse=True)
    sparse(ids).pow(2).sum().backward()
    uncoalesced_rows = int(sparse.weight.grad._nnz())

    gpt = build_model(GPTConfig(vocab_size=vocab_size, block_size=min(block_size, 64), n_layer=1,
                                n_head=1, n_embd=16))
    gpt(ids[:, :gpt.cfg.block_size]).logsumexp(-1).sum().backward()
    tied_rows = int((gpt.wte.weight.grad != 0).any(dim=1).sum())
    return EmbeddingTraffic(vocab_size, dim, int(ids.numel()), touched, uncoalesced_rows, world_size, tied_rows)


# ---------------------------------------------------------------- per-process batch


# The right run computes the single process's sum in another order: the fp32 tolerance the
# recipes are held to against `labkit train`.
RIGHT_TOLERANCE = 1e-5


@dataclass(frozen=True)
class PerProcessBatch:
    """`per_process_batch`'s three runs of the ddp recipe, their per-step losses: one process
    (`single`), `nproc` processes sharing the global batch `batch_size` (`right`), and `nproc`
    processes each taking all of it (`mistaken`, the recipe's `--mistake per-process-batch`
    lines), trained on the same number of samples in `nproc`× fewer steps."""

    nproc: int
    batch_size: int
    single: tuple[float, ...]
    right: tuple[float, ...]
    mistaken: tuple[float, ...]

    @property
    def per_process(self) -> int:
        """What each process takes when the global batch is split right."""
        return self.batch_size // self.nproc

    @property
    def mistaken_global_batch(self) -> int:
        return self.batch_size * self.nproc

    @property
    def samples(self) -> int:
        """Samples each run trained on."""
        return len(self.single) * self.batch_size

    @property
    def right_max_gap(self) -> float:
        """Largest per-step loss difference of the right run from the single process."""
        return max(abs(a - b) for a, b in zip(self.single, self.right, strict=True))

    @property
    def right_within_tolerance(self) -> bool:
        """Whether that is float rounding: within `RIGHT_TOLERANCE`."""
        return self.right_max_gap <= RIGHT_TOLERANCE

    @property
    def single_at_equal_samples(self) -> tuple[float, ...]:
        """The single process's loss at each mistaken step's count of samples seen (that step's
        batch included): its steps nproc - 1, 2 nproc - 1, ..."""
        return tuple(self.single[(k + 1) * self.nproc - 1] for k in range(len(self.mistaken)))

    @property
    def matched_tail(self) -> int:
        """How many of the last matched steps `end_comparison` compares: a quarter, at least
        `stats.MIN_REPEATS`."""
        return min(len(self.mistaken), max(stats.MIN_REPEATS, len(self.mistaken) // 4))

    @property
    def end_comparison(self) -> stats.Comparison | None:
        """The mistaken run's losses (b) against the single process's (a) over the last
        `matched_tail` matched steps, lower is better; None with fewer than a verdict needs."""
        k = self.matched_tail
        if k < stats.MIN_REPEATS:
            return None
        return stats.compare(self.single_at_equal_samples[-k:], self.mistaken[-k:], higher_is_better=False)

    @property
    def verdict(self) -> str:
        """The mistaken run against the single process after the same samples: "worse" (higher
        loss), "better", `stats.NO_DIFFERENCE` (the ranges overlap) or no verdict."""
        c = self.end_comparison
        if c is None:
            return f"fewer than {stats.MIN_REPEATS} matched steps: no verdict"
        return stats.NO_DIFFERENCE if c.winner is None else ("better" if c.b_is_better else "worse")


def per_process_batch(config: TrainConfig, nproc: int = 2, *, timeout_s: float = 600.0) -> PerProcessBatch:
    """Run the ddp recipe with `config`'s settings three times: as one process, as `nproc`
    processes (each takes batch_size / nproc: right), and as `nproc` processes with
    `--mistake per-process-batch` (each takes batch_size: the global batch is nproc× larger)
    for steps // nproc steps, so that all three train on the same number of samples."""
    from labkit.course import recipe_view

    if nproc < 2:
        raise ParameterError("nproc", nproc, "must be at least 2: with one process the two batches are the same")
    if config.steps < nproc:
        raise ParameterError("steps", config.steps, f"must be at least nproc={nproc}: the mistaken run trains "
                             "steps // nproc steps")
    if config.batch_size % nproc:
        raise ParameterError("batch_size", config.batch_size, f"must divide by nproc={nproc}")

    def losses(cfg: TrainConfig, processes: int, *mistake: str) -> tuple[float, ...]:
        argv = [*recipe_view.flags(cfg), *mistake]
        return tuple(recipe_view.run("ddp", argv, nproc=processes, timeout_s=timeout_s).losses)

    fewer = replace(config, steps=config.steps // nproc)
    return PerProcessBatch(nproc, config.batch_size, losses(config, 1), losses(config, nproc),
                           losses(fewer, nproc, "--mistake", "per-process-batch"))


def plot_per_process_batch(r: PerProcessBatch, path: str | os.PathLike | None = None):
    """Training loss against samples seen, so runs with different global batches compare on
    the same data."""
    fig, ax = new_figure((6, 3.5))
    b, n = r.batch_size, r.nproc
    seen = [b * (i + 1) for i in range(len(r.single))]
    ax.plot(seen, r.single, "-", lw=3, alpha=0.4, label=f"1 process, batch {b}")
    ax.plot(seen, r.right, "o--", ms=3, label=f"{n} processes × {r.per_process}")
    ax.plot([b * n * (i + 1) for i in range(len(r.mistaken))], r.mistaken, "s:", ms=4,
            label=f"{n} processes × {b} (mistake)")
    ax.set_xlabel("samples seen")
    ax.set_ylabel("training loss")
    ax.legend()
    return finish(fig, path)


# ---------------------------------------------------------------- memory of a 110M model


@dataclass(frozen=True)
class TrainingMemory:
    """The bytes one training step of `model` holds (`training_memory`), by kind."""

    model: GPTConfig
    parameters: int
    batch_size: int
    precision: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int  # AdamW's two moments and its step counts
    activation_bytes: int  # what autograd saves for backward

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.model.block_size

    @property
    def guess_bytes(self) -> int:
        """The guess "parameters × 4 bytes": the float32 weights alone."""
        return 4 * self.parameters

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes

    @property
    def total_over_guess(self) -> float:
        return self.total_bytes / self.guess_bytes

    @property
    def activation_share(self) -> float:
        """The activations' share of the total (the part that grows with batch × sequence)."""
        return self.activation_bytes / self.total_bytes

    @property
    def state_bytes_per_parameter(self) -> float:
        """Weights, gradients and optimizer state per parameter, whatever the batch."""
        return (self.param_bytes + self.grad_bytes + self.optimizer_bytes) / self.parameters


def training_memory(config: GPTConfig = MODEL_110M, batch_size: int = 8,
                    precision: str = "fp32") -> TrainingMemory:
    """Bytes one training step of `config` holds, counted from the tensors by the same function
    `labkit estimate` uses (`labkit.torch.footprint.measure`, on fake tensors: shapes and dtypes,
    no data, so a 110M model is counted in seconds): the parameters, a gradient per parameter,
    AdamW's state after a step, and what autograd saves for backward during the forward and the
    cross-entropy of `batch_size` sequences of `block_size` tokens (under bf16 autocast with
    `precision="bf16"`). Leaves out what varies by machine: the CUDA context, allocator caching
    and fragmentation, and temporaries freed within the step."""
    from labkit.torch.footprint import measure
    from labkit.torch.models import build_model

    if precision not in ("fp32", "bf16"):
        raise ParameterError("precision", precision, "must be 'fp32' or 'bf16'")
    fp = measure(lambda: build_model(config), (config.block_size,), batch_size, precision, name="GPT",
                 vocab_limit=config.vocab_size)
    return TrainingMemory(config, fp.parameters, batch_size, precision, fp.param_bytes, fp.grad_bytes,
                          fp.optimizer_bytes, fp.activation_bytes)


def memory_rows(*results: TrainingMemory) -> list[dict[str, Any]]:
    """A table row (GB) per `training_memory` result."""
    return [{"precision": r.precision, "guess (params × 4)": r.guess_bytes / 1e9,
             "params": r.param_bytes / 1e9, "grads": r.grad_bytes / 1e9,
             "AdamW state": r.optimizer_bytes / 1e9, "activations": r.activation_bytes / 1e9,
             "total": r.total_bytes / 1e9, "total / guess": r.total_over_guess} for r in results]
