"""Multi-worker data parallelism in TensorFlow: TF_CONFIG, MultiWorkerMirroredStrategy, a custom
training step, and Keras fit.

    # one process per worker, each with its own TF_CONFIG (Vertex AI sets it in multi-replica jobs)
    TF_CONFIG='{"cluster": {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"]},
                "task": {"type": "chief", "index": 0}}' \
        python -m labkit.recipes.tf_multiworker --model cnn --steps 20 --batch-size 32

Every worker holds the whole model (variables created in `strategy.scope()` are mirrored) and
trains on its own slice of each global batch; the gradients are all-reduced so every worker
applies the same update. Without TF_CONFIG the same code runs as one worker.

--loop fit trains with Keras `model.fit` instead of the custom step. With TensorFlow 2.21 and
Keras 3.15 it works on one worker and fails under MultiWorkerMirroredStrategy on two ("Attempt
to convert a value (PerReplica...) to a Tensor"): the custom step is the multi-worker path.
"""

from __future__ import annotations

import json
import os

import keras
import tensorflow as tf

from labkit.recipes import common


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--loop", choices=["custom", "fit"], default="custom")
    args = common.parse(p, argv)

    # Vertex AI names the primary replica "master" in TF_CONFIG; TensorFlow only knows "chief".
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if "master" in tf_config.get("cluster", {}):
        tf_config["cluster"]["chief"] = tf_config["cluster"].pop("master")
        if tf_config["task"]["type"] == "master":
            tf_config["task"]["type"] = "chief"
        os.environ["TF_CONFIG"] = json.dumps(tf_config)
    # The strategy first, before any other TensorFlow op: it sets up this worker's runtime.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # fp32 as labkit train's: on a GPU, TensorFlow's default is TF32 (10 mantissa bits).
    tf.config.experimental.enable_tensor_float_32_execution(False)
    task = tf_config.get("task", {})
    is_chief = task.get("type", "chief") == "chief"  # the chief alone writes files

    x_all, y_all = common.tf_data(args)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # Called on every worker: return this worker's share of each global batch (one replica
        # per worker here), in labkit train's sample order.
        order = common.tf_sample_order(args, ctx.input_pipeline_id, ctx.num_input_pipelines)
        ds = tf.data.Dataset.from_tensor_slices(order).batch(ctx.get_per_replica_batch_size(args.batch_size))
        ds = ds.map(lambda i: (tf.gather(x_all, i), tf.gather(y_all, i)), num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(tf.data.AUTOTUNE)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():  # variables created here are mirrored on every replica
        model = common.tf_model(args)
        optimizer = common.keras_adamw(model, args)  # clips the global gradient norm
        optimizer.build(model.trainable_variables)
    log = common.StepLog("tf_multiworker", args, framework="tf", loop=args.loop,
                         world_size=strategy.num_replicas_in_sync)

    if args.loop == "fit":
        with strategy.scope():
            model.compile(optimizer=optimizer,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        # One step per "epoch": Keras reports an epoch's mean loss, so each one is a step's loss.
        record = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: log.log(epoch, float(logs["loss"])))
        model.fit(dataset, epochs=args.steps, steps_per_epoch=1, callbacks=[record], shuffle=False,
                  verbose=0)
    else:
        predictions = args.batch_size * common.tokens_per_sample(args)  # labels per global batch

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per_label = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                # This replica's sum over the GLOBAL label count: summed over replicas, the mean.
                loss = tf.nn.compute_average_loss(per_label, global_batch_size=predictions)
            return loss, tape.gradient(loss, model.trainable_variables)

        @tf.function
        def train_step(iterator):
            losses, grads = strategy.run(replica_step, args=next(iterator))
            # Sum the gradients over replicas, then clip and apply (what DDP + clip_grad_norm_
            # does). Called inside strategy.run, Keras would clip each replica's part first.
            grads = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
            optimizer.apply(grads, model.trainable_variables)
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

        iterator = iter(dataset)
        for step in range(args.steps):
            lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
            log.log(step, float(train_step(iterator)), lr=lr)

    if is_chief:
        log.write()
    return log


if __name__ == "__main__":
    main()
