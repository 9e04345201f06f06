# %% [markdown]
# # 02 · Distribution: PyTorch DDP vs tf.distribute, on the same job
#
# Data parallelism is the same idea in both ecosystems: every replica holds the whole model,
# takes a slice of the batch, computes gradients, and an **all-reduce** sums them so every
# replica applies the same update. The APIs differ in where the batch is cut, who launches
# the processes, and how a replica learns where the others are:
#
# | | PyTorch | TensorFlow |
# |---|---|---|
# | wrapper | `DistributedDataParallel` | `MirroredStrategy` (one machine), `MultiWorkerMirroredStrategy` (many) |
# | processes | one per GPU, started by `torchrun` | one per machine, all local GPUs inside it |
# | cluster info | `MASTER_ADDR/PORT`, `WORLD_SIZE`, `RANK` | `TF_CONFIG` (Vertex may name the primary `master`; TF wants `chief`) |
# | batch you hand over | per process | global (`experimental_distribute_dataset`) or per replica (`distribute_datasets_from_function`) |
# | all-reduce | gloo (CPU), NCCL (GPU) | gRPC ring (CPU), NCCL (GPU) |
#
# Here both run for real on this machine: DDP processes over gloo, and MultiWorkerMirrored
# workers over gRPC on loopback, each started by labkit with the environment Vertex would
# give it (from a terminal: `labkit launch-tf --workers 2 -- --model cnn --steps 20`). Both engines read the same synthetic samples and define `batch_size` as the
# **global** batch, so the two frameworks train the same job and their loss curves can be
# put on one plot.

# %% tags=["parameters"]
scale = "auto"
model = "cnn"
steps = 0
global_batch = 64
processes = 2
grad_accum = 2
lr = 0.0  # 0: the plan's (10^-2 for the smoke model, 10^-3 at full size)
num_samples = 1024
device = "auto"
time_budget_s = 0.0
straggler_delay_ms = 100.0  # the parameter-server section: wait added to each step of one worker
ps_window_s = 1.0  # ... and the seconds of each measured window

# %%
from labkit.notebooks import artifacts_dir, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from dataclasses import replace

from labkit.core import config, frameworks
from labkit.core.stats import NO_DIFFERENCE
from labkit.course import distribution as dist, sizing
from labkit.course.tables import table
from labkit.core.train_config import TrainConfig

scale = config.resolve_scale(scale)

# %% [markdown]
# ## The sizes for this machine
# At `scale="full"` the sizes are chosen for the GPU this notebook runs on (its memory, the
# number formats it has tensor cores for, its speed), and a demo with more processes than GPUs
# runs them on the CPU. The plan says which, what it leaves out and why, and about how long this
# notebook takes here; `time_budget_s` trims the sizes to fit a time you give it.

# %%
plan = sizing.plan("02_distribution_tf_vs_ddp", scale, time_budget_s=time_budget_s, processes=processes,
                   device=device, model=model)
print(plan.text())
steps = steps or plan["steps"]
lr = lr or plan["lr"]
job = TrainConfig(model=model, scale=plan["model_scale"], steps=steps, batch_size=global_batch, lr=lr,
                  num_samples=num_samples, device=plan["device"], progress=False)
out_dir = artifacts_dir("02_distribution_tf_vs_ddp")

# %% [markdown]
# ## Global vs per-replica batch
# `batch_size` in labkit is the batch of **one optimizer step, summed over all replicas and
# all accumulation micro-steps**. Each replica therefore computes on
# `global_batch / (replicas × grad_accum)` samples at a time. This is what keeps the maths
# identical when the replica count changes, and it is the most common source of silent
# mistakes when porting: DDP's `DataLoader(batch_size=...)` is per process, while
# `strategy.experimental_distribute_dataset` expects a dataset batched with the *global* size
# (and `distribute_datasets_from_function`, which labkit's TF engine uses, asks the input
# context for the per-replica size). A global batch that does not divide evenly is an error
# naming `batch_size`, never a silent rounding.

# %%
rows = dist.batch_semantics(global_batch, (1, processes, 8), grad_accum=1)
print(table(rows))

