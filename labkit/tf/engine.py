"""The TensorFlow training engine: `fit(config, on_step=None)`, twin of `labkit.torch.trainer.fit`.

Why a custom loop and not `model.fit`: with TensorFlow 2.21 and Keras 3, `model.fit` under
MultiWorkerMirroredStrategy fails on two workers ("Attempt to convert a value (PerReplica...)
to a Tensor"); `labkit.tf.keras_fit` keeps that path (with BackupAndRestore) and a test tracks
when it starts working. The custom loop (`strategy.run` inside a `tf.function`, fed from a
distributed dataset) trains under every strategy today with the current Keras, and gives
exactly the torch engine's semantics: `batch_size` is the global batch, gradients are summed
across replicas before clipping (as DDP + clip_grad_norm_), accumulation, warm-up, AdamW with
the same hyper-parameters, fp16 loss scaling, a per-step loss (not Keras' running mean), and a
resume that continues with exactly the next step.

The custom loop is `labkit.tf.trainer.Trainer` (built, restored and trained there, read top to
bottom, twin of `labkit.torch.trainer`); the Keras loop is `labkit.tf.keras_fit`, the
parameter-server loop `labkit.tf.ps`. `fit` below chooses among them (`loop`, and the strategy
planned from the cluster: `labkit.tf.strategy`), holds the checkpoint folder's lease around the
custom loop (`labkit.tf.state.claim`) and turns running out of GPU memory into one line naming
the batch. Building blocks (`build`, `make_train_step`, `make_replica_step`, `training_arrays`,
`weights_fingerprint`) live in `labkit.tf.step` and are re-exported here.
"""

from __future__ import annotations

import os

from labkit.core.config import ParameterError, check_choice
from labkit.core.loop import StepCallback
from labkit.core.metrics import MetricsLog
from labkit.core.train_config import TrainConfig, with_vertex_dirs
from labkit.tf import state
from labkit.tf.keras_fit import fit_keras
from labkit.tf.ps import fit_parameter_server
from labkit.tf.step import (
    build,
    make_replica_step,
    make_train_step,
    training_arrays,
    weights_fingerprint,
)
from labkit.tf.trainer import Trainer

__all__ = ["LOOPS", "build", "fit", "make_replica_step", "make_train_step", "training_arrays",
           "weights_fingerprint"]
LOOPS = ("custom", "keras")


def fit(config: TrainConfig, *, on_step: StepCallback | None = None,
        loop: str | None = None, data_dir: str | None = None) -> MetricsLog:
    """Train as configured; returns the MetricsLog (written to `config.metrics_out` by the chief;
    other workers write `<name>.worker<i>.json` beside it). Raises
    `labkit.core.train_config.Preempted` after checkpointing when SIGTERM arrives (or at
    `config.preempt_at`). Unset checkpoint and TensorBoard folders default to Vertex AI's
    (`with_vertex_dirs`).

    `loop="keras"` (or LABKIT_TF_LOOP=keras) trains with Keras `model.fit` + BackupAndRestore
    instead of the custom loop. `data_dir` (or LABKIT_TF_DATA_DIR) makes the samples come
    through labkit's TFRecord layer (shards written there once, read with tf.data) rather than
    straight from the synthetic generator; the bytes are the same either way."""
    config = with_vertex_dirs(config)
    if config.fp8_head:
        raise ParameterError("fp8_head", True, "is a torch engine feature; TensorFlow has no fp8 head")
    if config.cuda_graph_step:
        raise ParameterError("cuda_graph_step", True, "is a torch engine feature (TensorFlow: use XLA)")
    loop = check_choice("loop", loop or os.environ.get("LABKIT_TF_LOOP", "custom"), LOOPS)
    data_dir = data_dir or os.environ.get("LABKIT_TF_DATA_DIR") or None
    if loop == "keras":
        return fit_keras(config, on_step=on_step, data_dir=data_dir)
    from labkit.tf import runtime

    device = runtime.configure(config.device)  # before anything else touches TF devices
    import tensorflow as tf

    from labkit.tf import strategy as strategies

    plan = strategies.plan_strategy(local_gpus=len(tf.config.get_visible_devices("GPU")))
    if strategies.run_server_if_needed(plan):  # ps / worker tasks of a PS job serve, then exit
        return MetricsLog(run={"framework": "tf", "strategy": plan.kind,
                               "task": f"{plan.task_type}:{plan.task_index}"})
    if plan.kind == "parameter_server":
        return fit_parameter_server(config, plan, device, on_step, data_dir)
    lease = state.claim(config, plan.is_chief)  # outputs writable, the checkpoint folder ours alone
    try:
        return Trainer(config, plan, device, data_dir=data_dir, lease=lease, on_step=on_step).train()
    except tf.errors.ResourceExhaustedError:
        raise _out_of_memory(config) from None
    finally:
        if lease is not None:
            lease.release()


def _out_of_memory(config: TrainConfig) -> ParameterError:
    """The one line for a step that does not fit the GPUs: it names the batch and what shrinks it."""
    import tensorflow as tf

    gpus = [tf.config.experimental.get_device_details(g).get("device_name", g.name)
            for g in tf.config.get_visible_devices("GPU")]
    return ParameterError("batch_size", config.batch_size,
                          f"does not fit in the memory of {', '.join(gpus) or 'this device'} with model "
                          f"{config.model!r} at scale {config.scale!r}, precision {config.precision}: use a "
                          f"smaller batch_size, grad_accum or bf16")
