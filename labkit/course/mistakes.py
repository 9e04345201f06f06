"""Mistakes that guides commonly make, each measured beside its fix in the run that shows it,
and the plots that put the mistake beside the fix. Notebooks 02, 04, 06, 07 and 08 each show
theirs. Notebook 04's two return numbers and verdicts, from which the notebook writes its
sentences; the others come with sentences computed from their numbers (`explain_*`, nothing
typed in).

- `softmax_into_cross_entropy`: probabilities fed to `F.cross_entropy` (which applies its own
  log-softmax), trained with the mixed_precision recipe's `--mistake softmax` line: the loss
  curves, the gradients at the first step, and the floor the logged loss can never go below.
- `save_to_bucket_url`: `torch.save` to a ``gs://`` string writes a local folder named ``gs:``;
  the same bytes through fsspec land in the bucket.
- `tf32_defaults`: what PyTorch and TensorFlow actually do with TF32, read from a fresh process.
- `embedding_gradient_traffic`: the bytes DDP all-reduces for an embedding gradient against the
  rows a batch touches.
- `per_process_batch`: a per-process batch taken for the global batch, against the
  single-process curve.
- `training_memory`: parameter, gradient, optimizer-state and activation bytes of a 110M-parameter
  model, counted from the tensors themselves, against the "parameters x 4 bytes" guess.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from labkit.core.config import ParameterError
from labkit.core.models import GPTConfig
from labkit.core.train_config import TrainConfig
from labkit.course.plots import finish, new_figure

# A BERT-base-sized decoder (BERT's 30522-token vocabulary, 512 positions): 109M parameters.
MODEL_110M = GPTConfig(vocab_size=30522, block_size=512, n_layer=12, n_head=12, n_embd=768)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


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

_SAVE_TO_URL = """
import os, sys, torch
url = sys.argv[1]
os.makedirs(os.path.dirname(url), exist_ok=True)  # what checkpoint code usually does first
torch.save({"w": torch.arange(1000.0)}, url)
"""


def save_to_bucket_url(workdir: str | os.PathLike, bucket_path: str = "labkit-demo/run1/model.pt"
                       ) -> dict[str, Any]:
    """`os.makedirs(dirname(url)); torch.save(state, url)` with ``url = gs://BUCKET_PATH``, run in
    `workdir` (its own process), against `fsspec.open(url, "wb")` on fsspec's memory filesystem
    standing in for the bucket. Reports where each write landed."""
    import fsspec
    import torch

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"gs://{bucket_path}"
    r = subprocess.run([sys.executable, "-c", _SAVE_TO_URL, url], cwd=workdir, capture_output=True,
                       text=True, timeout=120)
    if r.returncode:
        raise RuntimeError(f"the torch.save demo failed:\n{r.stderr[-2000:]}")
    landed = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*") if p.is_file())

    state = {"w": torch.arange(1000.0)}
    fixed_url = f"memory://{bucket_path}"
    with fsspec.open(fixed_url, "wb") as f:  # the fix: fsspec picks the filesystem from the URL
        torch.save(state, f)
    fs = fsspec.filesystem("memory")
    with fsspec.open(fixed_url, "rb") as f:
        back = torch.load(f, weights_only=True)
    size = fs.size(fixed_url)
    fs.rm(fixed_url)
    try:
        gs_class = fsspec.get_filesystem_class("gs")
        gs_handler = f"{gs_class.__module__}.{gs_class.__name__}"
    except (ImportError, ValueError):
        gs_handler = None  # gcsfs is not installed
    return {"url": url, "mistake_files_in_workdir": landed,
            "mistake_local_folder": landed[0].split(os.sep)[0] if landed else None,
            "fix_url": fixed_url, "fix_bytes": size, "fix_round_trip_equal": bool(torch.equal(back["w"], state["w"])),
            "gs_urls_handled_by": gs_handler}


def explain_save_to_bucket_url(r: dict[str, Any]) -> list[str]:
    """`save_to_bucket_url`'s result."""
    out = [f"torch.save(state, '{r['url']}') wrote {', '.join(r['mistake_files_in_workdir']) or 'nothing'} "
           f"under the working directory: a local folder named '{r['mistake_local_folder']}', not an "
           f"object in the bucket. On a Vertex VM it vanishes with the VM."]
    out.append(f"The fix, fsspec.open(url, 'wb') then torch.save into the file object, wrote "
               f"{r['fix_bytes']:,} bytes to {r['fix_url']} (an in-memory filesystem standing in for "
               f"the bucket); read back equal: {r['fix_round_trip_equal']}.")
    out.append(f"gs:// URLs are handled by {r['gs_urls_handled_by']}." if r["gs_urls_handled_by"]
               else "gcsfs is not installed here: `pip install gcsfs` and fsspec opens gs:// URLs.")
    out.append("On Vertex AI the bucket is also mounted at /gcs/BUCKET/, where a plain path works "
               "(but renames are not atomic: commit with a marker written last).")
    return out


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


