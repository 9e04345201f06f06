"""One slow worker under synchronous and asynchronous data parallelism: the program every replica
of an emulated Vertex AI job runs, in notebook 02's comparison of MultiWorkerMirrored with
ParameterServerStrategy.

    python -m labkit.tf.straggler --windows 6 --window-s 1 --slow-worker 0 --delay-ms 50 \\
        --out /gcs/BUCKET/straggler.json -- --model cnn --batch-size 64 --lr 0.01

The flags after ``--`` are `labkit train`'s (model, data, optimizer and the GLOBAL batch of one
update). TF_CONFIG decides the strategy, as `labkit.tf.strategy` decides it for `labkit train`:

- with ``ps`` tasks (Vertex's workerpool2), **ParameterServerStrategy**: the chief
  (workerpool0) only coordinates; a `ClusterCoordinator` schedules each update on whichever
  worker (workerpool1) is free; the worker reads the weights from the parameter servers,
  computes the gradient of one whole batch and applies it there, without waiting for the
  others. A version counter on the parameter server counts the updates applied: read before
  the weights and bumped after the update, it gives each update's **staleness**, the updates
  other workers applied between this worker's read of the weights and its own update.
- without, **MultiWorkerMirroredStrategy**: chief and workers each compute on their share of
  the batch and all-reduce the gradients; every update waits for every worker (staleness 0).

**The slow worker.** Time runs in `windows` windows of `window_s` seconds, after a warm-up that
is not counted (graphs traced, the first updates done). Even windows run every worker at full
speed; in odd ones the worker with TF task index `slow_worker` (workerpool1[`slow_worker`]) waits
`delay_ms` in every step, after computing its gradient and before sending it: a straggler. The
wait is an op in the step's graph (`wait_op`), so under ParameterServerStrategy it happens on the
worker that runs the step. The counts of updates per window, interleaved with and without the
straggler, are the measurement: synchronous training waits for it, asynchronous does not.

The chief writes one JSON file (`--out`, a local path or a ``/gcs/`` or ``gs://`` address through
the bucket's mount): the windows (slowed or not, seconds, updates) and every update (loss,
window, and under ParameterServerStrategy the worker that computed it, its staleness and its
version). Workers and parameter servers of a PS job only serve (`serve`), until that file
appears.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from labkit.core.config import ParameterError, check_float, check_int
from labkit.core.gcs import mount_path
from labkit.core.train_config import TrainConfig, from_argv

ASYNC, SYNC = "parameter_server", "multi_worker_mirrored"
# Updates scheduled ahead of the oldest unfinished one: enough that a fast worker always finds
# work while the coordinator waits on the slow worker's update.
MAX_IN_FLIGHT = 32
COUNT_LIMIT = 2**62  # ResourceCountUpTo's ceiling: never reached


@dataclass(frozen=True)
class StragglerConfig:
    """The measurement: `windows` windows of `window_s` s after `warmup_s` s, the odd ones with
    `delay_ms` added to every step of worker `slow_worker` (TF task index in the `worker` job)."""

    windows: int = 6
    window_s: float = 1.0
    warmup_s: float = 0.5
    slow_worker: int = 0
    delay_ms: float = 100.0
    out: str | None = None

    def __post_init__(self) -> None:
        check_int("windows", self.windows, minimum=2)
        check_float("window_s", self.window_s, minimum=0.05)
        check_float("warmup_s", self.warmup_s, minimum=0.0)
        check_int("slow_worker", self.slow_worker, minimum=0)
        check_float("delay_ms", self.delay_ms, minimum=0.0)

    @property
    def delay_us(self) -> int:
        return int(round(self.delay_ms * 1000))

    def slowed(self, window: int) -> bool:
        """Whether the straggler waits in `window` (the odd ones; none in the warm-up, -1)."""
        return window >= 0 and window % 2 == 1

    def argv(self) -> list[str]:
        """This program's own flags for these settings (the `labkit train` ones follow ``--``)."""
        out = ["--windows", str(self.windows), "--window-s", f"{self.window_s:g}",
               "--warmup-s", f"{self.warmup_s:g}", "--slow-worker", str(self.slow_worker),
               "--delay-ms", f"{self.delay_ms:g}"]
        return out + (["--out", self.out] if self.out else [])


