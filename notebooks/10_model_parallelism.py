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
# against one process at the same global batch. Then one planner scales the accounting to
# GPT-2 small, a 7B and a 70B model and picks a layout; every table after it is a view of that
# one answer.

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
    display(Markdown(table(mp.mode_table(reference, results), markdown=True)))
    found = mp.findings(reference, results)
    key_figure("least memory per rank vs DDP", found.least_memory.value, "×", found.least_memory.mode)
    key_figure("largest loss gap from one process", found.largest_gap.value, "",
               f"relative, {found.largest_gap.mode}: {found.losses_verdict}")

# %% [markdown]
# Your prediction, answered: what each rank held against DDP's rank, and the least it could hold
# (every rank keeping 1/N of the weights, gradients and optimizer state).

# %%
if has_torch:
    shares = ", ".join(f"{m.mode} {m.value:.2f}×" for m in found.memory)
    print(f"Per-rank memory against DDP's on {found.nproc} processes: {shares}.")
    print(f"Least: {found.least_memory.mode}, {found.least_memory.value:.2f}× DDP's; 1/{found.nproc} of everything "
          f"would be {found.memory_floor:.2f}×. Section 2 splits each figure into weights, gradients and optimizer state.")

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
# A stage waits while the pipeline fills and drains. With p *equal* stages and m micro-batches
# the idle share of a step is (p−1)/(m+p−1). What labkit measures, on every rank: the seconds its
# stage spends inside the schedule (the clock starts when that stage enters it) and, within them,
# the seconds it computes (forward, backward, and on the last stage the loss); idle is the rest.
# `measured` is the busiest stage's idle share (it sets the pace). The stages need not be equal:
# the last one also runs the output head and the loss. `stage_work` is each stage's compute
# relative to the busiest, and `expected` what the schedule gives with that work: the busiest
# stage then waits only for the others' shorter fill and drain, so unequal stages bring it
# *below* the formula. What remains, `unexplained`, says which way the measurement departs:
# above, the time spent sending and receiving between stages and in the schedule's own launches,
# which count as idle; below, fill time that passed before that stage's clock started (a stage
# still finishing the previous step's update enters the schedule late and finds its first
# micro-batch waiting).

# %%
if has_torch:
    bubbles = mp.bubble_findings(results)
    display(Markdown(table([b.row() for b in bubbles], markdown=True)))
    first = bubbles[0]
    key_figure("pipeline bubble, measured − (p−1)/(m+p−1)", first.difference, "",
               f"{first.mode}: {first.measured:.2f} vs {first.theory:.2f}")
    key_figure("pipeline bubble, measured − expected with these stages", first.unexplained, "",
               f"{first.mode}: stage work {first.row()['stage_work']}, expected {first.expected:.2f}")

# %% [markdown]
# Your prediction, answered, run by run: the formula, the measurement, what the stages' own work
# leads to expect, and which way what remains went (within ±0.02 counts as a match).

# %%
if has_torch:
    why = {mp.BUBBLE_ABOVE: "time spent sending, receiving and in the schedule's own launches, counted as idle",
           mp.BUBBLE_BELOW: "part of the fill passed before this stage's clock started (it entered the schedule late)"}
    for b in bubbles:
        work = ", ".join(f"{w:.2f}" for w in b.stage_work)
        print(f"{b.mode}: p={b.stages}, m={b.microbatches}, (p−1)/(m+p−1) = {b.theory:.2f}; measured {b.measured:.2f} "
              f"on the busiest stage ({b.difference:+.2f}).")
        print(f"  The stages did {'nearly equal' if b.equal_work else 'unequal'} work ({work} of the busiest), so the "
              f"busiest one should sit idle {b.expected:.2f} of the step.")
        print(f"  Measured − expected = {b.unexplained:+.2f}: {b.verdict}" + (f"; {why[b.verdict]}." if b.verdict in why
                                                                               else f" (±{mp.BUBBLE_TOLERANCE:.2f})."))

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
    display(Markdown(table(offload.rows, markdown=True)))
elif has_torch:
    print("ZeRO-Offload run skipped:", deepspeed_missing or "use_deepspeed is False")

