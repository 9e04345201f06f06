import hashlib

import numpy as np
import pytest

from labkit.core.models import CNNConfig, GPTConfig, build_config
from labkit.data import ImageDatasetConfig, SyntheticImages, SyntheticTokens, TokenDatasetConfig
from labkit.data.synthetic import (
    TRAINING_LABEL_NOISE,
    best_possible_loss,
    chance_loss,
    class_colours,
    for_model,
    held_out,
    held_out_batches,
    heldout_record,
    source_name,
)


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


def test_a_samples_bytes_do_not_depend_on_the_batch_it_is_drawn_in():
    """Each sample is drawn from its own (seed, index) stream, so a worker's batch, a resumed
    run's or another engine's gives the same bytes; the digests pin the bytes runs and
    checkpoints were made with (a change here changes every loss the course has measured)."""
    images = SyntheticImages(ImageDatasetConfig(num_samples=64, seed=7))
    tokens = SyntheticTokens(TokenDatasetConfig(num_sequences=64, seed=7))
    order = np.random.default_rng(0).permutation(64)[:20]
    x, y = images.batch(order)
    for row, index in enumerate(order):
        assert np.array_equal(x[row], images[index][0]) and y[row] == images[index][1]
    assert np.array_equal(tokens.sequences(order), np.stack([tokens[i] for i in order]))
    x, y = images.batch(range(64))
    assert hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()[:16] == "4365902f09d4cdb1"
    assert hashlib.sha256(tokens.sequences(range(64)).tobytes()).hexdigest()[:16] == "2f61940c3b0eea7b"


def test_label_noise_replaces_a_share_of_labels_and_leaves_the_pixels():
    clean = SyntheticImages(ImageDatasetConfig(num_samples=2000, image_size=2))
    noisy = SyntheticImages(ImageDatasetConfig(num_samples=2000, image_size=2, label_noise=0.3))
    (x_clean, y_clean), (x_noisy, y_noisy) = clean.batch(range(2000)), noisy.batch(range(2000))
    assert np.array_equal(x_clean, x_noisy)
    # A replaced label is drawn from all ten classes, so a tenth of the replacements keep it.
    assert (y_clean != y_noisy).mean() == pytest.approx(0.3 * 0.9, abs=0.03)
    assert np.array_equal(noisy.batch([1500, 7])[1], y_noisy[[1500, 7]])
    with pytest.raises(ValueError, match="label_noise"):
        ImageDatasetConfig(label_noise=1.5)
    # What a run trains on has a floor under its loss: a model cannot drive held-out loss to 0.
    assert for_model(build_config("cnn"), 8, 0).config.label_noise == TRAINING_LABEL_NOISE > 0
    floor = best_possible_loss(build_config("cnn"))
    assert 0.45 < floor < 0.55 < chance_loss(build_config("cnn"))  # 0.500 for ten classes
    # the floor is the loss of predicting the label distribution exactly, measured on samples
    cfg = build_config("cnn")
    x, y = for_model(cfg, 4000, 1).batch(range(4000))
    colours = SyntheticImages(ImageDatasetConfig(num_samples=4000, seed=1, image_size=cfg.image_size,
                                                 num_classes=cfg.num_classes)).batch(range(4000))[1]
    p = TRAINING_LABEL_NOISE
    probs = np.where(y == colours, 1 - p + p / cfg.num_classes, p / cfg.num_classes)
    assert -np.log(probs).mean() == pytest.approx(floor, abs=0.04)
    assert best_possible_loss(build_config("gpt")) is None


def test_images_are_learnable_class_means_differ():
    ds = SyntheticImages(ImageDatasetConfig(num_samples=400, image_size=8, num_classes=2))
    x, y = ds.batch(range(400))
    assert set(y.tolist()) == {0, 1}
    m0, m1 = x[y == 0].mean(axis=0), x[y == 1].mean(axis=0)
    assert np.abs(m0.astype(float) - m1).mean() > 5  # prototypes separate the classes


