# %% [markdown]
# # 10 · Beyond data parallelism: ZeRO 1–3, DeepSpeed, tensor and pipeline parallelism
#
# DDP copies the whole training state to every GPU: weights (P), gradients (P) and AdamW's two
# moments (2P). When that stops fitting, practitioners reach for:
#
# - **ZeRO** (stages 1, 2, 3): shard the optimizer state, then the gradients, then the weights
#   across the data-parallel processes (torch: `ZeroRedundancyOptimizer`, labkit's flat-buffer
#   ZeRO-2, FSDP2 `fully_shard`; or DeepSpeed with `zero_optimization.stage`);
# - **tensor parallelism** (Megatron): split every attention and MLP matrix across a group;
# - **pipeline parallelism**: cut the stack of blocks into stages and stream micro-batches
#   through them (GPipe, 1F1B), paying a "bubble" of (p−1)/(m+p−1).
#
# The same code runs on GPUs with NCCL (one process per GPU) and on CPU processes with gloo where
# there is not a GPU for each process, so this notebook measures them on whatever this machine
# has (the plan below says which): the same GPT
# trained with every mode through `labkit train --parallel ...`, each rank's memory and the
# bytes it sends per step (counted from the collectives that ran), step time, and the losses
# against one process at the same global batch. Then the calculator scales the accounting to
# GPT-2 small, a 7B and a 70B model on 80 GB GPUs and picks a mode.

# %% tags=["parameters"]
scale = "auto"
processes = 2
four_processes = True
steps = 6
global_batch = 32
microbatches = 4
use_deepspeed = True
compare_recipe = "pipeline"
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

import json
from IPython.display import Markdown, display
from labkit.core import config, frameworks, parallelism
from labkit.course import model_parallel as mp, recipe_view, sizing, tables
from labkit.course.tables import table

# %%
scale = config.resolve_scale(scale)
config.check_int("processes", processes, minimum=2, maximum=8)
workdir = artifacts_dir("10_model_parallelism")
has_torch = frameworks.has_torch()
deepspeed_missing = None if frameworks.is_installed("deepspeed") else frameworks.missing_reason("deepspeed")
run_plan = sizing.plan("10_model_parallelism", scale, time_budget_s=time_budget_s, processes=processes,
                   four_processes=four_processes, steps=steps)
print(run_plan.text())
base = mp.base_config(run_plan["model_scale"], steps=steps, batch_size=global_batch, device=run_plan["device"])
print(f"GPT at {run_plan['model_scale']} size, {steps} steps, global batch {global_batch}, {processes} processes"
      + ("" if has_torch else "; " + frameworks.missing_reason("torch")))
print("DeepSpeed:", deepspeed_missing or "installed")

# %% [markdown]
# ## 1. Every mode, measured in one run
# Each row is one `labkit train --nproc-per-node N --parallel MODE` run on local processes
# (NCCL with a GPU per process, else gloo on loopback with one thread each). `held` is what the largest rank keeps between steps
# (weights, optimizer state, and the gradients at the update); `sent` is what a rank sends per
# optimizer step, counted from the collectives that ran (ring algorithms); `loss_gap` is the
# largest relative difference from one process. Steps are short CPU steps on a shared machine:
# read the step times as this machine's, not a GPU's.
#
# Before running: with 2 processes, what share of DDP's per-rank memory do you expect ZeRO-1,
# ZeRO-2 and ZeRO-3 to hold? And with 2 pipeline stages and the micro-batches above, what share
# of each step will a stage sit idle (the **bubble**)? The answers are printed under this table
# and in section 3, from the measured runs.

# %%
if has_torch:
    modes = mp.course_modes(processes, four_processes, use_deepspeed and not deepspeed_missing, microbatches)
    reference, results = mp.run_modes(base, modes, workdir / "runs")
    rows = mp.mode_table(reference, results)
    display(Markdown(table(rows, markdown=True)))
    print("Your prediction, answered: " + mp.memory_answer(rows))
    least = min(rows, key=lambda r: r["vs_ddp"])
    key_figure("least memory per rank vs DDP", least["vs_ddp"], "×", least["mode"])
    key_figure("largest loss gap from one process", max(r["loss_gap"] for r in rows), "", "relative")

