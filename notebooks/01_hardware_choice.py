# %% [markdown]
# # 01 · Hardware choice: this machine's ceilings, the accelerator catalog, and what your run costs
#
# Before tuning anything, know the limits. This notebook **measures** the ceilings of the
# machine it runs on (matmul TFLOP/s per dtype, memory bandwidth, host↔device bandwidth on a
# GPU), draws the roofline, reads the catalog of machines a Vertex AI training job can ask for
# (every price the whole machine's, with its rate card, its source and the date it was read),
# and estimates the time and the dollars of *your* training run on each option, on-demand and
# on Spot, with the Pareto front: the options nobody beats on both time and cost. Every
# option is compared on equal terms: the same number of GPUs, the utilisation labkit measured
# for your kind of model, and no more samples per second than your input pipeline delivers.
#
# The accelerators are listed in `labkit/hardware/catalog.csv` and their prices in
# `labkit/hardware/machine_prices.csv` (one row per machine, each with its rate card, source
# and read date); prices change, so update that file (or point `catalog_path` at a catalog of
# your own, whose rows may carry their own prices) before you commit a budget.

# %% tags=["parameters"]
scale = "auto"
cpu_threads = 0
model = "gpt"  # gpt, cnn or resnet (labkit measured their kind); another name needs flops_per_sample and mfu
flops_per_sample = 0.0  # training FLOPs per sample; 0: computed for the course model
samples_per_step = 12  # per GPU
samples_per_epoch = 1_000_000
epochs = 1.0
mfu = None  # fraction of the datasheet peak; None: what labkit measured for the model's kind
gpus = 1  # GPUs in every row of the comparison (chips on a TPU row)
scaling_efficiency = None  # of N GPUs against perfect scaling; None: the default printed below
tpu_mfu = None  # a TPU's fraction of its datasheet peak; None: TPU rows show the one they would need
input_samples_per_s = None  # what your input pipeline delivers per GPU; None: measured here
preemptions_per_hour = 0.05
checkpoint_every_min = 30.0
restart_min = 5.0
catalog_path = ""
own_model = ""  # section 6: your factory, package.module:function (default: notebook 12's CNN)
own_input_shape = "3,96,96"
own_batch_size = 64
time_budget_s = 0.0

# %%
from labkit.notebooks import key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from labkit.core import config
from labkit.hardware import BenchConfig, CostAssumptions, Roofline, SpotModel, Workload
from labkit.hardware import estimate_costs, load_catalog, matmul_intensity, measure_ceilings
from labkit.course.tables import table

from labkit.course import sizing

scale = config.resolve_scale(scale)
config.check_int("cpu_threads", cpu_threads, minimum=0)
plan = sizing.plan("01_hardware_choice", scale, time_budget_s=time_budget_s)
print(plan.text())
bench = BenchConfig(matmul_size=plan["matmul_size"], copy_mb=plan["copy_mb"], threads=cpu_threads)

# %% [markdown]
# ## 1. The ceilings of this machine
# A large square matmul is the best case for arithmetic (TFLOP/s per dtype); a large buffer copy
# is the best case for memory (GB/s, read + write). On a GPU the host↔device copies show how
# fast batches can reach the device (pinned vs pageable host memory).

# %%
ceilings = measure_ceilings(bench)
print(f"device: {ceilings.device_name}")
print(table(ceilings.rows()))
print("\n".join(ceilings.notes))
best_dtype = max(ceilings.matmul_tflops, key=ceilings.matmul_tflops.get)
key_figure(f"best matmul ({best_dtype}) on this {ceilings.device}", ceilings.best_tflops, "TFLOP/s")
key_figure(f"memory copy bandwidth on this {ceilings.device}", ceilings.copy_gbs, "GB/s")

# %% [markdown]
# ## 2. The roofline
# What a kernel can reach is min(peak, bandwidth × arithmetic intensity). Big matmuls sit far
# right (compute-bound); elementwise ops sit far left (memory-bound), where a faster chip with
# the same memory does not help. The H100 line uses its datasheet figures from the catalog.