# %%
if has_torch and use_deepspeed and not deepspeed_missing:
    print(f"Largest relative loss gap, offload against none: {offload.gap:.1e}: {offload.verdict} (up to {mp.SAME_LOSSES_BELOW:.0e}).")
    for rank, (held, without) in enumerate(zip(offload.held, offload.without, strict=True)):
        where = ", ".join(f"{b / 1024:,.1f} KiB on {d}" for d, b in sorted(held.items()))
        print(f"Rank {rank}'s optimizer state: {where} with offload; {without / 1024:,.1f} KiB on the training device without.")
    print(f"The GPUs kept {offload.gpu_bytes / 1024:,.1f} KiB of optimizer state with offload, "
          f"{sum(offload.without) / 1024:,.1f} KiB without." if offload.on_gpu else
          f"These processes trained on {offload.device}: the 'device' is host memory too, so offload moved nothing here; "
          "on a GPU the GPU's share of these bytes drops to about 0.")

# %% [markdown]
# ## 5. Scaling up: one planner for GPT-2 small, 7B and 70B
# `labkit.core.parallelism.plan` answers "which layout for this model on these GPUs", with bf16
# weights and gradients, fp32 master weights and moments (2 + 2 + 12 bytes per parameter),
# checkpointed activations (Korthikanti et al., 2022) and 8,192 tokens per GPU per step. It
# weighs every TP × PP × DP layout of the GPUs with DDP or a ZeRO stage over the replicas:
#
# - **memory**: the fullest rank's weights, gradients, optimizer state, activations (and for
#   ZeRO-3 the gathered blocks) must fit within a **margin** printed below: a fixed share for the
#   CUDA context and the libraries' workspaces, and a fraction for what PyTorch's caching
#   allocator loses to fragmentation: a layout that needs nearly all of a GPU does not fit.
# - **time**: compute at one planning rate (labkit's own GPT-2 small run on one H100, printed
#   below), stretched by the bubble for pipelines, plus the communication that is *not hidden*:
#   DDP and ZeRO-1/2 reduce gradients in buckets while the backward pass still runs (only the last
#   bucket waits for its end, as PyTorch DDP's design note describes), ZeRO-1/2 gather the
#   updated weights after the optimizer step (exposed), ZeRO-3 gathers each block behind the
#   previous block's compute (only the first waits); tensor-parallel all-reduces and pipeline
#   sends count whole.
# - **choice**: among the layouts that fit, pure data parallelism and the smallest tp·pp that
#   fits (Megatron-LM's rule: split the model only as far as memory needs), the shortest step;
#   within 1%, the simpler layout.
#
# A calculation, labelled as such: measured only at CPU scale above. First every model on 8 and
# 64 GPUs of 80 GB on the A3 interconnect: the modes with a layout that fits, the leanest layout,
# and the planner's choice. The file printed below it holds every layout weighed.

# %%
effective_tflops, rate_source = mp.measured_effective_tflops()
print(f"planning rate: {effective_tflops:,.0f} TFLOP/s per GPU ({rate_source})")
print("memory margin:", parallelism.MARGIN.text())
plan = parallelism.plan_table(gpus=(8, 64), gpu_gib=80, effective_tflops=effective_tflops)
display(Markdown(table(mp.plan_summary(plan), markdown=True)))
print(f"every layout weighed (GiB per rank by kind, fits, step, exposed communication): "
      f"{tables.write_csv(plan, workdir / 'plan.csv')} ({len(plan)} rows)")

# %% [markdown]
# ## 6. Which layout? The same planner over GPU memory and interconnects
# The same call (`parallelism.decide` returns its answer) for 40 and 80 GB GPUs and three
# interconnects. The interconnect changes only the step times; the GPU memory changes what fits.
# The lines under the layout table below name, for each cell that changes, the assumption that
# differs, and check that where two tables meet they give the same layout.