# %% [markdown]
# ## 2. The calculator against the measurement
# `labkit.core.parallelism.estimate` predicts, from the model's shape alone, the bytes each rank
# holds and sends in each mode. Every rank of every torch run, measured beside it
# (ZeroRedundancyOptimizer gives each rank whole tensors, so its shares are only nearly equal).

# %%
if has_torch:
    check = mp.calculator_check(base, results)
    display(Markdown(table(check, markdown=True)))
    worst = max(check, key=lambda r: abs(r["ratio"] - 1))
    key_figure("calculator vs measured memory, worst rank", worst["ratio"], "×", worst["mode"])

# %% [markdown]
# ## 3. The pipeline bubble
# A stage waits while the pipeline fills and drains. With p equal stages and m micro-batches
# the idle share of a step is (p−1)/(m+p−1). Measured: the share of the schedule during which
# the stage that computes the most (the last one: it also holds the output head and the loss)
# was not computing. Sends and the schedule's own bookkeeping count as idle too.

# %%
if has_torch:
    bubbles = mp.bubble_rows(results)
    display(Markdown(table(bubbles, markdown=True)))
    print("Your prediction, answered: " + mp.bubble_answer(bubbles))
    first = bubbles[0]
    key_figure("pipeline bubble, measured − (p−1)/(m+p−1)", first["difference"], "",
               f"{first['mode']}: {first['measured']:.2f} vs {first['theory']:.2f}")

# %% [markdown]
# ## 4. The DeepSpeed equivalent of each torch mode
# `--sharding-backend deepspeed` hands the same model and AdamW to `deepspeed.initialize` with
# this config (ZeRO stage 0 is plain data parallelism). DeepSpeed's stages ran above
# ("deepspeed zero…" rows) when it is installed. Tensor and pipeline parallelism have no
# config-only equivalent: DeepSpeed's `PipelineModule` and AutoTP change the model code.

# %%
if has_torch:
    for row in mp.deepspeed_equivalents(base, processes):
        print(f"{row['torch mode']:>6}:", json.dumps(row["deepspeed config"]))

# %% [markdown]
# ### ZeRO-Offload: the optimizer state in host memory
# `--offload-optimizer cpu` on the DeepSpeed recipe sets `zero_optimization.offload_optimizer =
# {"device": "cpu"}`: each rank's optimizer partition (the fp32 master weights and AdamW's two
# moments, 12 bytes per parameter of the partition) lives in host RAM and the update runs on the
# CPU. It trades GPU memory for PCIe traffic (every step the gradient partition goes to the host
# and the updated weights come back) and for CPU time in Adam. It pays when the optimizer state
# is what does not fit (a large model on few GPUs); when the model already fits, it only slows
# the step. Stage 3 can also keep the weights on the host (`--offload-param cpu`).
#
# **Before you run:** will the offloaded run's losses differ from the same stage without offload?
# How much of a rank's optimizer state stays on the device?

# %%
if has_torch and use_deepspeed and not deepspeed_missing:
    offload_flags = mp.offload_argv(base, stage=2)
    print(recipe_view.command("deepspeed_zero", offload_flags, nproc=processes))
    offload = mp.offload_comparison(offload_flags, results, processes)
    display(Markdown(table(offload["rows"], markdown=True)))
    for line in mp.offload_lines(offload):
        print("-", line)
elif has_torch:
    print("ZeRO-Offload run skipped:", deepspeed_missing or "use_deepspeed is False")

# %% [markdown]
# ## 5. Scaling up: GPT-2 small, 7B and 70B on 80 GB GPUs
# The same accounting with bf16 weights and gradients and fp32 master weights and moments
# (2 + 2 + 12 bytes per parameter), plus checkpointed activations of one 4096-token sequence
# (Korthikanti et al., 2022), on 8 GPUs (one node) and 64 (eight nodes), 8,192 tokens per GPU
# per step. A pipeline splits a replica's sequences into up to 8 micro-batches per stage, never
# more micro-batches than sequences. A calculation, labelled as such: measured only at CPU
# scale above. The page shows which modes fit; the file printed below it holds every mode's
# breakdown (its `layout` column gives the pipeline's micro-batches).