# %%
from labkit.hardware.catalog import catalog_rows, find
from labkit.course.hardware_choice import plot_rooflines

catalog = load_catalog(catalog_path or None)
here = Roofline(f"this {ceilings.device} (measured)", ceilings.best_tflops, ceilings.copy_gbs)
h100 = find(catalog, "H100 80GB")
ref = Roofline("H100 datasheet", h100.peak_bf16_tflops, h100.memory_bw_gbs)
point = (f"matmul {bench.matmul_size}³ {best_dtype}", matmul_intensity(bench.matmul_size, 2 if best_dtype != "fp32" else 4), ceilings.best_tflops)
plot_rooflines([here, ref], [point])
print(f"ridge point here: {here.ridge_flops_per_byte:.0f} FLOP/byte; H100: {ref.ridge_flops_per_byte:.0f} FLOP/byte")

# %% [markdown]
# ## 3. The accelerator catalog
# Datasheet rates per accelerator (dense bf16 tensor-core TFLOP/s, HBM bandwidth) and the price
# per hour of the **whole machine** a replica gets: accelerators plus the host VM, read from the
# machine price list (`labkit/hardware/machine_prices.csv`). `price basis` names whose rate card
# the price is. Vertex AI bills custom training at its own rates; where
# its machine price was not read, the row carries the Compute Engine price of the same machine,
# which is a lower bound for a Vertex job (below: how much more Vertex charged for the one
# machine both rate cards were read for). Rows without a price are kept, and the estimator
# below skips them and says why. The catalog is checked for the rules every price list must
# keep (Spot below on-demand and within Google's documented discount, a bigger-memory variant
# never cheaper).

# %%
from labkit.hardware import facts
from labkit.hardware.catalog import sanity_problems

print(table(catalog_rows(catalog)))
for e in catalog:
    print(f"{e.name}: {e.price_basis} price read {e.price_read_on} from {e.price_source}"
          + (f"  [note: {e.note}]" if not e.has_price else ""))
print("catalog checks:", "; ".join(sanity_problems(catalog)) or "all kept")
print(f"Vertex AI's rate vs Compute Engine's for n1-standard-4: {facts.VERTEX_TRAINING_PREMIUM:.2f}×\n  "
      f"{facts.VERTEX_TRAINING_N1_STANDARD_4.text()}\n  {facts.COMPUTE_N1_STANDARD_4.text()}")
print(facts.SPOT_MAX_DISCOUNT.text())

# %% [markdown]
# ## 4. Your model's time and cost on each option
# FLOPs per step come from the model (`flops_per_sample`, or computed from the config of the
# course model `model` at full size: GPT-2 small, 6·N + attention per token; ResNet-50 or the
# course CNN, their convolutions). Utilisation (MFU) turns peaks into time, and an MFU figure
# means nothing without its peak: the estimator multiplies each option's **datasheet** peak, so
# every MFU it uses is a fraction of the datasheet figure. It also depends on the kind of model:
# the default `mfu=None` takes the one labkit measured for a model of the same kind on one H100
# (GPT-2 small for `gpt`, ResNet-50 for `cnn` and `resnet`), read from the repository's
# benchmark results and restated against the H100's datasheet peak. Any other model needs your
# own figure. The measured runs of that kind, against both peaks:

# %%
from labkit.hardware.cost import model_mfu

assumed = model_mfu(model, mfu, catalog_path=catalog_path or None)
print(assumed.text())

# %% [markdown]
# First, what this machine reaches on a simple matmul-heavy model, measured now (against this
# machine's own measured fp32 matmul ceiling from section 1: a CPU has no datasheet peak here):

# %%
from labkit.core import frameworks
from labkit.course.hardware_choice import measure_mlp_throughput

if frameworks.has_torch():
    measured = measure_mlp_throughput(width=plan["mlp_width"], depth=4, batch_size=plan["mlp_batch"],
                                      steps=plan["mlp_steps"], threads=cpu_threads)
    here_mfu = measured.mfu(ceilings.matmul_tflops.get("fp32", ceilings.best_tflops))
    key_figure("MLP training throughput here", measured.samples_per_s, "samples/s")
    key_figure("MLP model FLOPs utilisation here (vs this machine's measured fp32 matmul ceiling)", 100 * here_mfu, "%")
