# %% [markdown]
# # 08 · Memory: the largest batch, gradient accumulation, activation checkpointing, sharding
#
# Device memory holds four things: weights, gradients, optimizer state (Adam: two more copies)
# and the activations saved for the backward pass. This notebook measures each lever on this
# machine, through the same engine as `labkit train`:
#
# 1. **Largest-batch finder**: try, catch out-of-memory, back off, bisect.
# 2. **Gradient accumulation**: k micro-batches give the same gradients as one k× larger batch
#    (checked here, number by number), at a fraction of the activation memory.
# 3. **Activation checkpointing**: store less, recompute in backward: memory vs time, measured.
# 4. **Sharding (FSDP / ZeRO-3)**: each process holds 1/N of weights, gradients and optimizer
#    state instead of a full replica: measured per process with real processes.
# 5. **Attention through SDPA**: the fused kernels never store the T×T score matrix.

# %% tags=["parameters"]
scale = "auto"
model = "gpt"
device = "auto"
cpu_budget_mib = 24.0
batch_limit = 4096
accumulation_models = ["cnn", "gpt", "resnet"]
micro_steps = 4
tradeoff_batch = 16
tradeoff_steps = 6
tradeoff_repeats = 3  # runs of each setting in the checkpointing comparison, taking turns
sharding_processes = 2
sharding_steps = 3
time_budget_s = 0.0

# %%
from labkit.notebooks import key_comparison, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from IPython.display import Markdown, display
from labkit.core import config, frameworks
from labkit.course import sizing
from labkit.course.tables import table
from labkit.core.train_config import TrainConfig

scale = config.resolve_scale(scale)
config.check_int("micro_steps", micro_steps, minimum=1)
config.check_int("sharding_processes", sharding_processes, minimum=1, maximum=8)
has_torch = frameworks.has_torch()

# %% [markdown]
# ## The sizes for this machine
# At `scale="full"` the sizes are chosen for the GPU this notebook runs on (its memory, the
# number formats it has tensor cores for, its speed), and a demo with more processes than GPUs
# runs them on the CPU. The plan says which, what it leaves out and why, and about how long this
# notebook takes here; `time_budget_s` trims the sizes to fit a time you give it.

# %%
plan = sizing.plan("08_memory", scale, time_budget_s=time_budget_s, model=model,
                   sharding_processes=sharding_processes, tradeoff_steps=tradeoff_steps,
                   tradeoff_batch=tradeoff_batch, micro_steps=micro_steps)
print(plan.text() + ("" if has_torch else "\n" + frameworks.missing_reason("torch")))
base = TrainConfig(model=model, scale=scale, device=device, progress=False, batch_size=plan["tradeoff_batch"],
                   lr=plan["lr"])

# %% [markdown]
# ## 1. The largest batch that fits
# On a GPU every try is a real training step and a real `OutOfMemoryError` is caught. A CPU has
# no device memory to exhaust safely, so there a try fails when the activations autograd saves
# exceed `cpu_budget_mib`: the same search, against a stated budget.

# %%
if has_torch:
    from labkit.course import memory
    from labkit.torch.memory import largest_batch

    on_gpu = memory.is_cuda(device)
    search = largest_batch(base, budget_mib=None if on_gpu else cpu_budget_mib, limit=min(batch_limit, plan["batch_limit"]))
    print("tries (batch, fitted):", search.tries)
    limit_note = "device memory" if on_gpu else f"{cpu_budget_mib:g} MiB activation budget"
    key_figure(f"largest {model} batch that fits", search.batch_size, note=limit_note)

# %% [markdown]
# ## 2. Gradient accumulation gives the large batch's gradients
# From the same weights, the gradients of one batch and of the same batch split into
# `micro_steps` micro-batches (each loss divided by `micro_steps`, as the engine does). With
# batch norm the statistics are per micro-batch, so ResNet's gradients differ: accumulation is
# exact only for models whose layers treat samples independently.

# %%
if has_torch:
    checks = [{"model": m, **memory.accumulation_gradient_gap(TrainConfig(model=m, scale=scale, device=device,
                                                                   batch_size=plan["tradeoff_batch"]), micro_steps)}
              for m in accumulation_models]
    display(Markdown(table(checks, ["model", "micro_steps", "max_abs_grad", "max_abs_diff", "max_rel_diff", "verdict"],
                           markdown=True)))
    for c in checks:
        print(f"{c['model']}: {c['verdict']} (largest difference {c['max_rel_diff']:.1e} of the largest gradient; "
              f"float rounding stays under {memory.SAME_GRADIENTS_BELOW:.0e})")