# %%
decisions = mp.decision_rows(gpus=(8, 64), gpu_gib=(40, 80), effective_tflops=effective_tflops)
display(Markdown(table(mp.decision_summary(decisions), markdown=True)))
print(f"every decision with its rule, compute and communication: "
      f"{tables.write_csv(decisions, workdir / 'decisions.csv')} ({len(decisions)} rows)")

# %% [markdown]
# ### Combining them: TP × PP × DP
# Large runs combine the three: tensor parallelism inside a node, pipeline stages across nodes,
# data parallelism over the copies. The planner weighs every layout whose degrees multiply to
# the GPU count, with tp dividing the heads (and at most a node's 8 GPUs), pp at most one stage
# per block, dp dividing the batch, and never more micro-batches than a replica has sequences.
# Below: the layouts it weighed for the 70B on 64 × 40 GB (A3), those that fit fastest first
# (`weighed`: among those the choice is made), then the chosen TP × PP × DP layout of every case
# on the A3 interconnect with the rule that chose it: the decision table's A3 column in detail.

# %%
weighed = mp.weighed_rows("70B", 64, 40, effective_tflops=effective_tflops)
display(Markdown(table(weighed[:10], markdown=True)))
print(f"all {len(weighed)} layouts weighed: {tables.write_csv(weighed, workdir / 'weighed_70b_64x40.csv')}")
grid = mp.grid_rows(gpus=(8, 64), gpu_gib=(40, 80), effective_tflops=effective_tflops)
display(Markdown(table(grid, markdown=True)))
check = mp.view_check(plan, decisions, grid)

# %% [markdown]
# How the tables relate: where two of them meet they must give the same layout; where the
# decision table's layout changes along a row, the assumption that differs.

# %%
for c in check.clashes:
    print(f"- the {c.table} says {c.layout} for {c.model} on {c.gpus} × {c.gib:g} GiB, {c.interconnect}; "
          f"the decision table says {c.decided}")
if not check.clashes:
    print(f"- the memory, decision and layout tables share {check.shared} cells and give the same layout in every one: "
          "they are one planner's answer")
for c in check.by_interconnect:
    where = "; ".join(f"{d['interconnect']}: {d['layout']}" for d in c.cells)
    print(f"- {c.model} on {c.gpus} GPUs of {c.cells[0]['GiB']:g} GiB: {where}. The interconnect differs: it changes only "
          "the step times, so a layout whose communication hides on the faster link can lose on the slower one.")

# %%
for c in check.by_memory:
    small, big = c.smaller, c.larger
    where = "; ".join(f"{d['GiB']:g} GiB: {d['layout']}" for d in c.cells)
    why = (f"the {big['GiB']:g} GiB layout needs {big['GiB_per_rank']:.1f} GiB per GPU, over the {small['usable_GiB']:.1f} "
           f"usable on the {small['GiB']:g} GiB one" if c.reason == mp.OVER_MEMORY else
           f"on {small['GiB']:g} GiB the smallest tp·pp that fits is {small['smallest_tp_pp']}, so other layouts are weighed"
           if c.reason == mp.ANOTHER_SPLIT else "the same layouts are weighed, but with less memory each holds smaller "
           "micro-batches (more accumulation steps), which changes their step times")
    print(f"- {c.model} on {c.gpus} GPUs, {small['interconnect']}: {where}. The GPU memory differs: {why}.")

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
# ## What this run shows
# Every figure below comes from section 1's runs. A mode's losses count as the single process's
# when its largest relative gap stays within the tolerance; "slower" needs every timed step of
# the slowest mode to take longer than every timed step of DDP (its first step and the steps
# whose collectives were counted left out).

# %%
if has_torch:
    f, steps = found, found.slowest_steps
    print(f"Against one process at the same global batch, the largest relative loss gap was {f.largest_gap.value:.1e} "
          f"({f.largest_gap.mode}): {f.losses_verdict} (up to {mp.SAME_LOSSES_BELOW:.0e}).")
    print(f"{f.least_memory.mode} held the least per rank: {f.least_memory.value:.2f}× DDP's bytes.")
    print(f"{f.most_sent.mode} sent the most per step, {f.most_sent.value:.2f}× DDP's bytes"
          + (": its all-reduces carry activations, which grow with the batch, not with the model." if
             f.most_sent_carries_activations else "."))
    print(f"{f.slowest.mode} had the slowest median step, {f.slowest.value:.2f}× DDP's"
          + (f" ({steps.b.text()} against {steps.a.text()} ms per step)" if steps else "") + f": {f.slowest_verdict}"
          + ("." if f.device.startswith("cuda") else " (CPU processes on a shared machine: an order, not a GPU forecast)."))

