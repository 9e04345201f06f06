# %% [markdown]
# # 09 · Capstone: a slow training job, its levers, and the job to run on a GPU
#
# The course so far switched on one lever at a time. Here they are stacked on one job that is
# **slow for a stated reason**, so that each lever has something to remove: its batches wait for
# slow storage, and it trains in fp32. The levers come **in the order a practitioner would try
# them, and each is kept only if every run with it beat every run without it**: loader workers
# (notebook 03), bf16 (04), channels_last (04), torch.compile (04, 05), CUDA graphs (05), the
# whole training step replayed as one CUDA graph (05's launch gaps, closed) and, for GPT on fp8
# GPUs, labkit's fp8 output head (`benchmarks/RESULTS.md` measures it). A lever that does not
# pay off here is dropped, with its measured effect shown: what helps an H100 can slow a 2-core
# CPU. A lever that fails on this machine is listed with its error, and the climb goes on
# without it.
#
# Then the baseline and the optimised configuration run again, taking turns, and the notebook
# proposes the Vertex AI job for one epoch on a GPU, with its price. On a GPU machine the levers
# measured here decide that job. On a CPU, only the input lever is decided here (waiting for
# storage is the storage's, not the device's); bf16 and channels_last are decided by a GPU
# course run stored with the repository, which also prices the epoch, and every lever of the
# job says which of the two decided it.

# %% tags=["parameters"]
scale = "auto"
framework = "auto"
model = "resnet"
steps = None
batch_size = None
include_compile = None
min_gain = 0.03
samples_per_epoch = None
price_per_hour = None
spot_price_per_hour = None
input_latency_ms = None  # the baseline's wait per batch; None: as long as this machine's compute step
target = "H100 80GB"
output_uri = "gs://YOUR_BUCKET/labkit/09_capstone"
time_budget_s = 0.0

# %%
from labkit.notebooks import key_figure, key_ratio, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from labkit.course import capstone, sizing
from labkit.core import config, frameworks
from labkit.course.tables import table

# %% [markdown]
# ## The sizes for this machine
# At `scale="full"` the sizes are chosen for the GPU this notebook runs on (its memory, the
# number formats it has tensor cores for, its speed), and a demo with more processes than GPUs
# runs them on the CPU. The plan says which, what it leaves out and why, and about how long this
# notebook takes here; `time_budget_s` trims the sizes to fit a time you give it.

# %%
plan = sizing.plan("09_capstone", scale, time_budget_s=time_budget_s, model=model, include_compile=include_compile)
print(plan.text())
cfg = capstone.CapstoneConfig(framework=framework, model=model, scale=scale, steps=steps or plan["steps"],
                              batch_size=batch_size or plan["batch_size"], include_compile=plan["include_compile"],
                              min_gain=min_gain, input_latency_ms=input_latency_ms)
config.check_int("samples_per_epoch", samples_per_epoch, minimum=1, allow_none=True)
baseline = cfg.baseline()
print(f"framework {baseline.framework}, model {model}, scale {baseline.scale}: {baseline.steps} steps "
      f"at batch {baseline.batch_size} per run")
print("\n".join(frameworks.missing_reason(name) for name, present in
                (("torch", frameworks.has_torch()), ("tensorflow", frameworks.has_tf())) if not present))

# %% [markdown]
# ## The levers this machine can try
# In order. A lever that needs another one (CUDA graphs need torch.compile; the fp8 head needs
# bf16) is tried only if that one was kept. Levers that cannot apply here are listed with the
# reason.

# %%
from IPython.display import Markdown, display

hardware = capstone.Hardware.detect()
tried, not_here = capstone.levers(baseline.framework, model, hardware, cfg.compile_included())
display(Markdown(table(capstone.lever_rows(tried), markdown=True)))
print("Not tried here:", "; ".join(f"{s.label}: {s.why}" for s in not_here) or "none")

# %% [markdown]
# ## Why the baseline is slow, said before it is measured
# With torch, the baseline reads every batch from slow storage: `input_latency_ms` is a wait
# per batch injected into the training process, standing for reads from a remote bucket. Unless
# you give it, it is made as long as this machine's own compute step, measured first by one short
# run without it, so about half of each baseline step should be waiting; the loader lever
# (worker processes that read ahead while the model trains) is the one that can remove it. The
# baseline also trains in fp32, which the 16-bit and layout levers address. TensorFlow's engine
# has no loader lever here, so its baseline gets no wait. The table after the climb shows
# whether the measured breakdown agrees.

