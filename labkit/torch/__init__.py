"""PyTorch side of labkit: models built from `labkit.core.models` configs, data adapters, the trainer
(`labkit.torch.trainer`: `Trainer`, its loop and step in one file, `fit`), what a run is built
from (`labkit.torch.engine.build`), its checkpoints
(`labkit.torch.state`), precision modes, the local DDP launcher and memory tools.
This package's own `__init__` imports nothing; its modules import torch, so import them only
when `labkit.core.frameworks.has_torch()` is true (the framework-free layers never do)."""
