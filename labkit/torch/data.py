"""Torch input pipeline over labkit's deterministic synthetic datasets.

One loader item is one micro-batch: the sampler yields index lists and the dataset builds the
whole batch at once (vectorised, one injected latency per batch, the way a remote-storage read or
a decode costs per batch). Indices come from `DistributedSampler` (a seeded permutation per epoch,
`set_epoch`, each rank a disjoint slice), so a run is reproducible and a resumed run starts at an
exact `DataPosition` instead of replaying the epoch. The position counts samples, so a run
resumed with another batch size continues the same order. A dataset of at most
`IN_MEMORY_LIMIT_BYTES` is generated once and its batches taken from memory.

`SampleDataset` is the textbook form of the same data, one sample per index, for
`DataLoader(batch_size=micro, sampler=DistributedSampler(...))`: the recipes train on it, and
it yields exactly the engine's micro-batches. It and `to_float_images` are plain PyTorch in
`labkit.torch.plain` (which a recipe copied out of labkit carries), re-exported here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from labkit.core.models import ModelConfig
from labkit.data import synthetic
from labkit.data.synthetic import SyntheticImages, SyntheticTokens
from labkit.torch.plain import SampleDataset, to_float_images

__all__ = ["BatchDataset", "DataPosition", "IN_MEMORY_LIMIT_BYTES", "ResumableLoader", "SampleDataset",
           "make_dataset", "make_sample_dataset", "source_bytes", "to_float_images"]


@dataclass
class DataPosition:
    """Where the next micro-batch comes from: `epoch`, and how many samples of that epoch's
    order all replicas have taken so far. Counted in samples, not batches, so a run resumed with
    another batch size, world size or accumulation continues exactly where the last one left
    off: no sample lost, none repeated."""

    epoch: int = 0
    sample: int = 0


# A synthetic dataset up to this size is generated once, when the run starts, and held in memory
# (as a real dataset of its size would be read once): a step then takes its batch from memory
# instead of drawing it. Larger ones are drawn batch by batch, in loader workers where asked.
IN_MEMORY_LIMIT_BYTES = 64 * 2**20
_GENERATE_CHUNK = 256  # samples drawn at once while filling the memory copy


def source_bytes(source: SyntheticImages | SyntheticTokens) -> int:
    """Bytes of a dataset's inputs and targets as the engine's tensors hold them."""
    if isinstance(source, SyntheticImages):
        return len(source) * (source.config.image_bytes + 8)
    return len(source) * source.config.block_size * 8 * 2


class BatchDataset(Dataset):
    """`ds[list_of_indices] -> (inputs, targets)` tensors; images as uint8 NCHW. `in_memory`:
    generate every sample once and serve batches from that copy (None: when the dataset is at
    most `IN_MEMORY_LIMIT_BYTES`); the bytes are the same either way, each sample being drawn
    from its own stream."""

    def __init__(self, source: SyntheticImages | SyntheticTokens, latency_s: float = 0.0,
                 in_memory: bool | None = None):
        self.source = source
        self.latency_s = latency_s
        if in_memory is None:
            in_memory = source_bytes(source) <= IN_MEMORY_LIMIT_BYTES
        self.held = self._generate_all() if in_memory else None

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, indices):
        if self.latency_s:
            time.sleep(self.latency_s)  # injected storage / decode latency, once per batch
        if self.held is not None:
            rows = torch.as_tensor(indices, dtype=torch.long)
            return self.held[0][rows], self.held[1][rows]
        return self._tensors(*self.source.batch(indices))

    def _tensors(self, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.source, SyntheticImages):
            # Images stay uint8 (NCHW) until they reach the device: a quarter of the bytes to
            # move between workers and over PCIe; `to_float_images` scales them there.
            xt = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
            return xt, torch.from_numpy(y)
        return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(np.ascontiguousarray(y))

    def _generate_all(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.source)
        parts = [self._tensors(*self.source.batch(range(i, min(i + _GENERATE_CHUNK, n))))
                 for i in range(0, n, _GENERATE_CHUNK)]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


def make_dataset(model_cfg: ModelConfig, num_samples: int, seed: int,
                 latency_s: float = 0.0, in_memory: bool | None = None) -> BatchDataset:
    """The engine's batch-at-a-time dataset for a model config (images for conv nets, tokens
    for GPT); `in_memory` as in `BatchDataset`."""
    return BatchDataset(synthetic.for_model(model_cfg, num_samples, seed), latency_s, in_memory)


def make_sample_dataset(model_cfg: ModelConfig, num_samples: int, seed: int) -> SampleDataset:
    """The same samples one at a time (for a plain `DataLoader` with a sampler)."""
    return SampleDataset(synthetic.for_model(model_cfg, num_samples, seed))


class ResumableLoader:
    """Endless iterator of micro-batches across epochs, resumable from a `DataPosition`.

    An epoch's order is `DistributedSampler`'s seeded permutation (`set_epoch`); replica `r` of
    `R` takes every R-th sample of what is left after the position (r, r+R, ...), the tail that
    does not fill a micro-batch on every replica is dropped. From the start of an epoch that is
    exactly what `DistributedSampler(num_replicas=R, rank=r, drop_last=True)` yields. A step
    takes the next samples of the order whatever the layout, so the position is a sample count.
    A fresh DataLoader is built per epoch, so worker processes and pinned memory follow the
    config, and a restart only needs the position."""

    def __init__(self, dataset: BatchDataset, micro_batch: int, *, world_size: int = 1, rank: int = 0,
                 seed: int = 0, num_workers: int = 0, pin_memory: bool = False,
                 position: DataPosition | None = None):
        self.dataset = dataset
        self.micro_batch = micro_batch
        self.world_size, self.rank = world_size, rank
        # The epoch's whole order: one "replica" sees every sample.
        self.order = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=seed,
                                        drop_last=True)
        if len(dataset) // world_size < micro_batch:
            raise ValueError(f"num_samples={len(dataset)} gives each of {world_size} replica(s) "
                             f"{len(dataset) // world_size} samples, fewer than one micro-batch of "
                             f"{micro_batch}")
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.position = position or DataPosition()
        self._it = None
        self._left = 0

    def rank_indices(self, epoch: int, start: int) -> list[int]:
        """This replica's samples of epoch `epoch` after the first `start` of its order."""
        self.order.set_epoch(epoch)
        rest = list(self.order)[start:]
        usable = len(rest) // self.world_size * self.world_size
        return rest[self.rank:usable:self.world_size]

    def _start_epoch(self) -> None:
        while True:
            mine = self.rank_indices(self.position.epoch, self.position.sample)
            batches = [mine[b * self.micro_batch:(b + 1) * self.micro_batch]
                       for b in range(len(mine) // self.micro_batch)]
            if batches:
                break
            self.position = DataPosition(self.position.epoch + 1, 0)  # resumed in the dropped tail
        loader = DataLoader(self.dataset, sampler=batches, batch_size=None, num_workers=self.num_workers,
                            pin_memory=self.pin_memory, persistent_workers=False,
                            prefetch_factor=4 if self.num_workers else None)
        self._it, self._left = iter(loader), len(batches)

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            self._start_epoch()
        batch = next(self._it)
        self._left -= 1
        self.position = DataPosition(self.position.epoch,
                                     self.position.sample + self.micro_batch * self.world_size)
        if self._left == 0:
            # Roll over now so a checkpoint taken here resumes at the next epoch's first batch.
            self.position = DataPosition(self.position.epoch + 1, 0)
            self._it = None
        return batch
