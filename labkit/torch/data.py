"""Torch input pipeline over labkit's deterministic synthetic datasets.

One loader item is one micro-batch: the sampler yields index lists and the dataset builds the
whole batch at once (vectorised, one injected latency per batch, the way a remote-storage read or
a decode costs per batch). Indices come from `DistributedSampler` (a seeded permutation per epoch,
`set_epoch`, each rank a disjoint slice), so a run is reproducible and a resumed run starts at an
exact `DataPosition` instead of replaying the epoch.

`SampleDataset` is the textbook form of the same data, one sample per index, for
`DataLoader(batch_size=micro, sampler=DistributedSampler(...))`: the recipes train on it, and
it yields exactly the engine's micro-batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from labkit.core.models import ModelConfig
from labkit.data import synthetic
from labkit.data.synthetic import SyntheticImages, SyntheticTokens


@dataclass
class DataPosition:
    """Where the next micro-batch comes from: epoch and micro-batch index inside it."""

    epoch: int = 0
    batch: int = 0


class BatchDataset(Dataset):
    """`ds[list_of_indices] -> (inputs, targets)` tensors; images as uint8 NCHW."""

    def __init__(self, source: SyntheticImages | SyntheticTokens, latency_s: float = 0.0):
        self.source = source
        self.latency_s = latency_s

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, indices):
        if self.latency_s:
            time.sleep(self.latency_s)  # injected storage / decode latency, once per batch
        x, y = self.source.batch(indices)
        if isinstance(self.source, SyntheticImages):
            # Images stay uint8 (NCHW) until they reach the device: a quarter of the bytes to
            # move between workers and over PCIe; `to_float_images` scales them there.
            xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
            return xt, torch.from_numpy(y)
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))


class SampleDataset(Dataset):
    """`ds[i] -> (input, target)` tensors, one sample: images uint8 CHW with an int64 label,
    token sequences as (inputs, targets) int64 of `block_size`. Batched by the default collate
    function, it gives the bytes of `BatchDataset` for the same indices."""

    def __init__(self, source: SyntheticImages | SyntheticTokens):
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.source, SyntheticImages):
            image, label = self.source[index]
            return torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))), torch.tensor(label)
        seq = torch.from_numpy(self.source[index])
        return seq[:-1], seq[1:]


class MicroBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches of one epoch, starting at `start_batch`."""

    def __init__(self, sampler: DistributedSampler, micro_batch: int, start_batch: int = 0):
        self.sampler = sampler
        self.micro_batch = micro_batch
        self.start_batch = start_batch

    def __len__(self) -> int:
        return len(self.sampler) // self.micro_batch - self.start_batch

    def __iter__(self):
        indices = list(self.sampler)
        n = len(indices) // self.micro_batch
        for b in range(self.start_batch, n):
            yield indices[b * self.micro_batch:(b + 1) * self.micro_batch]


def make_dataset(model_cfg: ModelConfig, num_samples: int, seed: int,
                 latency_s: float = 0.0) -> BatchDataset:
    """The engine's batch-at-a-time dataset for a model config (images for conv nets, tokens
    for GPT)."""
    return BatchDataset(synthetic.for_model(model_cfg, num_samples, seed), latency_s)


def make_sample_dataset(model_cfg: ModelConfig, num_samples: int, seed: int) -> SampleDataset:
    """The same samples one at a time (for a plain `DataLoader` with a sampler)."""
    return SampleDataset(synthetic.for_model(model_cfg, num_samples, seed))


class ResumableLoader:
    """Endless iterator of micro-batches across epochs, resumable from a `DataPosition`.

    A fresh DataLoader is built per epoch (after `set_epoch`), so worker processes and pinned
    memory follow the config, and a restart only needs the position."""

    def __init__(self, dataset: BatchDataset, micro_batch: int, *, world_size: int = 1, rank: int = 0,
                 seed: int = 0, num_workers: int = 0, pin_memory: bool = False,
                 position: DataPosition | None = None):
        self.dataset = dataset
        self.micro_batch = micro_batch
        self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                          seed=seed, drop_last=True)
        if len(self.sampler) < micro_batch:
            raise ValueError(f"num_samples={len(dataset)} gives each of {world_size} replica(s) "
                             f"{len(self.sampler)} samples, fewer than one micro-batch of {micro_batch}")
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.position = position or DataPosition()
        self._it = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.sampler) // self.micro_batch

    def _start_epoch(self) -> None:
        self.sampler.set_epoch(self.position.epoch)
        batches = MicroBatchSampler(self.sampler, self.micro_batch, self.position.batch)
        loader = DataLoader(self.dataset, sampler=batches, batch_size=None, num_workers=self.num_workers,
                            pin_memory=self.pin_memory, persistent_workers=False,
                            prefetch_factor=4 if self.num_workers else None)
        self._it = iter(loader)

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._start_epoch()
        try:
            batch = next(self._it)
        except StopIteration:
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._start_epoch()
            batch = next(self._it)
        self.position = DataPosition(self.position.epoch, self.position.batch + 1)
        if self.position.batch >= self.batches_per_epoch:
            # Roll over now so a checkpoint taken here resumes at the next epoch's first batch.
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._it = None
        return batch


def to_float_images(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels → float in [0, 1] (on whatever device `x` is)."""
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x
