# %% [markdown]
# # 07 · Spot VMs and preemption
#
# Spot VMs cost a fraction of on-demand, and Google can reclaim them at any time. On Vertex AI
# a custom job asks for them with `scheduling.strategy = SPOT`. When a VM is reclaimed the
# replica gets **SIGTERM**. Compute Engine gives a Spot VM 30 seconds before it stops it; Vertex
# AI does not document how much of that reaches a training container, so labkit assumes half
# (15 s) and a checkpoint on SIGTERM must fit in that. The preempted job fails with STOCKOUT and
# Vertex restarts it, up to six times. What happens when a replica exits by itself depends on
# why, by Vertex's table of common errors: an error in the code (an exception, any non-zero exit
# such as 1) is **permanent**: the whole job stops and nothing is restarted, so a bug is not
# paid for five times. SIGABRT and SIGSEGV exits (6 or 134, 11 or 139) may be transient: the
# whole job restarts, up to three times, as after a stockout. Only a failure on the machine's
# side (a non-permanent error) restarts the worker on its own VM, up to five times, and then the
# whole job up to three times. `restartJobOnWorkerRestart` turns each worker restart into a
# restart of the whole job, which DDP needs (a process group cannot lose a member). labkit's
# local emulator applies the same table; each fact is printed below with the page it comes
# from and the date it was read, and a cell below shows the emulator following it.
#
# So a Spot job must (1) checkpoint on SIGTERM, (2) checkpoint periodically as well, and
# (3) resume exactly where it stopped. This notebook prices Spot, computes the checkpoint
# interval that minimises the expected cost, and runs a **preemption drill** through the local
# Vertex emulator, proving that the resumed job's per-step losses and final weights are
# identical to an uninterrupted run.
#
# **Step numbers.** Every step number below counts from 0, as labkit's metrics file (its `step`
# field), its checkpoint folders (`step-00000008` holds the state after step 8) and the recipes
# do: "SIGTERM during step 7" means steps 0-6 were done; a checkpoint of step 8 resumes with
# step 9.

# %% tags=["parameters"]
scale = "auto"
replicas = 2
steps = 0
checkpoint_every = 4
preempt_step = 0
signal = "SIGTERM"
accelerator_type = "NVIDIA_H100_80GB"
job_hours = 24.0
preemptions_per_hour = 0.05
restart_overhead_s = 300.0
checkpoint_gb = 1.5
output_uri = "gs://YOUR_BUCKET/labkit/07_spot"
own_epochs = 3  # epochs of the example trainer preempted as your own job
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_comparison, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from labkit import vertex
from labkit.core import config, frameworks
from labkit.course import sizing
from labkit.course.preemption import drill, spot
from labkit.course.tables import table
from labkit.vertex import pricing

scale = config.resolve_scale(scale)

# %% [markdown]
# ## The sizes for this machine
# At `scale="full"` the sizes are chosen for the GPU this notebook runs on (its memory, the
# number formats it has tensor cores for, its speed), and a demo with more processes than GPUs
# runs them on the CPU. The plan says which, what it leaves out and why, and about how long this
# notebook takes here; `time_budget_s` trims the sizes to fit a time you give it.

# %%
plan = sizing.plan("07_spot_and_preemption", scale, time_budget_s=time_budget_s, replicas=replicas)
print(plan.text())
steps = steps or plan["steps"]
preempt_step = preempt_step or steps // 2 + 1
cfg = drill.DrillConfig(replicas=replicas, steps=steps, checkpoint_every=checkpoint_every,
                        preempt_step=preempt_step, signal=signal, input_latency_ms=plan["input_latency_ms"])
workdir = artifacts_dir("07_spot_and_preemption")
print(f"scale {scale}: {cfg.steps} steps (0-{cfg.steps - 1}), a checkpoint after steps "
      f"{', '.join(map(str, cfg.periodic_checkpoints))}; {cfg.signal} to {cfg.target} during step {cfg.preempt_step}")

# %%
from labkit.hardware import facts

for fact in (facts.SPOT_SHUTDOWN_S, facts.CONTAINER_SIGTERM_GRACE_S):
    print(("" if fact.documented else "[not documented; labkit's assumption] ") + fact.text())
print("\n".join(facts.restart_rules()))

# %% [markdown]
# ## Spot scheduling in the job spec
# One field turns a job into a Spot job. The spec below is the drill's job as Vertex would run
# it, validated against `google.cloud.aiplatform_v1`.