# %% [markdown]
# ## The same job, 1 and 2 processes, both frameworks
# Each process gets one CPU thread, so the processes do not fight over cores and the
# comparison is about distribution, not threading. With the same global batch, a correct
# data-parallel run follows the single-process loss curve: the all-reduced gradient of two
# half-batches is the gradient of the whole batch.
#
# Before running: two processes on this machine split each step's global batch in half. Do you
# expect a step to take half the time of one process, about the same, or longer? (The scaling
# section below answers from the step times of these runs.)

# %%
comp = dist.compare(job, processes=tuple(sorted({1, processes})))
for reason in comp.skipped.values():
    print(reason)
fig = dist.plot_losses(comp, out_dir / "loss_curves.png")
print("\n".join(dist.learning_lines(comp)))
print(table(dist.scaling_rows(comp)))

# %% [markdown]
# Within a framework, the N-process curve must sit on the 1-process one (differences are
# float summation order). Across frameworks the curves differ a little: initial weights come
# from each framework's own random generator and sample order from each one's permutation,
# but the data, model, optimizer (AdamW, β=(0.9, 0.95), weight decay 0.1 on matrices),
# learning rate and global batch are the same, so the curves fall together. The lines above the
# table say whether each run learned at all: its loss on 256 samples it never trained on
# (**held-out loss**) against **chance**, the loss of guessing uniformly (ln 10 for ten classes).
# Curves that sit at chance would "fall together" too, and prove nothing.

# %%
gaps = {fw: dist.curve_gap(comp.runs[(fw, 1)].log, comp.runs[(fw, processes)].log)
        for fw in ("torch", "tf") if (fw, processes) in comp.runs and (fw, 1) in comp.runs}
for fw, gap in gaps.items():
    key_figure(f"{dist.LABELS[fw]}: largest loss gap, {processes} processes vs 1", gap,
               note="same global batch; 0 up to float rounding")
if len(gaps) == 2:
    ends = {fw: comp.runs[(fw, processes)].log.losses[-1] for fw in gaps}
    print(f"final loss with {processes} processes: torch {ends['torch']:.4f}, tf {ends['tf']:.4f}")

# %% [markdown]
# ## Scaling efficiency
# Strong scaling (same global batch, N processes) has efficiency
# `(t₁ / t_N) / N`: 100% means N processes take 1/N of the time. On a shared 2-core CPU with a
# tiny model the all-reduce and process overhead are large next to the compute, so expect
# well under 100% here; the figure that matters on GPUs is measured with real sizes
# (`scale="full"` on a multi-GPU VM, `device="cuda"`).

# %%
print("Your prediction, answered:")
print("\n".join(dist.scaling_answer(comp, processes)))
rows = dist.scaling_rows(comp)
for r in rows:  # an efficiency only where the steps were measurably faster or slower than one process's
    if not r["run"].endswith("x1"):
        key_figure(f"{r['run']} scaling efficiency",
                   "no measurable speed-up here" if r["vs 1 process"] == NO_DIFFERENCE else 100 * r["efficiency"],
                   "" if r["vs 1 process"] == NO_DIFFERENCE else "%",
                   note=f"{100 * r['efficiency']:.0f}%, speed-up {r['speed-up vs 1']:.2f}x on this machine; "
                        f"steps vs 1 process: {r['vs 1 process']}")
print("Reference figures for hardware this notebook does not have:")
print(table(list(dist.REFERENCES)))

# %% [markdown]
# ## Gradient accumulation
# Accumulating `grad_accum` micro-batches before one optimizer step gives the same update as
# one big batch, with a fraction of the activation memory. In DDP the gradients are
# all-reduced only on the last micro-step (`no_sync()` on the others), which saves
# `grad_accum − 1` all-reduces per step; labkit's TF engine sums the micro-step gradients
# locally and all-reduces once per step for the same reason. Same global batch, with and
# without accumulation:

# %%
gaps = dist.accumulation_loss_gap(replace(job, steps=min(steps, 4)), grad_accum)
for fw, gap in gaps.items():
    key_figure(f"{dist.LABELS[fw].split()[0]}: loss gap, accumulation x{grad_accum} vs none", gap,
               note="0 up to float summation order")

# %% [markdown]
# ## Learning rate and world size
# If the **per-replica** batch is kept and replicas are added, the global batch grows and the
# gradient noise shrinks; the usual correction is the linear scaling rule (LR × N, with a
# warm-up; Goyal et al. 2017) for SGD, or the gentler square-root rule often used with Adam.
# `TrainConfig(scale_lr_with_world_size=True)` makes both engines apply the linear rule; each
# step's LR is in the metrics file. labkit keeps the *global* batch fixed by default, in which
# case the LR should not change at all.

