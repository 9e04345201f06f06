# %% [markdown]
# # 06 · Multi-node training on Vertex AI
#
# A Vertex AI custom job runs up to four **worker pools**: pool 0 is the primary replica
# (exactly one), pool 1 the workers, pool 2 parameter servers or the **Reduction Server**,
# pool 3 evaluators. Every replica learns where it stands from its environment: `CLUSTER_SPEC`
# (pools and this task), `TF_CONFIG` (the same in TensorFlow's words) and the PyTorch variables
# `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK` (counted in **nodes**).
#
# Google Cloud is not needed to learn any of this: `labkit.vertex` builds the exact job spec,
# validates it against Vertex's API types, and **runs it here** with one process per replica on
# loopback, each with the environment Vertex would give it. This notebook:
#
# 1. shows the pools of a job and what each replica sees;
# 2. runs a 2-node PyTorch DDP job and a 2-worker TensorFlow MultiWorkerMirrored job through the
#    emulator, with `labkit train` in every replica;
# 3. runs **your own trainer**, a plain script that imports nothing from labkit, as a 2-node job
#    with `labkit emulate`, and reads its model, checkpoints and TensorBoard files back from the
#    emulated bucket;
# 4. measures all-reduce bandwidth (gloo on CPU processes, NCCL across GPUs);
# 5. configures a Reduction Server and prints the exact spec to submit for 4 nodes × 8 GPUs.

# %% tags=["parameters"]
scale = "auto"
replicas = 2
global_batch = 32
steps = 0
allreduce_max_mb = 0
nodes = 4
gpus_per_node = 8
machine_type = "a3-highgpu-8g"
accelerator_type = "NVIDIA_H100_80GB"
reduction_servers = 0  # 0: as many as Vertex's bandwidth rule asks for (labkit.vertex.reduction)
own_epochs = 3  # epochs of the example trainer run as your own job
output_uri = "gs://YOUR_BUCKET/labkit/06_multi_node"
submit = False
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from labkit import vertex
from labkit.core import config, devices, frameworks, metrics
from labkit.course import sizing
from labkit.course.multinode import allreduce_title, plot_allreduce_bandwidth
from labkit.course.tables import table
from labkit.hardware import allreduce as collectives
from labkit.vertex.emulator import describe_environments, replica_envs, LocalPaths, run_local

# %%
scale = config.resolve_scale(scale)
config.check_int("replicas", replicas, minimum=1, maximum=16)
plan = sizing.plan("06_multi_node", scale, time_budget_s=time_budget_s, replicas=replicas)
print(plan.text())
steps = steps or plan["steps"]
allreduce_max_mb = allreduce_max_mb or plan["allreduce_max_mb"]
workdir = artifacts_dir("06_multi_node")
fw = frameworks.Frameworks.detect()
train = dict(model="cnn", scale=plan["model_scale"], steps=steps, batch_size=global_batch, lr=plan["lr"],
             device="auto", progress=True)
print(f"{steps} steps, global batch {global_batch}, {replicas} nodes; files in {workdir}")

# %% [markdown]
# ## Worker pools and the environment of each replica
# A job with a chief, two workers, one Reduction Server replica and one evaluator. Parameter
# servers, reduction servers and evaluators are **not training ranks**: `RANK` and `WORLD_SIZE`
# count only pools 0 and 1. `TF_CONFIG` says `chief` (Vertex may write `master`, which
# TensorFlow rejects; `labkit.core.cluster.from_env(...).tf_config()` renames it).

# %%
layout = vertex.custom_job_spec(
    vertex.PoolConfig(args=["python", "-m", "labkit", "train"]),
    vertex.PoolConfig(replica_count=2, args=["python", "-m", "labkit", "train"]),
    vertex.reduction_server_pool(1),
    vertex.PoolConfig(args=["python", "-m", "labkit", "train"]),
    output_uri="gs://labkit-local/06/layout")
print(describe_environments(layout, workdir / "layout"))
worker_env = replica_envs(layout, LocalPaths(workdir / "layout"))[(1, 1)]
print("\nCLUSTER_SPEC of workerpool1[1]:", worker_env["CLUSTER_SPEC"][:200], "...")
print("TF_CONFIG of workerpool1[1]:   ", worker_env["TF_CONFIG"])
print("AIP_CHECKPOINT_DIR:", worker_env["AIP_CHECKPOINT_DIR"])

# %% [markdown]
# ## A 2-node PyTorch DDP job, emulated
# `vertex.training_job` writes the spec Vertex would run (`python -m labkit train ...` in every
# replica, checkpoints and metrics under the job's bucket, mapped here to a local folder). The
# global batch stays the same whatever the node count (each node takes its share), so the
# losses should follow a single-node run of the same job up to floating-point reordering.