# %%
import json

spot_spec = vertex.training_job(dict(model="cnn", steps=steps, checkpoint_every=checkpoint_every),
                                output_uri=output_uri, replica_count=replicas, spot=True)
print("scheduling:", json.dumps(spot_spec["scheduling"]))
print("baseOutputDirectory:", spot_spec["base_output_directory"]["output_uri_prefix"],
      "-> AIP_CHECKPOINT_DIR =", output_uri + "/checkpoints/")
if frameworks.has_aiplatform():
    message = vertex.validate(spot_spec)
    print("accepted by aiplatform_v1.CustomJobSpec; strategy =", message.scheduling.strategy.name)
else:
    print(frameworks.missing_reason("google.cloud.aiplatform"))

# %% [markdown]
# ## What Spot saves
# The machine's price per hour (its accelerators and host VM) divided by its accelerators, dated
# and sourced, with the rate card it comes from (Compute Engine rates are a lower bound for a
# Vertex AI job: notebook 01 compares the two).

# %%
price = pricing.accelerator_prices()[accelerator_type]
discount = 1 - price.spot / price.on_demand
print(f"{accelerator_type}: on-demand ${price.on_demand:.2f}/h, Spot ${price.spot:.2f}/h per accelerator, host VM share included")
print(f"source: {price.source}, read {price.read_on}")
key_figure(f"{accelerator_type} Spot discount", discount * 100, "%", note=f"prices read {price.read_on}")

# %% [markdown]
# ## On-demand, Spot or DWS flex-start for this job
# Three ways to buy the same `job_hours` on one machine of `accelerator_type`. Spot is the
# cheapest hour and can be taken away; Dynamic Workload Scheduler's flex-start
# (`scheduling.strategy = FLEX_START`) waits until all the job's GPUs are free at once, then is
# not preempted. labkit's catalog has no flex-start rate: its price is the range Google
# documents. Each price and rule below carries its source; the Spot row prices the preemptions
# assumed in the parameters at a 30-minute checkpoint interval.

# %%
from labkit.hardware.spot import SpotModel

capacity = spot.SpotScenario(job_hours, price.on_demand, price.spot,
                             SpotModel(preemptions_per_hour, restart_min=restart_overhead_s / 60))
options = spot.capacity_options(capacity, 1800.0, f"{price.source}, read {price.read_on}")
print(spot.capacity_text(options, f"{job_hours:.0f} h on one {accelerator_type}"))

# %%
flex = vertex.training_job(dict(model="cnn", steps=steps), output_uri=output_uri, machine_type="a3-highgpu-1g",
                           accelerator_type="NVIDIA_H100_80GB", accelerator_count=1, flex_start=True,
                           max_wait_s=6 * 3600)
print("a flex-start job's scheduling:", json.dumps(flex["scheduling"]))
on_demand_option, spot_option, flex_option = options
key_figure("Spot job cost / on-demand (with the preemptions assumed)",
           spot_option.job_usd[0] / on_demand_option.job_usd[0], "×")
key_figure("DWS flex-start job cost / on-demand (documented range)",
           f"{flex_option.job_usd[0] / on_demand_option.job_usd[0]:.2f}-1.00", "×",
           note="not preempted; waits for capacity")

# %% [markdown]
# ## What the emulator restarts, and what it does not
# Before running: a replica that raises an exception (exit 1), and one that crashes with
# SIGSEGV (exit 139). How many times does each run before the job ends, and how does it end?

# %%
from labkit.vertex.emulator import run_local

crashes = {}
for name, code in (("exception (exit 1)", 1), ("SIGSEGV (exit 139)", 139)):
    crash_spec = vertex.custom_job_spec(vertex.PoolConfig(image_uri="gcr.io/p/img",
                                                          args=["python", "-c", f"raise SystemExit({code})"]),
                                        output_uri=f"{output_uri}/crash-{code}")
    crashes[name] = run_local(crash_spec, workdir / f"crash-{code}", show_progress=False)
    print(f"{name}: {crashes[name].state} after {len(crashes[name].runs)} run(s); {crashes[name].error[:160]}")
key_figure("runs of a replica whose code raised (Vertex: permanent error)", len(crashes["exception (exit 1)"].runs))
key_figure("runs of a replica that crashed with SIGSEGV (Vertex: restarted up to 3 times)",
           len(crashes["SIGSEGV (exit 139)"].runs))

