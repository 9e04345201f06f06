"""Keras 3 twins of the PyTorch models, built from the same `labkit.core.models` configs.

Same layers, same shapes, same parameter count as `labkit.torch.models` (a test compares the
counts). Layout differences are only those of the frameworks: images are NHWC here (TensorFlow's
native layout) and NCHW in torch; batch-norm running statistics are non-trainable Keras weights
where torch keeps them as buffers, so "parameters" means trainable weights on both sides.

`dtype` is a Keras dtype policy name ("float32", "mixed_bfloat16", "mixed_float16"): it is set on
every layer instead of globally, so two models with different precisions can live in one process.
Logits always come out in float32, so the loss is computed in full precision.
"""

from __future__ import annotations

import math

from labkit.core.models import CNNConfig, GPTConfig, ModelConfig, ResNetConfig


def build_model(config: ModelConfig, *, dtype: str = "float32", seed: int = 0):
    """A built Keras model for `config` (weights created, deterministic for a seed)."""
    import keras

    keras.utils.set_random_seed(seed)
    if isinstance(config, CNNConfig):
        model = _cnn(config, dtype)
    elif isinstance(config, ResNetConfig):
        model = _resnet(config, dtype)
    elif isinstance(config, GPTConfig):
        model = _gpt(config, dtype)
    else:
        raise TypeError(f"no TensorFlow model for config type {type(config).__name__}")
    return model


def count_parameters(model) -> int:
    """Trainable parameters (what torch's `sum(p.numel() for p in model.parameters())` counts)."""
    return int(sum(math.prod(w.shape) for w in model.trainable_weights))


# ---------------------------------------------------------------- CNN


def _cnn(c: CNNConfig, dtype: str):
    import keras
    from keras import layers

    inputs = keras.Input((c.image_size, c.image_size, c.channels), dtype="uint8")
    x = _normalize_pixels(inputs, dtype)
    for i in range(c.depth):
        x = layers.Conv2D(c.width * 2**i, 3, padding="same", activation="relu", dtype=dtype,
                          name=f"conv{i}")(x)
        x = layers.MaxPooling2D(2, dtype=dtype, name=f"pool{i}")(x)
    x = layers.GlobalAveragePooling2D(dtype=dtype)(x)
    logits = layers.Dense(c.num_classes, dtype=dtype, name="head")(x)
    return keras.Model(inputs, _float32(logits), name="cnn")


def _normalize_pixels(x, dtype: str):
    """uint8 HWC pixels -> [0, 1] floats in the compute dtype (the torch twin does the same)."""
    from keras import layers

    return layers.Rescaling(1.0 / 255.0, dtype=dtype, name="rescale")(x)


def _float32(x):
    from keras import layers

    return layers.Activation("linear", dtype="float32", name="logits")(x)


# ---------------------------------------------------------------- ResNet


def _conv_bn(x, filters: int, kernel: int, stride: int, dtype: str, name: str, relu: bool = True):
    from keras import layers

    # torchvision pads 7x7/2 and 3x3/2 convs explicitly; "same" gives the same output shape.
    x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False,
                      dtype=dtype, name=f"{name}_conv")(x)
    # torch BatchNorm2d defaults: momentum 0.1 (Keras counts it the other way: 0.9), eps 1e-5.
    x = layers.BatchNormalization(momentum=0.9, epsilon=1e-5, dtype=dtype, name=f"{name}_bn")(x)
    return layers.ReLU(dtype=dtype)(x) if relu else x


def _basic_block(x, planes: int, stride: int, dtype: str, name: str):
    from keras import layers

    shortcut = x
    out = _conv_bn(x, planes, 3, stride, dtype, f"{name}_a")
    out = _conv_bn(out, planes, 3, 1, dtype, f"{name}_b", relu=False)
    if stride != 1 or x.shape[-1] != planes:
        shortcut = _conv_bn(x, planes, 1, stride, dtype, f"{name}_down", relu=False)
    return layers.ReLU(dtype=dtype)(layers.Add(dtype=dtype)([out, shortcut]))


def _bottleneck_block(x, planes: int, stride: int, dtype: str, name: str):
    from keras import layers

    shortcut = x
    out = _conv_bn(x, planes, 1, 1, dtype, f"{name}_a")
    out = _conv_bn(out, planes, 3, stride, dtype, f"{name}_b")  # stride on the 3x3 (ResNet v1.5)
    out = _conv_bn(out, planes * 4, 1, 1, dtype, f"{name}_c", relu=False)
    if stride != 1 or x.shape[-1] != planes * 4:
        shortcut = _conv_bn(x, planes * 4, 1, stride, dtype, f"{name}_down", relu=False)
    return layers.ReLU(dtype=dtype)(layers.Add(dtype=dtype)([out, shortcut]))


def _resnet(c: ResNetConfig, dtype: str):
    import keras
    from keras import layers

    inputs = keras.Input((c.image_size, c.image_size, c.channels), dtype="uint8")
    x = _normalize_pixels(inputs, dtype)
    if c.imagenet_stem:
        x = _conv_bn(x, c.width, 7, 2, dtype, "stem")
        x = layers.MaxPooling2D(3, strides=2, padding="same", dtype=dtype)(x)
    else:
        x = _conv_bn(x, c.width, 3, 1, dtype, "stem")
    block = _bottleneck_block if c.bottleneck else _basic_block
    for stage, blocks in enumerate(c.layers):
        planes = c.width * 2**stage
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            x = block(x, planes, stride, dtype, f"s{stage}b{b}")
    x = layers.GlobalAveragePooling2D(dtype=dtype)(x)
    logits = layers.Dense(c.num_classes, dtype=dtype, name="head")(x)
    return keras.Model(inputs, _float32(logits), name="resnet")


# ---------------------------------------------------------------- GPT


def _gpt(c: GPTConfig, dtype: str):
    import keras

    from labkit.tf import gpt_layers

    inputs = keras.Input((c.block_size,), dtype="int32")
    logits = gpt_layers.GPT(c, dtype=dtype, name="gpt")(inputs)
    return keras.Model(inputs, _float32(logits), name="gpt")