# %%
if fw.torch:
    ddp_spec = vertex.training_job(dict(train, framework="torch"), output_uri="gs://labkit-local/06/ddp",
                                   replica_count=replicas)
    ddp = run_local(ddp_spec, workdir / "ddp")
    print(ddp.summary())
    ddp_metrics = metrics.load_metrics(ddp.local("gs://labkit-local/06/ddp/metrics.json"))
    print("per-step loss:", [round(s["loss"], 4) for s in ddp_metrics["steps"]])
else:
    print(frameworks.missing_reason("torch"))

# %%
if fw.torch:
    one = run_local(vertex.training_job(dict(train, framework="torch"), output_uri="gs://labkit-local/06/one"),
                    workdir / "one")
    one_metrics = metrics.load_metrics(one.local("gs://labkit-local/06/one/metrics.json"))
    gap = max(abs(a["loss"] - b["loss"]) for a, b in zip(ddp_metrics["steps"], one_metrics["steps"], strict=True))
    t_ddp, t_one = ddp_metrics["summary"]["median_step_time_s"], one_metrics["summary"]["median_step_time_s"]
    print(f"{replicas} nodes vs 1 node, same global batch: largest per-step loss difference {gap:.2e}")
    print(f"median step time: {t_ddp * 1e3:.1f} ms on {replicas} nodes, {t_one * 1e3:.1f} ms on 1 node")
    key_figure(f"DDP {replicas} nodes vs 1: max loss difference", gap)
    key_figure(f"DDP {replicas}-node step time / 1-node step time", t_ddp / t_one, "×",
               note="processes share this machine's cores" if scale == "smoke" else "")

# %% [markdown]
# ## A 2-worker TensorFlow job, emulated
# The same `labkit train`, `--framework tf`: each worker builds a `MultiWorkerMirroredStrategy`
# from the `TF_CONFIG` the emulator set, exactly as on Vertex.

# %%
if fw.tensorflow:
    tf_spec = vertex.training_job(dict(train, framework="tf"), output_uri="gs://labkit-local/06/tf",
                                  replica_count=replicas)
    tf_job = run_local(tf_spec, workdir / "tf")
    print(tf_job.summary())
    tf_metrics = metrics.load_metrics(tf_job.local("gs://labkit-local/06/tf/metrics.json"))
    print("per-step loss:", [round(s["loss"], 4) for s in tf_metrics["steps"]])
    key_figure(f"TF MultiWorkerMirrored, {replicas} workers: final loss", tf_metrics["summary"]["final_loss"])
else:
    print(frameworks.missing_reason("tensorflow"))

# %% [markdown]
# What the emulated jobs show. A run "learned" when its loss on samples it never trained on ends
# well under chance (`labkit.core.metrics.learned`); a run that did not says nothing with its curve.

# %%
runs = ([(f"PyTorch DDP, {replicas} nodes", ddp_metrics), ("PyTorch, 1 node", one_metrics)] if fw.torch else []) + \
       ([(f"TensorFlow, {replicas} workers", tf_metrics)] if fw.tensorflow else [])
print(f"A run learned when its held-out loss ends under {metrics.LEARNED_BELOW:g} × chance.")
for name, m in runs:
    held = (m.get("run") or {}).get("heldout")
    print(f"{name}: held-out loss {held['loss']:.3f} on {held['samples']} unseen samples after {len(m['steps'])} steps, "
          f"chance {held['chance']:.3f}: {'learned' if metrics.learned(m) else 'did NOT learn'}."
          if held else f"{name}: no held-out loss measured, so no word on whether it learned.")
if fw.torch:
    print(f"With the same global batch, {replicas} nodes and 1 node gave per-step losses at most {gap:.2e} apart.")

# %% [markdown]
# ## Your own trainer, unmodified, as a 2-node job
# Everything above ran `labkit train`. Your code is what matters: `examples/ddp_trainer/train.py`
# is a plain PyTorch DDP script of the kind you write (about 100 lines, no labkit import). It
# reads `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` and `RANK` (the variables Vertex sets, counted
# in nodes), turns `AIP_MODEL_DIR` and friends from `gs://` into `/gcs/` paths as Google's
# samples do, checkpoints every epoch and resumes from the last one. Its `Dockerfile` says how
# the image runs it: `WORKDIR /app`, the code and its small data copied in,
# `ENTRYPOINT ["python", "train.py"]`.
#
# `labkit emulate` runs it as Vertex would: one process per replica, each in a container of its
# own (Linux namespaces: its own `/gcs`, its own host name, all its processes ending with it), the
# image's files copied fresh into its working directory, and a **local Cloud Storage server**
# behind `gs://` and `/gcs/` that google-cloud-storage, gcsfs and TensorFlow reach through their
# own emulator settings. The command a learner types, and what it left in the bucket:

# %%
from labkit.course import own_job

if fw.torch:
    own = own_job.run_example(own_job.ddp_request(workdir, "06-own-job", replicas=replicas, epochs=own_epochs))
    print(own.report())
    seen = own.learning
    print(f"\nHeld-out loss {seen.first_loss:.3f} after epoch 1, {seen.last_loss:.3f} after epoch {seen.last_epoch}, "
          f"against chance {seen.chance:.3f} (ln {own.classes} classes): {seen.verdict}.")
    key_figure(f"your own DDP trainer, {replicas} nodes: files it left in the bucket", len(own.run.outputs()),
               note=f"{own.run.job.state}")
else:
    print(frameworks.missing_reason("torch"))

# %% [markdown]
# The same job for the service is one flag away: `labkit job` builds the same CustomJob from
# the same flags (with your image: `--image REGION-docker.pkg.dev/PROJECT/REPO/trainer`), checks
# it offline, and without credentials prints its REST JSON and the `gcloud ai custom-jobs create`
# lines; notebook 07 preempts this trainer and watches it resume.

# %% [markdown]
# ## All-reduce bandwidth
# Data-parallel training sums every gradient across replicas each step (all-reduce). The
# benchmark times it from kilobytes to hundreds of megabytes. **Algorithm bandwidth** is
# size / time; **bus bandwidth** multiplies it by 2(n−1)/n, the traffic a ring all-reduce puts on
# each link, so it can be compared with the link's limit (as nccl-tests reports). Small messages
# are latency-bound; only large ones approach the link. Here: gloo between CPU processes on one
# machine (or NCCL between the GPUs when there are several).

# %%
if fw.torch:
    gpus = len(devices.detect().gpus)
    sizes = collectives.size_ladder(4 * collectives.KB, allreduce_max_mb * collectives.MB)
    ar = collectives.allreduce_benchmark(collectives.AllReduceConfig(sizes=sizes, world_size=max(2, gpus)))
    print(table(ar.results, title=allreduce_title(ar)))
    plot_allreduce_bandwidth(ar, workdir / "allreduce.png")
    key_figure("peak all-reduce bus bandwidth", ar.peak_busbw_gbps, "GB/s",
               note=f"{ar.world_size} × {ar.device}, {ar.backend}")

# %% [markdown]
# What it means for a step: all-reducing the fp32 gradients of GPT-2 small (124M parameters)
# at the bus bandwidth measured above. For comparison, a published nccl-tests reference for
# 8 × H100 with NVLink (the figure and its source are printed below); that hardware is not in
# this run.

# %%
if fw.torch:
    grad_bytes = 124e6 * 4
    n = ar.world_size
    seconds = grad_bytes * 2 * (n - 1) / n / (ar.peak_busbw_gbps * 1e9)
    from labkit.course import distribution as dist

    nvlink_gbs = dist.H100_NVLINK_ALLREDUCE_BUSBW_GBS[0]  # the low end of the published range
    reference = grad_bytes * 2 * 7 / 8 / (nvlink_gbs * 1e9)
    print(f"here: {seconds * 1e3:.0f} ms per all-reduce of 124M fp32 gradients ({n} ranks)")
    print(f"8 × H100 NVLink reference ({nvlink_gbs:.0f} GB/s bus bandwidth, the low end of "
          f"{dist.H100_NVLINK_ALLREDUCE_SOURCE}): {reference * 1e3:.1f} ms")
    key_figure("all-reduce of 124M fp32 gradients, this machine", seconds * 1e3, "ms")

# %% [markdown]
# ## Gradient compression: fewer bytes per step, at a price
# When the link is the bottleneck, DDP can send less. Its communication hooks compress each
# gradient bucket before the all-reduce: **fp16** and **bf16** halve the bytes (rounding every
# gradient); **PowerSGD** (Vogels et al., 2019) sends each gradient matrix as two thin rank-r
# factors, with the approximation error fed back into the next step. Each hook below trains the
# same GPT on `replicas` processes (`labkit train --grad-compression ...`); the bytes are counted
# from the collectives each rank ran, and the losses are compared with the uncompressed run.
# Compression costs arithmetic on every step: timed on its own (tensors shaped like this model's
# gradients, interleaved repeats), it gives the **break-even bandwidth**: below it the saved
# bytes take longer to send than the compression takes to compute, so compressing pays.

