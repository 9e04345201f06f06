# %% [markdown]
# # 00 · Tour: your environment, and the three ways a notebook runs
#
# Every notebook in this course **measures on your machine** and computes its conclusions from
# those measurements. The cells are thin: each calls `labkit`, the tested package beside the
# notebooks, so what you read here is what `labkit train` and a Vertex AI job run too.
#
# This notebook checks the environment (the same report as `labkit doctor` in a terminal) and
# then shows, for real, the three ways any notebook of the course runs:
#
# 1. **Interactively** in JupyterLab or Vertex AI Workbench: what you are doing now.
# 2. **Headless with papermill**, with parameters: `labkit run notebooks/04_mixed_precision.ipynb -p scale full`.
# 3. **As a Vertex AI custom job**: papermill inside labkit's own training image (CUDA, the
#    framework and labkit; `labkit image` builds it), the executed notebook written to Cloud Storage. Without a Google Cloud project the job spec is built and validated
#    offline (dry run) and nothing is submitted.
#
# The first code cell holds the **parameters** (tagged `parameters`, so papermill can override
# them). `scale="auto"` means real sizes on a GPU and small "smoke" sizes on a CPU, where every
# notebook finishes in about a minute.

# %% tags=["parameters"]
scale = "auto"
papermill_matmul_size = 256
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

import labkit
from labkit.core import config, doctor
from labkit.course import tour

scale = config.resolve_scale(scale)
config.check_int("papermill_matmul_size", papermill_matmul_size, minimum=1, maximum=8192)
print(f"labkit {labkit.__version__}, scale resolved to {scale!r}")

# %% [markdown]
# ## The environment
# Versions, devices (CPU cores; GPUs with memory and compute capability; a TPU if any) and
# whether Google Cloud is configured. The last lines say what that means for the course.

# %%
report = doctor.collect()
print(report.text())
key_figure("CPU cores usable", report.devices.cpu_count)
key_figure("GPUs", len(report.devices.gpus), note=", ".join(g.name for g in report.devices.gpus) or "none")

# %% [markdown]
# ## What the course will do here
# `scale="full"` does not mean one size for every GPU. A table of GPU facts (memory, which
# number formats have tensor cores, datasheet peak rates, each with its source) decides each
# notebook's sizes: the batch that fits this GPU's memory with headroom, only the precision rungs
# it can run (a T4 has no bf16 or TF32), and where a demo starts more processes than there are
# GPUs, CPU processes at CPU sizes (NCCL refuses two ranks on one GPU). Each notebook prints its
# plan before its long cells; here is the whole course's, with the time each notebook expects
# on this machine (a forecast from the GPU table and a short probe of the GPU). `time_budget_s`
# trims the sizes that only buy precision so a notebook fits a time you give it.

# %%
from IPython.display import Markdown, display
from labkit.course import sizing
from labkit.course.tables import table

machine = sizing.Machine.detect(probe=scale == "full")
print(machine.facts_line())
course_plan = sizing.course_table(machine, scale, time_budget_s=time_budget_s or None)
display(Markdown(table(course_plan, markdown=True)))
key_figure("course forecast here", sum(r["expected_min"] for r in course_plan), "min", note=f"scale {scale}, {machine.name}")

# %% [markdown]
# ## Way 1: interactively
# You are running this cell in a kernel. Every notebook reads its parameters from the first code
# cell, so changing `scale` there and re-running is all it takes to go from smoke to real sizes.
#
# ## Way 2: headless with papermill
# papermill executes a notebook top to bottom without a browser and injects a cell with the
# parameters you pass. Below, labkit runs a tiny notebook that times a NumPy matmul, with
# `size` set from this notebook's `papermill_matmul_size`, and shows the injected cell and the
# figure the run measured. From a terminal the same is `labkit run NOTEBOOK -p size 256`, and
# `labkit course` (or `make run`) runs the whole course and writes a summary report.

# %%
run, injected = tour.papermill_demo(artifacts_dir("00_tour"), size=papermill_matmul_size)
print("papermill injected this cell:\n" + injected)
print(f"\nexecuted in {run.seconds:.1f}s, ok={run.ok}, output: {run.output}")
for figure in run.figures:
    print("measured by the headless run ->", figure.text())
key_figure("papermill round trip (kernel start to saved notebook)", run.seconds, "s")

# %% [markdown]
# ## Way 3: as a Vertex AI custom job
# A Vertex job runs the same notebook with papermill inside a container, on the machine type you
# choose, and writes the executed notebook to Cloud Storage. Submitting needs credentials, a
# project, a region and a bucket; the next cell says which of those this environment has.

# %%
cloud = report.cloud
print("ready to submit" if cloud.ready else "dry-run mode; missing:\n- " + "\n- ".join(cloud.missing()))

# %% [markdown]
# The job spec for running **this** notebook on Vertex AI, on one L4 GPU with real sizes:
# papermill inside labkit's own PyTorch image (the `image_uri` below: Vertex's prebuilt images
# stop at PyTorch 2.4, older than labkit needs), the executed notebook written under the
# bucket. The dry run validates it offline against Vertex's API types
# (`google.cloud.aiplatform_v1`) and prints it with its estimated cost per hour.
# `labkit run notebooks/00_tour.ipynb --vertex --accelerator-type NVIDIA_L4 --accelerator-count 1`
# does the same from a terminal, and submits it when the environment is ready.

# %%
from labkit import vertex

tour_job = vertex.notebook_job("notebooks/00_tour.ipynb", {"scale": "full"},
                               output_uri=f"{cloud.bucket or 'gs://YOUR_BUCKET'}/labkit/00_tour",
                               machine_type="g2-standard-8", accelerator_type="NVIDIA_L4", accelerator_count=1)
print(vertex.dry_run(tour_job).text())

# %% [markdown]
# ## The code on the page: recipes
# labkit's engines are the fast, tested core every notebook measures with. Beside them, each
# technique of the course is also a short plain PyTorch, TensorFlow or Vertex SDK script under
# `labkit/recipes/`: the code you copy into your own project. The notebook that teaches it shows
# it from the file, runs it, and lays its loss curve over the engine's (tests hold them to
# 1e-5 in fp32). Only the plumbing none of them teaches (flags, labkit's models and synthetic
# data, the metrics file) is shared, in `labkit/recipes/common.py`.

# %%
from labkit.core import frameworks
from labkit.course import recipe_view

display(Markdown(table(recipe_view.catalogue(), markdown=True)))

# %% [markdown]
# Each runs from a terminal like any script. Here is one, run as you would run it: the DDP
# recipe without torchrun (one process, the same maths) for eight steps, what it printed, and
# the per-step losses it wrote to its metrics file (the schema of `labkit train --metrics-out`).
# It runs at the learning rate the course gives its small smoke models, 10⁻² (at `labkit
# train`'s default 10⁻³ they barely move in a few steps; the full-size models take 10⁻³).

# %%
if frameworks.has_torch():
    tour_argv = recipe_view.flags(model="cnn", steps=8, batch_size=32, lr=0.01)
    print("$", recipe_view.command("ddp", tour_argv))
    tour_run = recipe_view.run("ddp", tour_argv)
    print(tour_run.lines("step "))
    print("losses in its metrics file:", [round(loss, 4) for loss in tour_run.losses])
else:
    print(frameworks.missing_reason("torch"))
