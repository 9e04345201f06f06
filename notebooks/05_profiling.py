# %% [markdown]
# # 05 · Profiling: find what bounds your step, fix it, and prove the fix
#
# A profiler trace is only useful once someone reads it. Here labkit reads it **in code**: each
# training step is broken down into input, host-to-device copy, compute, communication,
# optimizer and idle time (fractions that sum to one), the top ops are ranked, and a verdict
# names the bound (input, compute, communication, launch/overhead, memory) with the fix and the
# notebook that teaches it.
#
# We build slow runs on purpose, let the profiler diagnose them, apply the fix through labkit
# settings, and profile again. A profile is one run: it shows *where* the time goes. *How much*
# faster the fix is comes from repeated, unprofiled runs of both settings taking turns, with the
# spread shown.
#
# 1. an **input-bound** `labkit train` run with **injected latency**: the loader sleeps
#    `input_latency_ms` per batch in the training process. The sleep stands in for waiting on
#    remote storage; it uses no CPU. The fix is loader workers and prefetching;
# 2. a **CPU-bound input**: real JPEG decoding in the loader. Workers help here too, but only
#    up to the cores this machine has;
# 3. a **launch-bound** run: a deep, narrow net at a tiny batch, where per-op overhead dwarfs
#    the arithmetic; the fix is more work per op (a bigger batch).
#
# Every trace is a Chrome trace: open it in https://ui.perfetto.dev, or point TensorBoard at the
# `tensorboard` folder. `labkit profile` does the same from a terminal.

# %% tags=["parameters"]
scale = "auto"
model = "cnn"
batch_size = 16
input_latency_ms = 100.0
fixed_num_workers = 8
small_batch = 2
large_batch = 4096
active_steps = 3
cpu_threads = 1
repeats = 3
decode_workers = [0, 1, 2, 4]
profile_tf = True
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_comparison, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from labkit.core import config, frameworks
from labkit.profiling import ProfileConfig, WorkloadConfig, profile_workload
from labkit.course import ladder, profiling, sizing
from labkit.profiling.run import profile_training, set_cpu_threads
from labkit.core.train_config import TrainConfig

scale = config.resolve_scale(scale)
out = artifacts_dir("05_profiling")
schedule = dict(wait=2, warmup=1, active=config.check_int("active_steps", active_steps, minimum=1))
config.check_int("repeats", repeats, minimum=3)  # each speed-up below is a verdict: 3 runs at least
has_torch = frameworks.has_torch()

# %% [markdown]
# ## The sizes for this machine
# At `scale="full"` the sizes are chosen for the GPU this notebook runs on (its memory, the
# number formats it has tensor cores for, its speed), and a demo with more processes than GPUs
# runs them on the CPU. The plan says which, what it leaves out and why, and about how long this
# notebook takes here; `time_budget_s` trims the sizes to fit a time you give it.

# %%
plan = sizing.plan("05_profiling", scale, time_budget_s=time_budget_s, batch_size=batch_size,
                   input_latency_ms=input_latency_ms, repeats=repeats)
print(plan.text())
print(f"traces under {out}", "" if has_torch else "\n" + frameworks.missing_reason("torch"))

# %% [markdown]
# ## 1. An input-bound `labkit train` run (injected latency)
# The torch engine (`labkit train`) trains the course's `model`; every batch waits
# `input_latency_ms` before it is delivered (`TrainConfig.input_latency_ms`: an injected sleep
# standing in for remote storage), read in the training process itself (`num_workers=0`, a
# DataLoader's default).

# %%
train_batch = plan["train_batch"]
slow_cfg = TrainConfig(model=model, scale=scale, batch_size=train_batch, input_latency_ms=input_latency_ms,
                       num_workers=0, steps=6, num_samples=64 * train_batch)
if has_torch:
    print(f"{set_cpu_threads(cpu_threads)} CPU thread(s) for torch")
    slow = profile_training(slow_cfg, ProfileConfig(out_dir=str(out / "input_bound"), **schedule), label="num_workers=0")
    print(slow.text())
    key_figure("input-bound run: share of step waiting for data", 100 * slow.breakdown.fractions["input"], "%")
    key_figure("verdict before the fix", slow.verdict.kind)