def parser() -> argparse.ArgumentParser:
    d = StragglerConfig
    p = argparse.ArgumentParser(prog="python -m labkit.tf.straggler", description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, default=d.windows, help="measured windows (even: all at full speed)")
    p.add_argument("--window-s", type=float, default=d.window_s, help="seconds per window")
    p.add_argument("--warmup-s", type=float, default=d.warmup_s, help="seconds of updates before the first window")
    p.add_argument("--slow-worker", type=int, default=d.slow_worker,
                   help="TF task index of the worker slowed in odd windows (Vertex: workerpool1[i])")
    p.add_argument("--delay-ms", type=float, default=d.delay_ms, help="wait added to each of its steps")
    p.add_argument("--out", default=None, help="the chief's JSON results (path, /gcs/... or gs://...)")
    return p


# ---------------------------------------------------------------- the step, both strategies


def wait_op(delay_us, after):
    """A TensorFlow op that waits `delay_us` microseconds (an int64 scalar tensor) once `after`
    has been computed, and returns a float32 scalar to make later ops depend on. TensorFlow has
    no sleep op of its own: tf.data's SleepDataset (`tf.raw_ops.SleepDataset`,
    https://www.tensorflow.org/api_docs/python/tf/raw_ops/SleepDataset, read 2026-11-29) waits
    before each element it hands out, and runs wherever the graph runs (on the worker that
    executes a scheduled step). It waits before the end of the data too: `take(1)` keeps the
    reduction from asking for a second element, which would wait a second time (measured by
    this module's tests)."""
    import tensorflow as tf

    one = tf.data.Dataset.from_tensors(tf.reduce_sum(tf.cast(after, tf.float32)))
    slept = tf.raw_ops.SleepDataset(input_dataset=tf.data.experimental.to_variant(one), sleep_microseconds=delay_us,
                                    output_types=[tf.float32], output_shapes=[[]])
    return tf.data.experimental.from_variant(slept, one.element_spec).take(1).reduce(
        tf.constant(0.0), lambda a, b: a + b)


def gradients(model, x, y, global_batch: int):
    """(loss, gradients) of this replica's samples, the loss summed over them and divided by the
    labels of the whole update (`global_batch` samples): summed over replicas it is the mean."""
    import keras
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        per_label = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        labels_per_sample = int(y.shape[-1]) if len(y.shape) == 2 else 1  # GPT: one per token
        loss = tf.reduce_sum(per_label) / float(global_batch * labels_per_sample)
    return loss, tape.gradient(loss, model.trainable_variables)


def after_wait(grads, delay_us):
    """`grads`, available only once `wait_op(delay_us)` has run after they were computed."""
    import tensorflow as tf

    waited = wait_op(delay_us, grads[0])
    with tf.control_dependencies([waited]):
        return [tf.identity(g) for g in grads]


def clipped(grads, grad_clip: float | None):
    import tensorflow as tf

    return tf.clip_by_global_norm(grads, grad_clip)[0] if grad_clip else grads


# ---------------------------------------------------------------- asynchronous: parameter servers


