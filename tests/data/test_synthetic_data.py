import numpy as np
import pytest

from labkit.data import ImageDatasetConfig, SyntheticImages, SyntheticTokens, TokenDatasetConfig


def test_images_are_a_pure_function_of_seed_and_index():
    cfg = ImageDatasetConfig(num_samples=50, image_size=8, seed=3)
    a, b = SyntheticImages(cfg), SyntheticImages(cfg)
    for i in (0, 17, 49):
        (xa, ya), (xb, yb) = a[i], b[i]
        assert np.array_equal(xa, xb) and ya == yb
    assert a[0][0].shape == (8, 8, 3) and a[0][0].dtype == np.uint8
    other = SyntheticImages(ImageDatasetConfig(num_samples=50, image_size=8, seed=4))
    assert not np.array_equal(a[0][0], other[0][0])
    with pytest.raises(IndexError):
        a[50]


def test_images_are_learnable_class_means_differ():
    ds = SyntheticImages(ImageDatasetConfig(num_samples=400, image_size=8, num_classes=2))
    x, y = ds.batch(range(400))
    assert set(y.tolist()) == {0, 1}
    m0, m1 = x[y == 0].mean(axis=0), x[y == 1].mean(axis=0)
    assert np.abs(m0.astype(float) - m1).mean() > 5  # prototypes separate the classes


def test_tokens_follow_the_stride_rule_with_noise():
    cfg = TokenDatasetConfig(num_sequences=20, block_size=32, vocab_size=100, noise=0.1, seed=1)
    ds = SyntheticTokens(cfg)
    x, y = ds.batch(range(20))
    assert x.shape == y.shape == (20, 32)
    assert np.array_equal(x[:, 1:], y[:, :-1])
    follows = ((x + cfg.stride) % cfg.vocab_size == y).mean()
    assert 0.6 < follows < 1.0
    assert np.array_equal(ds[5], SyntheticTokens(cfg)[5])