def embedding_gradient_traffic(vocab_size: int = 50304, dim: int = 768, batch_size: int = 8,
                               block_size: int = 1024, world_size: int = 8, seed: int = 0) -> dict[str, Any]:
    """One backward pass through an `nn.Embedding(vocab_size, dim)` on a batch of labkit's
    synthetic token sequences: how many rows of the gradient are non-zero, against the dense
    gradient DDP all-reduces. Per-rank bytes sent: ring all-reduce of the dense gradient,
    2 (N - 1) / N x its size; gathering only the touched rows (values and int64 row ids) from
    every rank, (N - 1) x their size. Also the rows an `nn.Embedding(sparse=True)` gradient
    carries before coalescing, and the non-zero rows of a tied GPT embedding (the output layer
    touches every row)."""
    import torch
    from torch import nn

    from labkit.data.synthetic import SyntheticTokens, TokenDatasetConfig
    from labkit.torch.models import build_model

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
    small = ids[:, :gpt.cfg.block_size]
    gpt(small).logsumexp(-1).sum().backward()
    tied_rows = int((gpt.wte.weight.grad != 0).any(dim=1).sum())

    dense_bytes = vocab_size * dim * 4
    row_bytes = dim * 4 + 8
    n = world_size
    return {"vocab_size": vocab_size, "dim": dim, "tokens": int(ids.numel()),
            "rows_touched": touched, "rows_touched_fraction": touched / vocab_size,
            "dense_gradient_bytes": dense_bytes, "touched_rows_bytes": touched * row_bytes,
            "sparse_grad_rows_uncoalesced": uncoalesced_rows, "world_size": n,
            "dense_allreduce_bytes_per_rank": 2 * (n - 1) / n * dense_bytes,
            "touched_rows_allgather_bytes_per_rank": (n - 1) * touched * row_bytes,
            "tied_embedding_rows_touched_fraction": tied_rows / vocab_size}


def explain_embedding_gradient_traffic(r: dict[str, Any]) -> list[str]:
    """`embedding_gradient_traffic`'s result."""
    n = r["world_size"]
    dense, rows = r["dense_allreduce_bytes_per_rank"], r["touched_rows_allgather_bytes_per_rank"]
    break_even = 2 * r["dense_gradient_bytes"] / r["touched_rows_bytes"]
    out = [f"One batch of {r['tokens']:,} tokens touched {r['rows_touched']:,} of the {r['vocab_size']:,} "
           f"embedding rows ({r['rows_touched_fraction']:.1%}); the other rows' gradients are zeros.",
           f"DDP all-reduces the dense gradient ({r['dense_gradient_bytes'] / 1e6:.0f} MB): a ring "
           f"sends {dense / 1e6:.0f} MB per rank with {n} ranks. Only the touched rows (values and "
           f"row ids, {r['touched_rows_bytes'] / 1e6:.1f} MB) gathered from every rank: "
           f"{rows / 1e6:.0f} MB per rank ({rows / dense:.2f}× the dense all-reduce).",
           f"Gathering rows sends (N − 1)× their size while the ring sends under 2× the dense "
           f"gradient, so from about {break_even:.0f} ranks on, sparse gradients send more than "
           f"dense ones here: sparse pays for huge vocabularies, few ranks, small batches.",
           f"nn.Embedding(sparse=True) gives a gradient of {r['sparse_grad_rows_uncoalesced']:,} rows "
           f"before coalescing (one per token, repeats included), not {r['rows_touched']:,}.",
           f"In a GPT whose output layer shares the embedding matrix, the output layer's gradient "
           f"touches {r['tied_embedding_rows_touched_fraction']:.0%} of the rows: nothing sparse to send."]
    return out