# %% [markdown]
# ## 3. Activation checkpointing: memory against time
# Each block's activations are dropped after the forward pass and recomputed in the backward
# pass: less memory, one more forward's worth of compute. The memory is counted from the tensors
# autograd saves. The time is measured: `tradeoff_repeats` runs of `tradeoff_steps` steps with
# each setting, taking turns (without, with, without, with, ...) after one discarded warm-up
# run of each, so a busy spell of the machine slows both; each run gives its median step time.
# The verdict names a cost only when the two settings' runs do not overlap.
#
# Before running: how much of the activation memory do you expect checkpointing to keep, and
# how much longer do you expect a step to take?

# %%
if has_torch:
    trade = memory.checkpointing_tradeoff(base, steps=tradeoff_steps, repeats=tradeoff_repeats)
    display(Markdown(table(trade.rows(), markdown=True)))
    key_figure("activation checkpointing: activation memory kept", trade.memory_ratio, "×",
               note="counted from the tensors autograd saves")
    key_comparison("activation checkpointing: step time with / without", trade.step_ms,
                   "without checkpointing", "with checkpointing", "ms")

# %% [markdown]
# What the trade shows here: the memory is counted, the time measured ("slower" only when none of
# the runs with checkpointing overlaps a run without).

# %%
if has_torch:
    off, on = trade.step_ms.a, trade.step_ms.b
    print(f"Checkpointing kept {trade.memory_ratio:.2f}× the activations ({trade.activation_mib[1]:.1f} of "
          f"{trade.activation_mib[0]:.1f} MiB, counted from the tensors autograd saves) on {trade.device}.")
    print(f"Step time, each run's median over {trade.steps} steps, {len(on.values)} runs of each in turns: with "
          f"checkpointing {on.text()} ms, without {off.text()} ms ({trade.step_ms.ratio:.2f}×): {trade.step_verdict}.")
    print(f"Final loss with checkpointing {trade.final_loss[1]:.6f}, without {trade.final_loss[0]:.6f}.")

# %% [markdown]
# ## 4. Sharding: FSDP (ZeRO-3) against DDP, per process
# `sharding_processes` real processes train `sharding_steps` steps twice: replicated (DDP) and
# sharded with FSDP2's `fully_shard` (gloo on CPU, nccl on GPUs). Each process reports the
# bytes it actually holds; the losses show the maths is unchanged. The second table extends
# the same accounting (2 + 2 + 12 bytes per parameter with bf16 and Adam) to GPT-2 small on
# 1 to 8 GPUs: a calculation, labelled as such.

# %%
if has_torch:
    from labkit.course import memory

    shard_cfg = TrainConfig(model=model, scale=plan["sharding_scale"], device=plan["sharding_device"],
                            steps=sharding_steps, batch_size=sharding_processes * 4, progress=False)
    shard = memory.compare_sharding(shard_cfg, sharding_processes)
    display(Markdown(table(shard, ["mode", "processes", "param_mib", "grad_mib", "optimizer_mib", "state_mib", "final_loss"],
                           markdown=True)))
    ratio = shard[1]["state_mib"] / shard[0]["state_mib"]
    same = max(abs(a - b) for a, b in zip(shard[0]["losses"], shard[1]["losses"], strict=True))
    key_figure("FSDP state per process vs DDP", ratio, "×", f"{sharding_processes} processes, loss gap {same:.1e}")
    display(Markdown(table(memory.sharding_table(124_000_000), markdown=True,
                           title="Calculated for GPT-2 small (124M), GiB per GPU:")))

# %% [markdown]
# ## 5. The code
# `labkit/recipes/fsdp.py` is the sharding of section 4 as you would write it: FSDP2's
# `fully_shard` on every transformer block, then on the whole model, launched by torchrun; the
# optimizer is built on the shards, so each process holds 1/N of its state. Highlighted: the
# lines that the DDP recipe of notebook 02 does not have (the rest is the same training script).

# %%
from labkit.course import recipe_view

recipe_view.show("fsdp").changes_from("ddp")

