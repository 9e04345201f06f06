"""TensorFlow side of labkit (Keras 3 on the TensorFlow backend).

- `models`: Keras twins of the torch models, built from the same `labkit.core.models` configs.
- `engine.fit(config)`: the training engine behind `labkit train --framework tf`; it picks the
  loop: `trainer` (the custom loop, `Trainer(...).train()`), `keras_fit` (the `model.fit` +
  BackupAndRestore variant) or `ps` (the ParameterServer one); `step`: what one optimizer step
  is made of (model, optimizer, schedule, the replica and distributed steps); `state`:
  checkpoints through `labkit.core.checkpoint`; `peak`: the measured matmul peak MFU is relative
  to.
- `strategy`: default / Mirrored / MultiWorkerMirrored / ParameterServer from TF_CONFIG
  (Vertex's `master` mapped to `chief`); `runtime`: CPU-only or GPU memory growth.
- `data`: global-batch layout and tf.data input over the synthetic samples or TFRecord shards.
- `precision`: fp32 / tf32 / mixed_bfloat16 / mixed_float16 + loss scaling.
- `launch`: N workers on loopback with a TF_CONFIG each (`labkit launch-tf`).
- `straggler`: one slow worker under MultiWorkerMirrored and ParameterServerStrategy, measured in
  windows of wall time (the program of notebook 02's emulated Vertex AI jobs).

Nothing here is imported by the framework-free top level; import `labkit.tf.*` only when
`labkit.core.frameworks.has_tf()` is true.
"""
