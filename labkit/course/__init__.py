"""The course layer: what the notebooks call. It builds on the engines (`labkit.torch`,
`labkit.tf`), the framework-free packages below them and the core; nothing below it imports it.
The library packages return data; this layer measures for the notebooks, states conclusions
computed from the measurements, and presents them.

Shared by every notebook:
    tables       the one table formatter (plain text or Markdown)
    plots        the one start and finish of every plot (headless backend, layout, saving)
    report       key figures: a notebook's measured results, collected by `labkit course`
    ladder       the one way settings are compared by training: warm-up, turns, summary, verdict
    levers       the one registry of rungs and levers: key, label, settings, the code that shows each
    references   the benchmark results files a notebook quotes, and what it says when they are absent
    recipe_view  a recipe shown from its file, run, and compared with the engine
    sizing       a notebook's sizes for this machine (the plan announced before the long cells)
    mistakes     mistakes guides make, each measured beside its fix (02, 04, 06, 07, 08)
    notebook     running one notebook with papermill; runner: `labkit course`, all of them

By notebook:
    00  tour
    01  hardware_choice (MLP throughput and MFU, roofline, time against cost)
    02  distribution (DDP vs tf.distribute; the engine's DDP agreement)
    03  input_pipeline: ladder, read_rates, step_probe, conclusions
    04  precision (the ladder and its conclusions): loss_scaling, tensor_cores, cuda_graphs
    05  profiling
    06  multinode (all-reduce bandwidth, gradient compression)
    07  preemption: drill, spot, writes
    08  memory (accumulation, activation checkpointing, FSDP next to DDP)
    09  capstone
    10  model_parallel
    11  tuning

Rungs and levers are found by key; their labels are only for display.

Imported in a Jupyter kernel, this package sends the kernel's file-descriptor-2 output (C/C++
library logs, child processes' stderr) to the notebook's log file: see `notebook`.
"""

from labkit.course.notebook import route_kernel_stderr

route_kernel_stderr()