# %% [markdown]
# ## The preemption drill
# The same `labkit train` job runs twice through the emulator: once undisturbed, once with
# `workerpool1[0]` receiving SIGTERM during step `preempt_step` (the emulator sends it when the
# chief's progress bar shows `preempt_step` steps done). Every rank agrees (in a step's
# all-reduce) to stop after the same step, the chief commits a checkpoint of that step, all exit
# 143; the Spot job restarts, every replica restores the newest committed checkpoint (model,
# optimizer, LR schedule, RNG, data position) and continues with exactly the next step. With
# `SIGKILL` there is no warning: the job resumes from the last periodic checkpoint and redoes
# the steps after it.
#
# Before running: the signal arrives during step `preempt_step`. Which step's checkpoint do
# you expect the restarted job to restore, and which step does it train first?

# %%
if frameworks.has_torch():
    result = drill.preemption_drill(cfg, workdir / "drill")
    print("the emulator's events:\n" + "\n".join(result.events()))
else:
    print(frameworks.missing_reason("torch"))

# %%
if frameworks.has_torch():
    print(table(result.attempt_rows(), title="the preempted job, replica by replica (steps counted from 0)"))
    last_words = [x for x in result.preempted.runs if x.job_attempt == 0 and x.pool == 0][0].log()
    print("\nchief, first attempt:", [ln for ln in last_words.splitlines() if "labkit train" in ln])
    drill.plot_losses(result, workdir / "drill_losses.png")
    key_figure("resumed run: per-step losses identical to uninterrupted", str(result.losses_equal))
    key_figure("resumed run: final weights identical to uninterrupted", str(result.weights_equal),
               note=f"max |difference| {result.max_weight_difference:g}")
    key_figure("steps computed twice after the preemption", result.redone_steps)

# %% [markdown]
# ### What the drill shows
# Every number below comes from the two jobs above, in labkit's step numbering. The checkpoint
# the restarted job restored was either **taken on the signal** (every replica agreed to stop
# after the same step and the chief checkpointed it: nothing is computed twice) or **a periodic
# one** (a SIGKILL gives no warning: the steps after it are trained again).

# %%
if frameworks.has_torch():
    r = result
    print(f"The uninterrupted job: {r.clean.state}, steps 0-{len(r.clean_losses) - 1}. The preempted job: "
          f"{r.preempted.state} after {r.preempted.job_restarts} job restart(s).")
    print(f"{cfg.signal} reached {cfg.target} during step {r.signal_step}, when steps 0-{r.signal_step - 1} were done.")
    print(f"The restarted job restored the checkpoint of step {r.checkpoint_step} ({r.restored}) and continued with "
          f"step {r.resumed_at_step}; steps computed twice: {r.steps_computed_twice or 'none'}.")
    print(f"Per-step losses identical to the uninterrupted job's: {r.losses_equal}. Final weights identical: "
          f"{r.weights_equal} (largest difference {r.max_weight_difference:g}).")

# %% [markdown]
# ## Your own trainer, preempted
# The drill above preempts `labkit train`. Yours is what will be preempted on Vertex:
# `examples/ddp_trainer/train.py` (notebook 06 ran it as a 2-node job) handles SIGTERM the plain
# way: it finishes the epoch it is in, every rank agrees in one all-reduce to stop, the chief
# checkpoints to `AIP_CHECKPOINT_DIR` through `/gcs/`, and all exit 143; on start it resumes from
# that checkpoint. `labkit emulate --spot --preempt-at-step 1 --step-pattern 'Epoch (\d+)/'`
# preempts it when any replica prints "Epoch 1/": a fault reaches any code by what it prints
# (or `--preempt-after 30s`, or `--preempt-when-file gs://...` when a file appears). The same job
# runs once undisturbed, to compare. This trainer is your code: it prints epochs counted from 1
# ("Epoch 1/3" is the first), its own convention, not labkit's step numbers. Before running:
# after the restart, which epoch does each replica start from, and should the final held-out
# loss differ from the undisturbed run?

# %%
from labkit.course import own_job

if frameworks.has_torch():
    own = own_job.preemption_comparison(workdir, replicas=replicas, epochs=own_epochs)
    print(own.report())
    calm, hit = own.undisturbed.learning, own.preempted.learning
    print(f"\nFinal held-out loss: undisturbed {calm.last_loss:.4f}, preempted and resumed {hit.last_loss:.4f}: "
          + ("the same at every epoch, an exact resume." if own.identical else "they differ: the resume changed the run."))
    key_figure("your own trainer, preempted and resumed: held-out losses identical to undisturbed",
               str(own.identical), note=f"{own.preempted.run.job.job_restarts} job restart(s)")
