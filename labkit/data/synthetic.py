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


@dataclass(frozen=True)
class ImageDatasetConfig:
    """`num_samples` images of `image_size`² × `channels` uint8 pixels (HWC) with labels in
    [0, num_classes). Each image is its class's colour blended with per-sample noise (`noise`
    is the noise's share of every pixel); with probability `label_noise` its label is replaced by
    one drawn uniformly (the pixels stay the colour's), which sets a floor under the best
    achievable loss."""

    num_samples: int = 1024
    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    noise: float = 0.5
    label_noise: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_samples", self.num_samples, minimum=1)
        check_int("image_size", self.image_size, minimum=1)
        check_int("channels", self.channels, minimum=1)
        check_int("num_classes", self.num_classes, minimum=2)
        check_float("noise", self.noise, minimum=0.0, maximum=1.0)
        check_float("label_noise", self.label_noise, minimum=0.0, maximum=1.0)
        check_int("seed", self.seed, minimum=0)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, self.channels)

    @property
    def image_bytes(self) -> int:
        return self.image_size * self.image_size * self.channels


def class_colours(config: ImageDatasetConfig) -> np.ndarray:
    """(num_classes, channels) colours in [0, 1], all different: points of an evenly spaced grid
    (levels 0, 0.5, 1 per channel for ten RGB classes), in an order drawn from the seed.

    A colour survives any conv net's global average pooling, so even a two-block CNN separates
    the classes within ten steps; random-texture prototypes (one per class) do not: their
    pooled features are the same for every class, and a small model stays at chance."""
    levels = max(2, math.ceil(config.num_classes ** (1.0 / config.channels) - 1e-9))
    grid = np.stack(np.meshgrid(*[np.linspace(0.0, 1.0, levels)] * config.channels, indexing="ij"), axis=-1)
    grid = grid.reshape(-1, config.channels)
    order = np.random.default_rng([config.seed, 0x5EED]).permutation(len(grid))[:config.num_classes]
    return grid[order].astype(np.float32)


class SyntheticImages:
    """Indexable image dataset: `ds[i] -> (uint8 HWC array, int label)`."""

    def __init__(self, config: ImageDatasetConfig):
        self.config = config
        self._prototypes = class_colours(config)[:, None, None, :] * np.ones(config.image_shape, np.float32)

    def __len__(self) -> int:
        return self.config.num_samples

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        images, labels = self.batch([index])
        return images[0], int(labels[0])

    def batch(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Stack samples: (N, H, W, C) uint8 images and (N,) int64 labels. A sample's random
        draws come from its own stream, seeded by (seed, index), so any subset, order, worker
        or resumed run gets the same bytes; the arithmetic after the draws runs once a batch."""
        c = self.config
        indices = [_checked(int(i), c.num_samples, "sample") for i in indices]
        colours = np.empty(len(indices), np.int64)
        noise = np.empty((len(indices), *c.image_shape), np.float32)
        flips, drawn = np.ones(len(indices)), np.zeros(len(indices), np.int64)  # 1.0: kept
        for row, index in enumerate(indices):
            rng = np.random.default_rng([c.seed, index])
            colours[row] = rng.integers(c.num_classes)
            rng.random(dtype=np.float32, out=noise[row])
            if c.label_noise:  # drawn after the pixels, which stay the same for any label_noise
                flips[row], drawn[row] = rng.random(), rng.integers(c.num_classes)
        labels = np.where(flips < c.label_noise, drawn, colours)
        # (1 - noise) * prototype + noise * uniform, in place: a batch's float temporaries are
        # large enough that each new one costs page faults.
        noise *= c.noise
        pixels = self._prototypes[colours]
        pixels *= 1.0 - c.noise
        pixels += noise
        pixels *= 255.0
        return pixels.astype(np.uint8), labels


def _checked(index: int, count: int, what: str) -> int:
    if not 0 <= index < count:
        raise IndexError(f"{what} {index} out of range [0, {count})")
    return index


@dataclass(frozen=True)
class TokenDatasetConfig:
    """`num_sequences` token sequences of `block_size + 1` ids in [0, vocab_size): each next
    token is the previous plus a fixed stride (mod vocab), replaced by a random token with
    probability `noise`. Inputs are `seq[:-1]`, targets `seq[1:]`."""

    num_sequences: int = 256
    block_size: int = 64
    vocab_size: int = 512
    noise: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        check_int("num_sequences", self.num_sequences, minimum=1)
        check_int("block_size", self.block_size, minimum=1)
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_float("noise", self.noise, minimum=0.0, maximum=1.0)
        check_int("seed", self.seed, minimum=0)

    @property
    def stride(self) -> int:
        return 1 + self.seed % max(1, self.vocab_size - 1)


class SyntheticTokens:
    """Indexable token dataset: `ds[i] -> int64 array of block_size + 1 token ids`."""

    def __init__(self, config: TokenDatasetConfig):
        self.config = config

    def __len__(self) -> int:
        return self.config.num_sequences

    def __getitem__(self, index: int) -> np.ndarray:
        return self.sequences([index])[0]

    def sequences(self, indices) -> np.ndarray:
        """(N, block_size + 1) int64 token ids. A sequence's random draws (its first token, which
        positions are noise, the noise tokens) come from its own stream, seeded by (seed,
        index); the arithmetic after the draws runs once a batch."""
        c = self.config
        indices = [_checked(int(i), c.num_sequences, "sequence") for i in indices]
        length = c.block_size + 1
        starts = np.empty(len(indices), np.int64)
        uniforms = np.empty((len(indices), length))
        replaced = np.empty((len(indices), length), bool)
        noise_tokens = [np.empty(0, np.int64)]
        for row, index in enumerate(indices):
            rng = np.random.default_rng([c.seed, index])
            starts[row] = rng.integers(c.vocab_size)
            rng.random(out=uniforms[row])
            np.less(uniforms[row], c.noise, out=replaced[row])
            noise_tokens.append(rng.integers(c.vocab_size, size=int(np.count_nonzero(replaced[row]))))
        seqs = (starts[:, None] + c.stride * np.arange(length, dtype=np.int64)) % c.vocab_size
        seqs[replaced] = np.concatenate(noise_tokens)  # row by row, as they were drawn
        return seqs

    def batch(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), each (N, block_size) int64."""
        seqs = self.sequences(indices)
        return seqs[:, :-1], seqs[:, 1:]


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
