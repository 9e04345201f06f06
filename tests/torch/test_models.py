"""Torch models built from labkit.core.models configs: sizes of the reference models, the
framework-free FLOP counts used for MFU against MACs counted on the real modules, and the options (channels_last, activation checkpointing) change nothing numerically."""

from __future__ import annotations

import pytest

from labkit.core.models import (
    CNNConfig,
    GPTConfig,
    ResNetConfig,
    flops_per_sample,
    forward_macs,
)


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch, build_model, count_parameters
    torch = pytest.importorskip("torch")
    from labkit.torch.models import build_model, count_parameters


def test_resnet50_matches_torchvision_parameter_count():
    with torch.device("meta"):
        model = build_model(ResNetConfig.resnet50())
    assert count_parameters(model) == 25_557_032  # torchvision.models.resnet50()


def test_gpt2_small_size_and_flops_per_token():
    cfg = GPTConfig.gpt2_small()
    with torch.device("meta"):
        model = build_model(cfg)
    assert count_parameters(model) == pytest.approx(124.34e6, rel=2e-3)  # 123.55M + position embeddings
    per_token = flops_per_sample(cfg) / cfg.block_size
    assert per_token == pytest.approx(0.8548e9, rel=2e-3)  # 6·N + attention FLOPs per token of GPT-2 small


def test_resnet50_flops_per_image():
    assert flops_per_sample(ResNetConfig.resnet50()) == pytest.approx(24.3e9, rel=0.03)


@pytest.mark.parametrize("cfg", [
    CNNConfig(), CNNConfig(image_size=33, width=8, depth=3), ResNetConfig(),
    ResNetConfig(image_size=33, width=8, bottleneck=True),
    ResNetConfig(image_size=65, width=8, layers=(2, 1, 2, 1), imagenet_stem=True),
], ids=["cnn", "cnn-odd", "resnet", "resnet-bottleneck", "resnet-imagenet-stem"])
def test_the_formula_counts_what_the_modules_compute(cfg):
    """The framework-free MAC count equals the MACs of every Conv2d and Linear of the torch twin,
    counted on its outputs in a real forward pass."""
    model, total = build_model(cfg), [0]

    def count(m, inputs, out):
        per_output = m.in_features if isinstance(m, torch.nn.Linear) else \
            m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
        total[0] += out.numel() * per_output

    for m in model.modules():
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            m.register_forward_hook(count)
    with torch.no_grad():
        model(torch.zeros(1, cfg.channels, cfg.image_size, cfg.image_size))
    assert forward_macs(cfg) == total[0]


@pytest.mark.parametrize("cfg", [CNNConfig(), ResNetConfig(), GPTConfig()], ids=["cnn", "resnet", "gpt"])
def test_forward_shapes(cfg):
    model = build_model(cfg)
    if isinstance(cfg, GPTConfig):
        out = model(torch.randint(cfg.vocab_size, (2, cfg.block_size)))
        assert out.shape == (2, cfg.block_size, cfg.vocab_size)
    else:
        out = model(torch.rand(2, cfg.channels, cfg.image_size, cfg.image_size))
        assert out.shape == (2, cfg.num_classes)


@pytest.mark.parametrize("cfg", [CNNConfig(), GPTConfig()], ids=["cnn", "gpt"])
def test_activation_checkpointing_gives_the_same_gradients(cfg):
    torch.manual_seed(0)
    plain = build_model(cfg)
    ckpt = build_model(cfg, activation_checkpointing=True)
    ckpt.load_state_dict(plain.state_dict())
    x = (torch.randint(cfg.vocab_size, (2, cfg.block_size)) if isinstance(cfg, GPTConfig)
         else torch.rand(2, cfg.channels, cfg.image_size, cfg.image_size))
    for m in (plain, ckpt):
        m(x).float().square().mean().backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_channels_last_changes_layout_not_results():
    torch.manual_seed(0)
    model = build_model(ResNetConfig()).eval()
    x = torch.rand(2, 3, 32, 32)
    ref = model(x)
    model = model.to(memory_format=torch.channels_last)
    out = model(x.contiguous(memory_format=torch.channels_last))
    assert torch.allclose(ref, out, atol=1e-5)