# %%
baseline, slow = capstone.slow_baseline(cfg, hardware)
if slow.injected:
    sized = "" if slow.compute_ms is None else (f", as long as this machine's compute step (measured just now without "
                                               f"it: {slow.compute_ms:,.0f} ms), so about {slow.expected_wait:.0%} "
                                               f"of each baseline step should be spent waiting")
    print(f"The baseline is input-bound by construction: each batch waits {slow.latency_ms:,.0f} ms for storage in "
          f"the training process{sized}. The loader lever has that wait to remove.")
print("It trains in fp32, eagerly: the 16-bit, layout and compiler levers have its fp32 arithmetic to remove."
      + ("" if slow.injected else " No input wait is injected: this engine has no loader lever here."))
print(f"baseline: {baseline.precision}, {baseline.num_workers} loader workers, "
      f"{baseline.input_latency_ms:g} ms injected wait per batch")

# %% [markdown]
# ## The climb
# Each lever is compared with the configuration so far, starting from the slow baseline. A configuration's first run pays for
# things a later run does not (thread pools, kernels chosen on first use, loader processes
# starting), so every configuration first runs briefly and that run is discarded; then the two
# take turns three times. The table shows the median and the range (lowest–highest) of each
# side's runs. The lever stays only when every run with it beat every run without it and the
# median gained at least `min_gain`; otherwise the verdict is **no measurable difference here**.
# On a CPU the climb runs torch with one compute thread (`CapstoneConfig.cpu_threads`): that
# leaves a core for the loader worker, and it keeps runs steady on a small shared machine, where
# oversubscribed threads make the same configuration swing from run to run.

# %%
from labkit.notebooks import key_comparison

result = capstone.optimise(cfg, hardware=hardware, slow=(baseline, slow))
print(f"torch compute threads during the climb: {result.cpu_threads or 'torch default'}")
display(Markdown(table(result.trials, ["lever", "before_samples_per_s", "before_range", "samples_per_s", "range",
                                       "gain", "verdict", "kept"], markdown=True)))
print("Optimised configuration (changes from the baseline):", result.changes() or "none")
for t in result.trials:
    key_comparison(t["figure"], t["comparison"], f"without {t['lever']}", f"with {t['lever']}")

# %% [markdown]
# ## Baseline against optimised, measured again side by side
# The two take turns again, three times each. `data_fraction` is the share of a step spent
# waiting for the input (median of the runs): the baseline's is where the stated bottleneck
# must show. `final_loss` checks that the faster run still learns the same thing from the same
# data. The speed-up is a ratio only when every optimised run beat every baseline run.

# %%
display(Markdown(table(result.final, ["run", "samples_per_s", "range", "step_time_ms", "data_fraction",
                                       "peak_memory_mib", "final_loss", "device"], markdown=True)))
key_figure("capstone baseline: share of each step waiting for input", result.baseline_wait or 0.0, "",
           f"median of its runs; input-bound from {capstone.INPUT_BOUND:.0%}")
key_comparison("capstone speed-up here, optimised over baseline", result.final_comparison, "the baseline",
               "the optimised run")
key_figure("capstone levers kept here", ", ".join(result.kept_labels) or "none")

# %% [markdown]
# The stated bottleneck against the measured one: a run counts as input-bound when it waits for
# its input a third of each step or more (`capstone.INPUT_BOUND`).

# %%
neck = result.bottleneck()
if neck.wait is None:
    print("This engine did not measure how long each step waited for its input.")
else:
    about = f", about {neck.expected:.0%} of each step waiting" if neck.injected and neck.expected is not None else ""
    print("Stated before it ran: " + ("input-bound" if neck.injected else "not input-bound") + f"{about}.")
    print(f"Measured: the baseline waited for its input {neck.wait:.0%} of each step (median of its {neck.runs} runs "
          f"in the final comparison; input-bound from {capstone.INPUT_BOUND:.0%}): " + ("input-bound" if
          neck.input_bound else "not input-bound") + (", as stated." if neck.shown else ", not as stated."))
    if neck.injected and not neck.shown:
        print("The stated bottleneck did not show on this machine, so the loader lever had little to remove.")

# %% [markdown]
# ## What the job on the target GPU carries
# The proposed job runs on the catalog's `target` machine. On a GPU machine the levers kept
# above are its levers. On a CPU, a verdict on bf16 or channels_last says nothing about tensor
# cores: the input lever is decided here (the storage wait does not depend on the device),
# and the device levers by the ladder of notebook 04 from the newest GPU course run stored with
# the repository (its file, GPU and date are in the "decided by" column): each kept only when
# the lowest of its runs there beat the highest of the runs without it. A lever nothing measured
# on a GPU is not carried.