else:
    print(frameworks.missing_reason("torch"))

# %% [markdown]
# The run to price: its FLOPs per step, and how fast its data arrives. A GPU trains no faster
# than its batches arrive. `input_samples_per_s` is what your input pipeline delivers to one GPU
# (notebook 03 measures it); without it, one loader process is timed here doing the costly part
# of feeding this model (reading token records for GPT, decoding JPEGs for the image models),
# a floor: more loader workers or a bigger VM deliver more. That figure caps every option below,
# and a row the input holds back says so.

# %%
from labkit.course.hardware_choice import input_rate, workload_flops_per_sample

per_sample = workload_flops_per_sample(model, flops_per_sample)
workload = Workload(flops_per_step=per_sample * samples_per_step, samples_per_step=samples_per_step,
                    samples_per_epoch=samples_per_epoch, epochs=epochs)
print(f"{model}: {per_sample / 1e9:.3g} GFLOP per sample, {workload.steps_per_epoch_on(gpus):,} steps per epoch "
      f"of {samples_per_step} samples on each of {gpus} GPU(s)")

# %%
feed = input_rate(model, input_samples_per_s)
if feed.passes is not None:
    print(f"Input pipeline: {feed.samples_per_s:,.0f} samples/s per GPU, the median of {len(feed.passes.values)} timed "
          f"passes ({feed.passes.range_text()} samples/s), {feed.source}.")
elif feed.samples_per_s is not None:
    print(f"Input pipeline: {feed.samples_per_s:,.0f} samples/s per GPU ({feed.source}).")
else:
    print(f"Input pipeline: no rate ({feed.source}); the estimates below are compute only.")

# %% [markdown]
# Now every option, **on equal terms**: each row runs `gpus` GPUs (a TPU row as many chips) and
# pays for the GPUs it uses, one GPU's share of its machine each, so an 8-GPU machine such as the
# H200's a3-ultragpu-8g never races one GPU. Above one GPU each step is slowed by the scaling
# efficiency (yours, or the published default printed below: labkit measured no multi-GPU run).
# No TPU run was measured and a GPU's MFU says nothing about a TPU, so without `tpu_mfu` a TPU
# row gets no time or cost, only the MFU it would need (section 5). Each row names its MFU and
# where it comes from, and whether compute or the input sets its pace.

# %%
spot = SpotModel(preemptions_per_hour, checkpoint_every_min, restart_min)
terms = CostAssumptions(mfu=assumed.value, mfu_source=assumed.source, spot=spot, gpus=gpus, tpu_mfu=tpu_mfu,
                        scaling_efficiency=scaling_efficiency, input_samples_per_s=feed.samples_per_s,
                        input_source=feed.source)
estimates = estimate_costs(workload, catalog, terms)
print(estimates.assumptions_text())
print(f"Spot: {100 * spot.overhead:.1f}% more hours expected from preemptions")
print(table(estimates.rows()))
print(estimates.skipped_text())

# %% [markdown]
# How much the answer depends on the MFU assumption: the same estimate under each measured
# configuration of this kind of model above (and yours). While compute sets the pace, time and
# dollars scale as 1/MFU and, with one MFU for every GPU, the ranking does not move, but the
# budget does; once the input sets the pace, a higher MFU buys nothing.

# %%
from labkit.hardware.cost import mfu_sensitivity

print(table(mfu_sensitivity(workload, catalog, terms, assumed.sensitivity_cases())))

# %% [markdown]
# The headlines are picked among the rows above that have a time and a cost, all at the same
# GPU count; each one's note says what it assumes (the MFU and its source, the scaling, what
# sets its pace, how it is priced).

# %%
from labkit.course.hardware_choice import plot_time_cost

