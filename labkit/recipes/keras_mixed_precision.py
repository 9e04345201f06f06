"""Mixed precision in Keras: a dtype policy, and LossScaleOptimizer for float16.

    python -m labkit.recipes.keras_mixed_precision --model gpt --precision bf16 --steps 20 --batch-size 32

A policy names two dtypes: layers compute in the first and keep their weights in the second.
"mixed_bfloat16" and "mixed_float16" compute in 16 bits with float32 weights; the model's last
layer stays float32, so logits and the loss are float32. float16 needs loss scaling (its small
gradients underflow to zero); bfloat16 has float32's range and does not. TensorFlow turns TF32
on by default on Ampere and newer GPUs, so "fp32" must switch it off to mean float32.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from labkit.recipes import common

POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def main(argv: list[str] | None = None) -> common.StepLog:
    p = common.parser(__doc__)
    p.add_argument("--precision", choices=list(POLICIES), default="fp32")
    args = common.parse(p, argv)

    tf.config.experimental.enable_tensor_float_32_execution(args.precision != "fp32")
    keras.mixed_precision.set_global_policy(POLICIES[args.precision])
    model = common.tf_model(args, keras.mixed_precision.global_policy().name)
    optimizer = common.keras_adamw(model, args)
    if args.precision == "fp16":
        # Multiplies the loss by a dynamic factor (2**16 to start) before backprop and divides
        # the gradients back; a step with inf/nan gradients is skipped and the factor halves.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0**16)
    optimizer.build(model.trainable_variables)

    x_all, y_all = common.tf_data(args)
    order = common.tf_sample_order(args)  # labkit train's sample order
    data = iter(tf.data.Dataset.from_tensor_slices(order).batch(args.batch_size)
                .map(lambda i: (tf.gather(x_all, i), tf.gather(y_all, i))).prefetch(tf.data.AUTOTUNE))
    predictions = args.batch_size * common.tokens_per_sample(args)  # labels per global batch

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)  # float32: the policy keeps the last layer in float32
            per_label = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_label, global_batch_size=predictions)
            scaled = optimizer.scale_loss(loss)  # x the loss scale with fp16, unchanged otherwise
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)  # unscales, skips non-finite steps
        return loss

    log = common.StepLog("keras_mixed_precision", args, framework="tf",
                         policy=keras.mixed_precision.global_policy().name)
    for step in range(args.steps):
        lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        x, y = next(data)
        log.log(step, float(train_step(x, y)), lr=lr)

    log.write()
    return log


if __name__ == "__main__":
    main()