# %% [markdown]
# ## 7. Sharded checkpoints: `torch.distributed.checkpoint` against the full state
# A ZeRO-3 run holds 1/N of the weights and AdamW's moments in each process. Saving them as one
# file means gathering the whole state into rank 0 first, which then writes all of it alone.
# `labkit train --checkpoint-format dcp` has every rank write its own shards with
# `torch.distributed.checkpoint` (DCP) instead, each file listed with its size and CRC-32C in the
# commit marker; DCP's index of which piece went where lets a run on another number of processes
# load them (`--allow-resume-change world_size`). Below, the zero3 run of this notebook's GPT
# saves the same state three ways on this machine's processes, taking turns save by save: the
# full state gathered to rank 0, labkit's per-rank `torch.save` files (only the same layout can
# resume them), and DCP. A save is synchronous under ZeRO-3, so its wall time is the training time
# it costs. After the saves the DCP checkpoint is loaded back and must give the state bit for bit.
#
# **Before you run:** what share of the full-state save's bytes will the busiest rank write with
# DCP? Will DCP's save be faster than the full-state save at this small size?

# %%
from labkit.course import sharded_checkpoints as sc
from labkit.notebooks import key_comparison

if has_torch:
    ckpt = sc.measure(base, nproc=processes, saves=5, workdir=workdir)
    display(Markdown(table(sc.rows(ckpt), markdown=True)))
    ck = sc.findings(ckpt)
    key_comparison("DCP save vs the full-state save, time per checkpoint", ck.time, "full state", "dcp", what="ms")
    key_figure("busiest rank's bytes per checkpoint, DCP vs full state", ck.bytes_ratio, "×", f"{processes} ranks")

# %% [markdown]
# Your prediction, answered: what each rank wrote, and how long a save took ("faster" only when
# every DCP save beat every full-state save).

# %%
if has_torch:
    t, dcp_mb = ck.time, ", ".join(f"{b / 1e6:.2f}" for b in ck.dcp_by_rank)
    print(f"Full state: rank 0 wrote {ck.full_by_rank[0] / 1e6:.2f} MB and held the whole state to do it; the other "
          f"{ck.world_size - 1} rank(s) wrote {sum(ck.full_by_rank[1:]) / 1e6:.2f} MB.")
    print(f"DCP: the ranks wrote {dcp_mb} MB each; the busiest {ck.bytes_ratio:.2f}× the full-state save's rank 0 "
          f"(1/{ck.world_size} of it would be {1 / ck.world_size:.2f}×).")
    print(f"Time per save, {len(t.b.values)} of each in turns: DCP {t.b.text()} ms, full state {t.a.text()} ms "
          f"({t.ratio:.2f}×): {ck.verdict}.")
    print(f"The DCP checkpoint loaded back bit for bit: {ck.reload_identical}.")

# %% [markdown]
# The same measurement at larger states, from the repository's benchmark (the file, the machine
# and the command it ran):

# %%
from labkit.course.references import NO_RESULTS

ref = sc.reference()
if ref is None:
    print(NO_RESULTS)
else:
    display(Markdown(table(sc.reference_rows(ref), markdown=True)))
    d, v = ref["device"], ref["versions"]
    print(f"{ref['file']}: {d['cpu']}, {d['cores']} cores, {ref['nproc']} {d['backend']} processes, torch {v['torch']}, "
          f"{ref['date']}; command: {ref['command']}")

# %% [markdown]
# The recipe: FSDP2 saved and resumed with DCP, on any number of processes (the lines
# `recipes/fsdp.py`, shown in notebook 08, does not have are highlighted):

# %%
recipe_view.show("sharded_checkpoint").changes_from("fsdp")