# %%
from labkit.course import capstone_target

job_plan = capstone_target.plan_for_target(result, hardware, target)
display(Markdown(table(list(job_plan.rows), ["lever", "here", "stored GPU run", "carried", "decided by"],
                       markdown=True)))
carried = "; ".join(f"{', '.join(labels)} ({who})" for who, labels in job_plan.carried_by.items())
print(f"The job on the {target} carries: {carried or 'no lever'}.")
if job_plan.not_carried:
    print("Not carried: " + "; ".join(f"{r['lever']} ({r['why'] or r['decided by']})" for r in job_plan.not_carried)
          + ".")
key_figure("capstone levers the job carries", ", ".join(job_plan.carried_labels) or "none", note=job_plan.deciders)

# %%
from labkit.course import references

if not job_plan.measured_here:
    if job_plan.ladder is None:
        print(f"{references.NO_RESULTS}: no device lever is carried.")
    elif not job_plan.ladder_decides:
        print(f"The stored GPU ladder trained {capstone_target.LADDER_MODEL} with {capstone_target.LADDER_FRAMEWORK}; "
              f"it does not decide for {model} with {baseline.framework}: run this notebook on a GPU to choose its "
              "device levers.")
    print("A CPU's verdicts on the 16-bit, layout and compiler levers do not decide a GPU job: tensor cores and GPU "
          "kernels are what those levers are for.")

# %%
if (gap := job_plan.gpu_gap) is not None:
    sheet = [f"{f.memory_bw_gbs:,.0f} GB/s memory, {f.peak_tflops.get('bf16', 0):,.1f} bf16 TFLOP/s datasheet, "
             f"{f.cite()}" if f else "not in labkit's GPU table" for f in (gap.ran, gap.wanted)]
    print(f"The stored ladder ran on {gap.ran_on} ({sheet[0]}); the target is the {gap.target} ({sheet[1]}). No ladder "
          f"measured on the target is stored: the hours below are the {gap.ran_on}'s, an estimate, not a measurement.")

# %% [markdown]
# ## What an epoch costs
# Machine-hours per epoch come from throughput; dollars from the hourly price: the reader's
# `price_per_hour` if given, else the accelerator catalog's (the whole machine, accelerator plus
# host; the row names its rate card, its source and the date read; `labkit/hardware/catalog.csv`).
# On a GPU machine the throughput is this run's and the price this machine's. On a CPU it is the
# stored GPU ladder's, median and range (its fp32 rung for the baseline, the rung the carried
# levers reach for the job), at the target's price, never the CPU's own result; that ladder ran
# without a storage wait, so both rows assume the input keeps up, which is what the loader lever
# is for. Spot adds the expected time lost to preemptions (`SpotModel`'s defaults: lost
# half-intervals of work plus restarts; notebook 07 shows how to choose them).

# %%
from labkit.course.ladder import verdict
from labkit.hardware.spot import SpotModel

epoch = samples_per_epoch or capstone.EPOCH_SAMPLES[model]
price, spot = capstone_target.target_price(job_plan, price_per_hour, spot_price_per_hour), SpotModel()
costs = capstone_target.cost_rows(job_plan, price, epoch, spot.overhead)
print(f"one epoch = {epoch:,} samples" + ("" if samples_per_epoch else f" ({capstone.EPOCH_SOURCES[model]})")
      + f"; throughput: {job_plan.priced_on}")
print(f"price: ${price.on_demand:.2f}/h on-demand" + (f", ${price.spot:.2f}/h Spot" if price.spot is not None else "")
      + f"; {price.source}" if price else "price: none (no catalog row with a price, no price_per_hour)")
display(Markdown(table(costs, markdown=True)) if costs else Markdown("No GPU throughput to price an epoch with."))
if (c := job_plan.comparison) is not None:
    key_ratio("capstone cost per epoch, planned job / baseline", 1 / c.ratio, verdict(c), job_plan.priced_on)

# %% [markdown]
# ## What this run shows
# Every sentence is written from the climb and the side-by-side runs above, on this machine
# (`capstone.findings` gives the numbers and the verdicts; dollars only where this machine's own
# runs priced the epoch). A verdict is "faster" or "slower" only when the two sides' runs do not
# overlap; otherwise it is "no measurable difference here".