# %%
if fw.torch:
    from labkit.course import multinode as gc
    from labkit.core.train_config import TrainConfig

    comp_base = TrainConfig(model="gpt", scale=plan["model_scale"], steps=plan["compression_steps"],
                            batch_size=global_batch, device=plan["nodes_device"], progress=False)
    comp = gc.compare(comp_base, replicas)
    even = gc.break_even(comp, gc.compression_cost(comp_base))
    print(table([{k: v for k, v in r.items() if k != "losses"} for r in comp], title="bytes and losses per hook"))
    print(table(even, title="measured cost and break-even bandwidth (ms: this machine's CPU)"))
    least = min(comp, key=lambda r: r["vs_none"])
    key_figure("gradient bytes per step with compression", least["vs_none"], "× of none",
               f"{least['hook']}, largest loss gap {least['max_loss_gap']:.2g}")

# %% [markdown]
# What each hook did here, read from the two tables (a break-even only from a cost larger than
# the spread of its repeats):

# %%
if fw.torch:
    print(f"Uncompressed, the busiest rank sent {comp[0]['sent_KiB_per_step']:,.0f} KiB per step.")
    for r, e in zip(comp[1:], even, strict=True):
        pays = (f"it pays on links slower than {e['break_even_MB_per_s']:,.0f} MB/s" if e["break_even_MB_per_s"] is not None
                else "it saved no bytes, so it never pays" if e["note"] == gc.SAVED_NOTHING
                else "its cost is within the spread of its repeats, so no break-even is claimed")
        print(f"{r['hook']}: {r['vs_none']:.2f}× the bytes ({e['saved_KiB_per_step']:,.0f} KiB less per step), losses within "
              f"{r['max_loss_gap']:.2g} of the uncompressed run's; its arithmetic took {e['cost_ms_per_step']:.3g} ms per step "
              f"(its repeats spread over {e['spread_ms']:.3g} ms): {pays}.")

# %% [markdown]
# ## Reduction Server
# Across nodes the network, not NVLink, limits all-reduce. A ring all-reduce makes each node
# send 2(n−1)/n times the gradient size; with Vertex's **Reduction Server** (pool 2, Google's
# image on CPU machines), each node sends its gradient once to the reducers and receives the
# sum once. Google quotes "up to 2×" all-reduce bandwidth (Google Cloud blog). The training code
# does not change: NCCL's all-reduce goes through the reducers.
#
# **Where it helps.** Vertex's distributed-training page asks for GPU workers using NCCL
# all-reduce, and the reducers are CPU VMs every worker connects to: they are reached over the
# training VMs' VM network. So they help where the GPUs' traffic between nodes crosses that
# network anyway (A2, G2, G4, N1 with T4/V100, A3 High). Not on the machines Vertex sets up with
# GPUDirect (configure-compute page: A3 Mega with TCPXO, A3 Ultra, A4 and A4X with RDMA): their
# GPUs send over GPU NICs (1,600–3,200 Gbps) the reducers cannot reach, behind host NICs of
# 200–400 Gbps. Nor on one node. There `auto` proposes **no reducers** and says why.
#
# **How many.** Vertex's rule: the reducers' total bandwidth "matches or exceeds" the training
# nodes'. labkit counts only the bandwidth that goes through the NIC the reducers share: an
# `a3-highgpu-8g` has 1,000 Gbps in Compute Engine's table, but 800 of it is four GPUDirect-TCPX
# GPU NICs and its primary NIC carries up to 200 Gbps, so 4 nodes need ⌈4 × 200 / 32⌉ = 25
# `n1-highcpu-16` reducers, not 125. The rule is advice: a count of your own
# (`reduction_servers`) is kept, with a one-line warning when it is below the rule. Every pool is
# priced, the reducers included. Before running: what share of the job's cost per hour do you
# expect the reducers to be?

# %%
from labkit.vertex.reduction import plan_reducers, price_plan

ring_traffic = 2 * (nodes - 1) / nodes
print(f"{nodes} nodes: ring all-reduce sends {ring_traffic:.2f}× the gradient per node, "
      f"Reduction Server 1.00× -> up to {ring_traffic:.2f}× less traffic per node")
rs_plan = plan_reducers(reduction_servers or "auto", nodes, machine_type, accelerator_type,
                        accelerator_count=gpus_per_node)
rs_cost = price_plan(rs_plan)
print(rs_plan.text() + "\n" + rs_cost.text())
reducers = rs_plan.count
key_figure(f"traffic per node, ring / Reduction Server ({nodes} nodes)", ring_traffic, "×")

