"""Plain-framework recipes: the code a learner copies, one technique per file, each proven by
tests to give `labkit train`'s per-step losses for the same settings.

| recipe                | technique                                                              |
|-----------------------|------------------------------------------------------------------------|
| ddp                   | torchrun, DistributedSampler + set_epoch, DDP, `no_sync` accumulation  |
| fsdp                  | FSDP2 `fully_shard`                                                    |
| sharded_checkpoint    | FSDP2 + DCP (`torch.distributed.checkpoint`): sharded save, reshard    |
| zero                  | ZeRO 1 (ZeroRedundancyOptimizer), 2 (reduce-scatter, flat buffers), 3  |
| deepspeed_zero        | `deepspeed.initialize` with `zero_optimization.stage` 1-3, CPU offload |
| tensor_parallel       | DTensor `parallelize_module`: column- then row-parallel linears        |
| pipeline              | `torch.distributed.pipelining` stages, GPipe / 1F1B, tied weights      |
| mixed_precision       | TF32 switches, autocast bf16 / fp16, GradScaler                        |
| attention             | `F.scaled_dot_product_attention` against the T×T matrix, `sdpa_kernel` |
| preemptible           | SIGTERM handler, fsspec checkpoints with a commit marker, resume       |
| elastic_ddp           | torchrun --max-restarts, atomic snapshot (os.replace), resume on start |
| profile               | torch.profiler schedule, record_function, TensorBoard trace            |
| tfrecord_pipeline     | TFRecord shards, tf.data interleave / map / prefetch, torch DataLoader |
| keras_mixed_precision | Keras dtype policy, LossScaleOptimizer                                 |
| keras_mirrored_fit    | MirroredStrategy on one machine's devices, `model.fit`, global batch   |
| tf_multiworker        | TF_CONFIG, MultiWorkerMirroredStrategy, custom step, Keras fit         |
| tf_parameter_server   | ParameterServerStrategy, ClusterCoordinator, staleness (asynchronous)  |
| vertex_job            | google-cloud-aiplatform CustomJob: worker pools, Spot, Reduction Server |

Run one with `python -m labkit.recipes.NAME --help`. `common` holds the plumbing none of them
teaches (flags, the model and synthetic data, the metrics file). A PyTorch recipe runs outside
labkit too: copy it with `common.py`, `labkit/torch/plain.py` (the networks) and
`labkit/data/samples.py` (the synthetic samples) into one folder and run it there; labkit's
engine builds its networks and data from those same two files.
"""