# ---------------------------------------------------------------- per-process batch


def per_process_batch(model: str = "cnn", steps: int = 10, batch_size: int = 32, nproc: int = 2,
                      **config: Any) -> dict[str, Any]:
    """The single-process run with `batch_size`, beside `nproc` DDP processes given the same
    GLOBAL batch (right: each takes batch_size / nproc) and `nproc` processes that each took
    `batch_size` (the mistake: the global batch is nproc times larger). The mistaken run is
    trained on the same number of samples as the others (steps // nproc steps of the larger
    batch), so the curves compare per sample seen, and each run's held-out loss (the same unseen
    samples) is taken at the end: what the mistake does to a run of a fixed number of epochs."""
    from labkit.train import run_replicas, run_training

    if steps // nproc < 1:
        raise ValueError(f"steps={steps} must be at least nproc={nproc}: the mistaken run trains steps // nproc")
    base = TrainConfig(model=model, steps=steps, batch_size=batch_size, progress=False, **config)
    single, right = run_training(base), run_replicas(base, nproc)
    mistaken = run_replicas(replace(base, batch_size=batch_size * nproc, steps=steps // nproc), nproc)
    at_equal_samples = [single.losses[(k + 1) * nproc - 1] for k in range(len(mistaken.losses))]
    return {"single": single.losses, "right": right.losses, "mistaken": mistaken.losses, "nproc": nproc,
            "batch_size": batch_size, "mistaken_global_batch": batch_size * nproc,
            "right_max_gap": max(abs(a - b) for a, b in zip(single.losses, right.losses, strict=True)),
            "mistaken_max_gap": max(abs(a - b) for a, b in zip(at_equal_samples, mistaken.losses, strict=True)),
            "heldout_single": _heldout(single), "heldout_mistaken": _heldout(mistaken),
            "samples": steps * batch_size}


def _heldout(log) -> float | None:
    heldout = log.run.get("heldout")
    return None if not heldout else float(heldout["loss"])


def explain_per_process_batch(r: dict[str, Any]) -> list[str]:
    """`per_process_batch`'s result, the harm computed from its held-out losses."""
    n, b = r["nproc"], r["batch_size"]
    out = [f"Global batch {b} split over {n} processes ({b // n} each): the curve followed the "
           f"single process within {r['right_max_gap']:.1e}."]
    mine, theirs = r.get("heldout_mistaken"), r.get("heldout_single")
    if mine is None or theirs is None:
        harm = "(no held-out loss was measured)"
    elif mine > theirs:
        harm = (f"after the same {r['samples']:,} samples its held-out loss is {mine:.3f} against "
                f"{theirs:.3f}: worse, because it made {n}× fewer updates with a learning rate tuned for "
                f"batch {b}")
    else:
        harm = (f"after the same {r['samples']:,} samples its held-out loss is {mine:.3f} against "
                f"{theirs:.3f}: no worse in this short run, but it is not the run you configured")
    out.append(f"Each of the {n} processes taking {b} (global batch {r['mistaken_global_batch']}) is another "
               f"training run: {n}× the samples per step, {n}× fewer steps per epoch; {harm}. In DDP "
               f"`DataLoader(batch_size=...)` is per process; divide the global batch by the world size "
               f"(and by the accumulation steps), as the ddp recipe does.")
    return out


def plot_per_process_batch(r: dict[str, Any], path: str | os.PathLike | None = None):
    """Training loss against samples seen, so runs with different global batches compare on
    the same data."""
    fig, ax = new_figure((6, 3.5))
    b, n = r["batch_size"], r["nproc"]
    seen = [b * (i + 1) for i in range(len(r["single"]))]
    ax.plot(seen, r["single"], "-", lw=3, alpha=0.4, label=f"1 process, batch {b}")
    ax.plot(seen, r["right"], "o--", ms=3, label=f"{n} processes × {b // n}")
    ax.plot([b * n * (i + 1) for i in range(len(r["mistaken"]))], r["mistaken"], "s:", ms=4,
            label=f"{n} processes × {b} (mistake)")
    ax.set_xlabel("samples seen")
    ax.set_ylabel("training loss")
    ax.legend()
    return finish(fig, path)


# ---------------------------------------------------------------- memory of a 110M model


def training_memory(config: GPTConfig = MODEL_110M, batch_size: int = 8,
                    precision: str = "fp32") -> dict[str, Any]:
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
        raise ValueError(f"precision must be 'fp32' or 'bf16' (got {precision!r})")
    fp = measure(lambda: build_model(config), (config.block_size,), batch_size, precision, name="GPT",
                 vocab_limit=config.vocab_size)
    n = fp.parameters
    total = fp.param_bytes + fp.grad_bytes + fp.optimizer_bytes + fp.activation_bytes
    return {"model": asdict(config), "parameters": n, "batch_size": batch_size,
            "tokens_per_step": batch_size * config.block_size, "precision": precision,
            "guess_bytes": n * 4, "param_bytes": fp.param_bytes, "grad_bytes": fp.grad_bytes,
            "optimizer_bytes": fp.optimizer_bytes, "activation_bytes": fp.activation_bytes,
            "total_bytes": total, "total_over_guess": total / (n * 4)}


def explain_training_memory(fp32: dict[str, Any], bf16: dict[str, Any] | None = None) -> list[str]:
    """`training_memory`'s results, in float32 and (optionally) under bf16 autocast."""
    m = fp32
    out = [f"{m['parameters'] / 1e6:.0f}M parameters: 'parameters × 4 bytes' says {_gb(m['guess_bytes'])}. "
           f"One training step at batch {m['batch_size']} × {m['tokens_per_step'] // m['batch_size']} tokens "
           f"holds {_gb(m['total_bytes'])}, {m['total_over_guess']:.1f}× that: weights "
           f"{_gb(m['param_bytes'])}, gradients {_gb(m['grad_bytes'])}, AdamW's two moments "
           f"{_gb(m['optimizer_bytes'])}, activations saved for backward {_gb(m['activation_bytes'])}.",
           f"Activations are {m['activation_bytes'] / m['total_bytes']:.0%} of it and grow with batch × "
           f"sequence length; weights, gradients and optimizer state are "
           f"{(m['param_bytes'] + m['grad_bytes'] + m['optimizer_bytes']) / m['parameters']:.0f} bytes "
           f"per parameter whatever the batch."]
    if bf16 is not None:
        out.append(f"Under bf16 autocast the activations were {_gb(bf16['activation_bytes'])} "
                   f"({bf16['activation_bytes'] / m['activation_bytes']:.2f}×) and the total "
                   f"{_gb(bf16['total_bytes'])}: weights, gradients and AdamW's state stay float32.")
    out.append("Not counted: the CUDA context, the allocator's cache and fragmentation, and the "
               "temporaries freed within the step; the device needs more than this.")
    return out


def memory_rows(*results: dict[str, Any]) -> list[dict[str, Any]]:
    """A table row (GB) per `training_memory` result."""
    return [{"precision": r["precision"], "guess (params × 4)": r["guess_bytes"] / 1e9,
             "params": r["param_bytes"] / 1e9, "grads": r["grad_bytes"] / 1e9,
             "AdamW state": r["optimizer_bytes"] / 1e9, "activations": r["activation_bytes"] / 1e9,
             "total": r["total_bytes"] / 1e9, "total / guess": r["total_over_guess"]} for r in results]