# %% [markdown]
# The job this plan gives, and what each of its replicas sees:

# %%
from labkit.course.multinode import reducer_job, reducer_rows

big = reducer_job(rs_plan, dict(model="gpt", precision="bf16", steps=5000, batch_size=8 * gpus_per_node * nodes,
                                checkpoint_every=500), output_uri=output_uri)
print(describe_environments(big, workdir / "big"))

# %% [markdown]
# The same `auto` plan for `nodes` nodes of other machines, priced from labkit's machine price
# list (Compute Engine list prices, us-central1). Before running: on which of them does `auto`
# propose reducers?

# %%
print(table(reducer_rows(nodes), title=f"Reduction Server plan ('auto') for {nodes} nodes"))
if reducers and rs_cost.reducers_share is not None:
    key_figure(f"{reducers} reducers' share of the job's cost per hour ({nodes} × {machine_type})",
               100 * rs_cost.reducers_share, "%", note=f"${rs_cost.reducers_usd_hr:,.2f}/h of reducers, on-demand")

# %% [markdown]
# ## The exact spec to submit: 4 nodes × 8 GPUs
# Pool 0 and pool 1 run `labkit train` under torchrun (8 processes per node, global rank =
# RANK × 8 + local rank), pool 2 the reducers the plan above proposes (if any),
# `restartJobOnWorkerRestart` because a DDP job cannot lose a member, checkpoints under
# `baseOutputDirectory`. The dry run validates it against `google.cloud.aiplatform_v1` and prices
# every pool; it is submitted only when `submit=True` and this environment has a project, region,
# bucket and credentials.

# %%
from labkit.course import recipe_view

dry = vertex.dry_run(big)
spec_file = workdir / "job_spec.json"
spec_file.write_text(dry.rest_json)
print(table(recipe_view.request_rows({"job_spec": big}), title="worker pools"))
print(dry.cost.text())
print(dry.preflight.text())
print(f"the whole spec, as the REST API takes it ({len(dry.rest_json.splitlines())} lines of JSON): {spec_file}")
key_figure(f"{nodes} × {gpus_per_node} {accelerator_type}: estimated accelerator cost", dry.cost.usd_per_hour,
           "USD/h", note="on-demand; notebook 07 covers Spot")
if submit and dry.preflight.ready:
    print("submitted:", vertex.submit(big, display_name="labkit-06-multi-node").name)

# %% [markdown]
# ## The code
# `labkit/recipes/vertex_job.py` submits a job like the one above with the google-cloud-aiplatform
# SDK, as you would: a `CustomJob` with worker pools (every training replica runs the ddp recipe
# under torchrun), Spot scheduling, a Reduction Server pool, `restart_job_on_worker_restart`,
# and a base output directory. Here it talks to labkit's local fake of Vertex AI's JobService
# (`labkit.vertex.fake_service`): the real client library builds and serialises the request and
# sends it over HTTP; the fake checks it, records it and answers like Vertex, so nothing is
# submitted and no project is needed.

# %%
from labkit.course import recipe_view

recipe_view.show("vertex_job")

# %% [markdown]
# Before running: for `nodes` nodes on Spot with the reducers sized above, how many worker
# pools do you expect in the request the service receives, which pool holds the reducers, and
# where does Spot appear?

# %%
from labkit.vertex.images import labkit_image

job_argv = recipe_view.flags(project="YOUR_PROJECT", bucket=output_uri, image_uri=labkit_image("torch"),
                             machine_type=machine_type, accelerator=accelerator_type,
                             accelerator_count=gpus_per_node, replicas=nodes,
                             reduction_servers=reducers, spot=True)
job_argv += ["--", *recipe_view.flags(model="gpt", steps=5000, batch_size=8 * gpus_per_node * nodes)]
print(recipe_view.command("vertex_job", job_argv))

# %%
if fw.aiplatform:
    sent = recipe_view.submit_locally(job_argv)
    spec = sent["request"]["job_spec"]
    print(table(recipe_view.request_rows(sent["request"])))
    key_figure("vertex_job recipe: worker pools in the request the service received", len(spec["worker_pool_specs"]),
               note=f"scheduling {spec['scheduling']['strategy']}")
else:
    print(frameworks.missing_reason("google.cloud.aiplatform"))

# %% [markdown]
# What arrived at the service, read from the request itself:

