# %% [markdown]
# # 12 · Your own job: a plain script made fast, cheap and Spot-safe on Vertex AI
#
# The course so far measured each technique on labkit's own models. Here the same commands are
# applied to a script as you would write it: `examples/your_job/step1_plain.py` has its own
# `Dataset` over a folder of JPEG files, its own CNN, one device, a plain loop, and no labkit
# imports. Step by step it is profiled, fixed, measured again, its data sharded, its memory
# and cost estimated, given mixed precision, Spot-safe checkpoints and DDP, and run as a
# 2-node Spot job that is preempted and resumes. Each step is a file of its own, shown as the
# change from the one before, and each is run here to prove it still learns (its held-out loss
# falls). On a GPU the same files run on the GPU; nothing in them is specific to this machine.

# %% tags=["parameters"]
scale = "auto"
repeats = 3
num_workers = 2
profile_steps = 4
seed = 0
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_comparison, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from labkit.core import config, frameworks
from labkit.course import sizing, your_job
from labkit.course.profiling import example_images

# %%
scale = config.resolve_scale(scale)
plan = sizing.plan("12_your_own_job", scale, time_budget_s=time_budget_s, repeats=repeats)
print(plan.text())
out = artifacts_dir("12_your_own_job")
has_torch = frameworks.has_torch()
size, epochs = plan["image_size"], plan["epochs"]
images = example_images(out / "images", per_class=plan["images_per_class"], size=plan["jpeg_size"])
runs = out / "runs"
print(f"scale={scale}: {plan['images_per_class']} JPEG files per class in {images}, trained at {size}², "
      f"{epochs} epochs; torch={has_torch}")
if not has_torch:
    print(frameworks.missing_reason("torch"), "Every step below is a PyTorch script: this notebook needs it.")

# %% [markdown]
# ## 1. The script as you wrote it
# A first script, nothing unusual: a `Dataset` that opens, decodes and resizes one JPEG per
# sample, a `DataLoader` with its defaults, SGD with momentum, the held-out loss after each
# epoch. Before running the profile below: where do you expect its steps to spend their time?
#
# Each step run in this notebook has *learned* when its held-out loss fell from the first epoch
# and ended below chance: the loss of a model that only guesses, ln of the number of classes.

# %%
your_job.show_step("step1_plain")

# %%
if has_torch:
    plain = your_job.run_step("step1_plain", images, epochs=epochs, image_size=size, workdir=runs / "step1")
    print(plain.report())
    seen = plain.learning
    print(f"Step 1's held-out loss: {seen.first_loss:.3f} after epoch 1, {seen.last_loss:.3f} after epoch "
          f"{seen.last_epoch}, against chance {seen.chance:.3f} (ln {plain.classes}): it {seen.verdict}.")

# %% [markdown]
# ## 2. Profile it, unmodified
# `labkit profile -- python step1_plain.py ...` runs the script as it is: its first
# `optimizer.step()` starts `torch.profiler`, a warm-up step is dropped, the next steps are
# kept, and the report names the script's own functions and its `DataLoader`.

# %%
if has_torch:
    from labkit.profiling.command import profile_command

    command = your_job.step_command("step1_plain", images, epochs=epochs, image_size=size)
    print("$ labkit profile --steps", profile_steps, "--", " ".join(command))
    before = profile_command(command, out / "profile-step1", steps=profile_steps, warmup=1)
    print(before.text())
    key_figure("step 1, profiled: verdict", before.verdict.kind, note=before.verdict.evidence)

# %% [markdown]
# ## 3. Apply the fix, and measure again
# The verdict's fix for a script that decodes its images in the training process is loader
# workers: step 2 decodes in `num_workers` processes while the model trains, pins batches for a
# fast copy to the GPU, and keeps its workers between epochs. Its profile, then both steps timed
# as whole runs, interleaved `repeats` times (images per second over the epochs after the first).

