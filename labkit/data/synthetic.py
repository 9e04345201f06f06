"""Deterministic synthetic datasets, identical in every framework and on every machine.

Sample `i` is a pure function of (seed, i): it is generated from its own random stream, never
from a shared one, so any shard, worker or resumed run sees exactly the same bytes for the same
index. The data is learnable (a colour per class for images, a fixed-stride rule for tokens), so
a smoke-size model's loss falls well below chance within the course's few smoke steps, on samples
it never trained on (`held_out`), and curves can be compared across frameworks. Neither can be
learned perfectly: a training run's images carry a share of wrong labels (`TRAINING_LABEL_NOISE`)
and its tokens a share of random ones, so a large model trained long cannot drive held-out loss to
zero, and one that memorises its training set shows it as a held-out loss that rises again.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from labkit.core.config import check_float, check_int
from labkit.core.models import GPTConfig, ModelConfig
from labkit.data.samples import ImageDatasetConfig as PlainImageDatasetConfig
from labkit.data.samples import SyntheticImages, SyntheticTokens
from labkit.data.samples import TokenDatasetConfig as PlainTokenDatasetConfig
from labkit.data.samples import class_colours as class_colours


# The generator itself is plain NumPy in `labkit.data.samples`, so a recipe copied out of labkit
# carries the very classes labkit trains on; labkit's configs add checks naming a bad field.
@dataclass(frozen=True)
class ImageDatasetConfig(PlainImageDatasetConfig):
    __doc__ = PlainImageDatasetConfig.__doc__

    def __post_init__(self) -> None:
        check_int("num_samples", self.num_samples, minimum=1)
        check_int("image_size", self.image_size, minimum=1)
        check_int("channels", self.channels, minimum=1)
        check_int("num_classes", self.num_classes, minimum=2)
        check_float("noise", self.noise, minimum=0.0, maximum=1.0)
        check_float("label_noise", self.label_noise, minimum=0.0, maximum=1.0)
        check_int("seed", self.seed, minimum=0)


@dataclass(frozen=True)
class TokenDatasetConfig(PlainTokenDatasetConfig):
    __doc__ = PlainTokenDatasetConfig.__doc__

    def __post_init__(self) -> None:
        check_int("num_sequences", self.num_sequences, minimum=1)
        check_int("block_size", self.block_size, minimum=1)
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_float("noise", self.noise, minimum=0.0, maximum=1.0)
        check_int("seed", self.seed, minimum=0)


def held_out(dataset: SyntheticImages | SyntheticTokens, count: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` samples from the same source (seed, rule, colours) that a run on `dataset` never
    sees: indices `len(dataset)` to `len(dataset) + count - 1`, as one (inputs, targets) batch."""
    check_int("count", count, minimum=1)
    n = len(dataset)
    if isinstance(dataset, SyntheticTokens):
        longer: SyntheticImages | SyntheticTokens = SyntheticTokens(
            replace(dataset.config, num_sequences=n + count))
    else:
        longer = SyntheticImages(replace(dataset.config, num_samples=n + count))
    return longer.batch(range(n, n + count))


def held_out_batches(model_cfg: ModelConfig, num_samples: int, seed: int, count: int,
                     batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The held-out samples of a run on `for_model(model_cfg, num_samples, seed)` (see
    `held_out`) in batches of `batch`: (inputs, targets) numpy arrays, images as generated (HWC).
    Both engines evaluate these, in this order."""
    inputs, targets = held_out(for_model(model_cfg, num_samples, seed), count)
    for i in range(0, count, batch):
        yield inputs[i:i + batch], targets[i:i + batch]


def heldout_record(mean_loss: float, count: int, model_cfg: ModelConfig) -> dict:
    """A run's `{"heldout": {"loss", "samples", "chance"}}` record, as both engines write it."""
    return {"heldout": {"loss": mean_loss, "samples": count, "chance": chance_loss(model_cfg)}}


def chance_loss(model_cfg: ModelConfig) -> float:
    """The cross-entropy of guessing uniformly: ln(classes), or ln(vocabulary) for GPT."""
    return math.log(model_cfg.vocab_size if isinstance(model_cfg, GPTConfig) else model_cfg.num_classes)


# A tenth of a training image's labels are drawn at random: the best possible held-out loss for
# ten classes is then about 0.50 nats (chance is 2.30), low enough that a smoke run shows learning
# and high enough that a full-size run cannot reach zero, so a tuning study ranks real differences.
TRAINING_LABEL_NOISE = 0.1


def best_possible_loss(model_cfg: ModelConfig) -> float | None:
    """The lowest expected held-out cross-entropy on the images a run trains on: the entropy of
    a label that is the image's class with probability 1 - p + p/k and each other class with
    p/k (p = `TRAINING_LABEL_NOISE`, k classes). None for GPT, whose floor depends on how much
    of the stride rule a model recovers from contexts with random tokens in them."""
    if isinstance(model_cfg, GPTConfig):
        return None
    k, p = model_cfg.num_classes, TRAINING_LABEL_NOISE
    right, wrong = 1.0 - p + p / k, p / k
    return -(right * math.log(right) + (k - 1) * wrong * math.log(wrong))


def source_name(model_cfg: ModelConfig) -> str:
    """What a checkpoint's run fingerprint records as its data (`labkit.core.fingerprint`): the
    generator and, for images, the share of random labels, so a checkpoint trained on other
    samples (an earlier version's clean labels) is never resumed on these."""
    if isinstance(model_cfg, GPTConfig):
        return "synthetic"
    return f"synthetic, label noise {TRAINING_LABEL_NOISE:g}"


def for_model(model_cfg: ModelConfig, num_samples: int, seed: int) -> SyntheticImages | SyntheticTokens:
    """The synthetic dataset a model trains on (images for conv nets, token sequences for GPT),
    the same for both engines; `TrainConfig.num_samples_or_default()` gives a run's count."""
    if isinstance(model_cfg, GPTConfig):
        return SyntheticTokens(TokenDatasetConfig(num_sequences=num_samples, seed=seed,
                                                  block_size=model_cfg.block_size,
                                                  vocab_size=model_cfg.vocab_size))
    return SyntheticImages(ImageDatasetConfig(num_samples=num_samples, seed=seed,
                                              image_size=model_cfg.image_size,
                                              channels=model_cfg.channels,
                                              num_classes=model_cfg.num_classes,
                                              label_noise=TRAINING_LABEL_NOISE))