# %% [markdown]
# ## 2. Fix it with labkit settings, profile again
# The verdict says: more loader workers and prefetching. That is `TrainConfig.num_workers`
# (`labkit train --num-workers N`); the engine's DataLoader prefetches 4 batches per worker.
# Workers fetch batches ahead while the step computes, so the latency is hidden once
# workers × step time covers it. The injected latency is waiting, not work, so more workers
# than cores is fine here. The speed-up below comes from `repeats` unprofiled runs of each
# setting, taking turns after a discarded first run of each.

# %%
fixed_cfg = TrainConfig(**{**slow_cfg.__dict__, "num_workers": fixed_num_workers})
if has_torch:
    fixed = profile_training(fixed_cfg, ProfileConfig(out_dir=str(out / "input_fixed"), **schedule), label=f"num_workers={fixed_num_workers}")
    print(fixed.text())
    input_fix = profiling.timed_comparison(profiling.training_rate(slow_cfg), profiling.training_rate(fixed_cfg), repeats)
    key_figure("verdict after the fix", fixed.verdict.kind)
    key_comparison("speed-up from loader workers + prefetch (injected latency)", input_fix,
                   "the slow loader", f"num_workers={fixed_num_workers}")

# %% [markdown]
# What the two settings show: each profiled run says where its steps' time went; how much faster
# the fix is comes from the repeated unprofiled runs, "faster" only when no run of one setting
# overlaps the other's (`ladder.verdict`), otherwise "no measurable difference here".

# %%
if has_torch:
    for r in (slow, fixed):
        print(f"[{r.label}] profiled run: {r.verdict.kind} ({r.verdict.evidence}), {1e3 * r.step_s:.1f} ms/step, "
              f"{r.samples_per_s:,.0f} samples/s.")
    print(f"Repeated unprofiled runs, in turns: num_workers={fixed_num_workers} ran at {input_fix.ratio:.2f}× the slow "
          f"loader's samples/s ({input_fix.b.range_text()} vs {input_fix.a.range_text()}, {len(input_fix.b.values)} runs "
          f"each): {ladder.verdict(input_fix)}.")

# %% [markdown]
# ## 3. A CPU-bound input: real image decoding
# Now the loader does work instead of waiting: every sample is a JPEG photo-sized image that
# Pillow decodes in the loader (`WorkloadConfig(decode="jpeg")`, built by
# `profiling.decode_workload`), feeding a small MLP. Loader workers move the
# decoding off the training process, and several workers decode in parallel, but every decode
# needs a core. The same workload runs with each count in `decode_workers`, the counts taking
# turns `repeats` times; each row's verdict is against the count before it.

# %%
from labkit.core import devices
from labkit.course.tables import table

if has_torch:
    sweep = profiling.decode_worker_sweep(profiling.decode_workload(plan["decode_steps"], cpu_threads), decode_workers, repeats=repeats)
    print(table(sweep, ["workers", "samples_per_s", "range", "speedup", "vs previous"]))
    decode = profiling.decode_findings(sweep, devices.usable_cpu_count())
    key_figure("CPU-bound decode: best loader workers here", decode.best_workers,
               note=f"{decode.cores} usable cores; {decode.best_speedup:.2f}× {decode.first_workers} workers")

# %% [markdown]
# What the sweep shows (`profiling.decode_findings`): where adding a worker stopped being
# measurably faster than the count before it, against the cores this machine has.

# %%
if has_torch:
    d = decode
    print(f"Decoding JPEGs is CPU work. Best median: {d.best_samples_per_s:,.0f} samples/s (runs {d.best_range}) with "
          f"{d.best_workers} loader worker(s), {d.best_speedup:.2f}× the median with {d.first_workers}.")
    if d.paid_up_to is not None:
        print(f"Adding workers was measurably faster up to {d.paid_up_to} worker(s).")
    else:
        print("No number of workers was measurably faster than the one before it.")
    for workers, verdict in d.beyond:
        print(f"{workers} worker(s) against the count before it: {verdict}.")
    print(f"This machine has {d.cores} usable core(s), and the training step needs one too: decode workers beyond "
          "the cores only share them.")