# %%
your_job.show_step("step2_loader", "step1_plain")

# %%
if has_torch:
    fix = ("--num-workers", str(num_workers))
    command = your_job.step_command("step2_loader", images, epochs=epochs, image_size=size, extra=fix)
    after = profile_command(command, out / "profile-step2", steps=profile_steps, warmup=1)
    print(f"step 2, profiled: {after.breakdown.text()}\n{after.verdict.kind}: {after.verdict.evidence}")
    timing = your_job.time_steps("step1_plain", "step2_loader", images, epochs=epochs, image_size=size,
                                 workdir=runs / "timing", repeats=repeats, extra={"step2_loader": fix})
    if timing.comparison is not None:
        key_comparison("step 2 (loader workers) vs step 1", timing.comparison, "step 1", "step 2", "images/s")

# %% [markdown]
# What the timing shows (`timing.findings()`): step 2 is "faster" only when none of its runs
# overlaps step 1's (`labkit.core.stats`); otherwise "no measurable difference here", or
# "slower". Before reading it: on a machine where the model trains on the same CPU cores that
# would decode the images, should loader workers pay?

# %%
if has_torch:
    t, machine = timing.findings(), plan.machine
    print(f"{t.b}: {t.b_rate.median:,.0f} images/s, {t.a}: {t.a_rate.median:,.0f}; {t.ratio:.2f}× (runs "
          f"{t.b_rate.range_text()} vs {t.a_rate.range_text()}, {len(t.b_rate.values)} each, in turns): {t.verdict}.")
    if t.pays:
        print(f"The fix pays here: with {num_workers} loader workers, the same training takes more images per second.")
    elif t.decided and machine.has_gpu:
        print("The model trains on the GPU here, and its step was not waiting for its data in these runs.")
    elif t.decided:
        print(f"The loader workers share this machine's {machine.cpu_cores} CPU cores with the training, which runs "
              "on them too. Act on the profile's verdict where the model trains on a GPU and the CPU cores only "
              "prepare batches, and measure it there.")

# %% [markdown]
# ## 4. Its data, sharded and read back
# On Vertex the images would sit in a bucket, one object per file: a request each. `labkit data
# shard` writes them into a few TFRecord files, the JPEG bytes as they are, with a manifest;
# `labkit data verify` reads every record back. Notebook 03 measures the readers of such shards
# against the folder; here, a batch read back shows what a training step would get.

# %%
shards = out / "shards"
print(your_job.run_labkit(["labkit", "data", "shard", str(images / "train"), str(shards), "--overwrite"]))
print(your_job.run_labkit(["labkit", "data", "verify", str(shards)]))
if has_torch:
    from labkit.data.images import ImageReadConfig, image_loader

    batch = next(iter(image_loader(shards, ImageReadConfig(image_size=size, batch_size=16))))
    print(f"a batch from the shards: images {tuple(batch['image'].shape)} {batch['image'].dtype}, "
          f"labels {batch['label'].tolist()}")

# %% [markdown]
# ## 5. Its memory and cost on Vertex machines
# `labkit estimate` builds the script's own model on fake tensors and counts one training
# step: parameters, gradients, optimizer state (SGD's momentum here is counted as AdamW's two
# moments: the estimate is for the common optimizer, an upper bound for this one), saved
# activations, the GPUs it fits, and an epoch's cost on each machine, here for 100,000 images
# (this notebook's folder is a sample; pass your own dataset's size).

# %%
if has_torch:
    estimate_cmd = ["labkit", "estimate", "step5_ddp:SmallCNN(4)", "--input-shape", f"3,{size},{size}",
                    "--batch-size", "32", "--samples-per-epoch", "100000"]
    print("$", " ".join(estimate_cmd), f"   (in {your_job.folder()})")
    print(your_job.run_labkit(estimate_cmd, cwd=your_job.folder()))

