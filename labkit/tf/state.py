"""The TF engine's full state as `labkit.core.checkpoint` blobs.

The chief writes three blobs, then the commit marker:

    model.npz       every model weight, trainable or not (batch-norm statistics), in order
    optimizer.npz   every optimizer variable, in order: the step count (which drives the LR
                    schedule), AdamW's moments and, with fp16, the loss scale and its counter
    train.json      {"next_step": s + 1, "data_position": {"step": s + 1}}

The data position is the step: the input of step s is a function of (seed, s)
(`labkit.tf.data.replica_indices`). The models have no random layers at training time (no
dropout), so there is no RNG state to keep. Arrays are matched to variables by position and
checked by shape, not by name: Keras numbers the names of optimizers built in one process.

Every worker of a MultiWorkerMirrored job holds the same (mirrored) values, so only the chief
writes, and every worker restores the chief's checkpoint. Under ParameterServerStrategy the
coordinating chief reads and assigns the variables on the parameter servers.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import numpy as np

from labkit.core import checkpoint
from labkit.core.config import ParameterError

FRAMEWORK = "tf"
# What a blob that verified against its marker but does not load raises.
_DECODE_ERRORS = (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, json.JSONDecodeError)


def snapshot(model, optimizer, step: int) -> dict[str, Any]:
    """The state after `step` as host copies (training may change the variables once this
    returns): one object per blob."""
    return {"model.npz": _host_copies(model.weights),
            "optimizer.npz": _host_copies(optimizer.variables),
            "train.json": {"next_step": step + 1, "data_position": {"step": step + 1}}}


def _host_copies(variables) -> list[np.ndarray]:
    # `.numpy()` may share the tensor's buffer: copy, so a later update cannot reach the snapshot.
    return [np.array(v.numpy(), copy=True) for v in variables]


def encode(objects: dict[str, Any]) -> dict[str, bytes]:
    """The blobs' bytes: `.npz` archives (no pickles) and JSON."""
    out = {}
    for name, obj in objects.items():
        if name.endswith(".json"):
            out[name] = json.dumps(obj).encode()
        else:
            buf = io.BytesIO()
            np.savez(buf, *obj)
            out[name] = buf.getvalue()
    return out


def save(directory: str, model, optimizer, step: int, replicas: int) -> None:
    """Checkpoint the state after `step` (the resumed run starts at step + 1), synchronously."""
    _write(directory, step, encode(snapshot(model, optimizer, step)), replicas)


def _write(directory: str, step: int, blobs: dict[str, bytes], replicas: int) -> None:
    checkpoint.save(directory, step, blobs, {"world_size": replicas, "framework": FRAMEWORK})


class Saver:
    """Checkpoints for one run. Only the chief (`writes`) saves: it copies the state to host
    memory (training waits only for that copy) and encodes, writes and commits it in a
    background thread (`labkit.core.checkpoint.BackgroundWrite`), unless asked to `wait`."""

    def __init__(self, directory: str, model, optimizer, *, replicas: int, writes: bool = True,
                 asynchronous: bool = True):
        self.directory = directory
        self.model, self.optimizer = model, optimizer
        self.replicas = replicas
        self.writes = writes
        self.asynchronous = asynchronous
        self._background = checkpoint.BackgroundWrite(directory)

    def save(self, step: int, *, wait: bool = False) -> None:
        if not self.writes:
            return
        self.wait()
        objects = snapshot(self.model, self.optimizer, step)
        if wait or not self.asynchronous:
            _write(self.directory, step, encode(objects), self.replicas)
            return
        self._background.start(step, lambda: _write(self.directory, step, encode(objects),
                                                    self.replicas))

    def wait(self) -> None:
        self._background.wait()


def restore(directory: str, model, optimizer) -> int | None:
    """Load the newest committed intact checkpoint into `model` and `optimizer`; returns the
    next step, or None when there is none. A step whose blobs fail verification or do not
    decode is skipped with a CheckpointWarning (the previous committed step is tried); one
    written by another engine, or for other variables, is refused with ParameterError."""

    def decode(ckpt: checkpoint.Checkpoint):
        if ckpt.meta.get("framework") != FRAMEWORK:
            return ckpt, None
        return ckpt, (_arrays(ckpt.files["model.npz"]), _arrays(ckpt.files["optimizer.npz"]),
                      json.loads(ckpt.files["train.json"]))

    found = checkpoint.restore(directory, decode, _DECODE_ERRORS)
    if found is None:
        return None
    ckpt, state = found
    if state is None:
        raise ParameterError("checkpoint_dir", directory,
                             f"holds a checkpoint of the {ckpt.meta.get('framework')} engine "
                             f"({ckpt.path}); the TF engine cannot resume from it")
    weights, slots, train = state
    _assign("model weights", model.weights, weights, ckpt.path)
    _assign("optimizer variables", optimizer.variables, slots, ckpt.path)
    return int(train["next_step"])


def _arrays(data: bytes) -> list[np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return [archive[f"arr_{i}"] for i in range(len(archive.files))]


def _assign(what: str, variables, arrays: list[np.ndarray], path: str) -> None:
    """Check every shape first, so a mismatch changes nothing."""
    shapes = [tuple(v.shape) for v in variables]
    if shapes != [a.shape for a in arrays]:
        raise ParameterError("checkpoint_dir", path,
                             f"holds {len(arrays)} {what} that do not match this run's "
                             f"{len(shapes)} (another model, precision or optimizer?)")
    for v, a in zip(variables, arrays, strict=True):
        v.assign(a)
