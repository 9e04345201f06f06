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
from labkit.notebooks import artifacts_dir, key_comparison, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from dataclasses import replace

from labkit.core import config, frameworks
from labkit.core.metrics import LEARNED_BELOW
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
print(table(dist.scaling_rows(comp)))

# %% [markdown]
# Within a framework, the N-process curve must sit on the 1-process one (differences are
# float summation order). Across frameworks the curves differ a little: initial weights come
# from each framework's own random generator and sample order from each one's permutation,
# but the data, model, optimizer (AdamW, β=(0.9, 0.95), weight decay 0.1 on matrices),
# learning rate and global batch are the same, so the curves fall together. Curves that sit at
# chance would "fall together" too, and prove nothing, so first: did each run learn at all? Its
# loss on samples it never trained on (**held-out loss**) against **chance**, the loss of
# guessing uniformly (ln 10 for ten classes); a run counts as having learned below
# `LEARNED_BELOW` × chance.

# %%
for r in dist.learning(comp):
    if r.heldout_loss is None:
        print(f"{r.label}: {r.steps} steps; {r.verdict}.")
        continue
    warning = "" if r.learned else f" (not under {LEARNED_BELOW:g} × chance): draw no conclusion from its curve"
    print(f"{r.label}: held-out loss {r.heldout_loss:.3f} on {r.heldout_samples} unseen samples after {r.steps} steps, "
          f"chance {r.chance:.3f}: {r.verdict}{warning}.")

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
scaling = dist.scaling(comp, processes)
print("Your prediction, answered:")
for s in scaling.values():
    c = s.comparison
    ranges = f" (ranges {c.b.low:.3g}–{c.b.high:.3g} vs {c.a.low:.3g}–{c.a.high:.3g} ms, n={len(c.b.values)} steps each)" if c else ""
    print(f"{s.b.label}: a step took {s.b_median_ms:.3g} ms against {s.a_median_ms:.3g} ms with one process{ranges}: "
          f"{s.verdict}. Ideal strong scaling would take {s.ideal_ms:.3g} ms: {100 * s.efficiency:.0f}% efficiency.")

# %%
for s in scaling.values():  # an efficiency only where the steps were measurably faster or slower than one process's
    key_figure(f"{s.b.label} scaling efficiency",
               "no measurable speed-up here" if s.verdict == NO_DIFFERENCE else 100 * s.efficiency,
               "" if s.verdict == NO_DIFFERENCE else "%",
               note=f"{100 * s.efficiency:.0f}%, speed-up {s.speedup:.2f}x on this machine; steps vs 1 process: {s.verdict}")
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
    key_figure(f"recipe ddp vs labkit train, {processes} processes: largest loss difference", ddp_cmp.max_abs_diff,
               note=f"tolerance {ddp_cmp.tolerance:.0e}")

