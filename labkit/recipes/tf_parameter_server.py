"""Asynchronous data parallelism with parameter servers: TF_CONFIG with `ps` tasks,
ParameterServerStrategy, a ClusterCoordinator that runs each step on whichever worker is free,
and a version counter that measures how stale each update is.

    # one process per task, each with its own TF_CONFIG (Vertex AI sets it in multi-replica jobs:
    # workerpool0 is the chief, workerpool1 the workers, workerpool2 the parameter servers)
    TF_CONFIG='{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:2222"]},
                "task": {"type": "worker", "index": 0}}' \
        python -m labkit.recipes.tf_parameter_server --model cnn --steps 40 --batch-size 32

The variables live on the parameter servers (`ps` tasks). The workers and parameter servers only
run a TensorFlow server; the chief (the coordinator) builds the model and schedules steps, and
each step runs on one worker: it reads the weights from the parameter servers, computes the
gradient of one whole batch (`--batch-size`) and applies it there, without waiting for the
other workers. That is what makes it asynchronous: between a worker's read of the weights and
its update, other workers may have applied theirs. A counter on the parameter server says how
many: each step's **staleness** (0 in synchronous training, and here with one worker).

Without TF_CONFIG the same code starts the whole cluster inside this process (`--workers`
worker servers and `--ps` parameter servers, as TensorFlow's parameter-server tutorial does), so
it runs on one machine as it is.
"""

from __future__ import annotations

import json
import os
import socket

import keras
import tensorflow as tf

from labkit.recipes import common

COUNT_LIMIT = 2**62  # the version counter's ceiling (ResourceCountUpTo's `limit`): never reached


def cluster_resolver(args):
    """This task's view of the cluster, from TF_CONFIG; without it, a cluster of in-process
    servers. Returns (resolver, task type)."""
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if tf_config:
        # Vertex AI may name the primary replica "master" in TF_CONFIG; TensorFlow only knows "chief".
        if "master" in tf_config["cluster"]:
            tf_config["cluster"]["chief"] = tf_config["cluster"].pop("master")
            if tf_config["task"]["type"] == "master":
                tf_config["task"]["type"] = "chief"
            os.environ["TF_CONFIG"] = json.dumps(tf_config)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return resolver, resolver.task_type
    ports = []
    for _ in range(args.workers + args.ps):
        with socket.socket() as s:  # a free port for each server
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cluster = tf.train.ClusterSpec({"worker": [f"127.0.0.1:{p}" for p in ports[:args.workers]],
                                    "ps": [f"127.0.0.1:{p}" for p in ports[args.workers:]]})
    # A worker runs the steps it is sent on its inter-op threads: it needs more than one.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=args.workers + 1)
    for job, count in (("worker", args.workers), ("ps", args.ps)):
        for i in range(count):
            tf.distribute.Server(cluster, job_name=job, task_index=i, config=config, protocol="grpc")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc"), "chief"


def main(argv: list[str] | None = None) -> common.StepLog | None:
    p = common.parser(__doc__)
    p.add_argument("--workers", type=int, default=2, help="without TF_CONFIG: worker servers to start")
    p.add_argument("--ps", type=int, default=1, help="without TF_CONFIG: parameter servers to start")
    args = common.parse(p, argv)
    if args.device == "cpu":  # before any server starts: TensorFlow takes every GPU it sees
        tf.config.set_visible_devices([], "GPU")
    resolver, task_type = cluster_resolver(args)
    if task_type in ("worker", "ps"):
        # Workers and parameter servers serve the chief until the job ends (Vertex AI stops them
        # once the chief has exited).
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=task_type,
                                      task_index=resolver.task_id, protocol="grpc", start=True)
        server.join()
        return None

    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    tf.config.experimental.enable_tensor_float_32_execution(False)  # fp32, as labkit train
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    with strategy.scope():  # variables created here are placed on the parameter servers
        model = common.tf_model(args)
        optimizer = common.keras_adamw(model, args)
        optimizer.build(model.trainable_variables)
        version = tf.Variable(0, dtype=tf.int64, trainable=False)  # updates applied so far

    x_all, y_all = common.tf_data(args)
    # labkit train's global batches in order; worker w takes batches w, w + workers, ...
    batches = common.tf_sample_order(args).reshape(-1, args.batch_size)

    def dataset_fn():
        # Runs on every worker; each one reads its own share of the batches.
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        ds = tf.data.Dataset.from_tensor_slices(batches).shard(workers, worker).repeat()
        return ds.map(lambda i: (tf.gather(x_all, i), tf.gather(y_all, i))).prefetch(2)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    predictions = args.batch_size * common.tokens_per_sample(args)  # labels per batch

    def replica_step(x, y):
        seen = version.read_value()  # the version of the weights this step is about to read
        with tf.control_dependencies([seen]):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per_label = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                loss = tf.nn.compute_average_loss(per_label, global_batch_size=predictions)
            grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)  # on the parameter servers, at once
        # Then count the update: ResourceCountUpTo adds 1 and returns the value before, in one
        # step (an assign_add and a later read could see another worker's update in between).
        # Reading the variables back first puts the count after the update.
        with tf.control_dependencies([v.value.read_value() for v in model.trainable_variables]):
            before = tf.raw_ops.ResourceCountUpTo(resource=version.handle, limit=COUNT_LIMIT, T=tf.int64)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return loss, before - seen, before + 1, worker  # staleness: updates applied meanwhile

    @tf.function
    def train_step(iterator):
        return strategy.run(replica_step, args=next(iterator))

    # schedule() returns at once; the coordinator hands each step to the next free worker.
    results = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(args.steps)]
    coordinator.join()
    log = common.StepLog("tf_parameter_server", args, framework="tf", asynchronous=True,
                         workers=workers, parameter_servers=len(resolver.cluster_spec().as_dict()["ps"]))
    fetched = [r.fetch() for r in results]  # (loss, staleness, version, worker) of each step
    for step, (loss, staleness, _, worker) in enumerate(sorted(fetched, key=lambda u: int(u[2]))):
        # in the order the updates were applied
        log.log(step, float(loss), staleness=int(staleness), worker=int(worker))
        print(f"step {step} loss {float(loss):.4f} worker {worker} staleness {staleness}", flush=True)
    log.write()
    return log


if __name__ == "__main__":
    main()