def _asynchronous(config: TrainConfig, job: StragglerConfig, strategy, parts, arrays, workers: int) -> dict[str, Any]:
    """The coordinator's part: updates scheduled on whichever worker is free (at most
    `MAX_IN_FLIGHT` ahead of the oldest unfinished one), counted per window on the version
    counter. `ClusterCoordinator.schedule` returns at once; a worker reads the variables from
    the parameter servers, runs the step and updates them there, "independently without
    synchronizing with each other" (https://www.tensorflow.org/api_docs/python/tf/distribute/
    experimental/ParameterServerStrategy, read 2026-11-29)."""
    import tensorflow as tf

    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():  # on the parameter servers
        version = tf.Variable(0, dtype=tf.int64, trainable=False, name="version")
        delay = tf.Variable(0, dtype=tf.int64, trainable=False, name="straggler_delay_us")
    iterator = iter(coordinator.create_per_worker_dataset(_per_worker_batches(config, arrays, workers)))
    ps_step = _ps_step(config, job, strategy, parts, version, delay)
    pending: deque = deque()
    done: list[dict[str, Any]] = []

    def schedule() -> None:
        pending.append(coordinator.schedule(ps_step, args=(iterator,)))
        while len(pending) > MAX_IN_FLIGHT:
            done.append(_fetched(pending.popleft()))

    _warm_up(job.warmup_s, schedule, coordinator.join)
    windows = []
    mark, start = int(version.read_value()), time.perf_counter()
    for w in range(job.windows):
        delay.assign(job.delay_us if job.slowed(w) else 0)  # read by every step that starts from now
        while time.perf_counter() - start < job.window_s:
            schedule()
        end_mark, end = int(version.read_value()), time.perf_counter()  # the next window's start
        windows.append({"index": w, "slowed": job.slowed(w), "seconds": end - start,
                        "updates": end_mark - mark, "first_version": mark})
        mark, start = end_mark, end
    delay.assign(0)
    coordinator.join()
    done += [_fetched(r) for r in pending]
    for u in done:
        u["window"] = _window_of(u["version"], windows)
    done.sort(key=lambda u: u["version"])
    return {"updates": done, "windows": windows, "params": _parameters(parts["model"])}


def _per_worker_batches(config: TrainConfig, arrays, workers: int):
    """The dataset function each worker runs: global batches w, w + workers, ... of
    `batch_table` (worker w's index comes from
    `tf.distribute.coordinator.experimental_get_current_worker_index`, which "may be used within
    [...] a `dataset_fn` that runs via `ClusterCoordinator.create_per_worker_dataset`",
    https://www.tensorflow.org/api_docs/python/tf/distribute/coordinator/experimental_get_current_worker_index,
    read 2026-11-29)."""
    import tensorflow as tf

    x_all, y_all = arrays
    table = batch_table(config, len(x_all))

    def dataset_fn():
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        ds = tf.data.Dataset.from_tensor_slices(table).shard(workers, worker).repeat()
        return ds.map(lambda i: (tf.gather(x_all, i), tf.gather(y_all, i))).prefetch(2)

    return dataset_fn


def _ps_step(config: TrainConfig, job: StragglerConfig, strategy, parts, version, delay):
    """One asynchronous update as a tf.function of the per-worker iterator: read the version,
    compute the gradient, wait if this is the slowed worker and `delay` says so, update, count.
    Returns (loss, worker, staleness, version of this update)."""
    import tensorflow as tf

    model, optimizer = parts["model"], parts["optimizer"]

    def replica_step(x, y):
        seen = version.read_value()  # before any weight is read
        with tf.control_dependencies([seen]):
            loss, grads = gradients(model, x, y, config.batch_size)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        wait = tf.where(worker == job.slow_worker, delay.read_value(), tf.constant(0, tf.int64))
        optimizer.apply(clipped(after_wait(grads, wait), config.grad_clip), model.trainable_variables)
        return (loss, worker, *count_update(version, seen, model.trainable_variables))

    @tf.function
    def ps_step(iterator):
        return strategy.run(replica_step, args=next(iterator))

    return ps_step


