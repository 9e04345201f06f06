# %% [markdown]
# # 04 · Mixed precision: fp32 → tf32 → bf16 → fp16 + GradScaler → channels_last → compile
#
# Lower-precision arithmetic runs on tensor cores and moves half the bytes, so the same model
# trains faster and holds smaller activations. This notebook climbs the ladder **in one run on
# this machine**, one switch at a time, through `labkit.torch.trainer.fit` (the same engine as
# `labkit train --precision ...`), and measures for each rung: throughput (median and range of
# repeated runs), speed-up over fp32 and whether it is measurable, activation memory, and the
# final loss (does the cheaper arithmetic still learn the same?).
#
# Then two mechanisms behind the ladder: the **loss-scale overflow** that fp16 needs a
# GradScaler for, and **tensor-core alignment** (sizes that are multiples of the tile run faster).

# %% tags=["parameters"]
scale = "auto"
model = "resnet"
steps = None
batch_size = None
include_compile = None
device = "auto"
repeats = 3
overflow_steps = 14
overflow_init_scale = 268435456.0
time_budget_s = 0.0

# %%
from labkit.notebooks import key_comparison, key_figure, key_ratio, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from IPython.display import Markdown, display
from labkit.core import config, frameworks
from labkit.course import ladder, precision, references, sizing
from labkit.course.precision import loss_scaling, tensor_cores
from labkit.course.tables import table

scale = config.resolve_scale(scale)
config.check_choice("model", model, ("cnn", "resnet", "gpt"))
config.check_int("overflow_steps", overflow_steps, minimum=1)
has_torch = frameworks.has_torch()

# %% [markdown]
# ## The sizes for this machine
# At `scale="full"` the sizes are chosen for the GPU this notebook runs on (its memory, the
# number formats it has tensor cores for, its speed), and a demo with more processes than GPUs
# runs them on the CPU. The plan says which, what it leaves out and why, and about how long this
# notebook takes here; `time_budget_s` trims the sizes to fit a time you give it.

# %%
plan = sizing.plan("04_mixed_precision", scale, time_budget_s=time_budget_s, model=model, repeats=repeats,
                   include_compile=include_compile)
print(plan.text() + ("" if has_torch else "\n" + frameworks.missing_reason("torch")))
fast = plan["recipe_precision"]  # the 16-bit format this GPU has tensor cores for: bf16, else fp16

# %% [markdown]
# ## The ladder (PyTorch)
# Each rung is a full training run of `steps` steps at `batch_size` with one more switch on; a
# run's throughput is the median over its steps after the first. A single run proves little:
# on a shared or throttled machine the same configuration can swing by tens of percent between
# runs. So every rung first runs once briefly (discarded: thread pools, kernels chosen on first
# use), then the rungs take turns `repeats` times. `samples_per_s` is the median of those runs,
# `range` their lowest and highest, and `vs_first` says whether the rung is faster or slower than
# fp32 or shows **no measurable difference here** (the ranges overlap).
# `activation_mib` is what autograd keeps for the backward pass, counted on any device.
#
# Before running: which rung do you expect to be fastest on this machine, and by how much over
# fp32? Will fp16 + GradScaler beat bf16 here? (The first lines under "What this run shows"
# answer from the measured runs.)
# `include_compile=None` compiles only at full scale: compiling takes minutes on a small CPU.

# %%
ladder_cfg = precision.PrecisionLadderConfig(model=model, scale=scale, steps=steps or plan["steps"],
                                             batch_size=batch_size or plan["batch_size"],
                                             include_compile=plan["include_compile"], device=device, repeats=repeats,
                                             formats=tuple(plan["formats"]))
rows = precision.run_ladder(ladder_cfg, "torch") if has_torch else []
if rows:
    display(Markdown(table(rows, precision.COLUMNS["torch"], markdown=True)))