else:
    print(frameworks.missing_reason("torch"))

# %% [markdown]
# ## Checkpoint interval vs lost work vs cost
# On Vertex a Spot job's checkpoints go to Cloud Storage (`AIP_CHECKPOINT_DIR`, through `/gcs/`),
# so the interval below comes from **Cloud Storage's write rate**. With credentials and a bucket
# here (`LABKIT_BUCKET`), it is measured: three writes of this run's checkpoint, topped up to
# 64 MB so they measure a bandwidth rather than a request's latency, to a new folder in that
# bucket (removed after). Without them it is Cloud Storage FUSE's published write benchmark, per
# writer, with the page it comes from: a best case, on a large VM next to its bucket. Beside it,
# the same writes to this machine's disk, measured, for comparison only. The cost model writes a
# `checkpoint_gb` checkpoint at each rate (GPT-2 small with AdamW is about 1.5 GB of full
# state). The preemption rate is **an assumption** (`preemptions_per_hour`): Google publishes
# none for Spot. A preemption loses half an interval of work on average (nothing when the
# SIGTERM checkpoint fits in the notice) plus the restart. The **Young/Daly** rule (Young, 1974;
# Daly, 2006) gives the interval that wastes least with hard kills, √(2·C·M): C the time one
# checkpoint takes to write, M the mean time between preemptions (1 / `preemptions_per_hour`);
# the table prices it beside round intervals.

# %%
from labkit.core import gcp

if frameworks.has_torch():
    ckpt_dir = str(result.clean.local(f"{cfg.bucket}/clean/checkpoints"))
    cloud_rate = spot.cloud_write_rate(ckpt_dir, gcp.detect())
    local_rate = spot.measured_rate("local disk", spot.time_checkpoint_write(ckpt_dir), "to a temporary folder here")
    for rate in (cloud_rate, local_rate):
        print(f"{rate.label}: {rate.bytes_per_s / 1e6:,.0f} MB/s, so a {checkpoint_gb:g} GB checkpoint takes "
              f"{rate.seconds(checkpoint_gb * 1e9):.1f} s; {rate.how}")
    key_figure(f"checkpoint write rate, {cloud_rate.label}", cloud_rate.bytes_per_s / 1e6, "MB/s",
               note=cloud_rate.how)
    key_figure("checkpoint write rate, local disk (measured, for comparison)", local_rate.bytes_per_s / 1e6, "MB/s",
               note=local_rate.how)

# %%
if frameworks.has_torch():
    choices = [spot.checkpoint_interval(capacity, checkpoint_gb * 1e9, rate) for rate in (cloud_rate, local_rate)]
    print(table(spot.interval_rows(choices), title="the interval at each write rate (hard kills):"))
    scenario, cheapest = choices[0].scenario, choices[0].cheapest
    hard_kills = scenario.spot
    print(f"\nat the {cloud_rate.label} rate, without a SIGTERM checkpoint (hard kills):\n"
          + table(spot.table_rows(choices[0].rows)))
    spot.plot_tradeoff(choices[0].rows, workdir / "tradeoff.png")
    key_figure(*spot.interval_headline(choices))

# %%
from dataclasses import replace

if frameworks.has_torch():
    with_sigterm = spot.row(replace(scenario, spot=replace(hard_kills, checkpoint_on_sigterm=True)),
                            cheapest.interval_s)
    print(f"{job_hours:.0f} h job on one {accelerator_type}: on-demand ${with_sigterm.on_demand_cost:,.0f}; "
          f"Spot ${cheapest.spot_cost:,.0f} with hard kills, ${with_sigterm.spot_cost:,.0f} with SIGTERM checkpoints")
    key_figure("Spot saving with SIGTERM checkpoints", with_sigterm.saving * 100, "%",
               note=f"{preemptions_per_hour}/h preemptions assumed, {restart_overhead_s:.0f} s per restart")

# %% [markdown]
# ## How far the saving rests on the assumed preemption rate
# Google publishes no preemption rate for Spot, so everything above rests on
# `preemptions_per_hour`. The same job at other rates and checkpoint intervals (hard kills),
# with the cheapest interval at each rate and what the SIGTERM checkpoint adds there.
#
# Before running: from which preemption rate do you expect the SIGTERM checkpoint to save at
# least 1% of the on-demand bill, and is there a rate at which Spot stops saving?

