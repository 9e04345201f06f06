"""The TF engine's full state as `labkit.core.checkpoint` blobs.

The chief writes three blobs, then the commit marker:

    model.npz       every model weight, trainable or not (batch-norm statistics), in order
    optimizer.npz   every optimizer variable, in order: the step count (which drives the LR
                    schedule), AdamW's moments and, with fp16, the loss scale and its counter
    train.json      {"next_step": s + 1, "data_position": {"step": s + 1, "epoch": e, "sample": n}}

The input of step s is a function of (seed, s) and where the run's data began
(`labkit.tf.data.replica_indices`, `DataOrigin`); the position also records the epoch and the
samples of it taken, so a run resumed with another batch size continues the same order. The
models have no random layers at training time (no dropout), so there is no RNG state to keep.
The commit marker carries the run's fingerprint (`labkit.core.fingerprint`): `restore` refuses a
checkpoint of a run with other settings unless the change was allowed; `claim` checks the
outputs and takes the checkpoint folder's lease (`labkit.core.lease`) on the chief. Arrays are matched to variables by position and
checked by shape, not by name: Keras numbers the names of optimizers built in one process.

Every worker of a MultiWorkerMirrored job holds the same (mirrored) values, so only the chief
writes, and every worker restores the chief's checkpoint. Under ParameterServerStrategy the
coordinating chief reads and assigns the variables on the parameter servers.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.core.fingerprint import Resume
from labkit.core.lease import Lease
from labkit.core.outputs import check_run_outputs

FRAMEWORK = "tf"
# What a blob that verified against its marker but does not load raises.
_DECODE_ERRORS = (KeyError, ValueError, OSError, EOFError, zipfile.BadZipFile, json.JSONDecodeError)


Position = Callable[[int], tuple[int, int]]  # step -> (epoch, samples of it taken before the step)


def claim(config, is_chief: bool) -> Lease | None:
    """Before the first step: check this worker's outputs and, on the chief of a run that
    checkpoints, take the checkpoint folder's lease (release it when the run ends)."""
    check_run_outputs(config, main=is_chief)
    if is_chief and config.checkpoint_dir:
        return Lease(config.checkpoint_dir).acquire()
    return None


def snapshot(model, optimizer, step: int, position: Position | None = None) -> dict[str, Any]:
    """The state after `step` as host copies (training may change the variables once this
    returns): one object per blob. `position` gives the data position of a step."""
    data_position: dict[str, int] = {"step": step + 1}
    if position is not None:
        data_position["epoch"], data_position["sample"] = position(step + 1)
    return {"model.npz": _host_copies(model.weights),
            "optimizer.npz": _host_copies(optimizer.variables),
            "train.json": {"next_step": step + 1, "data_position": data_position}}


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


def _write(directory: str, step: int, blobs: dict[str, bytes], replicas: int,
           fingerprint: dict[str, Any] | None = None, lease: Lease | None = None,
           keep: int | None = None) -> None:
    entries = {name: checkpoint.write_blob(directory, step, name, data) for name, data in blobs.items()}
    if lease is not None:
        lease.verify()  # another run took the folder over: do not commit into its steps
    meta: dict[str, Any] = {"world_size": replicas, "framework": FRAMEWORK}
    if fingerprint is not None:
        meta["fingerprint"] = fingerprint
    checkpoint.commit(directory, step, entries, meta, keep=keep)


class Saver:
    """Checkpoints for one run. Only the chief (`writes`) saves: it copies the state to host
    memory (training waits only for that copy) and encodes, writes and commits it in a
    background thread (`labkit.core.checkpoint.BackgroundWrite`), unless asked to `wait`. Each
    marker records `fingerprint` and each `train.json` the data `position`; with a `lease`, the
    chief checks it is still the folder's writer before each commit. With `keep`, only the
    newest `keep` committed steps are kept."""

    def __init__(self, directory: str, model, optimizer, *, replicas: int, writes: bool = True,
                 asynchronous: bool = True, fingerprint: dict[str, Any] | None = None,
                 lease: Lease | None = None, position: Position | None = None,
                 keep: int | None = None):
        self.directory = directory
        self.model, self.optimizer = model, optimizer
        self.replicas = replicas
        self.writes = writes
        self.asynchronous = asynchronous
        self.fingerprint, self.lease, self.position = fingerprint, lease, position
        self.keep = keep
        self._background = checkpoint.BackgroundWrite(directory)

    def save(self, step: int, *, wait: bool = False) -> None:
        if not self.writes:
            return
        self.wait()
        objects = snapshot(self.model, self.optimizer, step, self.position)

        def write() -> None:
            _write(self.directory, step, encode(objects), self.replicas, self.fingerprint, self.lease,
                   self.keep)

        if wait or not self.asynchronous:
            write()
            return
        self._background.start(step, write)

    def wait(self) -> None:
        self._background.wait()


def restore(directory: str, model, optimizer, resume: Resume | None = None) -> int | None:
    """Load the newest committed intact checkpoint into `model` and `optimizer`; returns the
    next step, or None when there is none. A step whose blobs fail verification or do not
    decode is skipped with a CheckpointWarning (the previous committed step is tried); one
    written by another engine, or for other variables, is refused with ParameterError. With
    `resume`, a checkpoint of a run with other settings is refused before anything is assigned
    (`labkit.core.fingerprint.ResumeMismatch`) unless the change was allowed, and
    `resume.data_position` is set to the checkpoint's data position."""

    def decode(ckpt: checkpoint.Checkpoint):
        if ckpt.meta.get("framework") != FRAMEWORK:
            return ckpt, None
        return ckpt, (_arrays(ckpt.files["model.npz"]), _arrays(ckpt.files["optimizer.npz"]),
                      json.loads(ckpt.files["train.json"]))

    found = checkpoint.restore(directory, decode, _DECODE_ERRORS)
    if found is None:
        return None
    ckpt, state = found
    if resume is not None and state is not None:
        # Outside `decode`: a refusal must not read as a corrupt step to fall back from.
        resume.check(ckpt.meta, directory)
    if state is None:
        raise ParameterError("checkpoint_dir", directory,
                             f"holds a checkpoint of the {ckpt.meta.get('framework')} engine "
                             f"({ckpt.path}); the TF engine cannot resume from it")
    weights, slots, train = state
    _assign("model weights", model.weights, weights, ckpt.path)
    _assign("optimizer variables", optimizer.variables, slots, ckpt.path)
    if resume is not None:
        position = train.get("data_position", {})
        if "sample" not in position:
            raise checkpoint.CheckpointError(f"{ckpt.path}: the data position {position} counts no "
                                             "samples (not a checkpoint a labkit engine wrote)")
        resume.data_position = position
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
