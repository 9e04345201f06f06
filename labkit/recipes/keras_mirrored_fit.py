"""One machine, several devices: MirroredStrategy and Keras `model.fit`.

    python -m labkit.recipes.keras_mirrored_fit --model cnn --steps 10 --batch-size 32 --devices 2

MirroredStrategy runs one replica of the model per device of this machine, in one process:
variables created in `strategy.scope()` are mirrored (a copy on every device, kept identical),
`fit` splits each batch of the dataset between the replicas, and the gradients are all-reduced
in-process (NCCL between GPUs, a reduction on the host between CPU devices) so every copy
applies the same update. The dataset is batched at the GLOBAL batch: with 2 replicas and
`--batch-size 32` each replica computes on 16 samples, and the step equals one step at batch 32
on one device, up to the order of float additions.

--devices 0 uses every visible GPU (the CPU when there is none); --devices N uses N GPUs, or,
on a machine without GPUs, N logical devices split from the CPU, so the same code runs here.
Several machines need MultiWorkerMirroredStrategy and TF_CONFIG instead (`tf_multiworker`).

One trap, measured by this recipe's tests: Keras 3.15 (TensorFlow backend) applies
`global_clipnorm` inside each replica, to that replica's share of the gradient, before the
all-reduce, so once clipping acts N replicas step differently from one device. The optimizer
below clips the all-reduced gradient, as one device (and DDP + clip_grad_norm_) does. Clipping
before aggregation is "usually wrong": https://github.com/tensorflow/tensorflow/issues/33929
(a TensorFlow maintainer's comment of 2020-05-26; read 2026-11-26).
"""

from __future__ import annotations

import sys

import keras
import tensorflow as tf

from labkit.recipes import common


class AdamWClipSummed(keras.optimizers.AdamW):
    """Keras AdamW whose `global_clipnorm` applies to the gradient summed over replicas."""

    def _clip_gradients(self, grads):
        context = tf.distribute.get_replica_context()
        if not self.global_clipnorm or context is None or context.num_replicas_in_sync == 1:
            return super()._clip_gradients(grads)
        # The norm of the gradient every replica will apply (this replica's share summed over
        # all of them); every share is scaled by the same factor, so their sum is clipped.
        norm = tf.linalg.global_norm(context.all_reduce(tf.distribute.ReduceOp.SUM, grads))
        scale = tf.minimum(1.0, self.global_clipnorm / tf.maximum(norm, 1e-12))
        return [g * scale for g in grads]


def pick_devices(args) -> list[str]:
    """The devices for MirroredStrategy. Runs before TensorFlow initialises its devices."""
    gpus = tf.config.list_physical_devices("GPU")
    if args.device == "cpu":
        tf.config.set_visible_devices([], "GPU")
        gpus = []
    if args.device == "cuda" and not gpus:
        sys.exit("error: --device cuda: TensorFlow sees no GPU")
    if gpus:
        if args.devices > len(gpus):
            sys.exit(f"error: --devices {args.devices}: this machine has {len(gpus)} GPU(s)")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        return [f"/gpu:{i}" for i in range(args.devices or len(gpus))]
    # No GPU: split the one physical CPU into N logical devices, one replica on each.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(max(1, args.devices))])
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--devices", type=int, default=0,
                   help="replicas: 0 = every visible GPU (the CPU when none); N = N GPUs, or N "
                        "logical CPU devices on a machine without GPUs")
    args = common.parse(p, argv)
    if args.devices < 0:
        p.error(f"argument --devices: must be 0 or more, got {args.devices}")

    strategy = tf.distribute.MirroredStrategy(pick_devices(args))
    # fp32 as labkit train's: on a GPU, TensorFlow's default is TF32 (10 mantissa bits).
    tf.config.experimental.enable_tensor_float_32_execution(False)
    replicas = strategy.num_replicas_in_sync
    print(f"MirroredStrategy: {replicas} replica(s) on {', '.join(strategy.extended.worker_devices)}")
    if args.batch_size % replicas:
        p.error(f"argument --batch-size: {args.batch_size} does not split evenly over {replicas} replicas")

    x_all, y_all = common.tf_data(args)
    order = common.tf_sample_order(args)  # labkit train's sample order
    # Batched at the GLOBAL batch: fit hands each replica its slice of every batch.
    dataset = (tf.data.Dataset.from_tensor_slices(order).batch(args.batch_size)
               .map(lambda i: (tf.gather(x_all, i), tf.gather(y_all, i))).prefetch(tf.data.AUTOTUNE))

    with strategy.scope():  # the model's and the optimizer's variables are mirrored
        model = common.tf_model(args)
        optimizer = common.keras_adamw(model, args, optimizer_class=AdamWClipSummed)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    log = common.StepLog("keras_mirrored_fit", args, framework="tf", world_size=replicas,
                         devices=list(strategy.extended.worker_devices))
    # One step per "epoch": Keras reports an epoch's mean loss, so each one is a step's loss.
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: log.log(epoch, float(logs["loss"])))
    model.fit(dataset, epochs=args.steps, steps_per_epoch=1, callbacks=[record], shuffle=False,
              verbose=0)

    log.write()
    return log


if __name__ == "__main__":
    main()