# %%
if frameworks.has_torch():
    rates = sorted({0.01, preemptions_per_hour, 0.2, 0.5, 1.0, 2.0})
    grid = spot.sensitivity(scenario, rates, [300.0, 900.0, 1800.0, 3600.0, 7200.0])
    print(table(grid))
    found = spot.sensitivity_findings(grid, with_sigterm.on_demand_cost)

# %% [markdown]
# What the grid shows, read from it: where the SIGTERM checkpoint starts to pay, and where Spot
# stops paying.

# %%
if frameworks.has_torch():
    share, bill = f"{spot.WORTH_SHARE:.0%}", f"the ${found.on_demand_usd:,.0f} on-demand bill"
    print(f"The SIGTERM checkpoint saves at least {share} of {bill} from {found.sigterm_pays_from:g} preemptions/h."
          if found.sigterm_pays_from is not None else
          f"The SIGTERM checkpoint saves under {share} of {bill} at every rate here (at most ${found.sigterm_most_usd:,.2f}).")
    if found.never_finishes_from is not None:
        print(f"With hard kills the job never finishes from {found.never_finishes_from:g} preemptions/h at these "
              "intervals: restarts and lost work outpace it.")
    print(f"Spot stops saving from {found.stops_saving_from:g} preemptions/h, even with the SIGTERM checkpoint."
          if found.stops_saving_from is not None else "With the SIGTERM checkpoint, Spot saves at every rate here.")

# %% [markdown]
# ## The code
# The drill above ran `labkit train` in the Vertex emulator. `labkit/recipes/preemptible.py` is
# the plain PyTorch you would write: a SIGTERM handler that only sets a flag, full-state
# checkpoints (model, optimizer, LR schedule, RNG, step) written through fsspec with a
# `COMMITTED` marker last, and a resume that continues with exactly the next step and skips the
# batches already trained on.

# %%
from labkit.course import recipe_view

recipe_view.show("preemptible")

# %% [markdown]
# Before running: the recipe sends itself SIGTERM during step `preempt_step`, saves, exits 143
# and is started again with the same command, as Vertex restarts a Spot job. Do you expect the
# two attempts' losses, joined, to equal an uninterrupted `labkit train` run exactly?

# %%
import tempfile

if frameworks.has_torch():
    pre_argv = recipe_view.flags(model="cnn", scale=scale, steps=steps, lr=plan["lr"], checkpoint_every=checkpoint_every,
                                 preempt_at=preempt_step,
                                 checkpoint_dir=tempfile.mkdtemp(prefix="recipe-ckpt-", dir=workdir))
    print(recipe_view.command("preemptible", pre_argv))
    pre = recipe_view.compare("preemptible", pre_argv)
    print(pre.recipe.lines("SIGTERM", "resumed"))
    recipe_view.plot(pre, workdir / "recipe_preemptible.png")
    key_figure("recipe preemptible (SIGTERM, restart, resume) vs uninterrupted labkit train: largest loss difference",
               pre.max_abs_diff, note=f"{pre.recipe.restarts} restart(s), tolerance {pre.tolerance:.0e}")