@pytest.mark.parametrize("classes,channels", [(10, 3), (2, 1), (1000, 3), (27, 3), (28, 3)])
def test_every_class_has_its_own_colour_which_survives_average_pooling(classes, channels):
    cfg = ImageDatasetConfig(num_samples=300, image_size=4, channels=channels, num_classes=classes)
    colours = class_colours(cfg)
    assert colours.shape == (classes, channels) and colours.min() >= 0 and colours.max() <= 1
    assert len({tuple(c) for c in colours.tolist()}) == classes
    if classes == 10:  # an image's mean colour names its class: a pooled conv net can see it
        x, y = SyntheticImages(cfg).batch(range(300))
        means = x.reshape(300, -1, channels).mean(axis=1) / 255.0
        nearest = np.argmin(((means[:, None, :] - (0.5 * colours + 0.25)[None]) ** 2).sum(-1), axis=1)
        assert (nearest == y).mean() > 0.95


def test_held_out_samples_come_after_the_training_ones_and_are_repeatable():
    train = SyntheticImages(ImageDatasetConfig(num_samples=40, image_size=4))
    x, y = held_out(train, 8)
    longer = SyntheticImages(ImageDatasetConfig(num_samples=48, image_size=4))
    expected_x, expected_y = longer.batch(range(40, 48))
    assert np.array_equal(x, expected_x) and np.array_equal(y, expected_y)
    assert not any(np.array_equal(x[0], train[i][0]) for i in range(40))
    tokens = SyntheticTokens(TokenDatasetConfig(num_sequences=10, block_size=8))
    a, b = held_out(tokens, 3)
    assert a.shape == b.shape == (3, 8) and np.array_equal(a, held_out(tokens, 3)[0])
    with pytest.raises(ValueError, match="count"):
        held_out(tokens, 0)


def test_chance_is_the_loss_of_a_uniform_guess():
    assert chance_loss(CNNConfig(num_classes=10)) == pytest.approx(np.log(10))
    assert chance_loss(GPTConfig(vocab_size=512)) == pytest.approx(np.log(512))


def test_tokens_follow_the_stride_rule_with_noise():
    cfg = TokenDatasetConfig(num_sequences=20, block_size=32, vocab_size=100, noise=0.1, seed=1)
    ds = SyntheticTokens(cfg)
    x, y = ds.batch(range(20))
    assert x.shape == y.shape == (20, 32)
    assert np.array_equal(x[:, 1:], y[:, :-1])
    follows = ((x + cfg.stride) % cfg.vocab_size == y).mean()
    assert 0.6 < follows < 1.0
    assert np.array_equal(ds[5], SyntheticTokens(cfg)[5])


def test_held_out_batches_are_the_held_out_samples_in_order():
    """What both engines evaluate: `held_out`'s samples, in micro-batches, the last one short."""
    cfg = build_config("cnn")
    inputs, targets = held_out(for_model(cfg, 64, 3), 10)
    parts = list(held_out_batches(cfg, 64, 3, 10, 4))
    assert [len(y) for _, y in parts] == [4, 4, 2]
    assert np.array_equal(np.concatenate([x for x, _ in parts]), inputs)
    assert np.array_equal(np.concatenate([y for _, y in parts]), targets)
    assert heldout_record(1.5, 10, cfg) == {"heldout": {"loss": 1.5, "samples": 10, "chance": chance_loss(cfg)}}


def test_a_checkpoint_trained_on_other_samples_is_not_resumed_on_these():
    """Images with another share of random labels are other data: the run fingerprint names the
    share, so a checkpoint made on clean labels (an earlier version) is refused, and data can
    never be allowed to change on resume."""
    from labkit.core.fingerprint import Resume, ResumeMismatch, run_fingerprint
    from labkit.core.train_config import TrainConfig

    assert source_name(build_config("cnn")) == f"synthetic, label noise {TRAINING_LABEL_NOISE:g}"
    assert source_name(build_config("gpt")) == "synthetic"  # the tokens did not change
    config = TrainConfig(model="cnn", steps=3, batch_size=8, num_samples=64, device="cpu", progress=False)
    saved = {"fingerprint": run_fingerprint(config, world_size=1, data="synthetic")}
    now = Resume.of(config, world_size=1, data=source_name(build_config("cnn")))
    with pytest.raises(ResumeMismatch, match="data 'synthetic' -> 'synthetic, label noise 0.1'"):
        now.check(saved, "ck")
