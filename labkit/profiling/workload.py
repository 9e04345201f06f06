"""Small, real training loops to profile: a model, a DataLoader with a tunable input pipeline,
and the step marked in phases. They let the course build runs that are input-bound, compute-bound
(big matmuls) or launch-bound (tiny batches of a deep, narrow net) on any machine, and show that
the profiler's verdict follows the settings, not the hardware.

Two kinds of slow input, which loader workers fix differently:

- **injected latency** (`input_latency_ms`): the loader sleeps per batch. It stands for waiting
  (remote storage, a network round trip) and uses no CPU, so workers hide it even when there
  are more workers than cores;
- **real decoding** (`decode="jpeg"` or `"png"`): every sample is an encoded image that Pillow
  decodes in the loader. That is CPU work, so workers help only up to the cores there are to
  run them (and the training step needs a core too).

The knobs mirror `labkit.core.train_config.TrainConfig` (`batch_size`, `num_workers`, `pin_memory`,
`input_latency_ms`) so a fix found here is the same setting in `labkit train`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from labkit.core.config import check_bool, check_choice, check_float, check_int
from labkit.core.placement import DEVICES, place_here

SHAPES = ("mlp", "deep_narrow")
DECODERS = ("none", "jpeg", "png")


@dataclass
class WorkloadConfig:
    """One profiled run. `input_latency_ms` is slept per batch in the loader (injected waiting, no
    CPU); `decode` makes every sample an encoded `image_size`² RGB image decoded with Pillow in
    the loader (CPU work); `num_workers` loader processes take either off the training process;
    `prefetch_factor` batches per worker."""

    shape: str = "mlp"
    batch_size: int = 64
    width: int = 512
    depth: int = 4
    num_workers: int = 0
    prefetch_factor: int = 2
    pin_memory: bool = False
    input_latency_ms: float = 0.0
    decode: str = "none"
    image_size: int = 96
    steps: int = 8
    device: str = "auto"
    threads: int = 1  # torch intra-op threads (0 = torch default); 1 keeps small runs steady on shared CPUs
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("shape", self.shape, SHAPES)
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("width", self.width, minimum=1)
        check_int("depth", self.depth, minimum=1)
        check_int("num_workers", self.num_workers, minimum=0)
        check_int("prefetch_factor", self.prefetch_factor, minimum=1)
        check_bool("pin_memory", self.pin_memory)
        check_float("input_latency_ms", self.input_latency_ms, minimum=0.0)
        check_choice("decode", self.decode, DECODERS)
        check_int("image_size", self.image_size, minimum=8)
        check_int("steps", self.steps, minimum=1)
        check_choice("device", self.device, DEVICES)
        check_int("threads", self.threads, minimum=0)


class _SlowDataset:
    """Deterministic random features and labels; each batch costs `latency_ms` to 'fetch'."""

    def __init__(self, n: int, width: int, batch_size: int, latency_ms: float, seed: int):
        self.n, self.width, self.batch_size, self.latency_ms, self.seed = n, width, batch_size, latency_ms, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        if self.latency_ms:
            time.sleep(self.latency_ms / 1e3)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x = torch.randn(self.batch_size, self.width, generator=g)
        y = torch.randint(0, 10, (self.batch_size,), generator=g)
        return x, y


ENCODED_POOL = 16  # distinct encoded images; samples cycle through them


def encoded_images(kind: str, size: int, count: int = ENCODED_POOL, seed: int = 0) -> list[bytes]:
    """`count` smooth random RGB images of `size`², encoded as JPEG (quality 90) or PNG: what a
    folder of photos holds, small enough to keep in memory."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        coarse = rng.integers(0, 256, (max(2, size // 8), max(2, size // 8), 3), dtype=np.uint8)
        img = Image.fromarray(coarse).resize((size, size), Image.BILINEAR)  # photo-like gradients
        buf = io.BytesIO()
        img.save(buf, format="JPEG" if kind == "jpeg" else "PNG", **({"quality": 90} if kind == "jpeg" else {}))
        out.append(buf.getvalue())
    return out


class _DecodeDataset:
    """Whole batches of encoded images, decoded with Pillow when the batch is fetched: the pixels,
    averaged over colour and pooled to `width` features, and a label per image."""

    def __init__(self, n: int, width: int, batch_size: int, kind: str, size: int, seed: int):
        self.n, self.width, self.batch_size, self.seed = n, width, batch_size, seed
        self.images = encoded_images(kind, size, seed=seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import io

        import numpy as np
        import torch
        from PIL import Image

        first = i * self.batch_size
        pixels = np.stack([np.asarray(Image.open(io.BytesIO(self.images[(first + k) % len(self.images)])).convert("RGB"))
                           for k in range(self.batch_size)])
        x = torch.from_numpy(pixels).float().mean(dim=3).flatten(1) / 255.0
        x = torch.nn.functional.adaptive_avg_pool1d(x.unsqueeze(1), self.width).squeeze(1)
        y = torch.arange(first, first + self.batch_size) % 10
        return x, y


def build_model(cfg: WorkloadConfig):
    import torch.nn as nn

    width = cfg.width if cfg.shape == "mlp" else min(cfg.width, 32)
    depth = cfg.depth if cfg.shape == "mlp" else max(cfg.depth, 24)
    layers: list = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers), width


def make_loader(cfg: WorkloadConfig, width: int, n_batches: int):
    from torch.utils.data import DataLoader

    # The dataset yields whole batches (batch_size=None): one latency per batch, like a shard read.
    if cfg.decode != "none":
        ds = _DecodeDataset(n_batches, width, cfg.batch_size, cfg.decode, cfg.image_size, cfg.seed)
    else:
        ds = _SlowDataset(n_batches, width, cfg.batch_size, cfg.input_latency_ms, cfg.seed)
    kwargs = {"prefetch_factor": cfg.prefetch_factor, "persistent_workers": False} if cfg.num_workers else {}
    return DataLoader(ds, batch_size=None, shuffle=False, num_workers=cfg.num_workers,
                      pin_memory=cfg.pin_memory, **kwargs)


def run_workload(cfg: WorkloadConfig, on_step=None) -> dict[str, float]:
    """Train for `cfg.steps` steps, calling `on_step()` after each; returns timing figures."""
    import torch

    from labkit.profiling.phases import phase

    device = place_here(device=cfg.device).device  # "cuda" without a GPU: a ParameterError naming device
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model, width = build_model(cfg)
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = make_loader(cfg, width, cfg.steps)
    it = iter(loader)
    t0 = time.perf_counter()
    for _ in range(cfg.steps):
        x, y = next(it)  # torch marks this as enumerate(DataLoader)...: input time
        with phase("h2d"):
            x = x.to(device, non_blocking=cfg.pin_memory)
            y = y.to(device, non_blocking=cfg.pin_memory)
        with phase("forward"):
            loss = loss_fn(model(x), y)
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return {"steps": cfg.steps, "seconds": seconds, "samples_per_s": cfg.steps * cfg.batch_size / seconds,
            "final_loss": float(loss.detach())}
