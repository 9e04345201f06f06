# %% [markdown]
# # 03 · Input pipelines: TFRecord shards, tf.data and the PyTorch DataLoader
#
# Most training jobs on Vertex AI are **input-bound before they are compute-bound**: the
# accelerator waits while files are opened, read, checked and decoded. This notebook writes a
# dataset as TFRecord files, reads it with tf.data and with a PyTorch DataLoader, and climbs the
# ladder **naive → shards → parallel reads → prefetch → cache** on both, every rung timed as a
# real training epoch on this machine.
#
# Cloud Storage is simulated: a storage-latency injector gives every file an open latency and
# every stream a bandwidth cap, the two costs that make many small files slow on `gs://` and
# `/gcs/`. Everything here also works on real buckets: the writers and readers go through
# fsspec, so `out_dir` may be `gs://bucket/path` or `/gcs/bucket/path`.

# %% tags=["parameters"]
scale = "auto"
num_samples = 0
image_size = 32
records_per_shard = 32
batch_size = 32
num_workers = 4
prefetch = 4
open_latency_ms = 20.0
bandwidth_mb_s = 50.0
repeats = 3
bench_record_kb = 100
seed = 0
own_image_size = 0  # section 8: the side your images are read at (0: chosen for the scale)
cloud_request_ms = 0.0  # section 9: Cloud Storage's time per request (0: the cited figure)
cloud_stream_mb_s = 0.0  # section 9: one stream's rate, MB/s (0: the cited figure)
cloud_bucket = ""  # section 9: gs://bucket/prefix to measure your own bucket too (needs credentials)
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_comparison, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

from labkit.core import config, frameworks
from labkit.course import sizing
from labkit.course.input_pipeline import findings, ladder, read_rates, step_probe
from labkit.course.tables import table
from labkit.data import read_records, decode_example

# %%
scale = config.resolve_scale(scale)
plan = sizing.plan("03_input_pipelines", scale, time_budget_s=time_budget_s, open_latency_ms=open_latency_ms,
                   repeats=repeats)
print(plan.text())
samples = num_samples or plan["num_samples"]
mb = plan["bench_mb"]  # MB of bench_record_kb records for the ceiling run
cfg = ladder.InputLadderConfig(num_samples=samples, image_size=image_size, records_per_shard=records_per_shard,
                               batch_size=batch_size, num_workers=num_workers, prefetch=prefetch,
                               open_latency_ms=open_latency_ms, bandwidth_mb_s=bandwidth_mb_s, repeats=repeats, seed=seed)
out = artifacts_dir("03_input_pipelines")
has_torch, has_tf = frameworks.has_torch(), frameworks.has_tf()
print(f"scale={scale}: {samples} images of {image_size}², shards of {records_per_shard}; torch={has_torch} tf={has_tf}")

# %% [markdown]
# ## 1. The same data, written twice
# One file per sample (what a folder of JPEGs looks like) and shards of `records_per_shard`
# samples. Each record is a `tf.train.Example` (`index`, `label`, `image` as raw uint8 bytes,
# `shape`), so TensorFlow parses it natively; labkit decodes the same bytes without TensorFlow.

# %%
data = ladder.write_ladder_data(out / "data", cfg)
print(f"{len(data.small_files.paths)} small files, {len(data.shards.paths)} shards, "
      f"{data.shards.bytes_written / 1e6:.2f} MB of records")
first = decode_example(next(read_records(data.shards.paths[:1])))
print("features of record 0:", {k: (v if k != "image" else f"<{len(v[0])} bytes>") for k, v in first.items()})

# %% [markdown]
# Every record carries two CRC-32C checksums (of its length and of its data). labkit verifies
# both on every read: a flipped bit on disk or a truncated upload is an error naming the file
# and the byte offset, never silently wrong training data.

# %%
print(read_rates.corruption_demo(data.shards.paths[0], str(out / "corrupted.tfrecord")))

# %% [markdown]
# ## 2. Which reading mechanism for PyTorch?
# Four ways to feed a training loop from TFRecord shards, timed from the page cache on the same
# shards: the textbook DataLoader whose dataset yields **one sample at a time** for the collate
# function to stack, with worker processes; a dataset that **decodes whole batches** straight
# into one tensor, in the training process or in worker processes (into shared memory); and
# whole batches decoded by a **background thread** of the training process (CRC32C and the
# copies release the GIL, and batches never cross a process boundary). Each is timed over
# several passes in turns after a discarded one, with the range shown; the one that beats the
# others in every pass is the one labkit should use here. The ladder below then shows the
# DataLoader knobs under latency.