# %%
found = capstone.findings(result, costs if job_plan.measured_here else [])
b, o = found.baseline, found.optimised
if found.nothing_kept:
    print(f"No lever measurably beat the configuration before it here, so the optimised run is the baseline itself "
          f"({b.median:,.0f} samples/s, {b.range_text()} over {len(b.values)} runs, on {found.device}).")
else:
    print(f"Final comparison, in turns on {found.device}: the optimised run trained {found.speedup:.2f}× the "
          f"baseline's samples per second ({o.median:,.0f} vs {b.median:,.0f}, ranges {o.range_text()} vs "
          f"{b.range_text()}, {len(o.values)} and {len(b.values)} runs): {found.verdict}.")

# %%
if found.kept:
    print("Kept, in order (every run with the lever faster than every run without it): " + ", ".join(
        f"{f.lever} {f.gain:.2f}× ({f.before_range} → {f.after_range} samples/s)" for f in found.kept) + ".")
if found.dropped:
    print("Dropped, because they did not pay off measurably on this machine: "
          + ", ".join(f"{f.lever} ({f.gain:.2f}×, {f.verdict})" for f in found.dropped) + ".")
if found.swung:
    r = found.baseline_runs
    print(f"The baseline configuration measured {r.range_text()} samples/s over its {len(r.values)} runs in this "
          f"climb, a {r.swing:.1f}× swing for the same settings: the machine's speed changed while this ran, so read "
          "these verdicts with care.")

# %%
if found.input_left:
    print(f"The optimised run still waits for its input {found.optimised_wait:.0%} of each step (the baseline "
          f"{found.baseline_wait:.0%}): the input pipeline is the next lever (notebook 03).")
print(f"At any fixed hourly price, an epoch of the optimised run costs {found.cost_ratio:.2f}× the baseline's (ratio "
      f"of the medians; final comparison: {found.verdict}): machine time is what you pay for.")
if found.epoch_dollars is not None:
    print(f"Per epoch on-demand: ${found.epoch_dollars[0]:,.2f} → ${found.epoch_dollars[1]:,.2f}"
          + (f"; optimised on Spot ${found.spot_dollars:,.2f}" if found.spot_dollars is not None else "") + ".")
loss_b, loss_o = found.final_loss
print(f"Final loss after {found.steps} steps: baseline {loss_b:.4f}, optimised {loss_o:.4f} "
      f"(difference {found.loss_gap:.4f}).")

# %% [markdown]
# ## Run the planned job on Vertex AI
# The carried levers are `labkit train` flags, so the planned run is one CustomJob: below, one
# epoch of it at full scale on Spot, on the catalog's `target` machine, checkpointing to
# `output_uri` (validated here, a dry run: nothing is submitted). Its levers are the ones in the
# "carried" column above; the injected storage wait is this notebook's stand-in and is not part
# of the job. To decide every lever on the target GPU itself, run this notebook there
# (`labkit run notebooks/09_capstone.ipynb --vertex ...`).

# %%
from labkit import vertex
from labkit.hardware.machines import target_machine

machine = target_machine(target)
job = capstone.epoch_job(result, epoch, config=job_plan.config, step_time_ms=job_plan.step_time_ms,
                         checkpoint_every_min=spot.checkpoint_every_min, output_uri=output_uri,
                         machine_type=machine.machine_type, accelerator_type=machine.accelerator_type,
                         accelerator_count=machine.accelerator_count, spot=True)
dry = vertex.dry_run(job)
print("replica command:", " ".join(job["worker_pool_specs"][0]["container_spec"]["args"]))
print("scheduling:", job["scheduling"])
print(dry.cost.text())
print(dry.preflight.text())

# %% [markdown]
# ## The code behind each lever
# Every lever of the climb is a `labkit train` flag. Where it is shown as plain framework code:
# a recipe (the notebook that teaches it runs it and proves it gives the engine's losses; from a
# terminal, `python -m labkit.recipes.NAME --help`), or the line it takes when there is no more
# to it. The whole-step CUDA graph and the fp8 output head have no short plain version: they are
# the engine's own. The Spot run above is `labkit.recipes.preemptible` (notebook 07) submitted
# as `labkit.recipes.vertex_job` does (notebook 06).

# %%
from labkit.course import recipe_view

display(Markdown(table(recipe_view.lever_code_rows(baseline.framework, [*tried, *not_here]), markdown=True)))