# %%
if fw.aiplatform:
    got = recipe_view.received(sent)
    pool2 = f", {got.pool2_replicas} × {got.pool2_image} on {got.pool2_machine} in pool 2" if got.pool2_replicas else ""
    print(f"{got.pools} worker pools: {got.training_nodes} training nodes in pools 0 and 1{pool2}.")
    print(f"scheduling.strategy = {got.strategy}: {'Spot VMs, cheaper and preemptible' if got.strategy == 'SPOT' else 'on-demand VMs'}.")
    print(f"restart_job_on_worker_restart = {got.restart_job_on_worker_restart}: " + (
        "a worker that restarts restarts the whole job, which DDP needs (its process group cannot lose a member)."
        if got.restart_job_on_worker_restart else "a restarted worker rejoins alone, which a DDP process group cannot take."))
    print(f"base_output_directory = {got.base_output_directory}: Vertex sets "
          + ", ".join(f"{k}={v}" for k, v in got.output_dirs.items()) + ".")
    print(f"Pool 0's command (a script that reads CLUSTER_SPEC) ends with: {got.primary_command.rsplit('; ', 1)[-1]}")
    print("States the recipe polled: " + " → ".join(got.states) + ".")

# %% [markdown]
# ### A common mistake: an embedding's gradient all-reduced as if it were dense, or sparse for free
# An embedding's gradient is zero except in the rows of the tokens in the batch. DDP all-reduces
# it as a dense tensor; `nn.Embedding(sparse=True)` sends only rows, gathered from every rank.
# Guides recommend either without counting. Below, one batch of 8 × 1024 tokens through a
# GPT-2-sized embedding (50,304 × 768), counted for the `nodes` × `gpus_per_node` ranks of the
# job above. Before running: what fraction of the rows does the batch touch, and which way
# sends fewer bytes per rank?

# %%
from labkit.course import mistakes

if fw.torch:
    # one process sends nothing, so the traffic is counted for at least two
    emb = mistakes.embedding_gradient_traffic(world_size=max(2, nodes * gpus_per_node))
    key_figure("embedding rows touched by one batch of 8 × 1024 tokens", 100 * emb.rows_touched_fraction, "%",
               note=f"of {emb.vocab_size:,}")
    key_figure(f"sparse row gather / dense all-reduce, bytes per rank at {emb.world_size} ranks", emb.sparse_over_dense,
               "×", note=emb.fewer_bytes)

# %% [markdown]
# What the count shows (bytes counted, not timed): a ring all-reduce sends 2(N−1)/N × the dense
# gradient from each rank; gathering the touched rows (float32 values and an int64 row id each)
# sends them to the N−1 other ranks.

# %%
if fw.torch:
    e = emb
    print(f"One batch of {e.tokens:,} tokens touched {e.rows_touched:,} of the {e.vocab_size:,} embedding rows "
          f"({e.rows_touched_fraction:.1%}); the other rows' gradients are zeros.")
    print(f"Dense, DDP's way: the gradient is {e.dense_gradient_bytes / 1e6:.0f} MB and a ring sends "
          f"{e.dense_allreduce_bytes_per_rank / 1e6:.0f} MB per rank with {e.world_size} ranks. Only the touched rows: "
          f"{e.touched_rows_bytes / 1e6:.1f} MB on each rank; gathering them from every rank sends "
          f"{e.touched_rows_allgather_bytes_per_rank / 1e6:.0f} MB per rank ({e.sparse_over_dense:.2f}× the ring): {e.fewer_bytes}.")
    print(f"The gather grows with N − 1 while the ring stays under 2× the dense gradient: from {e.sparse_sends_more_from} "
          f"ranks on, the rows send more than the dense all-reduce for this batch.")

# %%
if fw.torch:
    print(f"nn.Embedding(sparse=True) gives a gradient of {emb.sparse_grad_rows_uncoalesced:,} rows before coalescing "
          f"(one per token, repeats included), not the {emb.rows_touched:,} distinct rows.")
    print(f"In a GPT whose output layer shares the embedding matrix, the gradient touches {emb.tied_rows_touched_fraction:.0%} "
          f"of the rows" + (": nothing sparse to send." if emb.tied_rows_touched == emb.vocab_size else "."))

# %% [markdown]
# Why: the touched rows' bytes grow with the batch (more distinct tokens) and the gather's with
# the rank count, while the dense all-reduce depends on neither. So rows can pay for a large
# vocabulary, a small batch and few ranks, and cannot where the output layer shares the embedding.

