"""Train a small classifier with TensorFlow's MultiWorkerMirroredStrategy, the way a Vertex AI
custom job runs it: every replica reads TF_CONFIG (set by Vertex on multi-replica jobs), trains
its share of each global batch, and the gradients are all-reduced.

Outputs go straight to Cloud Storage through TensorFlow's own gs:// file system: TensorBoard
summaries to AIP_TENSORBOARD_LOG_DIR, a checkpoint per epoch to AIP_CHECKPOINT_DIR (a restarted
job resumes from it), the SavedModel to AIP_MODEL_DIR. Only the chief writes to those folders;
the other workers write their copies to a temporary folder, as every worker must save. On
SIGTERM (a Spot preemption) every worker stops after the epoch it is in, and exits 143.

    python train.py --epochs 5        # one worker, outputs in ./model etc.
"""

import argparse
import json
import os
import signal
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def load(path: str):
    table = np.loadtxt(path, delimiter=",", skiprows=1, dtype="float32")
    return table[:, :-1], table[:, -1].astype("int32")


def parse_args():
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="global batch")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", default="data", help="folder with train.csv and test.csv")
    p.add_argument("--model-dir", default=env("AIP_MODEL_DIR", "model"))
    p.add_argument("--checkpoint-dir", default=env("AIP_CHECKPOINT_DIR", "checkpoints"))
    p.add_argument("--log-dir", default=env("AIP_TENSORBOARD_LOG_DIR", "logs"))
    return p.parse_args()


def main() -> int:
    args = parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # first: it starts this worker's runtime
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # finish the epoch, then stop
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    is_chief = task.get("type", "chief") == "chief"
    own = tempfile.mkdtemp(prefix=f"worker-{task.get('index', 0)}-")  # a worker's throwaway copies

    def where(folder: str) -> str:
        return folder if is_chief else own

    x_train, y_train = load(os.path.join(args.data, "train.csv"))
    x_test, y_test = load(os.path.join(args.data, "test.csv"))
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train), seed=0)
    train = train.batch(args.batch_size, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = strategy.experimental_distribute_dataset(train.with_options(options))

    with strategy.scope():  # variables created here are mirrored on every replica
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(args.lr, momentum=0.9)
        optimizer.build(model.trainable_variables)
        epoch = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    manager = tf.train.CheckpointManager(checkpoint, where(args.checkpoint_dir), max_to_keep=2)
    latest = tf.train.latest_checkpoint(args.checkpoint_dir)  # the chief's, read by every worker
    if latest:  # the job restarted: carry on from the last epoch
        checkpoint.restore(latest)
        print(f"resumed from {latest} after epoch {int(epoch.numpy())}", flush=True)
    writer = tf.summary.create_file_writer(where(args.log_dir))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True),
                                                                       from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.batch_size)
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    @tf.function
    def train_step(x, y):
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(x, y)), axis=None)

    @tf.function
    def anyone(flag):  # every worker stops after the same epoch
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: flag), axis=None)

    while int(epoch.numpy()) < args.epochs:
        for x, y in dataset:
            loss = train_step(x, y)
        epoch.assign_add(1)
        logits = model(x_test, training=False)
        test_loss = float(keras.ops.mean(keras.losses.sparse_categorical_crossentropy(
            y_test, logits, from_logits=True)))
        accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
        print(f"Epoch {int(epoch.numpy())}/{args.epochs}: train loss {float(loss):.4f}, "
              f"test loss {test_loss:.4f}, test accuracy {accuracy:.3f}", flush=True)
        with writer.as_default():
            tf.summary.scalar("loss/test", test_loss, step=int(epoch.numpy()))
            tf.summary.scalar("accuracy/test", accuracy, step=int(epoch.numpy()))
        writer.flush()
        manager.save()  # every worker saves (a collective); only the chief's copy is kept
        if float(anyone(tf.constant(1.0 if stop else 0.0))):
            print(f"SIGTERM: stopped after epoch {int(epoch.numpy())}, checkpoint saved", flush=True)
            return 143

    model.export(where(os.path.join(args.model_dir, "saved_model")), verbose=False)
    if is_chief:
        print(f"model saved to {args.model_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
