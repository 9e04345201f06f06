"""tf.data input for the TF engine: the same synthetic samples the torch engine trains on.

Batch semantics are explicit. One optimizer step consumes `global_batch` samples, split into
`grad_accum` micro-steps and, within each, across `num_replicas` replicas:

    per-replica micro-batch = global_batch / (num_replicas * grad_accum)

Sample order is DistributedSampler's recipe: a seeded permutation per epoch, replica `r` of `R`
taking positions r, r+R, r+2R, ... of each global batch (the tail that does not fill a global step
is dropped). Every replica computes its own indices from (seed, epoch, step), so nothing is
communicated and a resumed run starts at exactly the next step. A step's samples are the next
`global_batch` of the epoch's order whatever the layout; a run resumed with another batch size
continues from a `DataOrigin` (the step it resumes at, and the epoch and sample count it had
reached), so no sample is lost or repeated.

Each input pipeline (one per worker) yields, per step and local replica, a tensor of shape
`(grad_accum, micro_batch, ...)`; `tf.distribute` hands consecutive elements to the worker's
replicas in order, which is why the rows are laid out (step, local replica).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labkit.core.config import ParameterError
from labkit.core.models import GPTConfig, ModelConfig
from labkit.data import synthetic


@dataclass(frozen=True)
class BatchLayout:
    """How one global batch is cut: replicas x accumulation micro-steps x micro-batch."""

    global_batch: int
    num_replicas: int
    grad_accum: int

    def __post_init__(self) -> None:
        if self.global_batch % (self.num_replicas * self.grad_accum):
            raise ParameterError(
                "batch_size", self.global_batch,
                f"must be divisible by replicas x grad_accum = {self.num_replicas} x {self.grad_accum}")

    @property
    def micro_batch(self) -> int:
        return self.global_batch // (self.num_replicas * self.grad_accum)


def load_arrays(model_cfg: ModelConfig, num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """All samples in memory: (images uint8 NHWC, labels int32) or (tokens int32, targets int32)."""
    x, y = synthetic.for_model(model_cfg, num_samples, seed).batch(range(num_samples))
    if isinstance(model_cfg, GPTConfig):
        return x.astype(np.int32), y.astype(np.int32)
    return x, y.astype(np.int32)


def arrays_from_shards(model_cfg: ModelConfig, num_samples: int, seed: int,
                       data_dir: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """The same samples as `load_arrays`, but through labkit's TFRecord layer: the synthetic
    dataset is written once as TFRecord shards under `data_dir` (skipped when they exist) and
    read back with the tf.data pipeline (`labkit.data.tf_pipeline`), checking that every
    index arrives exactly once."""
    from labkit.data import ShardConfig, write_image_shards, write_token_shards
    from labkit.data.tf_pipeline import TFPipelineConfig, make_tf_dataset

    gpt = isinstance(model_cfg, GPTConfig)
    kind = "tokens" if gpt else "images"
    shape = (model_cfg.block_size, model_cfg.vocab_size) if gpt else \
        (model_cfg.image_size, model_cfg.channels, model_cfg.num_classes)
    name = f"{kind}-n{num_samples}-s{seed}-" + "x".join(map(str, shape))
    final = Path(data_dir) / name
    if not (final / "data-manifest.json").exists():
        # Workers of one job may race here: each writes a private folder, the first rename wins.
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=_mkdir(data_dir)))
        write = write_token_shards if gpt else write_image_shards
        write(tmp, synthetic.for_model(model_cfg, num_samples, seed), ShardConfig())
        try:
            os.replace(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    paths = sorted(str(p) for p in final.glob("data-*.tfrecord"))
    batch = next(iter(make_tf_dataset(paths, TFPipelineConfig(kind=kind, batch_size=num_samples))))
    index = batch["index"].numpy()
    if not np.array_equal(index, np.arange(num_samples)):
        raise ValueError(f"{final}: shards do not hold samples 0..{num_samples - 1} in order")
    if gpt:
        seqs = batch["tokens"].numpy().astype(np.int32)
        return seqs[:, :-1], seqs[:, 1:]
    return batch["image"].numpy(), batch["label"].numpy().astype(np.int32)


def _mkdir(path) -> str:
    os.makedirs(path, exist_ok=True)
    return os.fspath(path)


@dataclass(frozen=True)
class DataOrigin:
    """Where the samples of step `step` begin: `sample` samples into epoch `epoch`'s order. A
    fresh run's origin is (0, 0, 0); a resumed run's is its first step and the position its
    checkpoint recorded, so it continues the same order whatever its batch size."""

    step: int = 0
    epoch: int = 0
    sample: int = 0

    @classmethod
    def resumed(cls, start: int, saved: dict | None) -> DataOrigin:
        """The origin of a run resumed at step `start` from a checkpoint whose data position is
        `saved` (its epoch and samples taken)."""
        if start and saved:
            return cls(start, int(saved["epoch"]), int(saved["sample"]))
        return cls()


def step_position(step: int, global_batch: int, num_samples: int,
                  origin: DataOrigin = DataOrigin()) -> tuple[int, int]:
    """(epoch, first sample in that epoch's order) of optimizer step `step`: steps take
    consecutive global batches; an epoch ends when the next batch would not fit."""
    per_epoch = num_samples // global_batch
    if per_epoch == 0:
        raise ParameterError("num_samples", num_samples,
                             f"must hold at least one global batch of {global_batch}")
    k = step - origin.step
    first = max(0, num_samples - origin.sample) // global_batch  # steps left in the origin's epoch
    if k < first:
        return origin.epoch, origin.sample + k * global_batch
    k -= first
    return origin.epoch + 1 + k // per_epoch, (k % per_epoch) * global_batch


def replica_indices(step: int, replica: int, layout: BatchLayout, num_samples: int,
                    seed: int, origin: DataOrigin = DataOrigin()) -> np.ndarray:
    """Sample indices replica `replica` trains on in optimizer step `step`: (grad_accum, micro)."""
    epoch, start = step_position(step, layout.global_batch, num_samples, origin)
    order = np.random.default_rng([seed, epoch]).permutation(num_samples)
    chunk = order[start:start + layout.global_batch][replica::layout.num_replicas]
    return chunk.reshape(layout.grad_accum, layout.micro_batch)


def index_table(first_step: int, last_step: int, replicas: range, layout: BatchLayout,
                num_samples: int, seed: int, origin: DataOrigin = DataOrigin()) -> np.ndarray:
    """Rows in the order one pipeline must yield them: (steps * len(replicas), accum, micro)."""
    rows = [replica_indices(s, r, layout, num_samples, seed, origin)
            for s in range(first_step, last_step) for r in replicas]
    return np.stack(rows).astype(np.int32)


def gather_fn(x_all: np.ndarray, y_all: np.ndarray, latency_s: float = 0.0):
    """`indices -> (inputs, targets)` for `Dataset.map`, with an optional injected latency
    (remote storage, decoding) once per element."""
    import tensorflow as tf

    x_t, y_t = tf.constant(x_all), tf.constant(y_all)

    def sleep():
        time.sleep(latency_s)
        return np.int32(0)

    def gather(idx):
        if latency_s:
            # The gather depends on the sleep, so tf.data cannot run it early.
            with tf.control_dependencies([tf.numpy_function(sleep, [], tf.int32)]):
                idx = tf.identity(idx)
        return tf.gather(x_t, idx), tf.gather(y_t, idx)

    return gather


def make_dataset_fn(arrays: tuple[np.ndarray, np.ndarray], layout: BatchLayout, *,
                    first_step: int, last_step: int, seed: int, latency_s: float = 0.0,
                    origin: DataOrigin = DataOrigin()):
    """`fn(input_context) -> tf.data.Dataset` for `strategy.distribute_datasets_from_function`."""
    import tensorflow as tf

    x_all, y_all = arrays
    num_samples = len(x_all)

    def fn(ctx: tf.distribute.InputContext):
        local = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        replicas = range(ctx.input_pipeline_id * local, (ctx.input_pipeline_id + 1) * local)
        table = index_table(first_step, last_step, replicas, layout, num_samples, seed, origin)
        ds = tf.data.Dataset.from_tensor_slices(table).map(gather_fn(x_all, y_all, latency_s))
        options = tf.data.Options()
        # The rows are already this worker's share: tf.distribute must not shard them again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(options).prefetch(2)

    return fn