# %%
plan = parallelism.plan_table(gpus=(8, 64), gpu_gib=80)
display(Markdown(table(mp.plan_summary(plan), markdown=True)))
plan_csv = tables.write_csv(plan, workdir / "plan.csv")
print(f"every mode's GiB per rank (weights, gradients, optimizer, activations) and GB sent: {plan_csv} "
      f"({len(plan)} rows)")
fit_70b = [r["mode"] for r in plan if r["model"] == "70B" and r["gpus"] == 64 and r["fits"]]
print("70B on 64 × 80 GB fits with:", ", ".join(fit_70b) or "none")

# %% [markdown]
# ## 6. Which mode? A decision table from the calculator
# For each model, GPU count, GPU memory and interconnect: among the modes that fit, the one
# with the shortest step, computed as the model's FLOPs at the rate labkit's own GPT-2 small run
# reached on one H100 (read from this repository's benchmark results, printed below), stretched
# by the bubble for pipelines, plus the time its bytes take on the link (tensor parallelism's
# all-reduces stay inside a node). Larger models usually reach a higher rate: the table is a
# plan, and its step times are estimates.

# %%
effective_tflops, rate_source = mp.measured_effective_tflops()
print(f"planning rate: {effective_tflops:,.0f} TFLOP/s per GPU ({rate_source})")
decisions = mp.decision_rows(gpus=(8, 64), gpu_gib=(40, 80), effective_tflops=effective_tflops)
display(Markdown(table(mp.decision_summary(decisions), markdown=True)))
print(f"every decision with its compute and communication times: "
      f"{tables.write_csv(decisions, workdir / 'decisions.csv')} ({len(decisions)} rows)")

# %% [markdown]
# ### Combining them: TP × PP × DP
# Large runs combine the three: tensor parallelism inside a node, pipeline stages across nodes,
# data parallelism over the copies. Every layout whose degrees multiply to the GPU count, with
# tp dividing the heads (and at most a node's 8 GPUs), pp at most one stage per block, dp
# dividing the batch, and never more micro-batches than a replica has sequences, is checked
# against the GPU's memory (the rank holding the most: its stage's weights split by tp, their
# gradients, 1/dp of the optimizer state, checkpointed activations). Among those that fit, the
# rules of Megatron-LM at scale (Narayanan et al., 2021) pick: the smallest model-parallel size
# tp·pp, then tensor before pipeline, then the smallest bubble. The `rule` column says which.

# %%
grid = mp.grid_rows(gpus=(8, 64), gpu_gib=(40, 80))
display(Markdown(table(grid, markdown=True)))
# %% [markdown]
# ## The code
# Each technique as a plain PyTorch script (`labkit/recipes/`), run with torchrun, giving
# `labkit train`'s losses for the same settings (the test suite checks every one). ZeRO 1–3 in
# full; the three after it are folded under one line each (click to read), so the page stays
# short, with the lines the ZeRO recipe does not have highlighted: what each technique changes.

# %%
recipe_view.show("zero")

# %% [markdown]
# Tensor parallelism with DTensor:

# %%
recipe_view.show("tensor_parallel").changes_from("zero").folded()

# %% [markdown]
# Pipeline parallelism with `torch.distributed.pipelining`:

# %%
recipe_view.show("pipeline").changes_from("zero").folded()

# %% [markdown]
# DeepSpeed ZeRO:

# %%
recipe_view.show("deepspeed_zero").changes_from("zero").folded()

# %% [markdown]
# One recipe run here as a learner runs it (`torchrun -m labkit.recipes.NAME`) against
# `labkit train` with the same flags:

# %%
if has_torch and compare_recipe:
    cmp = recipe_view.compare(compare_recipe, recipe_view.flags(model="gpt", scale=run_plan["model_scale"], steps=4,
                                                                batch_size=16), nproc=processes)
    recipe_view.plot(cmp)
    key_figure(f"recipe {compare_recipe} vs labkit train, largest loss gap", cmp.max_abs_diff, "",
               f"tolerance {cmp.tolerance:.0e}")

# %% [markdown]
# ## Conclusions (computed from this run)

# %%
if has_torch:
    for line in mp.conclusions(reference, results):
        print("-", line)