# %% [markdown]
# ## What this run shows
# Every sentence below is written from the table above (`precision.findings` gives each rung's
# ratio, range and verdict): a rung is "faster" or "slower" only when none of its runs overlaps
# fp32's; otherwise the verdict is "no measurable difference here".

# %%
if rows:
    found = precision.findings(rows)
    best, first = found.best, found.first
    print(f"Highest median on {found.device}: {best.rung} at {best.samples_per_s:,.0f} samples/s ({best.runs} runs, "
          f"{best.low:,.0f}–{best.high:,.0f}), {best.speedup:.2f}× {first.rung} ({best.verdict}).")
    for r in found.others:
        print(f"{r.rung}: {r.speedup:.2f}× {first.rung} (runs {r.low:,.0f}–{r.high:,.0f} vs {first.low:,.0f}–"
              f"{first.high:,.0f} samples/s): {r.verdict}; final loss {r.final_loss:.4f} vs {first.final_loss:.4f}; "
              f"activations {r.activation_mib:.1f} vs {first.activation_mib:.1f} MiB.")

# %% [markdown]
# On a CPU there are no tensor cores: what the 16-bit and TF32 rungs measured there, and why.

# %%
if rows:
    for slow in found.slow_on_cpu:
        print(f"{slow.precision} ran at under half of fp32's speed on this CPU: oneDNN multiplies in {slow.precision} "
              f"natively only with {' or '.join(slow.native_flags)}, and this CPU reports "
              + (f"{', '.join(slow.cpu_has)}, so the slowdown is elsewhere (small smoke-size matrices)."
                 if slow.cpu_has else "neither, so each operation converts to fp32 and back."))
    if found.tf32_on_cpu:
        print("TF32 is a tensor-core mode of NVIDIA GPUs (Ampere and newer): on a CPU the tf32 rung runs fp32's "
              "kernels, so any difference between the two is run-to-run noise.")

# %%
if rows:
    half = precision.find(rows, fast)
    key_ratio(f"{half['rung']} speed-up over fp32 (torch)", half["speedup"], half["vs_first"],
              f"{half['device']}, median of {half['repeats']} runs; {half['vs_first']}")
    key_figure("highest-median ladder rung (torch)", best.rung, note=f"{best.speedup:.2f}× fp32; {best.verdict}")
    key_figure(f"activation memory {fast} / fp32 (torch)", half["activation_mib"] / rows[0]["activation_mib"], "×")
    for r in rows:  # the whole ladder, so a course run on a GPU can serve as the reference below
        key_figure(precision.RUNG_FIGURE.format(rung=r["rung"]), r["samples_per_s"], "samples/s",
                   note=f"{r['device']}, batch {ladder_cfg.resolved()[2]}, range {r['range']}")

# %% [markdown]
# ## Without a GPU: the reference ladder
# Tensor cores (TF32, bf16, fp16) are what the ladder is about, and a CPU has none. When this
# run had no GPU, here is a ladder measured on one, read from the repository's results (the
# line above the table names the file, the device, the software, the date and the command): this
# notebook's own ladder from the newest full-size course run on a GPU, each rung with the range
# of its repeated runs; or, where the repository holds no such run, labkit's ResNet-50 benchmark
# ladder (batch 256, one run per rung, and a last rung that adds CUDA graphs to compile). Rerun
# this notebook on a GPU machine (`labkit run notebooks/04_mixed_precision.ipynb -p scale full`,
# or as a Vertex AI job) to measure the ladder yourself.

# %%
from labkit.hardware.results import ResultsUnavailable

if rows and not rows[0]["device"].startswith("cuda"):
    try:
        reference, provenance = precision.reference_ladder()
        print("Reference, not measured by this run:", provenance)
        display(Markdown(table(reference, ["rung", "samples_per_s", "range", "speedup"], markdown=True)))
    except ResultsUnavailable as e:
        print(e)

