"""labkit's data layer: deterministic synthetic datasets (framework-free) and, built on them,
TFRecord shards read by tf.data and by PyTorch."""

from labkit.data.synthetic import (
    ImageDatasetConfig,
    SyntheticImages,
    SyntheticTokens,
    TokenDatasetConfig,
)

__all__ = ["ImageDatasetConfig", "SyntheticImages", "SyntheticTokens", "TokenDatasetConfig"]
