"""A real training step to put behind an input pipeline, in both frameworks, for measuring the
share of step time spent waiting for data: a small conv net on the pipeline's uint8 images
(normalised on the device), cross-entropy, SGD. Each step returns the loss as a host float, so
its time includes the compute it launched."""

from __future__ import annotations

from collections.abc import Callable

from labkit.core.placement import place_here


def torch_image_step(num_classes: int, *, channels: int = 3, width: int = 16, lr: float = 0.05,
                     device: str = "auto", seed: int = 0) -> Callable[[dict], float]:
    """`step(batch)` for batches `{"image": (B,H,W,C) uint8, "label": (B,)}` from `make_loader`;
    on the GPU when there is one (`device="auto"`), where pinned batches copy asynchronously."""
    import torch
    from torch import nn

    device = place_here(device=device).device
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(width, num_classes)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def step(batch: dict) -> float:
        x = batch["image"].to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0).contiguous()
        y = batch["label"].to(device, non_blocking=True)
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def tf_image_step(num_classes: int, *, width: int = 16, lr: float = 0.05,
                  seed: int = 0) -> Callable[[dict], float]:
    """The same network and step in TensorFlow, for batches from `make_tf_dataset`."""
    import tensorflow as tf

    tf.random.set_seed(seed)
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        layers.Conv2D(width, 3, padding="same", activation="relu"), layers.MaxPool2D(2),
        layers.Conv2D(width, 3, padding="same", activation="relu"), layers.GlobalAveragePooling2D(),
        layers.Dense(num_classes)])
    opt = tf.keras.optimizers.SGD(lr, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train(images, labels):
        x = tf.cast(images, tf.float32) / 255.0
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables, strict=True))
        return loss

    def step(batch: dict) -> float:
        return float(train(batch["image"], batch["label"]))

    return step
