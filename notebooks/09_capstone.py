# %% [markdown]
# # 09 · Capstone: the baseline against the fully optimised run, in speed and in dollars
#
# The course so far switched on one lever at a time. Here they are stacked, **in the order a
# practitioner would try them, and each is kept only if it makes this machine measurably
# faster**:
# loader workers (notebook 03), bf16 (04), channels_last (04), torch.compile (04, 05), CUDA
# graphs (05), the whole training step replayed as one CUDA graph (05's launch gaps, closed) and,
# for GPT on fp8 GPUs, labkit's fp8 output head (`benchmarks/RESULTS.md` measures it). A lever
# that does not pay off here is dropped, with its measured effect shown: what helps an H100 can
# slow a 2-core CPU. A lever that fails on this machine is listed with its error, and the climb
# goes on without it.
#
# Then the baseline and the optimised configuration run again, taking turns, and the
# difference is priced per epoch: at a fixed hourly price, an epoch costs what its machine-hours
# cost, so the speed-up *is* the saving. Every number below is measured by this run.

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
target = "H100 80GB"
output_uri = "gs://YOUR_BUCKET/labkit/09_capstone"
time_budget_s = 0.0

# %%
from labkit.notebooks import key_figure, route_kernel_stderr

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
                              min_gain=min_gain)
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
# ## The climb
# Each lever is compared with the configuration so far. A configuration's first run pays for
# things a later run does not (thread pools, kernels chosen on first use, loader processes
# starting), so every configuration first runs briefly and that run is discarded; then the two
# take turns three times. The table shows the median and the range (lowest–highest) of each
# side's runs. The lever stays only when every run with it beat every run without it and the
# median gained at least `min_gain`; otherwise the verdict is **no measurable difference here**.
# On a CPU the climb runs torch with one compute thread (`CapstoneConfig.cpu_threads`): that
# leaves a core for the loader worker, and it keeps runs steady on a small shared machine, where
# oversubscribed threads make the same configuration swing from run to run.

# %%
result = capstone.optimise(cfg, hardware=hardware)
print(f"torch compute threads during the climb: {result.cpu_threads or 'torch default'}")
display(Markdown(table(result.trials, ["lever", "before_samples_per_s", "before_range", "samples_per_s", "range",
                                       "gain", "verdict", "kept"], markdown=True)))
print("Optimised configuration (changes from the baseline):", result.changes() or "none")

# %% [markdown]
# ## Baseline against optimised, measured again side by side
# The two take turns again, three times each. `data_fraction` is the share of a step spent
# waiting for the input (median of the runs); `final_loss` checks that the faster run still
# learns the same thing from the same data.

# %%
display(Markdown(table(result.final, ["run", "samples_per_s", "range", "step_time_ms", "data_fraction",
                                       "peak_memory_mib", "final_loss", "device"], markdown=True)))
key_figure("capstone speed-up, optimised over baseline", result.speedup, "×", result.final[1]["device"])
key_figure("capstone levers kept", ", ".join(result.kept_labels) or "none")

# %% [markdown]
# ## What an epoch costs
# Machine-hours per epoch come from the measured throughput; dollars from the hourly price of
# the machine: the reader's `price_per_hour` if given, else the accelerator catalog's row for
# this machine's GPU (the whole machine, accelerator plus host; the row names its rate card, its
# source and the date read; `labkit/hardware/catalog.csv`). A
# CPU has no catalog row: pass `price_per_hour` to price it. Spot adds the expected time lost
# to preemptions (`SpotModel`'s defaults: lost half-intervals of work plus restarts; notebook 07
# shows how to choose them).

# %%
from labkit.hardware.machines import price_for_this_machine
from labkit.hardware.spot import SpotModel

epoch = samples_per_epoch or capstone.EPOCH_SAMPLES[model]
price = price_for_this_machine(price_per_hour, spot_price_per_hour)
spot = SpotModel()
costs = capstone.cost_rows(result, price, epoch, spot.overhead)
print(f"one epoch = {epoch:,} samples" + ("" if samples_per_epoch else f" ({capstone.EPOCH_SOURCES[model]})"))
print(f"price: ${price.on_demand:.2f}/h on-demand" + (f", ${price.spot:.2f}/h Spot" if price.spot is not None else "")
      + f"; {price.source}" if price else "price: none for this machine (no GPU catalog row, no price_per_hour)")
display(Markdown(table(costs, markdown=True)))
key_figure("capstone cost per epoch, optimised / baseline", costs[1]["h/epoch"] / costs[0]["h/epoch"], "×")

# %% [markdown]
# ## What this run shows
# Every sentence is computed from the tables above.

# %%
print("\n".join(capstone.conclusions(result, costs)))

# %% [markdown]
# ## Run the optimised configuration on Vertex AI
# The kept levers are `labkit train` flags, so the optimised run is one CustomJob: below, one
# epoch of it at full scale on Spot, on the catalog's `target` machine, checkpointing to
# `output_uri` (validated here; submitted only when a project and credentials exist). The levers
# are the ones *this* machine rewarded: to choose them on the target GPU, run this notebook
# there (`labkit run notebooks/09_capstone.ipynb --vertex ...`).

# %%
from labkit import vertex
from labkit.hardware.machines import target_machine

machine = target_machine(target)
job = capstone.epoch_job(result, epoch, checkpoint_every_min=spot.checkpoint_every_min, output_uri=output_uri,
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