# %% [markdown]
# ## 4. A launch-bound run: tiny batches of a deep, narrow net
# A 24-layer, 32-wide MLP at batch `small_batch`: each op does almost no arithmetic, so the
# step is spent dispatching ops and between them. On a GPU this is kernel-launch overhead and
# the GPU sits idle; on a CPU it is per-op framework overhead. The profile shows it as idle time
# and time in tiny ops.

# %%
if has_torch:
    tiny = profile_workload(WorkloadConfig(shape="deep_narrow", batch_size=small_batch, threads=0),
                            ProfileConfig(out_dir=str(out / "launch_bound"), **schedule), label=f"batch {small_batch}")
    print(tiny.text())
    key_figure("launch-bound run: overhead share of the step", 100 * tiny.verdict.figures.get("overhead_fraction", 0.0), "%")

# %% [markdown]
# The fix: more work per op. A larger batch (with gradient accumulation if the global batch
# must stay fixed) amortises the per-op cost; on a GPU, `torch.compile` or CUDA graphs remove
# launches too (notebook 04). Same model, batch `large_batch`:

# %%
if has_torch:
    big = profile_workload(WorkloadConfig(shape="deep_narrow", batch_size=large_batch, threads=0),
                           ProfileConfig(out_dir=str(out / "launch_fixed"), **schedule), label=f"batch {large_batch}")
    print(big.text())
    launch_fix = profiling.timed_comparison(
        profiling.workload_rate(WorkloadConfig(shape="deep_narrow", batch_size=small_batch, threads=0)),
        profiling.workload_rate(WorkloadConfig(shape="deep_narrow", batch_size=large_batch, threads=0)), repeats)
    key_figure("verdict with the larger batch", big.verdict.kind)
    key_comparison("throughput gain (samples/s) from the larger batch", launch_fix,
                   f"batch {small_batch}", f"batch {large_batch}")

# %% [markdown]
# What the two batch sizes show, read the same way as in section 2.

# %%
if has_torch:
    for r in (tiny, big):
        print(f"[{r.label}] profiled run: {r.verdict.kind} ({r.verdict.evidence}), {1e3 * r.step_s:.1f} ms/step, "
              f"{r.samples_per_s:,.0f} samples/s.")
    print(f"Repeated unprofiled runs, in turns: batch {large_batch} ran at {launch_fix.ratio:.2f}× batch {small_batch}'s "
          f"samples/s ({launch_fix.b.range_text()} vs {launch_fix.a.range_text()}, {len(launch_fix.b.values)} runs each): "
          f"{ladder.verdict(launch_fix)}.")

# %%
if has_torch:
    profiling.plot_breakdowns([slow, fixed, tiny, big])

# %% [markdown]
# ## 5. NVTX ranges and GPU utilisation
# labkit marks each phase of the step (`labkit/h2d`, `labkit/forward`, `labkit/backward`,
# `labkit/optimizer`) with `labkit.profiling.phase(...)`: a `record_function` range in the
# torch trace and, when CUDA is in use, an NVTX range of the same name, so Nsight Systems shows
# the same phases: `nsys profile -t cuda,nvtx python -m labkit profile --device cuda`.
# The GPU sampler (NVML or nvidia-smi) runs beside every profiled run.

# %%
if has_torch:
    print("labkit ranges in the last trace:", profiling.nvtx_ranges(big))
    print("NVTX ranges emitted:", "yes (CUDA in use)" if big.gpu is not None else "no: NVTX needs a CUDA GPU")
    print("GPU utilisation:", big.gpu if big.gpu is not None else big.notes)
    print(f"open in Perfetto: {big.trace_path}\nTensorBoard: tensorboard --logdir {big.tensorboard_dir}")

