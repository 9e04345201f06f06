"""TensorFlow profiling: `tf.profiler` writes the trace TensorBoard's Profile tab reads (an
`.xplane.pb` under `<logdir>/plugins/profile/<run>/`), with each training step marked by a
`tf.profiler.experimental.Trace("train", step_num=...)` range, and labkit's `PhaseTimer` times
the same steps on the host so the breakdown and verdict come out in code, exactly as for torch.

`run_tf_workload` is the TF twin of `labkit.profiling.workload.run_workload`: a Keras MLP fed by
tf.data with the same knobs (batch size, injected per-batch latency, parallel reads, prefetch).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.core.config import check_bool, check_float, check_int
from labkit.profiling.phases import PhaseTimer


@dataclass
class TFWorkloadConfig:
    """`parallel_calls` and `prefetch` are tf.data's knobs (0 = AUTOTUNE for parallel_calls)."""

    batch_size: int = 64
    width: int = 256
    depth: int = 2
    input_latency_ms: float = 0.0
    parallel_calls: int = 1
    prefetch: bool = False
    steps: int = 8

    def __post_init__(self) -> None:
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("width", self.width, minimum=1)
        check_int("depth", self.depth, minimum=1)
        check_float("input_latency_ms", self.input_latency_ms, minimum=0.0)
        check_int("parallel_calls", self.parallel_calls, minimum=0)
        check_bool("prefetch", self.prefetch)
        check_int("steps", self.steps, minimum=1)


@dataclass
class TFProfile:
    logdir: Path
    timer: PhaseTimer

    def trace_files(self) -> list[Path]:
        """The xplane files TensorBoard's profiler plugin reads."""
        return sorted(self.logdir.glob("plugins/profile/*/*.xplane.pb"))


@contextlib.contextmanager
def tf_profile(logdir: str | Path):
    """Profile the enclosed TF code with tf.profiler; yields a TFProfile with a PhaseTimer."""
    import tensorflow as tf

    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    tf.profiler.experimental.start(str(logdir))
    handle = TFProfile(logdir, PhaseTimer())
    try:
        yield handle
    finally:
        tf.profiler.experimental.stop()


def _dataset(cfg: TFWorkloadConfig):
    import numpy as np
    import tensorflow as tf

    def fetch(i):
        if cfg.input_latency_ms:
            time.sleep(cfg.input_latency_ms / 1e3)
        rng = np.random.default_rng(int(i))
        return (rng.standard_normal((cfg.batch_size, cfg.width), dtype=np.float32),
                rng.integers(0, 10, cfg.batch_size).astype(np.int32))

    def load(i):
        x, y = tf.numpy_function(fetch, [i], (tf.float32, tf.int32))
        x.set_shape((cfg.batch_size, cfg.width))
        y.set_shape((cfg.batch_size,))
        return x, y

    calls = tf.data.AUTOTUNE if cfg.parallel_calls == 0 else cfg.parallel_calls
    ds = tf.data.Dataset.range(cfg.steps).map(load, num_parallel_calls=calls, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE) if cfg.prefetch else ds


def run_tf_workload(cfg: TFWorkloadConfig, profile: TFProfile | None = None) -> PhaseTimer:
    """Train a Keras MLP for `cfg.steps` steps; every step is timed in phases (input, forward
    + backward + optimizer as one compiled step) and marked for tf.profiler."""
    import tensorflow as tf

    layers = [tf.keras.layers.Dense(cfg.width, activation="relu") for _ in range(cfg.depth)]
    model = tf.keras.Sequential([tf.keras.Input((cfg.width,)), *layers, tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.SGD(1e-3)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables,
                                strict=True))
        return loss

    timer = profile.timer if profile else PhaseTimer()
    it = iter(_dataset(cfg))
    for step in range(cfg.steps):
        with tf.profiler.experimental.Trace("train", step_num=step, _r=1), timer.step():
            with timer.phase("input"):
                x, y = next(it)
            with timer.phase("forward"):  # forward, backward and update run as one graph
                train_step(x, y).numpy()  # .numpy() waits for the device: honest timing
    return timer