def batch_table(config: TrainConfig, num_samples: int, epochs: int = 4):
    """The sample indices of the first `epochs` epochs' global batches, one row per update, in
    `labkit train`'s order (`labkit.tf.data.replica_indices` of one replica); the asynchronous
    workers take its rows in turn, and start again at the top when they run out."""
    import numpy as np

    from labkit.tf.data import BatchLayout, replica_indices

    layout = BatchLayout(config.batch_size, 1, 1)
    rows = epochs * (num_samples // config.batch_size)
    return np.stack([replica_indices(s, 0, layout, num_samples, config.seed)[0] for s in range(rows)])


def count_update(version, seen, written) -> tuple:
    """(staleness, version) of the update just applied to the variables `written`, counted on
    `version`, which read `seen` before the step read any weight. The count is
    `tf.raw_ops.ResourceCountUpTo`, which increments the counter and returns "A copy of the input
    before increment. If nothing else modifies the input, the values produced will all be
    distinct." (https://www.tensorflow.org/api_docs/cc/class/tensorflow/ops/resource-count-up-to,
    read 2026-11-29): one step on the parameter server. `assign_add` would not do: the value it
    returns is read again wherever it is used, by then with other workers' increments in it. The
    count runs after reads of `written` that follow the update (TensorFlow orders the ops on one
    variable as the program wrote them), so after the update."""
    import tensorflow as tf

    after = [v.value.read_value() for v in written]  # Keras variables: their tf.Variable
    with tf.control_dependencies(after):
        before = tf.raw_ops.ResourceCountUpTo(resource=version.handle, limit=COUNT_LIMIT, T=tf.int64)
    return before - seen, before + 1


def _parameters(model) -> int:
    import numpy as np

    return int(sum(np.prod(v.shape) for v in model.trainable_variables))


def _fetched(remote) -> dict[str, Any]:
    loss, worker, staleness, version = remote.fetch()
    return {"loss": float(loss), "staleness": int(staleness), "worker": int(worker), "version": int(version)}


def _window_of(version: int, windows: list[dict[str, Any]]) -> int:
    """The window an update landed in, from its version (the windows' version ranges); -1 for
    the warm-up, len(windows) for updates that finished after the last window."""
    for w in windows:
        if w["first_version"] < version <= w["first_version"] + w["updates"]:
            return w["index"]
    return -1 if not windows or version <= windows[0]["first_version"] else len(windows)


def _warm_up(seconds: float, step, join) -> None:
    """At least two updates (graphs traced everywhere), then more until `seconds` have passed."""
    start = time.perf_counter()
    for _ in range(2):
        step()
    join()
    while time.perf_counter() - start < seconds:
        step()
    join()


# ---------------------------------------------------------------- synchronous: MultiWorkerMirrored


def _synchronous(config: TrainConfig, job: StragglerConfig, strategy, parts, arrays, plan) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf

    from labkit.tf.data import BatchLayout, replica_indices

    model, optimizer = parts["model"], parts["optimizer"]
    replicas = strategy.num_replicas_in_sync
    layout = BatchLayout(config.batch_size, replicas, 1)
    x_all, y_all = arrays
    rank = 0 if plan.task_type == "chief" else plan.task_index + 1  # TF's order: chief, then workers
    is_slow = plan.task_type == "worker" and plan.task_index == job.slow_worker

    def replica_step(x, y, delay_us, claim):
        ctx = tf.distribute.get_replica_context()
        loss, grads = gradients(model, x, y, layout.global_batch)
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, after_wait(grads, delay_us))
        optimizer.apply(clipped(grads, config.grad_clip), model.trainable_variables)
        # The chief's clock rides along: every worker learns the same window (the others send 0).
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.stack([loss, claim]))

    @tf.function
    def train_step(inputs):
        return strategy.experimental_local_results(strategy.run(replica_step, args=inputs))[0]

    clock = _ChiefClock(job, plan.task_type == "chief")
    window, step, done = -1, 0, []
    while window < job.windows:
        idx = replica_indices(step, rank, layout, len(x_all), config.seed)[0]
        delay_us = job.delay_us if is_slow and job.slowed(window) else 0
        values = (x_all[idx], y_all[idx], np.int64(delay_us), np.float32(clock.window()))
        inputs = strategy.experimental_distribute_values_from_function(lambda ctx, v=values: v)
        loss, claimed = (float(t) for t in train_step(inputs))
        window = int(round(claimed))
        done.append({"loss": loss, "window": window, "staleness": 0, "version": step + 1})
        clock.stepped(step)
        step += 1
    counted = [u for u in done if 0 <= u["window"] < job.windows]
    windows = [{"index": w, "slowed": job.slowed(w), "seconds": job.window_s,
                "updates": sum(1 for u in counted if u["window"] == w)} for w in range(job.windows)]
    return {"updates": done, "windows": windows, "params": _parameters(model)}


