"""The course layer: what the notebooks call. It builds on the engines (`labkit.torch`,
`labkit.tf`), the framework-free packages below them and the core; nothing below it imports it.
The library packages return data; this layer measures for the notebooks, states conclusions
computed from the measurements, and presents them.

Shared by every notebook:
    tables       the one table formatter (plain text or Markdown)
    plots        the one start and finish of every plot (headless backend, layout, saving)
    summary      the report `labkit course` writes of what this machine measured

By notebook:
    00  tour
    01  mlp_throughput (MLP throughput and MFU), hardware_plots (roofline, time against cost)
    02  distribution (DDP vs tf.distribute)
    03  input_ladder, read_rates, input_conclusions, crc_demo, step_probe
    04  precision (the ladder and its conclusions), loss_scaling, tensor_cores
    05  profile_results
    06  hardware_plots (all-reduce bandwidth)
    07  drill (the preemption drill), spot (checkpoint interval against cost)
    08  memory, sharding
    09  capstone
    vertex_demo: small real distributed programs a local Vertex job runs (`python -m`)

Running notebooks (papermill, the kernel and its log, key figures) is `labkit.notebooks`'s, below
this layer. Rungs and levers are found by key; their labels are only for display.
"""
