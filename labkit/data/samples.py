"""The synthetic samples labkit trains on, in plain NumPy: a file that runs without labkit.

Sample `i` is a pure function of (seed, i): it is drawn from its own random stream, never from a
shared one, so any shard, worker or resumed run sees exactly the same bytes for the same index.
The data is learnable (a colour per class for images, a fixed-stride rule for tokens), so a small
model's loss falls well below chance within a few steps, and curves can be compared across
frameworks.

    images = SyntheticImages(ImageDatasetConfig(num_samples=4096, label_noise=0.1, seed=0))
    image, label = images[7]                 # uint8 (32, 32, 3), an int in [0, 10)
    tokens = SyntheticTokens(TokenDatasetConfig(num_sequences=4096, seed=0))
    sequence = tokens[7]                     # int64 (65,): inputs sequence[:-1], targets sequence[1:]

labkit's engines read these same classes (`labkit.data.synthetic` re-exports them, with configs
that check their values); a recipe copied out of labkit carries this file beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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