# %% [markdown]
# ## 6. The TensorFlow profiler
# The same input-bound run (injected latency) in TensorFlow: `tf.profiler` writes the trace TensorBoard's Profile
# tab reads, each step marked with `tf.profiler.experimental.Trace`, and labkit's `PhaseTimer`
# times the steps on the host so the breakdown and the verdict come from the same code.

# %%
from labkit.profiling.analysis import step_breakdown
from labkit.profiling.tf_profiler import TFWorkloadConfig, run_tf_workload, tf_profile
from labkit.profiling.verdict import diagnose

if profile_tf and frameworks.has_tf():
    with tf_profile(out / "tf") as tf_prof:
        timer = run_tf_workload(TFWorkloadConfig(batch_size=batch_size, width=256, depth=2, input_latency_ms=input_latency_ms, steps=6), tf_prof)
    tf_breakdown = step_breakdown(timer.timeline, skip_first=1)
    print(tf_breakdown.text(), "\n" + diagnose(tf_breakdown).text(), "\nxplane traces:", tf_prof.trace_files())
else:
    print(frameworks.missing_reason("tensorflow") if not frameworks.has_tf() else "skipped (profile_tf=False)")

# %% [markdown]
# ## 7. Your own script, unmodified
# Everything above profiled labkit's runs. `labkit profile -- COMMAND` profiles yours as it is:
# `examples/your_job/step1_plain.py` is a plain first script (its own `Dataset` over a folder of
# JPEG files, its own CNN, one device, no labkit import; notebook 12 carries it to a Vertex job). The command runs with a profiler hook
# attached from outside: its first `optimizer.step()` starts `torch.profiler` (with Python
# stacks), a warm-up step is dropped, the next steps are recorded, the script is stopped, and
# the trace is read as above; the report names **your** functions and **your** DataLoader.
# `labkit profile --trace FILE` reads a trace you recorded yourself the same way. Before
# running: with `num_workers=0`, which of the script's functions do you expect to dominate?

# %%
if has_torch:
    images = profiling.example_images(out / "images", per_class=plan["own_images_per_class"])
    mine = profiling.profile_own_script(out / "own", images, steps=active_steps)
    print("$ labkit profile --out", out / "own", "--steps", active_steps, "--", *mine.command[:2], "...")
    print(mine.text())
    print("\n$ labkit profile --trace", mine.trace_path, "\n" + profiling.trace_verdict(mine.trace_path))

# %% [markdown]
# The fix is notebook 12's next script, `step2_loader.py`: below, the lines of `step1_plain.py`
# it removes (-) and the lines it runs instead (+). The profile after it runs exactly this file,
# with `--num-workers 2`.

# %%
profiling.show_own_script_change("step1_plain.py", "step2_loader.py")

# %%
if has_torch:
    mine_fixed = profiling.profile_own_script(out / "own-fixed", images, steps=active_steps, num_workers=2)
    print(f"step2_loader.py with --num-workers 2: {mine_fixed.breakdown.text()}\n{mine_fixed.verdict.kind}: "
          f"{mine_fixed.verdict.evidence}")
    print(f"Share of a step waiting for its batch: {mine.breakdown.fractions['input']:.0%} with step1_plain.py, "
          f"{mine_fixed.breakdown.fractions['input']:.0%} with step2_loader.py --num-workers 2 (one profiled run each).")
    key_figure("your own script: share of a step waiting for its batch (num_workers=0)",
               100 * mine.breakdown.fractions["input"], "%", note=f"{mine_fixed.breakdown.fractions['input']:.0%} with 2 workers")

# %% [markdown]
# Holistic Trace Analysis (HTA, `pip install HolisticTraceAnalysis`) reads the same trace files.
# Where it computes what labkit computes, the two stand side by side below: each step's time
# and, on a trace with GPU kernels, how busy the GPU was from its first kernel to its last (HTA's
# temporal breakdown). What labkit adds is the CPU side of each step (the wait for the
# DataLoader, forward, backward, optimizer), the verdict with its fix, and your own functions:
# HTA's breakdowns start from the GPU's kernels, so on a CPU-only trace only the steps compare.