# %%
print(table(dist.lr_scaling_rows(lr, global_batch, (1, 2, 8, 32))))
if (("torch", processes) in comp.runs) and frameworks.has_torch():
    scaled = dist.run_job(replace(job, steps=2, scale_lr_with_world_size=True), "torch", processes)
    key_figure(f"LR logged by DDP x{processes} with scale_lr_with_world_size", scaled.log.steps[-1]["lr"],
               note=f"base lr {lr}")

# %% [markdown]
# ## The code
# Everything above ran through labkit's engines. Here is the code you would write for the same
# job: `labkit/recipes/ddp.py`, plain PyTorch shown from the file (torchrun's variables,
# `init_process_group`, `DistributedSampler` with `set_epoch`, `DistributedDataParallel`,
# `no_sync` for accumulation, logging on rank 0). Only the model, the synthetic data and the
# metrics file come from labkit (`labkit/recipes/common.py`); the technique does not.

# %%
from labkit.course import recipe_view

recipe_view.show("ddp")

# %% [markdown]
# Before running: the recipe is a separate program, launched by torchrun, with none of the
# engine's machinery. Do you expect its losses to match the engine's run above exactly, to a few
# decimals, or only roughly?

# %%
ddp_cmp = None
if ("torch", processes) in comp.runs:
    ddp_argv = recipe_view.flags(job)
    print(recipe_view.command("ddp", ddp_argv, nproc=processes))
    ddp_cmp = recipe_view.compare("ddp", ddp_argv, nproc=processes, engine=comp.runs[("torch", processes)].log)
    recipe_view.plot(ddp_cmp, out_dir / "recipe_ddp.png")
    print(recipe_view.explain(ddp_cmp))
    key_figure(f"recipe ddp vs labkit train, {processes} processes: largest loss difference", ddp_cmp.max_abs_diff,
               note=f"tolerance {ddp_cmp.tolerance:.0e}")

# %% [markdown]
# ### One machine, several devices: MirroredStrategy + fit
# The first step of the Keras distributed-training guide needs no cluster: one process,
# `tf.distribute.MirroredStrategy()`, the model built and compiled in `strategy.scope()`, then
# `model.fit(dataset)`. `MirroredStrategy` places one **replica** (a copy of the model) on each
# device of this machine; variables created in the scope are **mirrored** (one copy per device,
# kept identical); `fit` cuts every batch of the dataset into one slice per replica, and the
# gradients are all-reduced inside the process (NCCL between GPUs, a reduction on the host
# between CPU devices) so every copy applies the same update. The dataset is therefore batched
# at the **global** batch, as labkit's `batch_size` means it.
#
# Use it for the GPUs of one machine; `MultiWorkerMirroredStrategy` (next) is the same idea
# across machines, with one process per machine and `TF_CONFIG` telling each where the others
# are. This machine may have no GPU, so `--devices N` splits the CPU into N **logical devices**
# (`tf.config.set_logical_device_configuration`) and the same code runs with N replicas here;
# with GPUs it uses one replica per GPU (`--devices 0`: all of them). One trap the file works
# around: Keras clips `global_clipnorm` inside each replica, on that replica's share of the
# gradient, before the all-reduce; `AdamWClipSummed` clips the summed gradient, as one device
# does (the recipe's tests measure the difference with clipping active).

# %%
recipe_view.show("keras_mirrored_fit")

# %% [markdown]
# Before running: the recipe trains with `processes` replicas, each computing on
# `global_batch / processes` samples per step; the engine's single-process TensorFlow run
# above took the whole global batch on one device. Do you expect the two loss curves to agree
# to float rounding, or to differ because each replica saw only part of the batch?