plot_time_cost(estimates, title=f"{epochs:g} epoch(s) of {samples_per_epoch:,} samples, {gpus} GPU(s) per option")
fast, cheap, cheap_spot = estimates.fastest(), estimates.cheapest(), estimates.cheapest(spot=True)
each = f"at {gpus} GPU{'s' if gpus > 1 else ''} each"
key_figure(f"fastest option {each}", f"{fast.name}: {fast.hours_per_run:.2f} h, ${fast.on_demand_per_run:,.2f}",
           note=estimates.basis(fast))
key_figure(f"cheapest on-demand {each}", f"{cheap.name}: ${cheap.on_demand_per_run:,.2f}, {cheap.hours_per_run:.2f} h",
           note=estimates.basis(cheap))
key_figure(f"cheapest on Spot {each}", f"{cheap_spot.name}: ${cheap_spot.spot_per_run:,.2f}, "
           f"{cheap_spot.spot_hours_per_run:.2f} h", note=estimates.basis(cheap_spot))
print("Pareto front (fastest first):", "; ".join(f"{n} {k} {h:.2f} h ${c:,.2f}" for n, k, h, c in estimates.pareto()))

# %% [markdown]
# ## 5. When would a TPU pay off?
# A TPU needs an XLA code path (JAX, or TensorFlow / PyTorch-XLA); labkit's torch engine
# targets GPUs, and no TPU is measured here, so the TPU rows use datasheet rates and no MFU of
# labkit's. The question to ask is the utilisation (of its datasheet peak) a TPU must reach to
# cost no more per run than the cheapest GPU row above, with as many chips as that row has GPUs
# and the same input pipeline. Once you have timed your model on a TPU, pass `tpu_mfu`: the TPU
# rows then get a time and a cost and join the comparison.

# %%
from labkit.hardware.cost import tpu_break_even

rows = tpu_break_even(estimates)
print(table(rows))
for r in rows:
    need, gpu = r["break-even TPU MFU"], r["cheapest GPU row"]
    if need is not None:
        print(f"{r['tpu']} on {r['chips']} chip(s) costs per run what {gpu} does (${r['GPU $/run']:,.2f}) at {need:.1%} of "
              f"its datasheet peak" + ("." if r["reachable"] else ": above 100%, out of reach."))
    else:
        print(f"{r['tpu']}: no break-even utilisation ({r['why']}).")
    if r["your TPU MFU"] is not None:
        print(f"  at your tpu_mfu of {r['your TPU MFU']:.1%}: ${r['TPU $/run']:,.2f} per run")

# %% [markdown]
# ## 6. Your own model: `labkit estimate`
# Section 4 priced a FLOP count at the utilisation of its kind of model. For your own model,
# `labkit estimate` counts what one training step holds and computes from the model itself: it builds the model
# from your factory on fake tensors (shapes and dtypes, no memory: a 70B model counts on a
# laptop), runs a forward, the loss and a backward, and takes one AdamW step. Out come the exact
# parameter count, the bytes of weights, gradients, optimizer state and saved activations per
# precision and per data-parallel mode, the GPUs it fits with room to spare, and an epoch's time
# and cost per machine. The utilisation again depends on the kind of model: most FLOPs in
# convolutions take labkit's ResNet-50 run, matmul-bound models its GPT-2 small run, each
# printed with its file; pass `--mfu` once you have timed your own step. Below, the example
# CNN of notebook 12's script (`examples/your_job/step1_plain.py`), as you would run it in a
# terminal:
#
#     cd examples/your_job && labkit estimate "step1_plain:SmallCNN(4)" --input-shape 3,96,96 --batch-size 64

# %%
if frameworks.has_torch():
    from labkit.course.own_job import example
    from labkit.torch.estimate import estimate

    own = estimate(own_model or "step1_plain:SmallCNN(4)", tuple(int(s) for s in own_input_shape.split(",")),
                   batch_size=own_batch_size, search_path=None if own_model else str(example("your_job")),
                   samples_per_epoch=samples_per_epoch, catalog_path=catalog_path or None)
    print(own.text())
else:
    print(frameworks.missing_reason("torch"))