# %%
mechanisms = read_rates.compare_mechanisms(data) if has_torch else None
if mechanisms:
    print(table(read_rates.mechanism_rows(mechanisms)))
    key_figure("highest-median torch reading mechanism here", read_rates.best_torch_mechanism(mechanisms))

# %% [markdown]
# ## 3. The ceiling: how fast can one core read and verify?
# A reader that reads every byte once and checksums it once cannot beat, on one core,
# 1 / (1/raw_read + 1/crc32c). Measured here on shards of `bench_record_kb` KB records from the
# page cache, with labkit's torch path (batch mechanism, one process) and tf.data's
# TFRecordDataset (batch 64, 2 parallel reads) timed in the same run. (labkit reads shards in
# cache-sized pieces into one reused buffer, checks each record's CRCs with one call, and copies
# each payload once into its batch.)

# %%
bench = read_rates.write_bench_shards(out / "bench", record_kb=bench_record_kb, total_mb=mb)
raw = read_rates.page_cache_rates(bench.paths, kind="raw", batch_size=64, repeats=repeats, with_torch=has_torch,
                                  with_tf=has_tf)
print(table(raw.rows()))
fig_rates = read_rates.plot_rates(raw, out / "page_cache_rates.png")
torch_gb, tf_gb = raw.gb_per_s.get("torch_batch"), raw.gb_per_s.get("tf_data")

# %%
if torch_gb:
    key_figure("labkit torch path vs single-core ceiling (CRC on)", 100 * torch_gb / raw.ceiling, "%",
               f"{bench_record_kb} KB records, page cache")
if torch_gb and tf_gb:
    key_figure("labkit torch path vs tf.data TFRecordDataset", torch_gb / tf_gb, "×", "same shards, same run")
for module in [m for m in ("torch", "tensorflow") if not frameworks.is_installed(m)]:
    print(frameworks.missing_reason(module))

# %% [markdown]
# ## 4. The ladder, PyTorch DataLoader
# Each rung is training epochs of a small conv net behind the injected latency
# (`open_latency_ms` per file, `bandwidth_mb_s` per stream): **naive** one file per sample, no
# workers; **shards**; **parallel reads** with `num_workers` loader processes (each reads its
# own shards); **prefetch** (`prefetch_factor`, persistent workers, pinned memory on a GPU);
# **cache** (batches kept in memory after the first epoch). After a discarded warm-up of each,
# the rungs take turns, one epoch at a time, `repeats` times; a row is the median epoch with the
# range of all of them. "data wait" is the share of the epoch the training loop spent waiting
# for its next batch. `num_workers` may exceed the core count: loader workers reading from
# remote storage mostly wait.

# %%
torch_ladder = None
if has_torch:
    torch_ladder = ladder.torch_ladder(data, step_probe.torch_image_step(cfg.num_classes, seed=seed))
    print(table(torch_ladder.rows(), title=torch_ladder.engine))
else:
    print(frameworks.missing_reason("torch"))

# %% [markdown]
# ## 5. The ladder, tf.data
# The same rungs: sequential reads of small files; shards; `interleave` over `num_workers`
# files at once with parallel batched parsing; `prefetch(AUTOTUNE)`; `cache()`.

# %%
tf_ladder = None
if has_tf:
    tf_ladder = ladder.tf_ladder(data, step_probe.tf_image_step(cfg.num_classes, seed=seed))
    print(table(tf_ladder.rows(), title=tf_ladder.engine))
else:
    print(frameworks.missing_reason("tensorflow"))

# %%
measured = [lad for lad in (torch_ladder, tf_ladder) if lad is not None]
fig = ladder.plot_ladders(measured, out / "ladder.png") if measured else None
for lad in measured:
    key_figure(f"{lad.engine}: best rung vs naive", lad.speedup(), "×", "training samples/s, injected latency")
    key_figure(f"{lad.engine}: data wait, naive → best rung", f"{100 * lad.rungs[0].data_fraction:.0f}% → "
               f"{100 * lad.best.data_fraction:.0f}%")