# %%
mirrored_cmp = None
if ("tf", 1) in comp.runs:
    mirrored_argv = recipe_view.flags(job, devices=processes)
    print(recipe_view.command("keras_mirrored_fit", mirrored_argv))
    mirrored_cmp = recipe_view.compare("keras_mirrored_fit", mirrored_argv, engine=comp.runs[("tf", 1)].log)
    print(mirrored_cmp.recipe.lines("MirroredStrategy:"))
    recipe_view.plot(mirrored_cmp, out_dir / "recipe_keras_mirrored_fit.png")
    print(recipe_view.explain(mirrored_cmp))
    key_figure(f"recipe keras_mirrored_fit ({processes} replicas) vs labkit train (1): largest loss difference",
               mirrored_cmp.max_abs_diff, note=f"same global batch; tolerance {mirrored_cmp.tolerance:.0e}")

# %% [markdown]
# ### The same job in TensorFlow
# `labkit/recipes/tf_multiworker.py`: `TF_CONFIG` (a `master` from Vertex renamed to `chief`),
# `MultiWorkerMirroredStrategy`, the model and optimizer created in `strategy.scope()`,
# `distribute_datasets_from_function` giving each worker its share of the global batch, and a
# custom step under `strategy.run` (`--loop fit` trains with Keras `model.fit` instead; the
# section after this one says why that is not the multi-worker path). Each worker is its own
# process with its own `TF_CONFIG`, as on Vertex.

# %%
recipe_view.show("tf_multiworker")

# %% [markdown]
# Before running: the recipe's step sums the gradients over the workers before clipping them,
# as labkit's TF engine does. Do you expect the two to agree to float rounding, or to drift apart
# over the steps?

# %%
tf_cmp = None
if ("tf", processes) in comp.runs:
    tf_argv = recipe_view.flags(job)
    print(recipe_view.command("tf_multiworker", tf_argv, nproc=processes))
    tf_cmp = recipe_view.compare("tf_multiworker", tf_argv, nproc=processes, engine=comp.runs[("tf", processes)].log)
    recipe_view.plot(tf_cmp, out_dir / "recipe_tf_multiworker.png")
    print(recipe_view.explain(tf_cmp))
    key_figure(f"recipe tf_multiworker vs labkit train, {processes} workers: largest loss difference",
               tf_cmp.max_abs_diff, note=f"tolerance {tf_cmp.tolerance:.0e}")

# %% [markdown]
# ### A common mistake: the per-process batch taken for the global batch
# Guides that port a one-GPU script to DDP often keep `DataLoader(batch_size=B)` as it was. In
# DDP that batch is **per process**, so N processes train on N × B samples per step: a different
# run. Below, the single-process run beside `processes` DDP processes given the same global
# batch (right) and `processes` processes that each took the whole batch (the mistake), trained
# on the same number of samples (so the mistake makes `processes`× fewer steps), plotted against
# samples seen, with each run's held-out loss at the end. Before running: after the same data,
# will the mistaken run end better or worse than the single process?

# %%
from labkit.course import mistakes

if frameworks.has_torch() and processes > 1:
    ppb = mistakes.per_process_batch(model=model, steps=steps, batch_size=global_batch, nproc=processes, lr=lr,
                                     num_samples=num_samples, device=job.device, scale=job.scale)
    mistakes.plot_per_process_batch(ppb, out_dir / "per_process_batch.png")
    print("\n".join(mistakes.explain_per_process_batch(ppb)))
    key_figure("per-process batch taken for the global batch: held-out loss after the same samples",
               ppb["heldout_mistaken"], note=f"1 process: {ppb['heldout_single']:.3f}; "
               f"batch split right follows it within {ppb['right_max_gap']:.1e}")

# %% [markdown]
# ## Why the ring all-reduce is taught through DDP and torchrun, not Horovod
# Horovod made the ring all-reduce popular (one `hvd.DistributedOptimizer` around any
# framework's optimizer, `horovodrun` to start the processes). Its last release, 0.28.1 (2023),
# does not build against this course's PyTorch. Tried on 2026-11-23 with torch 2.13.0 and
# gcc 12 (`pip wheel horovod==0.28.1` from source, `HOROVOD_WITH_PYTORCH=1`, gloo, no MPI):
# Horovod's CMake compiles its torch extension as C++14, and the first torch header stops it:
#
# ```
# horovod/torch/mpi_ops_v2.cc ... -std=c++14
# torch/include/torch/csrc/api/include/torch/all.h:5:2: error: #error C++17 or later
#   compatible compiler is required to use PyTorch.
# ```
#
# DDP's gradient all-reduce is the same ring algorithm (gloo on CPUs, NCCL's rings and trees on
# GPUs), bucketed and overlapped with backward, and torchrun starts the processes as
# `horovodrun` did, so the course teaches it there. `labkit doctor` reports whether
# `horovod.torch` imports in your environment.

