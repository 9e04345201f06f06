"""What each measurement of `labkit.course.mistakes` shows: sentences computed from its numbers
(nothing typed in), and the plots that put the mistake beside the fix."""

from __future__ import annotations

import os
from typing import Any

from labkit.course.plots import finish, new_figure


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _moved(first: float, last: float) -> str:
    return f"fell from {first:.3f} to {last:.3f}" if _fell(first, last) else \
        f"stayed flat ({first:.3f} → {last:.3f})"


def _fell(first: float, last: float) -> bool:
    return last < first - 0.01


# ---------------------------------------------------------------- softmax into cross_entropy


def softmax(sgd: dict[str, Any], adamw: dict[str, Any]) -> list[str]:
    """Both optimisers' runs of `mistakes.softmax_into_cross_entropy`."""
    s = sgd
    out = [f"First step, {s['classes']} classes: the gradient with probabilities fed to cross_entropy "
           f"was {s['gradient_shrink']:.0f}× smaller than with logits ({s['first_grad_norm_mistaken']:.2e} "
           f"vs {s['first_grad_norm_right']:.2e}). cross_entropy applies log-softmax itself, and the "
           f"softmax of probabilities (all in [0, 1]) is almost uniform and almost flat."]
    for name, r, why in (("SGD", sgd, "whose steps scale with the gradient"),
                         ("AdamW", adamw, "which divides each gradient by its own running size")):
        out.append(f"{name} (lr {r['lr']:g}), {why}: over {len(r['right'])} steps the true loss of the "
                   f"correct run {_moved(r['right'][0], r['right'][-1])}, of the mistaken run "
                   f"{_moved(r['mistaken'][0], r['mistaken'][-1])} (final gap {r['final_gap']:+.3f}); "
                   f"the loss the mistaken code logged {_moved(r['mistaken_logged'][0], r['mistaken_logged'][-1])}.")
    a = adamw
    learns = {name: _fell(r["mistaken"][0], r["mistaken"][-1]) for name, r in (("SGD", sgd), ("AdamW", adamw))}
    verdict = "; ".join(f"with {name} the mistaken model " + ("still learned" if ok else "hardly learned")
                        for name, ok in learns.items())
    out.append(f"The logged loss can never go below log(1 + (C − 1)/e) = {a['logged_floor']:.3f} for "
               f"C = {a['classes']} classes (its lowest here: "
               f"{min(min(sgd['mistaken_logged']), min(a['mistaken_logged'])):.3f}), so the log looks stuck "
               f"whatever the model learns: {verdict}. The fix: pass logits (Keras: from_logits=True).")
    return out


def plot_softmax(sgd: dict[str, Any], adamw: dict[str, Any], path: str | os.PathLike | None = None):
    """True loss of the correct and the mistaken run, and the mistaken run's logged loss, for
    each optimiser."""
    fig, ax = new_figure((10, 3.5))
    ax.remove()
    for ax, (name, r) in zip(fig.subplots(1, 2), (("SGD", sgd), ("AdamW", adamw)), strict=True):
        ax.plot(r["right"], label="logits (right): true loss")
        ax.plot(r["mistaken"], label="softmax first: true loss")
        ax.plot(r["mistaken_logged"], "--", label="softmax first: logged loss")
        ax.axhline(r["logged_floor"], color="grey", lw=0.8, ls=":", label="floor of the logged loss")
        ax.set_title(f"{name} (lr {r['lr']:g}), {r['model']}, {r['classes']} classes")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
    ax.legend(fontsize=8)
    return finish(fig, path)


# ---------------------------------------------------------------- torch.save to gs://


def save_to_bucket_url(r: dict[str, Any]) -> list[str]:
    """`mistakes.save_to_bucket_url`'s result."""
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