# %% [markdown]
# ## 6. What this run says
# Every sentence below is written from the tables above (`findings.ladder_findings` gives each
# step up the ladder its ratio of median epochs and its verdict): a rung is "faster" or "slower"
# than the one below it only when none of their epochs overlap; otherwise the verdict is "no
# measurable difference here".

# %%
found = [findings.ladder_findings(lad, cfg) for lad in measured]
for f in found:
    n = f.naive
    print(f"{f.engine}: one file per sample trained at {n.samples_per_s:,.0f} samples/s (median of {f.epochs} epoch(s)) "
          f"with {100 * n.data_fraction:.0f}% of the time waiting for data, each file paying {cfg.open_latency_ms:g} ms to open.")
    for s in f.steps:
        print(f"  {s.after.label}: {s.ratio:.2f}× {s.before.label} ({s.verdict})")
    print(f"  Highest median: {f.best.label}, {f.speedup:.1f}× the naive rung, data wait {100 * f.best.data_fraction:.0f}%.")

# %% [markdown]
# A step that did not pay off here, and the likely reason, from what the rung adds and the waits
# this run measured (loader workers and reader threads share the machine's cores with the
# training step; with more cores and remote storage they pay off):

# %%
for f in found:
    if f.workers_cost_more:
        print(f"{f.engine}: the {cfg.num_workers} loader workers of the parallel-reads rung were started afresh for each epoch "
              f"(persistent_workers=False); over an epoch of {f.steps_per_epoch} steps that start-up cost more than the "
              "overlap saved. The prefetch rung keeps them alive.")
    for s in f.not_faster:
        print(f"{f.engine}, {s.after.label}: not measurably faster than {s.before.label} here; the step waited for data "
              f"{100 * s.before.data_fraction:.0f}% of the time before it and {100 * s.after.data_fraction:.0f}% with it: "
              f"{s.reason} ({f.cores} cores here).")

# %% [markdown]
# And the page-cache readings of sections 2 and 3. A mechanism that beat the runner-up in every
# pass ("faster") is the one to use on this machine; with no measurable difference, either will do.

# %%
if mechanisms:
    m = findings.mechanism_findings(mechanisms)
    best, second, worst = m.passes[m.best], m.passes[m.runner_up], m.passes[m.worst]
    print(f"torch reading mechanism, from the page cache: {m.best} delivered the most ({best.median:,.0f} samples/s), "
          f"{m.best_over_worst:.1f}× {m.worst} ({worst.median:,.0f} samples/s); against the runner-up, {m.runner_up} "
          f"(ranges {best.range_text()} vs {second.range_text()} over {len(best.values)} passes each): {m.verdict}.")
if torch_gb:
    print(f"From the page cache, with CRCs verified, the torch path read {torch_gb:.2f} GB/s: {100 * torch_gb / raw.ceiling:.0f}% "
          f"of the single-core ceiling {raw.ceiling:.2f} GB/s (raw read {raw.gb_per_s['raw']:.2f}, CRC32C "
          f"{raw.gb_per_s['crc32c']:.2f} GB/s)" + (f", {torch_gb / tf_gb:.2f}× tf.data's TFRecordDataset ({tf_gb:.2f} GB/s)." if tf_gb else "."))

# %% [markdown]
# ## 7. Does it feed a GPU?
# This machine may have no GPU. The reference point is the fastest ResNet-50 training rate
# labkit measured on one GPU (batch 256, synthetic 224×224 images): notebook 04's from the newest
# full-size course run on a GPU in the repository's results, else labkit's H100 benchmark, read
# below with the file, device, software, date and command. Feeding it
# with margin (1.5×) at 224×224×3 uint8 pixels per image gives the decoded images per second and
# the bytes per second the input pipeline must deliver. `benchmarks/bench_input.py --images 224`
# measures that on the training machine; below, the rate of this machine's one-process torch
# path from section 3 is turned into the number of loader workers that appetite needs, and so
# is the rate at which one process here decodes 224² JPEGs (timed below): real images arrive
# compressed, and decoding, not reading, is then what sets the count (notebook 05 measures it).
# The count is rough: this machine's cores, and no augmentation, which costs more on top.

# %%
feed = read_rates.feed_estimate(torch_gb, read_rates.jpeg_decodes_per_s()) if torch_gb else None
if feed is None:
    print(frameworks.missing_reason("torch"))
elif feed.reference is None:
    print(feed.why)