# %% [markdown]
# ## Watch the job in Vertex AI TensorBoard
# A CustomJob can stream its training curves to a **Vertex AI TensorBoard** instance while it
# runs. Three fields of the job spec do it: `tensorboard` names the instance
# (`projects/P/locations/L/tensorboards/ID`), `service_account` is the account the job runs as
# (Vertex requires one with a TensorBoard: it must be able to write the bucket and use Vertex AI),
# and `base_output_directory`, under which Vertex sets `AIP_TENSORBOARD_LOG_DIR=<base>/logs/`.
# The TensorBoard **event files** the training code leaves there are uploaded while the job runs
# (Google's "Use Vertex AI TensorBoard with custom training",
# https://docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/experiments/tensorboard-training,
# read 2026-11-26), but only what Cloud Storage holds as a finished object: a file written
# through the `/gcs/` mount becomes one when it is closed, not on `flush()` or `fsync()` (Cloud
# Storage FUSE's streaming writes, its default, finalize on close only). `labkit train` writes
# its scalars to a file on the VM's disk and copies it whole to `AIP_TENSORBOARD_LOG_DIR` every
# 30 seconds and at the end (`labkit.core.scalars`), so the curves arrive while it trains. Below, the
# same DDP job as above with a TensorBoard, run by the emulator, which sets the variable as Vertex
# does. Before running: with `replicas` nodes, how many event files do you expect, and which
# scalars in them?

# %%
from labkit.course import multinode as mn

tensorboard_name = "projects/YOUR_PROJECT/locations/us-central1/tensorboards/YOUR_TENSORBOARD_ID"
service_account = "trainer@YOUR_PROJECT.iam.gserviceaccount.com"
tb_uri = "gs://labkit-local/06/tensorboard"
tb_spec = vertex.training_job(dict(train, framework="torch"), output_uri=tb_uri, replica_count=replicas,
                              tensorboard=tensorboard_name, service_account=service_account,
                              env={"NCCL_DEBUG": "INFO"})
print(table(mn.tensorboard_spec_rows(tb_spec), title="what Vertex AI TensorBoard needs in the job spec"))

# %%
if fw.torch:
    tb_job = run_local(tb_spec, workdir / "tensorboard")
    tb_logdir = tb_job.local(tb_uri + "/logs/")
    tb_rows = mn.tensorboard_rows(tb_logdir)
    print(tb_job.summary().splitlines()[0])
    print(table(tb_rows, title=f"event files under AIP_TENSORBOARD_LOG_DIR (here {tb_logdir})"))
    print(f"{len(tb_rows)} event file(s) from {replicas} replicas: only rank 0 writes scalars")
    print(f"open them here: tensorboard --logdir {tb_logdir}")
else:
    print(frameworks.missing_reason("torch"))

# %% [markdown]
# On Vertex, the job's TensorBoard experiment in the Google Cloud console shows these same scalar
# tags (`train/loss`, step time, throughput, learning rate), at most about half a minute behind
# the job plus the uploader's own delay (a curve written with a plain `open()` or `SummaryWriter`
# on `/gcs/` would appear only when training ends); locally, `tensorboard --logdir` above shows them at
# http://localhost:6006. The `vertex_job` recipe passes the same two fields to the SDK:
# `--tensorboard ... --service-account ...` become `CustomJob.submit(tensorboard=...,
# service_account=...)`.
#
# ## NCCL variables on Vertex GPU jobs
# **NCCL** (NVIDIA's collective communication library) carries DDP's all-reduce between GPUs;
# environment variables set in the job's containers steer it. The table lists the ones that
# matter on Vertex GPU jobs; each entry's default and source URL are in `labkit.vertex.nccl`.

# %%
from labkit.vertex import nccl

print(table(nccl.rows(), title="NCCL and PyTorch variables for Vertex GPU jobs (labkit.vertex.nccl)"))
print("sources:", *nccl.sources(), sep="\n  ")

# %% [markdown]
# A variable reaches every training container through the spec (`env=` of `vertex.training_job`
# or `vertex.PoolConfig`). `NCCL_DEBUG=INFO` is the first thing to set when a multi-node job is
# slow or hangs: each rank then logs the network and transport NCCL chose. Before running: in the
# emulated job above, run with `NCCL_DEBUG=INFO`, how many NCCL lines do you expect in the logs?

# %%
nccl_spec = vertex.training_job(dict(model="gpt", precision="bf16", steps=5000, batch_size=8 * gpus_per_node * nodes),
                                output_uri=output_uri, machine_type=machine_type, accelerator_type=accelerator_type,
                                accelerator_count=gpus_per_node, replica_count=nodes, env={"NCCL_DEBUG": "INFO"})