# %% [markdown]
# ## fp16 needs a loss scale: the overflow demo
# fp16 keeps 5 exponent bits: small gradients underflow to zero, so the loss is multiplied by a
# scale before backward and the gradients divided by it before the update. Too large a scale
# overflows to inf: the GradScaler then **skips the step** (weights untouched) and **halves the
# scale**. Below, training starts from an absurd scale and finds a workable one by itself.
# (bf16 has fp32's exponent range and needs no scaler.)

# %%
if has_torch:
    demo = loss_scaling.overflow_demo("torch", steps=overflow_steps, init_scale=overflow_init_scale, device=device)
    display(Markdown(table(demo, ["step", "loss_scale", "skipped", "loss"], markdown=True)))
    skipped = sum(r["skipped"] for r in demo)
    print(f"{skipped} of {len(demo)} steps skipped; scale went from {demo[0]['loss_scale']:.3g} "
          f"to {demo[-1]['loss_scale']:.3g}")
    key_figure("fp16 steps skipped by the GradScaler (overflow demo)", skipped, note=f"of {len(demo)}")

# %% [markdown]
# ## Tensor-core alignment
# Tensor cores multiply tiles; a matrix dimension that is not a multiple of the tile (8 for
# fp16/bf16 elements, 64 to be safe) pays for padding or falls back to slower kernels. GPT-2's
# vocabulary of 50,257 tokens is the classic case: padding it to 50,304 (a multiple of 64)
# speeds up the output projection. On a CPU the effect is smaller and noisier, so the two
# projections are timed in turns and the verdict comes with their ranges.

# %%
if has_torch:
    aligned = tensor_cores.alignment_demo(device=device)
    display(Markdown(table(aligned, ["shape", "multiple_of_64", "tflops", "ms", "dtype"], markdown=True)))
    padded = tensor_cores.vocab_comparison(device=device)
    print(f"Vocab 50304 against 50257: {padded.ratio:.2f}× the FLOP rate ({padded.b.range_text()} vs "
          f"{padded.a.range_text()} TFLOP/s over {len(padded.b.values)} runs each): {ladder.verdict(padded)}.")
    key_comparison("vocab 50304 vs 50257 matmul FLOP rate", padded, "vocab 50257", "vocab 50304", "TFLOP/s")

# %% [markdown]
# ## The TensorFlow column
# The same ladder with TensorFlow, through `labkit.tf.engine` (the same model twin, data and
# optimizer as the torch runs above). TensorFlow's rungs are its own: a Keras **dtype policy**
# per model (`mixed_bfloat16`, `mixed_float16`) instead of an autocast region, Keras'
# `LossScaleOptimizer` instead of the GradScaler, no channels_last rung (TensorFlow is channels
# last natively), and XLA (`jit_compile`) as the compiler rung, included when
# `include_compile` is (by default only at full scale). Mind one default: TensorFlow turns TF32
# on by itself on Ampere and newer GPUs, so its "fp32" rung switches it off explicitly.
# TensorFlow shares the GPU with torch here by growing its memory as needed instead of
# reserving it all.

# %%
has_tf = frameworks.has_tf()
tf_cfg = ladder_cfg if plan["tf_scale"] == scale else precision.PrecisionLadderConfig(model=model, scale="smoke", repeats=repeats)
tf_rows = precision.run_ladder(tf_cfg, "tf") if has_tf else []
if has_tf:
    print(table(tf_rows, precision.COLUMNS["tf"]))
else:
    print(frameworks.missing_reason("tensorflow"))

# %% [markdown]
# Side by side, computed from the two tables: the bf16 speed-up each framework got over its
# own fp32 rung on this machine, with the verdict from its repeated runs.