# %% [markdown]
# Before running: FSDP all-gathers each block's weights before using them and reduce-scatters
# the gradients, instead of DDP's all-reduce. Do you expect its losses to equal `labkit train`'s
# data-parallel run at the same global batch?

# %%
if has_torch:
    fsdp_argv = recipe_view.flags(shard_cfg)
    print(recipe_view.command("fsdp", fsdp_argv, nproc=sharding_processes))
    fsdp_cmp = recipe_view.compare("fsdp", fsdp_argv, nproc=sharding_processes)
    recipe_view.plot(fsdp_cmp)
    key_figure(f"recipe fsdp vs labkit train, {sharding_processes} processes: largest loss difference",
               fsdp_cmp.max_abs_diff, note=f"tolerance {fsdp_cmp.tolerance:.0e}")

# %%
if has_torch:
    c, trend = fsdp_cmp, recipe_view.curve_trend(fsdp_cmp.recipe_losses)
    print(f"The recipe ({c.nproc} processes) and `labkit train`, {len(c.recipe_losses)} steps in {c.precision}: largest "
          f"loss difference {c.max_abs_diff:.1e} at step {c.worst_step} (the tests allow {c.tolerance:.0e}): {c.agreement}.")
    if c.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {c.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

# %% [markdown]
# ## 6. Attention: SDPA instead of the T×T matrix
# Causal self-attention written out is `softmax(q kᵀ / √d + mask) v` per head, for a sequence of
# T tokens (the model's block size): the scores `q kᵀ` form a T×T matrix per head, and autograd
# keeps it (softmax's output) for the backward pass. **SDPA**, PyTorch's
# `F.scaled_dot_product_attention`, computes the same function with fused kernels that walk over
# the keys in tiles, keeping only a running maximum and sum per row, and recompute the tiles in
# backward: the T×T matrix never exists. On CUDA, **FlashAttention-2** runs in fp16/bf16 on
# compute capability 8.0 and newer (A100, L4, H100, H200) and the **memory-efficient** kernel
# also in fp32 and on older GPUs (T4, V100); on the CPU a fused CPU kernel; where none applies,
# SDPA falls back to the written-out maths. labkit's GPT already calls SDPA.
#
# Below, one forward and backward of the attention alone at three sequence lengths, both ways:
# the bytes autograd keeps for backward (counted from the saved tensors, on any device; on a GPU
# also the peak allocated), the time (median of round-robin repeats, with the range), and the
# bytes of one T×T score matrix per head (batch × heads × T² × bytes per element) beside them.
#
# Before you run: when the sequence doubles, how much more memory does each keep, written out
# and through SDPA?

# %%
if has_torch:
    from labkit.course import attention

    att = attention.measure(plan["attention_block_sizes"], batch=plan["attention_batch"],
                            heads=plan["attention_heads"], head_dim=plan["attention_head_dim"],
                            dtype=plan["attention_dtype"], device=device)
    print(f"batch {plan['attention_batch']}, {plan['attention_heads']} heads of {plan['attention_head_dim']}, "
          f"{plan['attention_dtype']}, on {att[0]['device']}")
    display(Markdown(table(att, ["T", "method", "saved_mib", "peak_mib", "score_matrix_mib", "time_ms",
                                 "time_low_ms", "time_high_ms"], markdown=True)))
    found = attention.findings(att)
    key_figure(f"attention memory at T={found.longest}: manual / SDPA", found.memory_ratio, "×")

# %% [markdown]
# What the table shows. The written-out version keeps softmax's output, one T×T score matrix per
# head, for its own backward and the product with v, and builds a T×T causal mask (a byte per
# entry); SDPA keeps its output and a maximum and sum per row, which grow with T.

# %%
if has_torch:
    for g in found.growth:
        steps = ", ".join(f"{x:.2f}×" for x in g.ratios)
        print(f"{g.method}: from T={found.sizes[0]} to T={found.sizes[-1]} the memory kept for backward grew {steps} "
              f"as T grew {', '.join(f'{t:g}×' for t in found.t_ratios)} ({g.law} would be "
              f"{', '.join(f'{g.expected(t):g}×' for t in found.t_ratios)}).")

# %%
if has_torch:
    print(f"At T={found.longest}: manual kept {found.manual_mib:.1f} MiB, SDPA {found.sdpa_mib:.2f} MiB ({found.memory_ratio:.0f}× "
          f"less with SDPA); the score matrix ({found.score_matrix_mib:.1f} MiB) and the mask ({found.mask_mib:.1f} MiB) "
          f"are {found.explained:.0%} of manual's.")
    if found.peak_mib[0] is not None:
        print(f"Peak allocated during forward + backward: manual {found.peak_mib[0]:.1f} MiB, SDPA {found.peak_mib[1]:.1f} MiB.")
    if found.time is not None:
        print(f"Time at T={found.longest}, forward + backward on {found.device}: SDPA {found.time.b.text()} ms, manual "
              f"{found.time.a.text()} ms, {found.time.ratio:.2f}×: {found.time_verdict}.")

# %% [markdown]
# `labkit/recipes/attention.py` trains labkit's GPT with its attention computed either way: the
# written-out function and the SDPA call side by side, swapped into each block's attention layer
# (same weights), and `--backend` to pin one SDPA kernel with `sdpa_kernel`. Before running: the
# written-out version adds and divides in another order than the fused kernel; do you expect
# its losses to equal `labkit train`'s?

# %%
recipe_view.show("attention")

# %%
if has_torch:
    att_argv = recipe_view.flags(base, steps=tradeoff_steps, attention="manual")
    print(recipe_view.command("attention", att_argv))
    att_cmp = recipe_view.compare("attention", att_argv)
    key_figure("recipe attention (written out) vs labkit train (SDPA): largest loss difference",
               att_cmp.max_abs_diff, note=f"tolerance {att_cmp.tolerance:.0e}")

# %%
if has_torch:
    c, trend = att_cmp, recipe_view.curve_trend(att_cmp.recipe_losses)
    print(f"The recipe's written-out attention and `labkit train`'s SDPA, {len(c.recipe_losses)} steps in {c.precision}: "
          f"largest loss difference {c.max_abs_diff:.1e} at step {c.worst_step} (the tests allow {c.tolerance:.0e}): "
          f"{c.agreement}.")
    if c.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {c.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

# %% [markdown]
# ### A common mistake: "a 110M-parameter model needs 440 MB"
# Estimates that multiply the parameter count by 4 bytes count the weights only. Below, every
# byte one training step holds, counted from the tensors themselves (on "fake" tensors: shapes
# and dtypes, no data), for a BERT-base-sized GPT: 12 layers, width 768, 30,522 tokens, 512
# positions, AdamW, batch 8 × 512 tokens. Before running: how much memory do you expect one
# training step to need, as a multiple of 440 MB?

# %%
from labkit.course import mistakes

if has_torch:
    mem = [mistakes.training_memory(precision=p) for p in ("fp32", "bf16")]
    display(Markdown(table(mistakes.memory_rows(*mem), markdown=True, title="GB, counted from the tensors:")))
    key_figure("110M-parameter GPT, one AdamW step at batch 8 × 512: memory / (parameters × 4 bytes)",
               mem[0].total_over_guess, "×", note=f"{mem[0].total_bytes / 1e9:.2f} GB counted, fp32")

# %% [markdown]
# What the count shows. Not counted: the CUDA context, the allocator's cache and fragmentation,
# and the temporaries freed within the step, so a device needs more than this.

# %%
if has_torch:
    m, half = mem
    print(f"{m.parameters / 1e6:.0f}M parameters: 'parameters × 4 bytes' says {m.guess_bytes / 1e9:.2f} GB. One training "
          f"step at batch {m.batch_size} × {m.model.block_size} tokens holds {m.total_bytes / 1e9:.2f} GB, "
          f"{m.total_over_guess:.1f}× that: weights {m.param_bytes / 1e9:.2f} GB, gradients {m.grad_bytes / 1e9:.2f} GB, "
          f"AdamW's state {m.optimizer_bytes / 1e9:.2f} GB, activations saved for backward {m.activation_bytes / 1e9:.2f} GB.")
    print(f"Activations are {m.activation_share:.0%} of it and grow with batch × sequence length; weights, gradients "
          f"and optimizer state are {m.state_bytes_per_parameter:.0f} bytes per parameter whatever the batch.")
    print(f"Under bf16 autocast the activations were {half.activation_bytes / 1e9:.2f} GB "
          f"({half.activation_bytes / m.activation_bytes:.2f}×) and the total {half.total_bytes / 1e9:.2f} GB: "
          f"weights, gradients and AdamW's state stay float32 ({half.state_bytes_per_parameter:.0f} bytes per parameter).")