class _ChiefClock:
    """The chief's window number for the next step: -1 during the warm-up (two steps, then until
    `warmup_s` has passed), then one per `window_s` seconds. Other workers always say 0: their
    sum over the all-reduce is the chief's."""

    def __init__(self, job: StragglerConfig, is_chief: bool):
        self.job, self.is_chief = job, is_chief
        self.begun = time.perf_counter()
        self.zero: float | None = None

    def window(self) -> float:
        if not self.is_chief:
            return 0.0
        if self.zero is None:
            return -1.0
        return float(int((time.perf_counter() - self.zero) // self.job.window_s))

    def stepped(self, step: int) -> None:
        if self.zero is None and step >= 1 and time.perf_counter() - self.begun >= self.job.warmup_s:
            self.zero = time.perf_counter()


# ---------------------------------------------------------------- the program


def run(config: TrainConfig, job: StragglerConfig) -> dict[str, Any] | None:
    """Run this replica's part; the chief's results (None on the other replicas)."""
    from labkit.tf import runtime

    runtime.configure(config.device)
    import tensorflow as tf

    from labkit.tf import strategy as strategies
    from labkit.tf.data import load_arrays
    from labkit.tf.step import build, precision_and_model

    plan = strategies.plan_strategy(local_gpus=len(tf.config.get_visible_devices("GPU")))
    if plan.kind not in (ASYNC, SYNC):
        raise ParameterError("TF_CONFIG", os.environ.get("TF_CONFIG"),
                             "must describe a cluster: a chief and workers, with or without ps tasks")
    if config.precision == "fp16" or config.grad_accum != 1:
        raise ParameterError("precision" if config.precision == "fp16" else "grad_accum",
                             config.precision if config.precision == "fp16" else config.grad_accum,
                             "is not supported here (no loss scaling, one micro-batch per update)")
    if plan.kind == ASYNC and plan.task_type in ("worker", "ps"):
        serve(plan, job.out)
        return None
    strategy = strategies.make_strategy(plan)
    precision, model_cfg = precision_and_model(config)
    arrays = load_arrays(model_cfg, config.num_samples_or_default(), config.seed)
    with strategy.scope():
        parts = build(config, model_cfg, precision, 1 if plan.kind == ASYNC else strategy.num_replicas_in_sync)
    if plan.kind == ASYNC:
        result = _asynchronous(config, job, strategy, parts, arrays, len(plan.tf_config["cluster"]["worker"]))
    else:
        result = _synchronous(config, job, strategy, parts, arrays, plan)
    if not plan.is_chief:
        return None
    cluster = plan.tf_config["cluster"]
    computing = len(cluster.get("worker", [])) + (0 if plan.kind == ASYNC else len(cluster.get("chief", [])))
    return {"strategy": plan.kind, "straggler": asdict(job), "config": asdict(config),
            "workers_computing": computing, "parameter_servers": len(cluster.get("ps", [])), **result}


def serve(plan, done_file: str | None, poll_s: float = 0.2) -> None:
    """A worker or parameter server of a PS job: run this task's TensorFlow server until the
    chief's results file exists (then return), or for ever without one. (On Vertex AI the job
    ends when the primary replica exits and the service stops the rest; returning at once saves
    the emulated job that wait.)"""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=plan.task_type,
                                  task_index=plan.task_index, protocol="grpc", start=True)
    if done_file is None:
        server.join()
    path, started = mount_path(done_file), time.time()
    while not (os.path.exists(path) and os.path.getmtime(path) >= started - 1.0):  # not an old run's
        time.sleep(poll_s)


def write(result: dict[str, Any], out: str) -> None:
    """The results, whole or not at all (a file renamed over `out`: the serving tasks take its
    appearance as the end of the job)."""
    path = mount_path(out)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, train = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser().parse_args(ours)
    try:
        job = StragglerConfig(windows=args.windows, window_s=args.window_s, warmup_s=args.warmup_s,
                              slow_worker=args.slow_worker, delay_ms=args.delay_ms, out=args.out)
        config = from_argv(train)
        result = run(config, job)
    except ParameterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result is not None:
        summary = ", ".join(f"{'slowed' if w['slowed'] else 'full speed'} {w['updates']}" for w in result["windows"])
        print(f"{result['strategy']}: updates per window: {summary}", flush=True)
        if job.out:
            write(result, job.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