def tf32_defaults(r: dict[str, Any]) -> list[str]:
    """`mistakes.tf32_defaults`'s result."""
    matmul, cudnn = r["torch.backends.cuda.matmul.allow_tf32"], r["torch.backends.cudnn.allow_tf32"]
    on_off = {True: "on", False: "off"}
    out = [f"A fresh PyTorch process: TF32 for float32 matmuls is {on_off[matmul]} "
           f"(torch.backends.cuda.matmul.allow_tf32 = {matmul}, float32 matmul precision "
           f"'{r['torch.get_float32_matmul_precision()']}'), for cuDNN convolutions {on_off[cudnn]} "
           f"(torch.backends.cudnn.allow_tf32 = {cudnn})."]
    if matmul != cudnn:
        out.append("So 'PyTorch uses TF32 by default' is true of one and false of the other: a "
                   "Linear-heavy model (a transformer) runs in true float32 and a ConvNet in TF32 "
                   "unless both switches are set, as the mixed_precision recipe does.")
    key = "tf.config.experimental.tensor_float_32_execution_enabled()"
    if key in r:
        out.append(f"TensorFlow: {key} = {r[key]}: "
                   + ("TF32 is on by default on Ampere and newer GPUs, so TensorFlow's 'float32' is "
                      "not float32 unless switched off." if r[key] else "TF32 is off."))
    if r.get("cuda"):
        ratio = r["matmul_rel_error_tf32"] / r["matmul_rel_error_default"]
        out.append(f"On this GPU a 2048² float32 matmul's largest relative error was "
                   f"{r['matmul_rel_error_default']:.1e} with the default and "
                   f"{r['matmul_rel_error_tf32']:.1e} with TF32 on ({ratio:.0f}×).")
    else:
        out.append("No CUDA GPU here, so TF32's effect on a matmul is not measured in this run; "
                   "rerun this notebook on a GPU to see it.")
    return out


# ---------------------------------------------------------------- embedding gradients


def embedding_gradient_traffic(r: dict[str, Any]) -> list[str]:
    """`mistakes.embedding_gradient_traffic`'s result."""
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


def per_process_batch(r: dict[str, Any]) -> list[str]:
    """`mistakes.per_process_batch`'s result."""
    n, b = r["nproc"], r["batch_size"]
    return [f"Global batch {b} split over {n} processes ({b // n} each): the curve followed the "
            f"single process within {r['right_max_gap']:.1e}.",
            f"Each of the {n} processes taking {b} (global batch {r['mistaken_global_batch']}): it left "
            f"the single-process curve by up to {r['mistaken_max_gap']:.3f}. That is another training "
            f"run: {n}× the samples per step, fewer steps per epoch, and a learning rate tuned for "
            f"batch {b}. In DDP `DataLoader(batch_size=...)` is per process; divide the global batch "
            f"by the world size (and by the accumulation steps), as the ddp recipe does."]


def plot_per_process_batch(r: dict[str, Any], path: str | os.PathLike | None = None):
    fig, ax = new_figure((6, 3.5))
    ax.plot(r["single"], "-", lw=3, alpha=0.4, label=f"1 process, batch {r['batch_size']}")
    ax.plot(r["right"], "o--", ms=3, label=f"{r['nproc']} processes × {r['batch_size'] // r['nproc']}")
    ax.plot(r["mistaken"], "s:", ms=3, label=f"{r['nproc']} processes × {r['batch_size']} (mistake)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    return finish(fig, path)


# ---------------------------------------------------------------- memory of a 110M model


def training_memory(fp32: dict[str, Any], bf16: dict[str, Any] | None = None) -> list[str]:
    """`mistakes.training_memory`'s results, in float32 and (optionally) under bf16 autocast."""
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
    """A table row (GB) per `mistakes.training_memory` result."""
    return [{"precision": r["precision"], "guess (params × 4)": r["guess_bytes"] / 1e9,
             "params": r["param_bytes"] / 1e9, "grads": r["grad_bytes"] / 1e9,
             "AdamW state": r["optimizer_bytes"] / 1e9, "activations": r["activation_bytes"] / 1e9,
             "total": r["total_bytes"] / 1e9, "total / guess": r["total_over_guess"]} for r in results]