# %% [markdown]
# ## Why labkit's TF engine uses a custom loop, not `model.fit`
# With TensorFlow 2.21 and Keras 3.15, `model.fit` under `MultiWorkerMirroredStrategy` on two
# workers fails ("Attempt to convert a value (PerReplica...) to a Tensor"). Two things do
# work: a custom loop (`strategy.run` inside a `tf.function`, over a distributed dataset), and
# the legacy `tf_keras` 2.x (`TF_USE_LEGACY_KERAS=1`). labkit chooses the **custom loop**:
#
# * it works with the current Keras under every strategy, instead of pinning a legacy package
#   that only receives maintenance fixes;
# * it gives exactly the semantics of the torch engine: global batch, gradients summed across
#   replicas *before* clipping (as DDP + `clip_grad_norm_`), accumulation, warm-up, fp16 loss
#   scaling, the loss of each step (Keras reports a running mean), and a resume that continues
#   with exactly the next step;
# * the two frameworks can therefore be compared step by step, as above.
#
# `model.fit` stays available (`LABKIT_TF_LOOP=keras`) with Keras' `BackupAndRestore` for
# preemption on one worker, and a test in the course's suite watches the multi-worker
# failure: it fails the day Keras fixes it, so this choice gets revisited.
#
# ## When to choose which
# * **Already in one ecosystem?** Stay: both scale data-parallel training well (see the
#   reference figures); the difference on GPUs is mostly in the input pipeline and the kernels.
# * **PyTorch DDP**: one process per GPU, explicit and easy to debug; the largest ecosystem
#   for LLM training (FSDP, torch.compile); on Vertex, use `restartJobOnWorkerRestart`.
# * **tf.distribute**: one process per machine drives all its GPUs; TPUs via `TPUStrategy`;
#   `ParameterServerStrategy` for asynchronous training on many CPU workers with variables
#   too large for one machine (labkit picks it when TF_CONFIG has `ps` tasks; try
#   `labkit launch-tf --workers 2 --ps 1 -- --steps 10`); Keras `BackupAndRestore` for
#   preemption.
# * Either way, on Vertex multi-node jobs the Reduction Server can speed up the all-reduce
#   without code changes (notebook 06).

# %%
if len(comp.runs) == 2 * len({1, processes}):
    faster, sentence = dist.framework_verdict(comp, processes)
    print(sentence)
    key_figure(f"faster at {processes} processes here", dist.LABELS[faster] if faster else "neither (no verdict)",
               note=sentence)

# %% [markdown]
# ## Asynchronous training: parameter servers
# Every run above is **synchronous**: a step ends when every replica's gradient is in the
# all-reduce, so all replicas apply the same update to the same weights. TensorFlow's
# `ParameterServerStrategy` is the other design. The variables live on **parameter servers**; a
# **coordinator** (the chief) schedules steps with a `ClusterCoordinator`, each on whichever
# **worker** is free; that worker reads the current weights from the parameter servers, computes
# the gradient of one whole batch and applies it there, without waiting for the other workers.
# Vertex AI lays the pools out for it: workerpool0 is the chief, workerpool1 the workers,
# workerpool2 the parameter servers, and TF_CONFIG gives each replica its `chief`, `worker` or
# `ps` task.
#
# The price is **staleness**: between a worker's read of the weights and its update, other
# workers may have applied theirs, so its gradient was computed for weights that have since
# moved. A version counter on the parameter server measures it: read before the weights,
# incremented by every update; the difference is the number of updates applied meanwhile.
#
# Below, both designs train the same model on the same data with the same batch per update,
# each as an emulated Vertex AI job in which two replicas compute (every replica a local
# process with the environment Vertex would give it). Time runs in windows of `ps_window_s`
# seconds, and in every other window workerpool1[0] waits `straggler_delay_ms` in each of its
# steps, after computing its gradient: a **straggler**, like a slower machine or a busy
# neighbour. What is counted is the updates in each window, the two kinds interleaved so that a
# slow spell of this machine hits both.

# %%
from labkit.course import parameter_server as psd
from labkit.notebooks import key_comparison

