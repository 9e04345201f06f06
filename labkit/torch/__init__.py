"""PyTorch side of labkit: models built from `labkit.core.models` configs, data adapters, the training
engine (`labkit.torch.engine.fit`), precision modes, the local DDP launcher and memory tools.
Importing this package imports torch; the framework-free top level never does."""