print("\n".join(mn.pool_env_lines(nccl_spec)))
if fw.torch:
    gpus_here, nccl_lines = len(devices.detect().gpus), mn.nccl_log_lines(tb_job)
    print(f"The TensorBoard job above ran with NCCL_DEBUG=INFO: {nccl_lines} NCCL log line(s) in its replicas' logs, "
          f"{gpus_here} GPU(s) on this machine.")
    print("With GPUs, each rank's NCCL INFO lines name the network and the transport NCCL chose." if gpus_here else
          "No GPU here: the replicas used gloo, which reads no NCCL_* variable. NCCL variables act only between GPUs, "
          "and what one changes (all-reduce bus bandwidth with and without it) needs a GPU machine to measure: "
          "no such figure is shown.")

# %% [markdown]
# ## What a running job reports, and where to read it
# While a job runs, its replicas' output goes to **Cloud Logging**, line by line. A progress bar
# redraws its line with carriage returns, which only a terminal replays; a line that is one JSON
# object becomes a **structured** entry: its `severity` is the entry's severity, its `message`
# the text shown, and every other field lands in `jsonPayload`, where a query can filter on it
# (Google's "Structured logging", https://cloud.google.com/logging/docs/structured-logging, read
# 2026-11-29). So inside a job `labkit train` writes no bar: one JSON line per step, with the
# step's figures as fields (`step`, `loss`, `step_time_s`, `samples_per_s`, `steps_per_s`, `lr`,
# and on a GPU `gpu_util` and `gpu_mem_gib`, sampled about once a second), a start line, and its
# warnings and failures as WARNING and ERROR entries. It knows it runs in a job from
# `CLOUD_ML_JOB_ID`, which Vertex sets in every replica and the emulator too;
# `LABKIT_LOG_FORMAT=json` or `text` forces either way. Below, a tiny job through the emulator.
# Before running: how many lines do you expect from its primary replica, and in what order?

# %%
from labkit.core import joblog

log_uri = "gs://labkit-local/06/joblog"
log_spec = vertex.training_job(dict(train, framework="torch" if fw.torch else "tf", steps=min(steps, 8)),
                               output_uri=log_uri)
log_job = run_local(log_spec, workdir / "joblog")
chief_log = log_job.final().log()
records = joblog.parse(chief_log)
step_lines = [r for r in records if r.get("event") == "step"]
print(log_job.summary().splitlines()[0])
print(f"primary replica: {len(chief_log.splitlines())} line(s), {len(records)} of them JSON log lines, "
      f"{len(step_lines)} with a step; carriage returns in its log: {chief_log.count(chr(13))}")
key_figure("tiny emulated job: JSON log lines with a step's figures", len(step_lines), note=f"of {len(records)} lines")

# %%
shown = ("severity", "event", "step", "loss", "samples_per_s", "steps_per_s", "gpu_util", "message")
picked = records[:3] + records[-2:]
print(table([{k: r.get(k, "") for k in shown} for r in picked], title="parsed log lines (first three, last two)"))
print("\nas written:", next(line for line in chief_log.splitlines() if '"event":"step"' in line))
log_tags = mn.tensorboard_rows(log_job.local(log_uri + "/logs/"))
print(table(log_tags, title="the same run's TensorBoard scalars (AIP_TENSORBOARD_LOG_DIR)"))
sampled = [r for r in step_lines if "gpu_util" in r or "gpu_mem_gib" in r]
print(f"GPU samples in the step lines: {len(sampled)}"
      + ("" if sampled else " (no GPU here: nothing is sampled, no system/ scalars are written)"))

# %% [markdown]
# **Where to read them on Vertex.** Each replica's lines are entries of the job in **Logs
# Explorer**; the query below is the filter `gcloud ai custom-jobs stream-logs JOB_ID` uses
# itself (`resource.type="ml_job"` and the job's id), narrowed to the step lines, and that command
# prints the same entries' messages in a terminal. The job's page in the Google Cloud console
# (Vertex AI, Training, Custom jobs) is where its state and logs are reached from. The curves are
# in **TensorBoard** as before: `train/samples_per_s` (and `train/step_time_s`) for the step rate,
# `system/gpu_util` (percent) and `system/gpu_mem_gib` on GPU machines. With
# `--wandb-project NAME` (the `wandb` extra) the same scalars also go to a Weights & Biases run;
# `WANDB_MODE=offline` keeps it on disk.

# %%
print("Logs Explorer query:", joblog.logs_query("JOB_ID"))
print("in a terminal:      ", "gcloud ai custom-jobs stream-logs JOB_ID --region REGION")
print("more or fewer lines: LABKIT_LOG_EVERY_S=30 (at most one step line per 30 s; default: every step)")