# %% [markdown]
# ## 6. Mixed precision
# bf16 autocast for the forward and the loss; weights, gradients and optimizer state stay
# float32, and bf16 needs no loss scaling. On a GPU the convolutions also get channels-last
# inputs (notebook 04 measures both levers on each GPU). On a CPU bf16 is rarely faster: what
# this step must show here is that it still learns.

# %%
your_job.show_step("step3_bf16", "step2_loader")

# %%
if has_torch:
    bf16 = your_job.run_step("step3_bf16", images, epochs=epochs, image_size=size, workdir=runs / "step3",
                             extra=("--num-workers", str(num_workers)))
    print(bf16.report())
    seen = bf16.learning
    print(f"Step 3 (bf16) held-out loss: {seen.first_loss:.3f} after epoch 1, {seen.last_loss:.3f} after epoch "
          f"{seen.last_epoch}, against chance {seen.chance:.3f}: it {seen.verdict}.")

# %% [markdown]
# ## 7. Safe on Spot VMs, then on several machines
# Step 4 checkpoints after every epoch (written beside the old one, then renamed), resumes
# from it when the job restarts, seeds each epoch's shuffle so a resumed run sees exactly the
# batches it would have, and on SIGTERM finishes the epoch, checkpoints and exits. Step 5 adds
# DDP over the replicas Vertex starts (`MASTER_ADDR`, `RANK`, `WORLD_SIZE`), a
# `DistributedSampler`, and the first machine alone writes.

# %%
your_job.show_step("step4_spot", "step3_bf16")

# %%
your_job.show_step("step5_ddp", "step4_spot")

# %%
if has_torch:
    spot = your_job.run_step("step4_spot", images, epochs=epochs, image_size=size, workdir=runs / "step4",
                             extra=("--num-workers", str(num_workers)))
    print(spot.report())
    seen = spot.learning
    print(f"Step 4 (Spot-safe) held-out loss: {seen.first_loss:.3f} after epoch 1, {seen.last_loss:.3f} after epoch "
          f"{seen.last_epoch}, against chance {seen.chance:.3f}: it {seen.verdict}.")

# %% [markdown]
# ## 8. A 2-node Spot job, preempted
# Step 5 from its `Dockerfile` as a Vertex custom job with two machines, on Spot, run twice by
# `labkit emulate`: undisturbed, and preempted when the primary prints epoch 2 (both replicas
# get SIGTERM, the job restarts, the script resumes from its checkpoint in the bucket).

# %%
if has_torch:
    job = your_job.spot_job(out / "jobs", images, epochs=epochs, image_size=size, at_epoch=2)
    print(job.report())
    calm, hit = job.undisturbed.learning, job.preempted.learning
    print(f"Final held-out loss: {calm.last_loss:.4f} undisturbed, {hit.last_loss:.4f} preempted after epoch 2 and "
          "resumed: " + ("the same at every epoch, an exact resume." if job.identical else "they differ."))
    print(f"The preempted job's held-out loss went from {hit.first_loss:.3f} after epoch 1 to {hit.last_loss:.3f} "
          f"after epoch {hit.last_epoch}, against chance {hit.chance:.3f}: it {hit.verdict}.")
    key_figure("your script as a 2-node Spot job, preempted and resumed",
               "identical held-out losses" if job.identical else "held-out losses differ",
               note=f"{hit.epochs} epochs, preempted after epoch 2; {hit.verdict}")

# %% [markdown]
# ## 9. The job to submit
# The same job for Vertex AI, on an L4 per machine and on Spot. Without credentials, `labkit job
# --dry-run` prints the spec, its cost per hour, the `gcloud` command that submits the same job,
# and what is missing to submit it; with a project, a region and credentials, drop `--dry-run`.
# Push the image first (`docker build` + `docker push` of `examples/your_job/Dockerfile`, or a
# Cloud Build).

# %%
submit = your_job.submit_command(images, epochs=20)
print("$", " ".join(submit))
print(your_job.run_labkit(submit))