else:
    print(f"reference: {feed.reference.text()}\n{feed.margin:g}× that is {feed.images_per_s:,.0f} images/s, "
          f"{feed.images_per_s * feed.image_bytes / 1e9:.2f} GB/s of pixels.")
    print(f"One loader process here reads {feed.gb_per_s:.2f} GB/s of {bench_record_kb} KB records: about "
          f"{feed.reading_workers} worker(s) would read {feed.margin:g}× the reference's rate. The images arrive as JPEGs: one "
          f"process here decodes {feed.decodes_per_s:,.0f} of 224² a second, so decoding alone needs about "
          f"{feed.decoding_workers} worker(s); the pipeline needs the more of the two, {feed.workers}.")

# %%
if feed is not None and feed.reference is not None:
    key_figure("loader workers to feed 1.5× the reference GPU's ResNet-50 (estimate from this machine)", feed.workers,
               note=f"{feed.reference.value:,.0f} images/s, reading and JPEG decoding; {feed.reference.source.name}")

# %% [markdown]
# ## 8. Your own images: a folder of JPEG files as shards
# Your data is more likely a folder of JPEG files in a bucket, one subfolder per class, than
# synthetic pixels. Below, `examples/your_job/make_images.py` writes such a folder, and
# `labkit data shard` turns it into TFRecord shards: the files' bytes as they are (a JPEG stays
# the JPEG it was: no decode, no re-encode), with the label and the file's name, shuffled before
# they are cut so each shard mixes the classes, written in parallel, with the manifest that
# `labkit data verify` checks. The same command takes a CSV of paths and labels
# (`--labels csv:COLUMN`), a CSV, JSON Lines or Parquet table, and `gs://` or `/gcs/` on either
# side; an interrupted run resumes where it stopped when run again.
#
# Shards default to about 100 MB: each file costs one request's latency (tens of milliseconds
# on Cloud Storage, the `open_latency_ms` the ladders above simulate) before it streams, and
# at 100 MB that is a few percent of the file's transfer, while a few GB still make dozens of
# files for ranks and loader workers to split; Cloud Storage FUSE, Vertex's `/gcs` mount,
# recommends files of 5 MB to 200 MB for sequential reads
# ([its performance page](https://cloud.google.com/storage/docs/cloud-storage-fuse/performance),
# read 2026-11-28). A job that reads its shards for several epochs can copy them to the VM's
# disk first, many files at once, each checked against the manifest:
# `labkit data stage gs://bucket/shards /tmp/shards`. A small set like this one is cut into at least
# 8 files instead, so that many readers each get their own.

# %%
from labkit.course import own_data
from labkit.course.profiling import example_images

photos = example_images(out / "own_photos", per_class=plan["own_images_per_class"], size=plan["own_jpeg_size"]) / "train"
own_shards_dir = out / "own_shards"
n_files, n_bytes = own_data.count_files(photos)
print(f"{n_files} JPEG files, {n_bytes / 1e6:.1f} MB in {photos}")
shard_cmd = own_data.shard_command(photos, own_shards_dir, "--overwrite")
print("$", " ".join(shard_cmd))
print(own_data.run_labkit(shard_cmd))
print("$ labkit data verify", own_shards_dir)
print(own_data.run_labkit(["labkit", "data", "verify", str(own_shards_dir)]))

# %% [markdown]
# Three readers of these images, each with the same workers (`num_workers`, at most one per CPU
# core) and batches of `batch_size`, one epoch at a time, interleaved `repeats` times: the
# folder as most training scripts read it
# (torchvision's `ImageFolder` with `Resize`, `CenterCrop`, `ToTensor`: a file opened, decoded
# and made a float tensor per sample, then collated), the shards through labkit's reader (a
# batch of JPEGs decoded straight into one uint8 array, handed over whole), and the shards
# through tf.data (`parse_example` on a batch, its JPEGs decoded in parallel). Before running:
# here the files sit in the page cache, so the folder pays no request latency. Which do you
# expect to win, and by how much?

# %%
own_size = own_image_size or plan["own_image_size"]
readers_here = own_data.frameworks_here()
own_workers = own_data.effective_workers(num_workers)  # decoding is CPU work: one worker per core at most
own_rows = own_data.compare_readers(photos, own_shards_dir, image_size=own_size, batch_size=batch_size,
                                    workers=own_workers, repeats=repeats, frameworks=readers_here) if readers_here else []
