"""Sharded checkpoints through `torch.distributed.checkpoint` (DCP), checked the labkit way.

Under `TrainConfig.checkpoint_format = "dcp"` (``--checkpoint-format dcp``, with ``--parallel
ddp`` or ``zero3``) every rank writes the model and optimizer state it holds through DCP into the
step folder, beside labkit's own small blobs (`labkit.torch.state.DcpSaver`), and rank 0 writes
the commit marker last:

    step-00000042/.metadata          DCP's index: which file holds which piece of which tensor
    step-00000042/__0_0.distcp       rank 0's shards of the weights and AdamW state
    step-00000042/__1_0.distcp       rank 1's
    step-00000042/train.pt           LR schedule, loss scaler, next step, data position (rank 0)
    step-00000042/rng-rank{r}.pt     each rank's RNG states
    step-00000042/COMMITTED          every file above with its size and CRC-32C, written last

This module is the DCP part. `save` writes the state of a model and its optimizer and returns
the marker entries of the files this rank wrote, their size and CRC-32C taken while the bytes
go out (as `labkit.core.checkpoint.write_blob` does for a blob). `verify_share` checks this
rank's share of a committed step's DCP files against its marker, streaming (no file is held in
memory), and `read_verified` reads one small blob checked the same way. `load` fills a live
model and optimizer of any layout DCP can reshard to: a zero3 run's FSDP2 shards on any number
of ranks, or the whole tensors of a DDP replica or a single process. DCP "handles load-time
resharding which enables saving in one cluster topology and loading into another", keyed by
fully qualified parameter names through `get_state_dict` / `set_state_dict`
(https://docs.pytorch.org/docs/stable/distributed.checkpoint.html and
https://docs.pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html, read 2026-11-29).
The same pages warn that DCP makes no promise of backward compatibility across PyTorch versions:
resume with the version that saved.

Storage: a local folder or a ``/gcs/`` mount through DCP's `FileSystemWriter` /
`FileSystemReader`, a ``gs://`` URL (any fsspec URL) through its `FsspecWriter` /
`FsspecReader` (gcsfs), the pair DCP itself picks for a URL. No fsync (``sync_files=False``), as
for labkit's own blobs: a file the machine lost fails its CRC-32C at load, and the previous
committed step is taken (on an fsspec stream DCP's fsync falls back to a machine-wide
``os.sync()``: `_write_files_from_queue` in
https://github.com/pytorch/pytorch/blob/main/torch/distributed/checkpoint/filesystem.py, read
2026-11-29 in torch 2.13's copy).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import crc32c
import fsspec
import torch
import torch.distributed as dist

from labkit.core.checkpoint import CheckpointError, CheckpointWriteError

if TYPE_CHECKING:
    from torch.distributed.checkpoint import StorageReader, StorageWriter

# torch.distributed.checkpoint is imported where it is used: it takes most of a second to import,
# which every run of the engine would pay, checkpointing in this format or not.

FORMAT = "dcp"
METADATA = ".metadata"
_CHUNK = 8 << 20  # bytes read at a time while checking a file's CRC-32C
# How the update runs (the kernel AdamW picks, CUDA-graph capture) is this run's choice, not the
# saved run's: `Optimizer.load_state_dict` would otherwise take the saved values.
_IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")
# DCP says so for every call without a process group, and when a folder holds an earlier attempt's
# `.metadata` (an uncommitted save of the same step): both are expected here.
_EXPECTED_WARNINGS = ("torch.distributed is disabled", "Detected an existing checkpoint")


def is_dcp_file(name: str) -> bool:
    """Whether a file of a step folder is one of DCP's (its index or a rank's data)."""
    return name == METADATA or name.endswith(".distcp")


def _is_url(folder: str) -> bool:
    return "://" in folder


def writer(folder: str) -> StorageWriter:
    """DCP's writer for `folder`: files for a path (a ``/gcs/`` mount too), fsspec for a URL."""
    if _is_url(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(folder, sync_files=False)
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(folder, sync_files=False)


def reader(folder: str) -> StorageReader:
    """DCP's reader for `folder` (see `writer`)."""
    if _is_url(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(folder)
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(folder)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _expected_warnings_quiet() -> Generator[None, None, None]:
    with warnings.catch_warnings():
        for text in _EXPECTED_WARNINGS:
            warnings.filterwarnings("ignore", message=text)
        yield


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and optimizer's state keyed by parameter names, as DCP saves and loads it:
    DTensor shards under FSDP2, whole tensors otherwise."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optimizer_state}


def save(folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, Any]]:
    """Write the model and optimizer state into `folder` with DCP (a collective: every rank of
    the process group calls it); returns {file name: {size, crc32c}} of the files this rank
    wrote. Raises CheckpointWriteError naming the folder and the storage's reason on failure."""
    import torch.distributed.checkpoint as dcp

    out = writer(folder)
    checksums = _Checksums(out.fs)
    out.fs = checksums  # every stream DCP opens for writing goes through it
    try:
        with _expected_warnings_quiet():
            dcp.save(state_of(model, optimizer), storage_writer=out, no_dist=not _distributed())
    except (Exception, dcp.CheckpointException) as e:
        raise CheckpointWriteError(f"cannot write the sharded checkpoint files in {folder}: "
                                   f"{_reason(e)}") from e
    return checksums.entries


def load(folder: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read the model and optimizer state saved in `folder` into `model` and `optimizer`,
    resharded to however they are laid out now (a collective, as `save`). Gradients are
    dropped: `get_state_dict` creates an empty optimizer's state (the tensors DCP fills) only
    when no parameter has a gradient (torch 2.13 silently returns none otherwise, older torch
    raised: `_init_optim_state` in https://github.com/pytorch/pytorch/blob/main/torch/distributed/
    checkpoint/state_dict.py, read 2026-11-29), and a restored run starts its next step afresh."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    optimizer.zero_grad(set_to_none=True)
    live = [{k: group[k] for k in _IMPLEMENTATION if k in group} for group in optimizer.param_groups]
    target = state_of(model, optimizer)
    with _expected_warnings_quiet():
        dcp.load(target, storage_reader=reader(folder), no_dist=not _distributed())
    set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    for group, implementation in zip(optimizer.param_groups, live, strict=True):
        group.update(implementation)


def _reason(error: BaseException) -> str:
    """A failed DCP call's cause in one line: the first failing rank's own error."""
    failures = getattr(error, "failures", None)
    if failures:
        rank, (cause, _) = next(iter(failures.items()))
        return f"rank {rank}: {_reason(cause)}"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# ---------------------------------------------------------------- checksums on the way out


class _ChecksumStream(io.RawIOBase):
    """A writable stream that passes everything to `raw` and keeps the size and CRC-32C of the
    bytes written through it. DCP asks it where it is (`tell`) to record each item's offset."""

    def __init__(self, raw: Any):
        super().__init__()
        self.raw, self.size, self.crc = raw, 0, 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        written = self.raw.write(data)
        view = memoryview(data).cast("B")
        self.crc = crc32c.crc32c(view, self.crc)
        self.size += view.nbytes
        return written if written is not None else view.nbytes

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        if not getattr(self.raw, "closed", False):
            self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        if not self.closed:
            super().close()  # flushes
            self.raw.close()


class _Checksums:
    """DCP's file system (a `FileSystemBase`, whose methods DCP's writers call) with every file
    written through it checksummed: `entries` maps each file's name (a renamed file under its
    final name) to its marker entry {size, crc32c}."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.entries: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def create_stream(self, path, mode: str):
        with self.inner.create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            out = _ChecksumStream(stream)
            yield out
        self.entries[_name(path)] = {"size": out.size, "crc32c": f"{out.crc:08x}"}

    def rename(self, path, new_path) -> None:
        self.inner.rename(path, new_path)
        if _name(path) in self.entries:
            self.entries[_name(new_path)] = self.entries.pop(_name(path))

    def rm_file(self, path) -> None:
        self.inner.rm_file(path)
        self.entries.pop(_name(path), None)

    def concat_path(self, path, suffix: str):
        return self.inner.concat_path(path, suffix)

    def init_path(self, path, **kwargs):
        return self.inner.init_path(path, **kwargs)

    def mkdir(self, path) -> None:
        self.inner.mkdir(path)

    def exists(self, path) -> bool:
        return self.inner.exists(path)

    def ls(self, path) -> list[str]:
        return self.inner.ls(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return True


def _name(path: Any) -> str:
    return os.fspath(path).rstrip("/").rsplit("/", 1)[-1]


# ---------------------------------------------------------------- checks on the way in


def verify_share(folder: str, files: dict[str, dict[str, Any]], rank: int, world_size: int) -> str | None:
    """Check this rank's share of the DCP files listed in a commit marker (`files`: {name:
    {size, crc32c}}; file i of the sorted names falls to rank i mod `world_size`) against their
    sizes and CRC-32C, reading each in chunks. Returns what is wrong, naming the file, or None."""
    names = sorted(name for name in files if is_dcp_file(name))
    if METADATA not in names:
        return f"{folder}: the commit marker lists no {METADATA} (not a DCP checkpoint)"
    fs, root = fsspec.core.url_to_fs(folder)
    for name in names[rank::world_size]:
        problem = _file_problem(fs, f"{root.rstrip('/')}/{name}", files[name])
        if problem is not None:
            return problem
    return None


def _file_problem(fs, path: str, entry: dict[str, Any]) -> str | None:
    size, crc = 0, 0
    try:
        with fs.open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                size += len(chunk)
                crc = crc32c.crc32c(chunk, crc)
    except OSError as e:
        return f"{path}: missing ({e})"
    if size != entry["size"]:
        return f"{path}: truncated, {size} of {entry['size']} bytes"
    if f"{crc:08x}" != entry["crc32c"]:
        return f"{path}: contents do not match the digest in its commit marker"
    return None


def read_verified(folder: str, name: str, entry: dict[str, Any]) -> bytes:
    """One small file of a committed step, checked against its marker entry; raises
    CheckpointError naming the file when it is missing, truncated or corrupt."""
    fs, root = fsspec.core.url_to_fs(folder)
    path = f"{root.rstrip('/')}/{name}"
    try:
        with fs.open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: missing ({e})") from e
    if len(data) != entry["size"]:
        raise CheckpointError(f"{path}: truncated, {len(data)} of {entry['size']} bytes")
    if f"{crc32c.crc32c(data):08x}" != entry["crc32c"]:
        raise CheckpointError(f"{path}: contents do not match the digest in its commit marker")
    return data