# %%
if tf_rows:
    tf_found = precision.findings(tf_rows)
    tf_first = tf_found.first
    for r in tf_found.others:
        print(f"TensorFlow {r.rung}: {r.speedup:.2f}× {tf_first.rung} (runs {r.low:,.0f}–{r.high:,.0f} vs "
              f"{tf_first.low:,.0f}–{tf_first.high:,.0f} samples/s): {r.verdict}; final loss {r.final_loss:.4f} "
              f"vs {tf_first.final_loss:.4f}.")
    if rows:
        mine, theirs = found.rung(fast), tf_found.rung(fast)
        print(f"{fast} over fp32 here: torch {mine.speedup:.2f}× ({mine.verdict}), TensorFlow {theirs.speedup:.2f}× "
              f"({theirs.verdict}); final loss fp32 → {fast}: torch {first.final_loss:.4f} → {mine.final_loss:.4f}, "
              f"TensorFlow {tf_first.final_loss:.4f} → {theirs.final_loss:.4f}.")

# %%
if tf_rows:
    tf_bf16 = precision.find(tf_rows, fast)
    key_ratio(f"{tf_bf16['rung']} speed-up over fp32 (tf)", tf_bf16["speedup"], tf_bf16["vs_first"],
              f"{tf_bf16['device']}, median of {tf_bf16['repeats']} runs; {tf_bf16['vs_first']}")

# %% [markdown]
# The fp16 overflow demo with Keras' `LossScaleOptimizer`: same absurd starting scale, same
# behaviour (skip the step, halve the scale) as the GradScaler.

# %%
if has_tf:
    tf_demo = loss_scaling.overflow_demo("tf", steps=overflow_steps, init_scale=overflow_init_scale, device=device)
    print(table(tf_demo))
    tf_skipped = sum(r["skipped"] for r in tf_demo)
    key_figure("fp16 steps skipped by Keras' LossScaleOptimizer (overflow demo)", tf_skipped,
               note=f"of {len(tf_demo)}")

# %% [markdown]
# ## The code
# The ladder ran labkit's engines with one flag per rung. `labkit/recipes/mixed_precision.py` is
# the plain PyTorch you would write: both TF32 switches, `torch.autocast` to bf16 or fp16, a
# `GradScaler` for fp16, and the loss computed in float32.

# %%
from labkit.course import recipe_view

recipe_view.show("mixed_precision")

# %% [markdown]
# Before running: in bf16 every matmul rounds its inputs to 8 bits of mantissa. Do you expect the
# recipe's bf16 losses to equal the engine's bf16 run bit for bit, to agree within bf16 rounding
# (the tests allow 1e-3), or to drift apart? Two equal curves prove the code equal, not that the
# settings train: the last sentence says whether the recipe's curve falls.

# %%
code_argv = recipe_view.flags(model=model, scale=scale, steps=plan["recipe_steps"], batch_size=plan["recipe_batch"],
                              lr=plan["lr"], precision=fast)
if has_torch:
    print(recipe_view.command("mixed_precision", code_argv))
    mp = recipe_view.compare("mixed_precision", code_argv)
    recipe_view.plot(mp)
    key_figure(f"recipe mixed_precision ({fast}) vs labkit train: largest loss difference", mp.max_abs_diff,
               note=f"tolerance {mp.tolerance:.0e}, {model}")

