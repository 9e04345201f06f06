"""The framework-free core of labkit: what every other layer builds on.

- `config`: parameter checks whose errors name the parameter, and `scale` resolution
- `train_config`: `TrainConfig` (help beside each field) and its one argv round trip
- `models`: model configurations both engines build their twins from, and their training FLOPs
- `cluster`: where this process sits in a (Vertex AI) cluster: `ClusterInfo`, `from_env` (the
  one reader of CLUSTER_SPEC, TF_CONFIG and the torch variables)
- `launcher`: the one process launcher: start, watch, stop local processes (`run_group`)
- `checkpoint`: named blobs committed by a marker written last, through fsspec
- `fingerprint`: what defines a run, recorded in each checkpoint; the check a resume must pass
- `lease`: one writer per checkpoint folder (a lease naming its holder, stale ones taken over)
- `outputs`: every output location checked for writability before a run's first step
- `gcs`: Cloud Storage as a Vertex job sees it: gs:// addresses, the /gcs/ mount, the AIP_*
  folders (`aip_mount_paths`), and the emulator's local stand-in bucket
- `hypertune`: reporting a tuning objective the way Vertex's tuning service reads it
- `metrics`: the per-step metrics schema both engines write
- `preemption`: the one SIGTERM guard
- `loop`: the training loop both engines run (step cadence, the preemption drill, checkpoint
  cadence, metrics, the non-finite loss check), with `schedule` (the LR warm-up rule) and
  `scalars` (TensorBoard event files)
- `joblog`: what a running Vertex AI job reports: one JSON log line per event (severity, message,
  the step's figures) for Cloud Logging; `wandb_scalars`: the same scalars to Weights & Biases
- `stats`: repeated measurements, their spread, and verdicts that say "no measurable difference"
- `devices`, `frameworks`, `gcp`, `doctor`: what this machine and cloud configuration offer

Nothing here imports torch or TensorFlow at module level, and nothing imports upward.
"""