# %%
if frameworks.has_torch():
    logged, trend = [s["step"] for s in pre.recipe.steps], recipe_view.curve_trend(pre.recipe_losses)
    print(f"The recipe was preempted {pre.recipe.restarts} time(s) (exit 143), started again with the same command "
          f"and resumed with step(s) {', '.join(map(str, pre.recipe.resumed_at))}; its metrics file holds "
          f"{len(logged)} steps, {len(set(logged))} distinct ({min(logged)}-{max(logged)}).")
    print(f"Its losses and uninterrupted `labkit train`'s, {len(pre.recipe_losses)} steps in {pre.precision}: largest "
          f"difference {pre.max_abs_diff:.1e} at step {pre.worst_step} (the tests allow {pre.tolerance:.0e}): {pre.agreement}.")
    if pre.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {pre.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")

# %% [markdown]
# ### A common mistake: `torch.save` to a `gs://` string
# Many snippets checkpoint with `torch.save(state, "gs://bucket/run/model.pt")`. The preemptible
# recipe keeps the mistake runnable (`--mistake save-to-url`): below, its mistaken lines beside
# the right ones. With exactly these lines, the recipe's `save` writes step 0's checkpoint to the
# same `gs://` address twice, from a process whose working folder stands for the job's disk,
# through gcsfs to a local Cloud Storage server standing in for the bucket; then it looks for the
# checkpoint a restarted job would resume from. Before running: where do the mistaken save's
# bytes go, and what does the restarted job find?

# %%
recipe_view.show_mistake("preemptible", "save-to-url")

# %%
from labkit.course import mistakes

if frameworks.has_torch() and frameworks.is_installed("gcsfs"):
    url_demo = mistakes.save_to_bucket_url(workdir / "save_to_url")
    wrong, right = url_demo.mistake, url_demo.fix
    for name, saved in (("With the mistake", wrong), ("With the fix", right)):
        print(f"{name}: on the job's disk {list(saved.disk_files)}; in the bucket {list(saved.bucket_files)}; "
              f"a restarted job resumes from {saved.resumes_from or 'nothing, so it starts again with step 0'}"
              + ("" if saved.read_back_equal is None else f" (read back equal: {saved.read_back_equal})") + ".")
    print(f"gs:// addresses were opened by {url_demo.gs_handler}.")
    key_figure("torch.save to a gs:// string wrote into", f"a local folder named {wrong.local_folder!r}")
else:
    print(frameworks.missing_reason("gcsfs" if frameworks.has_torch() else "torch"))

# %% [markdown]
# `torch.save` takes a path or a file object: given the address, it made the folders of a path
# that starts with a folder named `gs:`, on a disk that vanishes with the VM. fsspec opens the
# address itself (gcsfs for `gs://`), and `torch.save` writes into the file it returns. On
# Vertex AI the bucket is also mounted at `/gcs/BUCKET/`, where a plain path works (but renames
# are not atomic there either: commit with a marker written last).

# %% [markdown]
# ### What the engine does that the recipe does not
# The recipe saves synchronously: training waits while `torch.save` serialises the state and the
# bytes are written. labkit's engine (`labkit.torch.state.Saver`) only copies the state to host
# memory; a background thread serialises, writes and commits it while training goes on. Below,
# both ways take turns, each timed as one save plus the training steps after it, up to the end
# of the write. Before running: on this machine, do you expect the background save to cost
# training less time than a synchronous one, counting everything until the write is done?

# %%
from labkit.course.preemption import writes

if frameworks.has_torch():
    saves = writes.save_findings(writes.background_save())
    key_comparison("background checkpoint: training stall / synchronous save", saves.stall, "synchronous save",
                   f"background save's stall ({saves.state_mb:.0f} MB of state)", "ms")
    key_comparison(f"background checkpoint: a save + {saves.steps_after} steps until written / synchronous",
                   saves.total, "synchronous save", "background save (its writer shares the CPU with training)", "ms")

# %% [markdown]
# What the two ways cost here, from the runs above ("faster" only when none of the runs
# overlap). Three outcomes are possible. **A shorter wait, but not less time in all**: the
# writer's serialisation and writes run on the cores training already keeps busy; a background
# save pays where the training thread mostly waits for a GPU, leaving the host's cores to the
# writer. **Not even a shorter wait**: with every core busy (training and whatever else runs on
# this machine), the host copy and the writer compete with training. **Less time in all**: the
# cores had room for the writer beside training.

# %%
if frameworks.has_torch():
    f = saves
    print(f"A {f.parameters / 1e6:.1f}M-parameter model, {f.state_mb:.0f} MB of full state, plain step "
          f"{f.step_ms:,.0f} ms, {f.threads} torch thread(s).")
    print(f"What training waits for: the synchronous save {f.stall.a.text()} ms, the background save's stall "
          f"{f.stall.b.text()} ms: {f.stall_verdict}.")
    print(f"A save and the {f.steps_after} training steps after it, until written: synchronous {f.total.a.text()} ms, "
          f"background {f.total.b.text()} ms: {f.total_verdict}.")
    print(f"So here the background save bought {f.outcome}.")

# %%
from labkit.course import references

ref = writes.checkpoint_reference()
if ref is None:
    print(references.NO_RESULTS + ".")
else:
    print(f"The checkpoint benchmark ({ref['source']}, {ref['device']}, {ref['threads']} threads, {ref['date']}): "
          f"{ref['parameters'] / 1e6:.1f}M parameters, {ref['state_mb']:.0f} MB; synchronous save {ref['write_ms']:.0f} ms, "
          f"background stall {ref['stall_ms']:.0f} ms ({ref['stall_over_write']:.2f}×), training lost until written "
          f"{ref['lost_ms']:.0f} ms ({ref['lost_over_write']:.2f}×). Not measured on a GPU machine yet.")

# %% [markdown]
# ## Fault-tolerant DDP with `torchrun --max-restarts`
# The drill above restarted a whole job, as Vertex does after a preemption. Inside a running job
# one DDP worker process can also die on its own (a crash, the out-of-memory killer). A DDP
# process group cannot lose a member: the other workers would wait in the next all-reduce
# forever. `torchrun`, PyTorch's launcher (it starts one worker process per GPU or CPU slot),
# watches its workers: when one fails it **stops all of them and starts the whole group again**,
# up to `--max-restarts N` times (then it gives up and exits non-zero), and tells each new
# process its attempt number in `TORCHELASTIC_RESTART_COUNT`. The new processes know only what
# is on disk, so the training script must save a **snapshot** (model, optimizer, LR schedule,
# the next step and the data position) regularly and load it whenever one exists: on every
# start, not only after a failure. `labkit/recipes/elastic_ddp.py` does it the way PyTorch's
# fault-tolerance tutorial does, with rank 0 writing the snapshot to a temporary file and
# renaming it over the old one (`os.replace`), so a kill mid-write leaves the previous snapshot
# whole, never a torn one.
#
# How this differs from the preemption earlier in this notebook: there Vertex restarted the
# **job** (new VMs, the container started again, a SIGTERM first giving the script the chance
# to save); here torchrun restarts the **processes** on the same machine within seconds, and the
# failing worker gives no warning, so everything since the last snapshot is trained again. On
# Vertex the two combine: torchrun absorbs a crashed worker inside a replica, and Vertex's own
# restarts (the rules printed at the top) handle a lost VM.

# %%
recipe_view.show("elastic_ddp")

# %% [markdown]
# Before running: two workers, a snapshot every `checkpoint_every` steps, and rank 1 exits
# abruptly at the start of step `preempt_step` on the first attempt; torchrun may restart the
# group twice. How many steps are trained twice? And do you expect the losses in the metrics
# file (every step once) to equal an uninterrupted `labkit train` run?

# %%
if frameworks.has_torch():
    snapshot_dir = tempfile.mkdtemp(prefix="recipe-snapshot-", dir=workdir)
    elastic_argv = recipe_view.flags(model="cnn", scale=scale, steps=steps, lr=plan["lr"], snapshot_every=checkpoint_every,
                                     fail_at_step=preempt_step, snapshot=f"{snapshot_dir}/snapshot.pt")
    print(recipe_view.command("elastic_ddp", elastic_argv, nproc=2, max_restarts=2))
    elastic = recipe_view.compare("elastic_ddp", elastic_argv, nproc=2, max_restarts=2)

# %%
if frameworks.has_torch():
    print(elastic.recipe.lines("exiting abruptly", "resumed from"))
    recipe_view.plot(elastic, workdir / "recipe_elastic_ddp.png")
    key_figure("recipe elastic_ddp (worker killed, torchrun restart, snapshot resume) vs uninterrupted labkit train: "
               "largest loss difference", elastic.max_abs_diff,
               note=f"{len(elastic.recipe.repeated_steps())} step(s) trained twice, tolerance {elastic.tolerance:.0e}")

# %%
if frameworks.has_torch():
    e, resumed = elastic, elastic.recipe.run.get("resumed_at_step") or 0  # None: no snapshot yet, step 0 again
    logged, trend = [s["step"] for s in e.recipe.steps], recipe_view.curve_trend(e.recipe_losses)
    print(f"Rank 1 failed at the start of step {preempt_step}; torchrun restarted the group {e.recipe.restarts} time(s) from "
          f"the snapshot naming step {resumed} next: {preempt_step - resumed} step(s) trained twice, {e.recipe.repeated_steps()}.")
    print(f"The recipe's losses and `labkit train`'s, {len(e.recipe_losses)} steps in {e.precision}: largest difference "
          f"{e.max_abs_diff:.1e} at step {e.worst_step} (the tests allow {e.tolerance:.0e}): {e.agreement}; its metrics "
          f"file holds {len(logged)} steps, {len(set(logged))} distinct.")
    if e.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {e.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")
