"""TensorFlow side of labkit: Keras 3 model twins, tf.distribute strategies from the cluster
environment, mixed-precision policies and the training engine (`labkit.tf.engine.fit`).

Nothing here is imported by the framework-free top level; import `labkit.tf.*` only when
`labkit.frameworks.has_tf()` is true.
"""
