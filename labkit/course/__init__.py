"""The course layer: what the notebooks call. It builds on the engines (`labkit.torch`,
`labkit.tf`), the framework-free packages below them and the core; nothing below it imports it.
The library packages return data; this layer measures for the notebooks and returns the numbers
and verdicts each notebook's "What this run shows" turns into sentences on the page (02, 03, 04,
05, 07, 08 and 11; the other notebooks still take some sentences from here), and presents them.

Shared by every notebook:
    tables       the one table formatter (plain text or Markdown)
    plots        the one start and finish of every plot (headless backend, layout, saving)
    summary      the report `labkit course` writes of what this machine measured
    ladder       the one way settings are compared by training: warm-up, turns, summary, verdict
    levers       the one registry of rungs and levers: key, label, settings, the code that shows each
    references   the benchmark results files a notebook quotes, and what it says when they are absent
    recipe_view  a recipe shown from its file, run, and compared with the engine
    sizing       a notebook's sizes for this machine (the plan announced before the long cells)
    mistakes     mistakes guides make, each measured beside its fix (02, 04, 06, 07, 08)
    own_job      your own trainer (examples/) as an emulated Vertex job (06, 07)

By notebook:
    00  tour
    01  hardware_choice (MLP throughput and MFU, roofline, time against cost)
    02  distribution (DDP vs tf.distribute), parameter_server (async PS training against sync)
    03  input_pipeline: ladder, read_rates, step_probe, findings; own_data (your JPEGs as shards);
        cloud_reads (your shards from Cloud Storage: mount, gcsfs or staged)
    04  precision (the ladder and its findings): loss_scaling, tensor_cores, cuda_graphs
    05  profiling
    06  multinode (all-reduce bandwidth, gradient compression)
    07  preemption: drill, spot, writes
    08  memory (accumulation, activation checkpointing, FSDP next to DDP), attention (manual vs SDPA)
    09  capstone (the climb from a slow baseline), capstone_target (the job on the target GPU)
    10  model_parallel, sharded_checkpoints (DCP against the full-state save)
    11  tuning
    12  your_job (a plain script carried step by step to a Spot-safe multi-node job)

Running notebooks (papermill, the kernel and its log, key figures) is `labkit.notebooks`'s, below
this layer. Rungs and levers are found by key; their labels are only for display.
"""