ps_job, ps_note = psd.demo_config(job)
ps_specs = psd.jobs(ps_job, psd.StragglerConfig(delay_ms=straggler_delay_ms, window_s=ps_window_s))
print(ps_note)
print(psd.layout_text(ps_specs))

# %% [markdown]
# Before running: with one worker slowed, what share of its updates per second do you expect
# the synchronous job to keep, and the asynchronous one?

# %%
ps_runs = {}
if frameworks.has_tf():
    ps_runs = psd.run(ps_specs, out_dir / "straggler_jobs")
    print(table(psd.window_rows(ps_runs)))
    psd.plot(ps_runs, out_dir / "parameter_server.png")
else:
    print(frameworks.missing_reason("tensorflow"))

# %%
if ps_runs:
    print("Your prediction, answered:")
    print("\n".join(psd.conclusions(ps_runs)))
    for r in ps_runs.values():
        key_comparison(f"{r.label}: updates/s with one worker slowed (+{r.delay_ms:g} ms per step) vs none",
                       psd.slowdown(r), "all at full speed", "one worker slowed", "steps/s")
    key_comparison("ParameterServer vs MultiWorkerMirrored, all workers at full speed", psd.throughput(ps_runs),
                   "MultiWorkerMirrored", "ParameterServer", "samples/s")

# %% [markdown]
# ### Staleness
# In the synchronous job every gradient is computed on the weights it updates (staleness 0).
# In the asynchronous one, the table counts, for each update, the updates other workers applied
# between its read of the weights and its own: by kind of window, and separately for the
# slowed worker. A straggler's gradients arrive late, and asynchronous SGD applies them anyway;
# the loss curves above show what that costs at this learning rate.

# %%
if ps_runs:
    print(table(psd.staleness_rows(ps_runs[psd.ASYNC])))
    median_stale, stale_note = psd.staleness_figure(ps_runs[psd.ASYNC])
    key_figure("ParameterServer: median staleness of an update, all workers at full speed", median_stale,
               "updates", note=stale_note)

# %% [markdown]
# ### The code
# `labkit/recipes/tf_parameter_server.py`: TF_CONFIG with `ps` tasks (a `master` from Vertex
# renamed to `chief`); workers and parameter servers only run a `tf.distribute.Server`; the chief
# builds `ParameterServerStrategy` and a `ClusterCoordinator`, creates the model, optimizer and
# version counter in `strategy.scope()` (so they live on the parameter servers), gives each
# worker its share of the batches with `create_per_worker_dataset`, and `schedule`s the steps.
# Without TF_CONFIG it starts the whole cluster inside its own process, as TensorFlow's
# tutorial does, which is how it runs here.

# %%
recipe_view.show("tf_parameter_server")

# %% [markdown]
# Before running: two workers share this run's steps. Do you expect every step's staleness to be
# 0, as with one worker (where the recipe's tests find `labkit train`'s losses, within 1e-5)?

# %%
if frameworks.has_tf():
    ps_argv = recipe_view.flags(ps_job, steps=24, workers=2, ps=1)
    print(recipe_view.command("tf_parameter_server", ps_argv))
    ps_recipe = recipe_view.run("tf_parameter_server", ps_argv)
    print(psd.recipe_summary(ps_recipe.steps) + recipe_view.curve_sentence(ps_recipe.losses))
    key_figure("recipe tf_parameter_server: mean staleness with 2 workers",
               sum(s["staleness"] for s in ps_recipe.steps) / len(ps_recipe.steps), "updates")

# %% [markdown]
# ### PyTorch's parameter server, and why the course uses DDP
# PyTorch has no parameter-server strategy; its tutorials build one on the RPC framework
# (`torch.distributed.rpc`). The course measures the design rather than that code: the
# TensorFlow jobs above are the same pattern (workers pull the weights, push gradients, the
# server applies them as they come). What their numbers say, beside DDP's from the top of this
# notebook:

# %%
if ps_runs:
    ddp_gap = (dist.curve_gap(comp.runs[("torch", 1)].log, comp.runs[("torch", processes)].log)
               if processes > 1 and {("torch", 1), ("torch", processes)} <= set(comp.runs) else None)
    print("\n\n".join(psd.rpc_lines(ps_runs, ddp_gap)))
