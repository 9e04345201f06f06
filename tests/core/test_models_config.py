import pytest

from labkit.core.config import ParameterError
from labkit.core.models import CNNConfig, GPTConfig, ResNetConfig, build_config


def test_presets():
    g = GPTConfig.gpt2_small()
    assert (g.n_layer, g.n_head, g.n_embd, g.block_size, g.vocab_size) == (12, 12, 768, 1024, 50304)
    r = ResNetConfig.resnet50()
    assert r.layers == (3, 4, 6, 3) and r.bottleneck and r.image_size == 224
    assert isinstance(build_config("cnn", "smoke"), CNNConfig)
    assert build_config("gpt", "full") == g


def test_bad_model_configs_name_the_field():
    with pytest.raises(ParameterError, match="'n_embd' must be divisible by n_head=3"):
        GPTConfig(n_embd=64, n_head=3)
    with pytest.raises(ParameterError, match="'layers'"):
        ResNetConfig(layers=(1, 1, 1))
    with pytest.raises(ParameterError, match="'model' must be one of"):
        build_config("vit")