# %%
if ddp_cmp is not None:
    trend = recipe_view.curve_trend(ddp_cmp.recipe_losses)
    print(f"The recipe ({processes} processes) and `labkit train` (the run above, same settings), {len(ddp_cmp.recipe_losses)} "
          f"steps: largest loss difference {ddp_cmp.max_abs_diff:.1e} at step {ddp_cmp.worst_step} (the tests allow "
          f"{ddp_cmp.tolerance:.0e} in {ddp_cmp.precision}): {ddp_cmp.agreement}.")
    if ddp_cmp.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {ddp_cmp.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

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
    key_figure(f"recipe keras_mirrored_fit ({processes} replicas) vs labkit train (1): largest loss difference",
               mirrored_cmp.max_abs_diff, note=f"same global batch; tolerance {mirrored_cmp.tolerance:.0e}")

# %%
if mirrored_cmp is not None:
    trend = recipe_view.curve_trend(mirrored_cmp.recipe_losses)
    replicas = len(mirrored_cmp.recipe.run.get("devices") or ())
    print(f"The recipe (1 process, {replicas} replicas) and `labkit train` (the run above: 1 replica, the same global batch), "
          f"{len(mirrored_cmp.recipe_losses)} steps: largest loss difference {mirrored_cmp.max_abs_diff:.1e} at step "
          f"{mirrored_cmp.worst_step} (the tests allow {mirrored_cmp.tolerance:.0e} in {mirrored_cmp.precision}): "
          f"{mirrored_cmp.agreement}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

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
    key_figure(f"recipe tf_multiworker vs labkit train, {processes} workers: largest loss difference",
               tf_cmp.max_abs_diff, note=f"tolerance {tf_cmp.tolerance:.0e}")

# %%
if tf_cmp is not None:
    trend = recipe_view.curve_trend(tf_cmp.recipe_losses)
    print(f"The recipe ({processes} workers) and `labkit train` (the run above, same settings), {len(tf_cmp.recipe_losses)} "
          f"steps: largest loss difference {tf_cmp.max_abs_diff:.1e} at step {tf_cmp.worst_step} (the tests allow "
          f"{tf_cmp.tolerance:.0e} in {tf_cmp.precision}): {tf_cmp.agreement}.")
    if tf_cmp.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {tf_cmp.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

# %% [markdown]
# ### A common mistake: the per-process batch taken for the global batch
# Guides that port a one-GPU script to DDP often keep the script's batch line as it was. In DDP
# a `DataLoader`'s `batch_size` is **per process**, so N processes train on N × B samples per
# step: a different run. The ddp recipe keeps the mistake runnable (`--mistake
# per-process-batch`): below, its mistaken line beside the right one.

# %%
from labkit.course import mistakes

recipe_view.show_mistake("ddp", "per-process-batch")

# %% [markdown]
# With exactly these lines, the recipe trains three times: as one process, as `processes`
# processes that split the global batch (right), and as `processes` processes that each take
# the whole batch (the mistake), the last for `processes`× fewer steps so that all three train
# on the same number of samples. The plot puts them against samples seen. Before running: after
# the same data, will the mistaken run's loss be higher, lower, or the same as the single
# process's?

# %%
ppb = None
if frameworks.has_torch() and processes > 1:
    ppb = mistakes.per_process_batch(job, processes)
    mistakes.plot_per_process_batch(ppb, out_dir / "per_process_batch.png")
    if ppb.end_comparison is not None:
        key_comparison("per-process batch taken for the global batch: training loss after the same samples",
                       ppb.end_comparison, "1 process", f"{processes} processes × {global_batch} (mistake)", "loss")

# %% [markdown]
# What the three runs show, against the single process at the same number of samples seen (the
# mistaken run's last quarter of steps, at least three, and the single process's steps that had
# seen as many samples; "worse" only when the two ranges do not overlap):

# %%
if ppb is not None:
    c, rounding = ppb.end_comparison, ppb.right_within_tolerance
    print(f"Global batch {ppb.batch_size} split over {ppb.nproc} processes ({ppb.per_process} each): the curve followed the "
          f"single process within {ppb.right_max_gap:.1e}, {'within' if rounding else 'over'} the "
          f"{mistakes.RIGHT_TOLERANCE:.0e} of float rounding the recipe's tests allow.")
    print(f"Each of the {ppb.nproc} processes taking {ppb.batch_size} (global batch {ppb.mistaken_global_batch}) made "
          f"{len(ppb.mistaken)} updates for the same {ppb.samples:,} samples instead of {len(ppb.single)}.")
    tail = (f"over its last {ppb.matched_tail} steps its training loss was {c.b.low:.3f}–{c.b.high:.3f}, the single "
            f"process's after as many samples {c.a.low:.3f}–{c.a.high:.3f}: " if c else "")
    print(f"After the same samples, against the single process: {tail}{ppb.verdict}.")

# %% [markdown]
# A run with `processes`× the global batch makes `processes`× fewer updates per epoch, at a
# learning rate chosen for the batch you configured: it is not the run you asked for, whatever
# its loss. In DDP, divide the global batch by the world size (and by the accumulation steps)
# before it reaches the `DataLoader`, as the recipe's right line does.

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
race = dist.framework_race(comp, processes)
if race is not None:
    c = race.comparison
    ranges = f" (ranges {c.b.low:.3g}–{c.b.high:.3g} vs {c.a.low:.3g}–{c.a.high:.3g} ms, n={len(c.b.values)} and {len(c.a.values)})" if c else ""
    said = (f"{race.b.label}: a step took {race.b_median_ms:.3g} ms, {race.a.label} {race.a_median_ms:.3g} ms{ranges}, over "
            f"the steps of one run each; {race.b.label} against {race.a.label}: {race.verdict}")
    print(said + ".")
    key_figure(f"faster at {processes} processes here",
               dist.LABELS[race.faster.framework] if race.faster else f"neither ({race.verdict})", note=said)

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

ps_job = psd.demo_config(job)
ps_specs = psd.jobs(ps_job, psd.StragglerConfig(delay_ms=straggler_delay_ms, window_s=ps_window_s))
print(f"Both jobs: {ps_job.model} at the smoke size, global batch {ps_job.batch_size} per update, lr {ps_job.lr:g}, "
      f"{ps_job.num_samples_or_default()} samples; every replica on the CPU of this machine.")
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

# %% [markdown]
# A synchronous step waits for the slowest worker's gradient; an asynchronous step waits for
# nobody. What the windows measured, each kind of window against the full-speed ones (a verdict
# only where the windows' rates do not overlap):

# %%
ps_found = psd.findings(ps_runs) if ps_runs else None
if ps_found:
    f, o = ps_found, ps_found.others
    print("Your prediction, answered:")
    for name, c, verdict in (("synchronous", f.sync, f.sync_verdict), ("asynchronous", f.asynchronous, f.async_verdict)):
        print(f"The {name} job with workerpool1[{f.slow_worker}] waiting {f.delay_ms:g} ms per step: {c.b.median:.3g} updates/s "
              f"against {c.a.median:.3g} at full speed (ranges {c.b.range_text()} vs {c.a.range_text()}): {verdict}, {c.ratio:.0%} of its rate.")
    print(f"The asynchronous worker that was never slowed, beside the straggler: {o.b.median:.3g} updates/s against {o.a.median:.3g} "
          f"in its full-speed windows: {f.others_verdict}" + ("; it did not wait for the straggler." if f.others_kept_pace else
          " (the workers share this machine's cores and the parameter server)."))

# %%
if ps_found:
    t = ps_found.throughput
    print(f"All workers at full speed: asynchronous {t.b.median:,.0f} samples/s, synchronous {t.a.median:,.0f} (ranges "
          f"{t.b.range_text()} vs {t.a.range_text()}): {ps_found.throughput_verdict}.")
    print(f"Training loss after the same {ps_found.compared_updates} updates (mean over the last tenth, each on its own "
          f"batch): synchronous {ps_found.sync_tail_loss:.3f}, asynchronous {ps_found.async_tail_loss:.3f}.")
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
if ps_found:
    print(table(psd.staleness_rows(ps_runs[psd.ASYNC])))
if ps_found and ps_found.staleness:
    s = ps_found.staleness
    print(f"At full speed an asynchronous update was computed on weights {s.median:g} update(s) old (median; mean {s.mean:.2f}, "
          f"max {s.max}); with the straggler, its updates were {s.slowed_mean:.1f} updates old on average and the other "
          f"worker's {s.other_mean:.2f}: the slow worker's gradients arrive late, and are applied to weights that have moved on.")
    key_figure("ParameterServer: median staleness of an update, all workers at full speed", s.median, "updates",
               note=f"mean {s.mean:.2f}, max {s.max}, over {len(s.full_speed)} updates; with the straggler: its updates "
                    f"{s.slowed_mean:.1f} on average, the other worker's {s.other_mean:.2f}")

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
    rs, trend = psd.recipe_staleness(ps_recipe.steps), recipe_view.curve_trend(ps_recipe.losses)
    print(f"{rs.updates} updates ({', '.join(f'worker {w}: {n}' for w, n in rs.by_worker.items())}); staleness: mean "
          f"{rs.mean:.2f}, max {rs.max}; {rs.stale_share:.0%} of the updates were applied to weights another worker had "
          f"changed since they were read. The curve {trend.verdict}: mean loss {trend.first:.3f} over its first "
          f"quarter of steps, {trend.last:.3f} over its last.")
    key_figure("recipe tf_parameter_server: mean staleness with 2 workers", rs.mean, "updates")

# %% [markdown]
# ### PyTorch's parameter server, and why the course uses DDP
# PyTorch has no parameter-server strategy: its parameter server is written on the RPC
# framework, trainers fetching parameters from a server process and sending it gradients
# ([the RPC parameter-server tutorial](https://docs.pytorch.org/tutorials/intermediate/rpc_param_server_tutorial.html)),
# an API the PyTorch docs call "stable and in maintenance mode"
# ([torch.distributed.rpc](https://docs.pytorch.org/docs/2.9/rpc.html), read 2026-11-29); the
# [distributed overview](https://docs.pytorch.org/tutorials/beginner/dist_overview.html) (read
# 2026-11-29) sends data parallelism to DDP and keeps RPC for structures that "cannot fit into
# data-parallel training". The course does not run that code: the TensorFlow jobs above are the
# same design (workers pull the weights, push gradients, the server applies them as they come).
# What their numbers say, beside DDP's from the top of this notebook:

# %%
if ps_found:
    ddp_gap = (dist.curve_gap(comp.runs[("torch", 1)].log, comp.runs[("torch", processes)].log)
               if processes > 1 and {("torch", 1), ("torch", processes)} <= set(comp.runs) else None)
    tr, s = psd.traffic(ps_runs), ps_found.staleness
    print((f"- Asynchronous updates are stale (median {s.median:g}, mean {s.mean:.2f} updates here with {tr.workers} workers "
           f"at full speed), so the run is not the single-process run; " if s else "- ")
          + (f"DDP with several processes followed the single-process curve within {ddp_gap:.1e} (measured above)."
             if ddp_gap is not None else "DDP's curves were not measured in this run (no PyTorch here)."))

# %%
if ps_found:
    print(f"- Every update sends the whole gradient to the parameter server and takes the whole weights back: "
          f"{tr.server_bytes_per_update / 1e6:.2f} MB per update for this model's {tr.params:,} parameters, "
          f"{tr.server_bytes_per_s / 1e6:.1f} MB/s at the {tr.updates_per_s:.0f} updates/s measured here, all through the "
          f"parameter servers; a ring all-reduce sends {tr.ring_bytes_per_worker / 1e6:.2f} MB per worker per step, over every link at once.")
    print(f"- With a straggler the asynchronous job kept {ps_found.asynchronous.ratio:.0%} of its update rate, the synchronous one "
          f"{ps_found.sync.ratio:.0%}.")

# %% [markdown]
# That last line is the case for parameter servers: many unreliable CPU workers, or variables
# too large for one machine, where TensorFlow's `ParameterServerStrategy` is the supported path.
# For dense models on equal GPUs, synchronous data parallelism gives the single-process result
# at the all-reduce's cost.