print(own_data.report(own_rows, files=n_files, image_size=own_size, workers=own_workers, batch_size=batch_size))
own_vs_folder = own_data.comparison_of(own_rows, own_data.READERS[0], own_data.READERS[1])
if own_vs_folder is not None:
    key_comparison("your JPEGs: labkit shard reader vs ImageFolder", own_vs_folder, "ImageFolder", "shards", "images/s")

# %% [markdown]
# From the same page cache, the gap is the work per image: the folder reader makes a PIL image
# and a float tensor per sample and collates them; the shard reader decodes into the batch it
# hands over, in uint8. On Cloud Storage the folder also pays a request per file, the cost the
# ladders' naive rung shows. The plain code of the shard reader, to copy into your own script
# (a `DataLoader` over your shards, each worker of each DDP rank reading its own files):

# %%
from labkit.course import recipe_view

recipe_view.show("jpeg_shards")

# %%
if has_torch:
    jpeg_argv = [str(own_shards_dir), "--image-size", str(own_size), "--batch-size", str(batch_size),
                 "--workers", str(num_workers)]
    print("$", recipe_view.command("jpeg_shards", jpeg_argv))
    print(own_data.run_recipe(jpeg_argv))
    compared, same = own_data.recipe_agrees(own_shards_dir, image_size=own_size, batch_size=batch_size)
    print(f"the recipe's batches against labkit's reader, one process: {compared} images, "
          f"{'every pixel and label equal' if same else 'NOT EQUAL'}")
else:
    print(frameworks.missing_reason("torch"))

# %% [markdown]
# ## 9. Your shards in Cloud Storage: the mount, gcsfs, or staged to local disk
# In a Vertex job the shards sit in a bucket, and the script can read them three ways: through
# the `/gcs/BUCKET/...` mount Vertex provides (Cloud Storage FUSE), straight through a client
# (gcsfs's `gs://`, or TensorFlow's own), or copied to the VM's local disk first, many files at
# once (`labkit data stage gs://bucket/shards /tmp/shards`, each file checked against the
# manifest). Each request to Cloud Storage costs a wait before its first byte, and each stream
# has a rate: below, the local Cloud Storage server that `labkit emulate` gives a job plays the
# figures of Cloud Storage FUSE's published benchmark, per reader, and four ways read the images
# of section 8 from it, each feeding the same small CNN with `num_workers` reader threads, the
# ways taking turns `repeats` times. The `/gcs` mount itself does not run here (it needs FUSE and
# Google's network): the "mount" row makes the requests the mount makes when it reads a file
# from start to end, one streamed request per file. Before running: which way do you expect to
# be slowest, and by how much?

# %%
from labkit.course import cloud_reads

figures = cloud_reads.cited_figures()
if cloud_request_ms or cloud_stream_mb_s:
    figures = cloud_reads.CloudFigures(cloud_request_ms or figures.request_ms,
                                       cloud_stream_mb_s or figures.stream_mb_s, "this notebook's parameters")
print("Cloud Storage as the local server plays it:", figures.text())
reads = cloud_reads.compare_ways(own_shards_dir, photos, out / "cloud_reads", figures=figures, image_size=own_size,
                                 batch_size=batch_size, workers=own_workers, repeats=repeats, probe_mb=plan["probe_mb"])
print(table(cloud_reads.rows(reads), title=f"{n_files} images, {own_workers} reader thread(s), batches of {batch_size}"))
print(cloud_reads.staging_line(reads))
print(table(cloud_reads.probe_rows(reads), title="one stream reading whole objects"))

# %% [markdown]
# What the rows say, as rules for your job: staging costs one parallel copy and then reads
# local bytes, so it pays once the epochs it saves add up to the copy; a file per image pays
# requests per image (a lookup and a read); a shard pays them once per file, and the probe
# shows the size from which that wait stops mattering. gcsfs asks for 5 MiB at a time (its
# default `block_size`), so a 100 MB shard costs it twenty requests where the mount streams it
# in one; the requests column counts them. The measured rates sit below what the figures alone
# predict by the local server's own cost per request and per byte, which every way pays alike.
# The reader threads a GPU needs are its appetite (1.5× the reference GPU's ResNet-50 rate,
# section 7) over what one reader delivered here, decoding included. Each is computed from
# this run's rows:

# %%
cloud_rule = cloud_reads.rule(reads, cloud_reads.appetite())
print(cloud_rule.text(cloud_reads.appetite()))
staged_vs_mount = cloud_reads.comparison(reads, "mount", "staged")
if staged_vs_mount is not None:
    key_comparison("your shards: staged to local disk vs read as the /gcs mount reads them", staged_vs_mount,
                   "mount", "staged", "images/s")
files_vs_mount = cloud_reads.comparison(reads, "files", "mount")
if files_vs_mount is not None:
    key_comparison("your images from the bucket: shards vs a file per image", files_vs_mount, "files", "shards",
                   "images/s")

# %% [markdown]
# With a bucket of your own (`cloud_bucket = "gs://BUCKET/PREFIX"` and credentials in this
# environment), the same four ways run against it below, with no figures played: Cloud
# Storage's own latency and rate, from wherever this notebook runs (from a VM in the bucket's
# region, that is what a job sees). The shards and images are uploaded to a new folder under
# that prefix (`labkit-03-TIME-PID`), left there for you to inspect or delete.

# %%
if cloud_bucket:
    own_reads = cloud_reads.compare_ways(own_shards_dir, photos, out / "cloud_reads_bucket", figures=figures,
                                         image_size=own_size, batch_size=batch_size, workers=own_workers,
                                         repeats=repeats, probe_mb=plan["probe_mb"], bucket_url=cloud_bucket)
    print(table(cloud_reads.rows(own_reads), title=cloud_bucket))
    print(cloud_reads.rule(own_reads, cloud_reads.appetite()).text(cloud_reads.appetite()))
else:
    print("no cloud_bucket given: only the local server above was measured")

# %% [markdown]
# ## 10. The code
# The ladders above ran labkit's readers. `labkit/recipes/tfrecord_pipeline.py` is the plain
# version you would write: it writes the dataset as TFRecord shards, indexes where each record
# starts so a PyTorch `Dataset` can read record *i* without TensorFlow, trains through a
# `DataLoader` over those shards, and then reads one epoch of the same files with tf.data
# (`interleave` over files, `batch` then a vectorised `parse_example` in `map`, `prefetch`,
# `AUTOTUNE`). What it leaves to a real reader, and labkit's does: checking each record's CRCs
# (section 1) and decoding whole batches at a time (section 2).

# %%
from labkit.course import recipe_view

recipe_view.show("tfrecord_pipeline")

# %% [markdown]
# Before running: the recipe trains from TFRecord files on disk, read by `DataLoader` workers;
# `labkit train` trains from the same samples generated in memory. Do you expect their loss
# curves to differ, and by how much?

# %%
if has_torch:
    tfr_argv = recipe_view.flags(model="cnn", scale=scale, steps=plan["recipe_steps"], lr=plan["lr"],
                                 batch_size=batch_size, num_samples=samples, seed=seed,
                                 data_dir=str(out / "recipe_shards"), records_per_shard=records_per_shard,
                                 num_workers=num_workers)
    print(recipe_view.command("tfrecord_pipeline", tfr_argv))
    tfr = recipe_view.compare("tfrecord_pipeline", tfr_argv)
    recipe_view.plot(tfr, out / "recipe_tfrecord_pipeline.png")
    print(tfr.recipe.lines("tf.data read", "tf.data half"))
    key_figure("recipe tfrecord_pipeline vs labkit train: largest loss difference", tfr.max_abs_diff,
               note=f"tolerance {tfr.tolerance:.0e}; {tfr.recipe.run.get('shards')} shard(s) on disk")

# %%
if has_torch:
    trend = recipe_view.curve_trend(tfr.recipe_losses)
    print(f"The recipe (from {tfr.recipe.run.get('shards')} shard(s) on disk) and `labkit train` (from memory), "
          f"{len(tfr.recipe_losses)} steps: largest loss difference {tfr.max_abs_diff:.1e} at step {tfr.worst_step} "
          f"(the tests allow {tfr.tolerance:.0e} in {tfr.precision}): {tfr.agreement}.")
    if tfr.engine_spread is not None:
        print(f"`labkit train` run a second time here differs from its first run by up to {tfr.engine_spread:.1e}.")
    print(f"The recipe's curve {trend.verdict}: mean loss {trend.first:.3f} over its first quarter of steps, "
          f"{trend.last:.3f} over its last.")