# %%
if has_torch:
    trend = recipe_view.curve_trend(mp.recipe_losses)
    print(f"The recipe and `labkit train`, {len(mp.recipe_losses)} steps in {mp.precision}: largest loss difference "
          f"{mp.max_abs_diff:.1e} at step {mp.worst_step} (the tests allow {mp.tolerance:.0e}): {mp.agreement}.")
    if mp.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {mp.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

# %% [markdown]
# ### A common mistake: "PyTorch uses TF32 by default"
# Guides disagree on whether float32 work runs on TF32 tensor cores unless you say otherwise.
# The recipe sets both switches instead of trusting either answer. Before running: in a fresh
# PyTorch process on an Ampere or newer GPU, do float32 matmuls use TF32? Do convolutions? And in
# TensorFlow?

# %%
from labkit.course import mistakes

if has_torch:
    tf32 = mistakes.tf32_defaults()
    print(table(tf32.settings(), ["setting, in a fresh process", "value"]))
    on = {True: "on", False: "off", None: "unknown (TensorFlow is not installed here)"}
    key_figure("TF32 for float32 matmuls in a fresh PyTorch process", on[tf32.matmul],
               note=f"cuDNN convolutions: {on[tf32.convolutions]}")

# %% [markdown]
# Where the two switches differ, "PyTorch uses TF32 by default" is true of one and false of the
# other: a Linear-heavy model (a transformer) runs in true float32 and a ConvNet in TF32, unless
# both switches are set, as the recipe does.

# %%
if has_torch:
    print(f"A fresh PyTorch process: TF32 {on[tf32.matmul]} for float32 matmuls (float32 matmul precision "
          f"'{tf32.matmul_precision}'), {on[tf32.convolutions]} for cuDNN convolutions. TF32 in a fresh "
          f"TensorFlow process: {on[tf32.tensorflow]}.")
    if tf32.cuda:
        print(f"On this GPU a 2048² float32 matmul's largest relative error was {tf32.matmul_error_default:.1e} "
              f"with the default and {tf32.matmul_error_tf32:.1e} with TF32 on ({tf32.error_ratio:.0f}×).")
    else:
        print("No CUDA GPU here: TF32's effect on a matmul is not measured in this run.")

# %% [markdown]
# ### A common mistake: softmax fed to `cross_entropy`
# `F.cross_entropy` (like Keras' loss with `from_logits=True`) takes logits and applies
# log-softmax itself; many snippets apply `softmax` first. The mixed_precision recipe keeps the
# mistake runnable (`--mistake softmax`): below, its mistaken line beside the right one. With
# exactly these two lines, the course's GPT (512 classes) trains from the same weights on the
# same batches, once with plain SGD and once with AdamW, the optimizer of the recipes. The plot
# shows each run's true loss, and the loss the mistaken code logs. Before running: will the
# mistaken model learn more slowly, not at all, or just as well, and does it depend on the
# optimizer?

# %%
recipe_view.show_mistake("mixed_precision", "softmax")

# %%
if has_torch:
    softmax_runs = {opt: mistakes.softmax_into_cross_entropy(model="gpt", steps=30, batch_size=32, optimizer=opt)
                    for opt in ("sgd", "adamw")}
    mistakes.plot_softmax(softmax_runs["sgd"], softmax_runs["adamw"])
    key_figure("softmax into cross_entropy: first-step gradient, right / mistaken",
               softmax_runs["sgd"].gradient_shrink, "×", note=f"{softmax_runs['sgd'].classes} classes")
    for opt, r in softmax_runs.items():
        key_figure(f"softmax into cross_entropy, {opt}: true loss, mistaken − right after {len(r.right)} steps",
                   r.final_gap)

# %% [markdown]
# What the two runs show. cross_entropy applies log-softmax itself, and the softmax of
# probabilities (all in [0, 1]) is almost uniform and almost flat. SGD's steps scale with the
# gradient; AdamW divides each gradient by its own running size. The loss the mistaken code logs
# can never go below log(1 + (C − 1)/e) for C classes. The fix: pass logits (Keras:
# `from_logits=True`).

# %%
if has_torch:
    sgd = softmax_runs["sgd"]
    print(f"First step, {sgd.classes} classes: the gradient from probabilities was {sgd.gradient_shrink:.0f}× smaller "
          f"than from logits ({sgd.first_grad_norm_mistaken:.2e} vs {sgd.first_grad_norm_right:.2e}).")
    for r in softmax_runs.values():
        print(f"{r.optimizer} (lr {r.lr:g}), {len(r.right)} steps: the true loss {r.right_trend} with logits "
              f"({r.right[0]:.3f} → {r.right[-1]:.3f}) and {r.mistaken_trend} with probabilities ({r.mistaken[0]:.3f} → "
              f"{r.mistaken[-1]:.3f}); the loss the mistaken code logged {r.logged_trend} ({r.mistaken_logged[0]:.3f} → "
              f"{r.mistaken_logged[-1]:.3f}, floor {r.logged_floor:.3f}).")

# %% [markdown]
# ### What the engine does that the recipe does not
# On a GPU, labkit's engine can replay the compiled forward and backward passes as CUDA graphs
# (`compile_mode="reduce-overhead"`), and the whole step, optimizer included, as one graph
# (`cuda_graph_step`): the CPU launches one graph instead of hundreds of small kernels, which
# matters when the kernels are short. The recipe launches every kernel from Python. What that
# bought on an H100, read from the benchmark results files:

# %%
from labkit.course.precision import cuda_graphs

graph_rows, whole_step = cuda_graphs.cuda_graph_gains(), cuda_graphs.whole_step_graph()
if graph_rows:
    print(table(graph_rows, ["workload", "configuration", "without graphs", "with CUDA graphs", "unit", "gain"]))
else:
    print(references.NO_RESULTS + ".")
for r in graph_rows:
    print(f"{r['workload']}, {r['configuration']}: CUDA graphs took {r['without graphs']:,.0f} to "
          f"{r['with CUDA graphs']:,.0f} {r['unit']} ({r['gain']:.3f}×; {r['runs']} run, {r['verdict']}) on "
          f"{r['device']} ({r['source']}, {r['date']}).")
if rows and not rows[0]["device"].startswith("cuda"):
    print(f"This run's ladder ran on {rows[0]['device']}: CUDA graphs need a CUDA GPU, so none of this is measured here.")

# %% [markdown]
# The whole step as one graph (`labkit train --cuda-graph-step`: forward, backward, clipping and
# the fused AdamW update replayed in one launch), on top of labkit's best GPT settings, whose
# compiled forward and backward already replay as CUDA graphs: three runs each, so with a verdict.

# %%
if whole_step:
    w = whole_step
    print(f"{w['workload']}, {w['configuration']}: the whole step as one graph took {w['without']:,.0f} to "
          f"{w['with']:,.0f} {w['unit']} (medians of {w['runs']} runs, {w['without_low']:,.0f}–{w['without_high']:,.0f} "
          f"vs {w['with_low']:,.0f}–{w['with_high']:,.0f}), {w['gain']:.3f}× on {w['device']} ({w['date']}): "
          f"{w['verdict']}.")
else:
    print(references.NO_RESULTS + ".")

# %% [markdown]
# ### The same in Keras
# `labkit/recipes/keras_mixed_precision.py`: a Keras dtype policy (`mixed_bfloat16`,
# `mixed_float16`), `LossScaleOptimizer` for float16, and TF32 switched off explicitly when
# "fp32" must mean float32.

# %%
recipe_view.show("keras_mixed_precision")

# %% [markdown]
# Before running: the policy keeps the model's last layer in float32 so the logits and the loss
# are float32. Do you expect the Keras recipe's bf16 losses to match the TF engine's bf16 run?

# %%
if has_tf:
    print(recipe_view.command("keras_mixed_precision", code_argv))
    kmp = recipe_view.compare("keras_mixed_precision", code_argv)
    recipe_view.plot(kmp)
    key_figure(f"recipe keras_mixed_precision ({fast}) vs labkit train --framework tf: largest loss difference",
               kmp.max_abs_diff, note=f"tolerance {kmp.tolerance:.0e}, {model}")

# %%
if has_tf:
    ktrend = recipe_view.curve_trend(kmp.recipe_losses)
    print(f"The Keras recipe and `labkit train --framework tf`, {len(kmp.recipe_losses)} steps in {kmp.precision}: "
          f"largest loss difference {kmp.max_abs_diff:.1e} at step {kmp.worst_step} (the tests allow "
          f"{kmp.tolerance:.0e}): {kmp.agreement}.")
    if kmp.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {kmp.engine_spread:.1e}.")
    print(f"The Keras recipe's curve {ktrend.verdict}: mean loss {ktrend.first:.3f} over its first quarter of steps, "
          f"{ktrend.last:.3f} over its last.")