# %%
if has_torch:
    hta = profiling.hta_side_by_side(out / "own")
    print(hta.table.text() if hta.table is not None else hta.missing)
    if hta.agreement is not None:
        print(f"Where both compute a figure, labkit's and HTA's readings {hta.agreement}.")

# %% [markdown]
# ## 8. The code
# labkit's profiling above wraps `torch.profiler` and analyses the trace in code.
# `labkit/recipes/profile.py` is the plain version you would write: `torch.profiler.profile`
# with a `schedule` (wait, warm-up, active steps), `record_function` regions around data,
# forward, backward and optimizer, `tensorboard_trace_handler` for TensorBoard and Perfetto, and
# the hottest operators printed at the end.

# %%
from labkit.course import recipe_view

recipe_view.show("profile")

# %% [markdown]
# Before running: does profiling change what a training step computes, i.e. will the profiled
# recipe log the same losses as an unprofiled `labkit train` run?

# %%
if has_torch:
    prof_argv = recipe_view.flags(model=model, scale=scale, steps=2 + 1 + active_steps, batch_size=batch_size,
                                  trace_dir=str(out / "recipe_profile"), wait=2, warmup=1, active=active_steps)
    print(recipe_view.command("profile", prof_argv))
    prof = recipe_view.compare("profile", prof_argv)
    recipe_view.plot(prof, out / "recipe_profile.png")
    print(prof.recipe.block("---", "Self CPU time total"))
    print("trace files:", *sorted(p.name for p in (out / "recipe_profile").rglob("*.json")))
    key_figure("recipe profile vs unprofiled labkit train: largest loss difference", prof.max_abs_diff,
               note=f"tolerance {prof.tolerance:.0e}")

# %%
if has_torch:
    trend = recipe_view.curve_trend(prof.recipe_losses)
    print(f"The profiled recipe and unprofiled `labkit train`, {len(prof.recipe_losses)} steps in {prof.precision}: largest "
          f"loss difference {prof.max_abs_diff:.1e} at step {prof.worst_step} (the tests allow {prof.tolerance:.0e}): "
          f"{prof.agreement}.")
    if prof.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {prof.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

# %% [markdown]
# ## 9. Looking inside a job while it runs on Vertex
# Everything above profiles a run you start here. On Vertex two switches in the job spec let
# you look inside a job that is already running (`labkit.vertex.cloud_profile` cites the pages):
# `enable_web_access` opens an **interactive shell** into each node (the job lists one URI per
# node as `webAccessUris` once it runs): the way into a replica that hangs, with `py-spy dump
# --pid 1` or `nvidia-smi`. The **Vertex AI TensorBoard Profiler** captures a trace from the
# running job on demand, from the Profile tab of the job's TensorBoard; it profiles TensorFlow
# only (the SDK's profiler has a single `tensorflow` plugin), and needs the job's TensorBoard,
# its service account, the SDK's `cloud_profiler` extra in the image, and `cloud_profiler.init()`
# in the training process. `tensorboard_profiler=True` (or `labkit job --tensorboard-profiler`)
# arranges the last two; a PyTorch job is profiled with `labkit profile`, as in section 7. The
# spec below is built and checked here; the `YOUR_` names are placeholders that `submit`
# refuses until you replace them.

# %%
from labkit import vertex

watch_spec = vertex.training_job(
    {"framework": "tf", "model": model, "steps": 2000}, output_uri="gs://YOUR_BUCKET/05-watch",
    machine_type="g2-standard-8", accelerator_type="NVIDIA_L4", accelerator_count=1,
    tensorboard="projects/YOUR_PROJECT/locations/us-central1/tensorboards/YOUR_TENSORBOARD_ID",
    service_account="trainer@YOUR_PROJECT.iam.gserviceaccount.com",
    enable_web_access=True, tensorboard_profiler=True)
print(table(profiling.running_job_rows(watch_spec), title="the fields that open a running job"))
print("the same from a shell: labkit job --dry-run --framework tf --enable-web-access "
      "--tensorboard-profiler --tensorboard ... --service-account ... --output gs://... -- python train.py")

