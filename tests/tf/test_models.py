"""The TF twins have the torch models' architecture: same parameter counts, same outputs' shapes."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.core.models import CNNConfig, GPTConfig, ResNetConfig, build_config
from labkit.tf.models import build_model, count_parameters


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    """TensorFlow, imported when this module's first test runs rather than at collection."""
    global tf
    tf = pytest.importorskip("tensorflow")


SMALL_CONFIGS = [
    CNNConfig(),
    CNNConfig(width=8, depth=3, num_classes=7),
    ResNetConfig(),
    ResNetConfig(width=8, layers=(1, 2, 1, 1), bottleneck=True),
    ResNetConfig(width=8, image_size=64, imagenet_stem=True),
    GPTConfig(),
    GPTConfig(vocab_size=100, block_size=16, n_layer=1, n_head=4, n_embd=32, bias=True),
]


def _cnn_count(c: CNNConfig) -> int:
    total, c_in = 0, c.channels
    for i in range(c.depth):
        c_out = c.width * 2**i
        total += c_in * c_out * 9 + c_out
        c_in = c_out
    return total + c_in * c.num_classes + c.num_classes


@pytest.mark.slow
def test_known_parameter_counts():
    # torchvision's ResNet-50 and the 124M GPT-2 (vocab 50304, tied head, no biases).
    assert count_parameters(build_model(ResNetConfig.resnet50())) == 25_557_032
    assert count_parameters(build_model(GPTConfig.gpt2_small())) == 124_373_760
    for c in SMALL_CONFIGS[:2]:
        assert count_parameters(build_model(c)) == _cnn_count(c)


@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=lambda c: repr(c)[:60])
def test_equal_parameter_counts_with_torch_twin(config):
    torch_models = pytest.importorskip("labkit.torch.models", reason="the torch engine is not here")
    torch_count = torch_models.count_parameters(torch_models.build_model(config))
    assert count_parameters(build_model(config)) == torch_count, type(config).__name__


@pytest.mark.parametrize("name", ["cnn", "resnet", "gpt"])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_forward_shapes_and_float32_logits(name, policy):
    config = build_config(name, "smoke")
    model = build_model(config, dtype=policy)
    if isinstance(config, GPTConfig):
        x = np.zeros((2, config.block_size), np.int32)
        expected = (2, config.block_size, config.vocab_size)
    else:
        x = np.zeros((2, config.image_size, config.image_size, config.channels), np.uint8)
        expected = (2, config.num_classes)
    out = model(x)
    assert tuple(out.shape) == expected
    assert out.dtype == tf.float32  # the loss is always computed in float32
    if policy == "mixed_bfloat16":
        assert any(layer.compute_dtype == "bfloat16" for layer in model.layers)


def test_same_seed_same_weights():
    a = build_model(CNNConfig(), seed=3).get_weights()
    b = build_model(CNNConfig(), seed=3).get_weights()
    c = build_model(CNNConfig(), seed=4).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
