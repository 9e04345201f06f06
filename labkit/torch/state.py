"""The torch engine's full state as `labkit.core.checkpoint` blobs.

Rank 0 writes `model.pt` and `train.pt` (optimizer, LR schedule, GradScaler, next step, data
position in samples); every rank writes its own `rng-rank{r}.pt` (torch CPU/CUDA, NumPy and
Python RNG states); after a barrier rank 0 writes the commit marker, with the run's fingerprint
(`labkit.core.fingerprint`), once it has checked that the folder's lease is still its own
(`labkit.core.lease`). Everything is serialised with `torch.save` into an in-memory file object,
so the same bytes go to a local disk, `gs://` or a `/gcs/` mount.

`claim` runs before the first step: the outputs are checked and rank 0 takes the lease; `restore`
refuses a checkpoint of a run with other settings unless the change was allowed.

Three formats, chosen by `saver_class` from `TrainConfig.checkpoint_format`: the full state above
(DDP, ZeRO-1), one `rank{r}.pt` per rank for the other parallel modes (`ShardedSaver`: resumed by
the same layout only), and with ``--checkpoint-format dcp`` (DDP, ZeRO-3) each rank's shards
written by `torch.distributed.checkpoint` (`DcpSaver`, `labkit.torch.dcp`): resumable on another
number of processes, or by the other of the two modes. A restore reads whichever format the
newest committed step has (`restore` and `restore_sharded` hand a DCP step to `restore_dcp`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import random
import threading
import warnings
import zipfile
from typing import IO, TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map

from labkit.core import checkpoint
from labkit.core.config import ParameterError
from labkit.core.fingerprint import Resume
from labkit.core.lease import Lease
from labkit.core.outputs import check_run_outputs
from labkit.core.schedule import WarmupThenConstant
from labkit.torch import compression, dcp
from labkit.torch.data import DataPosition

if TYPE_CHECKING:
    from labkit.core.train_config import TrainConfig
    from labkit.torch.distributed import DistInfo

FRAMEWORK = "torch"


class RefusedOnAnotherRank(OSError):
    """Another rank of this run could not start (its error names the cause)."""


def claim(config: TrainConfig, info: DistInfo) -> Lease | None:
    """Before the first step: check this process's outputs (`labkit.core.outputs`) and, on rank
    0 of a run that checkpoints, take the checkpoint folder's lease. Returns the lease (release
    it when the run ends). Under DDP every rank learns whether all could start, so a refused
    run stops on every rank instead of leaving the others waiting in a collective."""
    lease, error = None, None
    try:
        check_run_outputs(config, main=info.is_main)
        if info.is_main and config.checkpoint_dir:
            lease = Lease(config.checkpoint_dir).acquire()
    except (ValueError, OSError) as e:
        error = e
    if info.distributed:
        messages: list[str | None] = [None] * info.world_size
        dist.all_gather_object(messages, None if error is None else str(error))
        refused = [(rank, m) for rank, m in enumerate(messages) if m is not None]
        if refused and error is None:
            if lease is not None:
                lease.release()
            rank, message = refused[0]
            raise RefusedOnAnotherRank(f"rank {rank} could not start: {message}")
    if error is not None:
        raise error
    return lease


class TrainingState(Protocol):
    """What a checkpoint holds of a run (`labkit.torch.engine.Components` is one)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def to_bytes(obj: Any) -> bytes:
    """`torch.save` of `obj` as bytes (see `save_to`)."""
    buf = io.BytesIO()
    save_to(obj, buf)
    return buf.getvalue()


def save_to(obj: Any, f: IO[bytes]) -> None:
    """`torch.save` of `obj` into `f`, without the zip format's per-record CRC-32: `torch.load`
    never checks it, and `labkit.core.checkpoint` checks every blob against its marker's CRC-32C
    anyway; computing it took about a quarter of `torch.save`'s time (benchmarks/RESULTS.md)."""
    with _ZIP_CRC_OFF_LOCK, _zip_crc_off():
        torch.save(obj, f)


# torch's switch for the zip CRC is process-wide (torch >= 2.6), and a patch restores whatever it
# found: two interleaved saves could leave it off for everyone. One labkit save flips it at a time.
_ZIP_CRC_OFF_LOCK = threading.Lock()


def _zip_crc_off() -> contextlib.AbstractContextManager:
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch < 2.6 always computes it
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})


def from_bytes(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def rng_state() -> dict[str, Any]:
    out = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["python"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def snapshot(c: TrainingState, info: DistInfo, step: int, position: DataPosition, *,
             copy: bool = True) -> dict[str, Any]:
    """This rank's state after `step`, one object per blob, as host copies: all that training
    must wait for, since once it returns the live tensors may change while `encode` and the
    storage write run in the background. `copy=False` returns the live tensors instead, for a
    save that serialises them before training goes on."""
    host = _host_copy if copy else _on_host
    objects: dict[str, Any] = {}
    if info.is_main:
        objects["model.pt"] = host(c.model.state_dict())
        objects["train.pt"] = host({
            "optimizer": c.optimizer.state_dict(), "scheduler": c.scheduler.state_dict(),
            "scaler": c.scaler.state_dict(), "next_step": step + 1,
            "data_position": {"epoch": position.epoch, "sample": position.sample}})
    objects[f"rng-rank{info.rank}.pt"] = rng_state()  # fresh copies already
    comm = compression.state_dict(getattr(c, "comm_state", None))
    if comm is not None:  # PowerSGD's error feedback: each rank its own
        objects[f"comm-rank{info.rank}.pt"] = host(comm)
    return objects


def _host_copy(tree: Any) -> Any:
    """`tree` with its containers rebuilt and every tensor copied to the host (on the CPU too:
    `.cpu()` alone would alias the live tensor). Tensors that are the same view of the same
    memory (tied weights) stay one tensor, written once as `torch.save` of the live state would."""
    copies: dict[tuple, torch.Tensor] = {}

    def copy_once(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        key = (v.device, v.untyped_storage().data_ptr(), v.storage_offset(), v.dtype, tuple(v.shape), v.stride())
        if key not in copies:
            copies[key] = v.detach().to("cpu", copy=True)
        return copies[key]

    return tree_map(copy_once, tree)


def _on_host(tree: Any) -> Any:
    return tree_map(lambda v: v.detach().cpu() if isinstance(v, torch.Tensor) else v, tree)


def encode(objects: dict[str, Any]) -> dict[str, bytes]:
    """The blobs' bytes (`torch.save` of each object)."""
    return {name: to_bytes(obj) for name, obj in objects.items()}


def serialize(c: TrainingState, info: DistInfo, step: int, position: DataPosition) -> dict[str, bytes]:
    """This rank's blobs for the state after `step`, as bytes on the host (no copy first:
    `torch.save` reads the live tensors)."""
    return encode(snapshot(c, info, step, position, copy=False))


def save(directory: str, c: TrainingState, info: DistInfo, step: int, position: DataPosition, *,
         fingerprint: dict[str, Any] | None = None) -> None:
    """Checkpoint the state after `step` (the resumed run starts at step + 1), synchronously."""
    _write_and_commit(directory, info, step, serialize(c, info, step, position), fingerprint)


def _write_and_commit(directory: str, info: DistInfo, step: int, blobs: dict[str, bytes | checkpoint.BlobWriter],
                      fingerprint: dict[str, Any] | None = None, lease: Lease | None = None,
                      keep: int | None = None, *, written: dict[str, Any] | None = None,
                      meta: dict[str, Any] | None = None) -> None:
    """Write this rank's `blobs`, then (rank 0, once every rank's are written) the marker listing
    them all, with the files this rank `written` already (DCP's) and `meta` beside the usual."""
    entries: dict[str, Any] = {name: checkpoint.write_blob(directory, step, name, data)
                               for name, data in blobs.items()}
    entries.update(written or {})
    if info.distributed:
        gathered: list[dict[str, Any]] = [{} for _ in range(info.world_size)]
        dist.all_gather_object(gathered, entries)  # also a barrier: every blob is written
        entries = {k: v for part in gathered for k, v in part.items()}
    if info.is_main:
        if lease is not None:
            lease.verify()  # another run took the folder over: do not commit into its steps
        marker_meta = {"world_size": info.world_size, "framework": FRAMEWORK, **(meta or {})}
        if fingerprint is not None:
            marker_meta["fingerprint"] = fingerprint
        checkpoint.commit(directory, step, entries, marker_meta, keep=keep)
    if info.distributed:
        dist.barrier()  # nobody runs ahead (or exits) before the marker exists


class Saver:
    """Checkpoints for one run. A single process copies the state to host memory (training
    stalls only for that copy) and serialises, writes and commits it in a background thread
    (`labkit.core.checkpoint.BackgroundWrite`: one save in flight at most); replicas of a DDP job
    save synchronously, since commit needs collectives. `wait()` joins the save in flight and
    re-raises its error. Each marker records `fingerprint`; with a `lease`, rank 0 checks it is
    still the folder's writer before each commit. With `keep`, only the newest `keep` committed
    steps are kept."""

    def __init__(self, directory: str, info: DistInfo, asynchronous: bool = True, *,
                 fingerprint: dict[str, Any] | None = None, lease: Lease | None = None,
                 keep: int | None = None):
        self.directory = directory
        self.info = info
        self.asynchronous = asynchronous and not info.distributed
        self.fingerprint, self.lease, self.keep = fingerprint, lease, keep
        self._background = checkpoint.BackgroundWrite(directory)

    def save(self, c: TrainingState, step: int, position: DataPosition, *, wait: bool = False) -> None:
        self.wait()
        if not self.asynchronous or wait:
            self._commit(step, serialize(c, self.info, step, position))
            return
        objects = snapshot(c, self.info, step, position)
        # Each object is serialised straight into its file, CRC-32C taken on the way: no copy of
        # the whole state in memory, the background work's largest cost (benchmarks/RESULTS.md).
        writers = {name: functools.partial(save_to, obj) for name, obj in objects.items()}
        self._background.start(step, lambda: self._commit(step, writers))

    def _commit(self, step: int, blobs: dict[str, bytes | checkpoint.BlobWriter]) -> None:
        _write_and_commit(self.directory, self.info, step, blobs, self.fingerprint, self.lease, self.keep)

    @property
    def in_flight(self) -> bool:
        """A background write has started and not finished yet."""
        return self._background.in_flight

    def wait(self) -> None:
        self._background.wait()


# What a blob that verified against its marker but does not load raises.
_DECODE_ERRORS = (KeyError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError,
                  zipfile.BadZipFile)


def restore(directory: str, c: TrainingState, info: DistInfo,
            resume: Resume | None = None) -> tuple[int, DataPosition] | None:
    """Load the newest committed intact checkpoint into `c`; returns (next step, data position),
    or None when there is none. A blob that fails to deserialise counts as corrupt: the previous
    committed step is tried, with a warning. With `resume`, a checkpoint of a run with other
    settings is refused (`labkit.core.fingerprint.ResumeMismatch`) before anything is loaded,
    unless the change was allowed; the run's LR schedule then follows `resume.fingerprint`. A
    newest step written by DCP is restored by `restore_dcp`."""
    if holds_dcp(directory):
        return restore_dcp(directory, c, info, resume)

    def decode(ckpt: checkpoint.Checkpoint) -> tuple[checkpoint.Checkpoint, Any, Any, Any]:
        if ckpt.meta.get("framework", FRAMEWORK) != FRAMEWORK:
            return ckpt, None, None, None, None  # refused below, not skipped as corrupt
        rng_blob = ckpt.files.get(f"rng-rank{info.rank}.pt")
        comm_blob = ckpt.files.get(f"comm-rank{info.rank}.pt")
        return (ckpt, from_bytes(ckpt.files["model.pt"]), from_bytes(ckpt.files["train.pt"]),
                from_bytes(rng_blob) if rng_blob is not None else None,
                from_bytes(comm_blob) if comm_blob is not None else None)

    found = checkpoint.restore(directory, decode, _DECODE_ERRORS)
    if found is None:
        return None
    ckpt, model, train, rng, comm = found
    if model is None:
        raise ParameterError("checkpoint_dir", directory,
                             f"holds a checkpoint of the {ckpt.meta.get('framework')} engine "
                             f"({ckpt.path}); the torch engine cannot resume from it")
    if resume is not None:
        # Outside `decode`: a refusal must not read as a corrupt step to fall back from.
        resume.check(ckpt.meta, directory)
    c.model.load_state_dict(model)
    c.optimizer.load_state_dict(train["optimizer"])
    for group in c.optimizer.param_groups:
        # Saved by a run under cuda_graph_step; StepGraph sets both again when it captures.
        if isinstance(group["lr"], torch.Tensor):
            group["lr"] = float(group["lr"])
        group["capturable"] = False
    _restore_the_rest(c, info, train, rng, comm, resume, ckpt.step, ckpt.meta.get("world_size"))
    return int(train["next_step"]), saved_position(train["data_position"], ckpt.path)


def _restore_the_rest(c: TrainingState, info: DistInfo, train: dict[str, Any], rng: Any, comm: Any,
                      resume: Resume | None, step: int, saved_world: Any) -> None:
    """After the model and optimizer: the LR schedule, the loss scaler, PowerSGD's error
    feedback and this rank's RNG states (each missing one said with a warning)."""
    c.scheduler.load_state_dict(train["scheduler"])
    if train["scaler"] or not c.scaler.is_enabled():  # empty: saved without fp16 (an allowed change)
        c.scaler.load_state_dict(train["scaler"])
    if resume is not None:
        follow_schedule(c, resume.fingerprint)
    live_comm = getattr(c, "comm_state", None)
    if comm is not None and live_comm is not None:
        compression.load_state_dict(live_comm, comm, next(c.model.parameters()).device)
    elif live_comm is not None:
        warnings.warn(f"checkpoint step {step} has no gradient-compression state for rank "
                      f"{info.rank}: PowerSGD starts its error feedback afresh",
                      checkpoint.CheckpointWarning, stacklevel=3)
    if rng is not None:
        set_rng_state(rng)
    else:
        warnings.warn(f"checkpoint step {step} has no RNG state for rank {info.rank} (saved "
                      f"with {saved_world} replicas); continuing with seeded RNG",
                      checkpoint.CheckpointWarning, stacklevel=3)


def follow_schedule(c: TrainingState, fingerprint: dict[str, Any]) -> None:
    """Make the restored optimizer and LR schedule use this run's peak LR and warm-up: the
    checkpoint holds the saved run's, which differ only when a resume was allowed to change
    them (without a change this recomputes the same values)."""
    peak = fingerprint["lr"] * (fingerprint["world_size"] if fingerprint["scale_lr_with_world_size"] else 1)
    c.scheduler.base_lrs = [peak for _ in c.scheduler.base_lrs]
    c.scheduler.lr_lambdas = [WarmupThenConstant(fingerprint["warmup_steps"])
                              for _ in c.scheduler.lr_lambdas]
    for group, rule in zip(c.optimizer.param_groups, c.scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = peak
        group["lr"] = peak * rule(c.scheduler.last_epoch)


def saved_position(saved: dict[str, Any], path: str) -> DataPosition:
    """The `DataPosition` the checkpoint at `path` recorded: an epoch and the samples taken."""
    if "sample" not in saved:
        raise checkpoint.CheckpointError(f"{path}: the data position {saved} counts no samples "
                                         "(not a checkpoint this labkit wrote)")
    return DataPosition(int(saved["epoch"]), int(saved["sample"]))


# ---------------------------------------------------------------- sharded state (parallel modes)
#
# Under --parallel zero1/zero2/zero3/tp/pp (and DeepSpeed) every rank writes one blob,
# `rank{r}.pt`: the parameters and optimizer state it holds (its shards; replicated parts as
# they are), the LR schedule, the next step, the data position and its RNG state. Nothing is
# gathered, so no rank ever holds the whole model state; a resumed run must use the same layout
# (mode and degrees), which the marker records and `restore_sharded` checks.


class ShardedState(Protocol):
    """What a sharded checkpoint reads (`labkit.torch.engine.Components` with a strategy)."""

    strategy: Any
    scheduler: torch.optim.lr_scheduler.LRScheduler


def _layout_meta(c: ShardedState) -> dict[str, Any]:
    layout = c.strategy.layout
    return {"mode": layout.mode, "world": layout.world, "tp": layout.tp, "pp": layout.pp}


def sharded_blobs(c: ShardedState, info: DistInfo, step: int, position: DataPosition) -> dict[str, bytes]:
    """This rank's one blob for the state after `step`."""
    obj = {"local": c.strategy.local_state(), "scheduler": c.scheduler.state_dict(),
           "next_step": step + 1, "data_position": {"epoch": position.epoch, "sample": position.sample},
           "rng": rng_state()}
    return {f"rank{info.rank}.pt": to_bytes(obj)}


class ShardedSaver:
    """Checkpoints of a parallel run: each rank writes its blob, rank 0 commits once all are
    written (synchronously: committing needs every rank). Same interface as `Saver`, and the
    same guarantees: the marker records `fingerprint`, with a `lease` rank 0 checks it is
    still the folder's writer before it commits, and `keep` bounds the committed steps kept."""

    def __init__(self, directory: str, info: DistInfo, *, fingerprint: dict[str, Any] | None = None,
                 lease: Lease | None = None, keep: int | None = None):
        self.directory = directory
        self.info = info
        self.fingerprint, self.lease, self.keep = fingerprint, lease, keep

    def save(self, c: ShardedState, step: int, position: DataPosition, *, wait: bool = False) -> None:
        blobs = sharded_blobs(c, self.info, step, position)
        entries: dict[str, Any] = {name: checkpoint.write_blob(self.directory, step, name, data)
                                   for name, data in blobs.items()}
        gathered: list[dict[str, Any]] = [{} for _ in range(self.info.world_size)]
        dist.all_gather_object(gathered, entries)  # also a barrier: every blob is written
        if self.info.is_main:
            if self.lease is not None:
                self.lease.verify()  # another run took the folder over: do not commit into its steps
            merged = {k: v for part in gathered for k, v in part.items()}
            meta = {"world_size": self.info.world_size, "framework": FRAMEWORK, "sharded": True,
                    "layout": _layout_meta(c)}
            if self.fingerprint is not None:
                meta["fingerprint"] = self.fingerprint
            checkpoint.commit(self.directory, step, merged, meta, keep=self.keep)
        dist.barrier()

    @property
    def in_flight(self) -> bool:
        return False

    def wait(self) -> None:
        return None


class LayoutMismatch(ValueError):
    """A sharded checkpoint was written by a run of another parallel layout."""


def restore_sharded(directory: str, c: ShardedState, info: DistInfo,
                    resume: Resume | None = None) -> tuple[int, DataPosition] | None:
    """Load this rank's blob of the newest committed step into `c`; returns (next step, data
    position), or None when there is none. Raises `LayoutMismatch` naming both layouts when the
    checkpoint was written by another mode or other degrees, and (with `resume`) ResumeMismatch
    when it was written by a run with other settings, as `restore` does. A newest step written
    by DCP is restored by `restore_dcp` (resharded to this layout when it can be)."""
    if holds_dcp(directory):
        return restore_dcp(directory, c, info, resume)
    expected = _layout_meta(c)

    def decode(ckpt: checkpoint.Checkpoint) -> tuple[checkpoint.Checkpoint, Any]:
        saved = ckpt.meta.get("layout")
        if not ckpt.meta.get("sharded") or saved != expected:
            raise LayoutMismatch(f"checkpoint_dir: step {ckpt.step} in {directory} was written with "
                                 f"layout {saved or 'unsharded (ddp)'}, this run is {expected}")
        return ckpt, from_bytes(ckpt.files[f"rank{info.rank}.pt"])

    # A layout mismatch (a ValueError) is raised, not skipped like a blob that does not decode.
    errors = tuple(e for e in _DECODE_ERRORS if e is not ValueError)
    found = checkpoint.restore(directory, decode, errors)
    if found is None:
        return None
    ckpt, blob = found
    if resume is not None:
        resume.check(ckpt.meta, directory)  # outside `decode`: a refusal is not a corrupt step
    c.strategy.load_local_state(blob["local"])
    c.scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return int(blob["next_step"]), saved_position(blob["data_position"], ckpt.path)


# ---------------------------------------------------------------- DCP (sharded, any layout)
#
# Under --checkpoint-format dcp (ddp or zero3) every rank writes the parameters and optimizer
# state it holds through torch.distributed.checkpoint (`labkit.torch.dcp`), beside `train.pt`
# (rank 0: LR schedule, loss scaler, next step, data position in samples) and its own
# `rng-rank{r}.pt` (and `comm-rank{r}.pt` under PowerSGD); rank 0 commits once every rank's files
# are written, the marker listing DCP's files with their sizes and CRC-32C like any blob. A
# resume reshards: a zero3 run of 2 ranks resumes on 2 exactly, and on 1 process (DDP) or 4
# ranks with the same model and optimizer state (`--allow-resume-change world_size`: the
# fingerprint refuses another world size otherwise); the data position, in samples, continues
# the same sample order whatever the number of replicas.


def saver_class(checkpoint_format: str, sharded: bool) -> type:
    """The saver of a run: `DcpSaver` for the "dcp" format, else `ShardedSaver` for a sharded
    mode (`sharded`: the run has a `Strategy`) and `Saver` for DDP."""
    if checkpoint_format == dcp.FORMAT:
        return DcpSaver
    return ShardedSaver if sharded else Saver


def _step_folder(directory: str, step: int) -> str:
    return f"{str(directory).rstrip('/')}/{checkpoint.step_dir_name(step)}"


def _layout_of(c: Any) -> dict[str, Any]:
    strategy = getattr(c, "strategy", None)
    layout = strategy.layout if strategy is not None else getattr(c, "layout", None)
    if layout is None:
        return {"mode": "ddp"}
    return {"mode": layout.mode, "world": layout.world, "tp": layout.tp, "pp": layout.pp}


def dcp_objects(c: TrainingState, info: DistInfo, step: int, position: DataPosition) -> dict[str, Any]:
    """This rank's labkit blobs beside DCP's files: everything but the model and optimizer."""
    objects: dict[str, Any] = {}
    if info.is_main:
        objects["train.pt"] = {"scheduler": c.scheduler.state_dict(), "scaler": c.scaler.state_dict(),
                               "next_step": step + 1,
                               "data_position": {"epoch": position.epoch, "sample": position.sample}}
    objects[f"rng-rank{info.rank}.pt"] = rng_state()
    comm = compression.state_dict(getattr(c, "comm_state", None))
    if comm is not None:
        objects[f"comm-rank{info.rank}.pt"] = _on_host(comm)
    return objects


class DcpSaver:
    """Checkpoints through torch.distributed.checkpoint: each rank writes its shards and its
    blobs, then rank 0 commits (synchronously: DCP's save is a collective). Same interface and
    guarantees as `Saver`: the marker records `fingerprint` and lists every file with its size
    and CRC-32C, rank 0 checks the `lease` before it commits, `keep` bounds the steps kept."""

    def __init__(self, directory: str, info: DistInfo, *, fingerprint: dict[str, Any] | None = None,
                 lease: Lease | None = None, keep: int | None = None):
        self.directory = directory
        self.info = info
        self.fingerprint, self.lease, self.keep = fingerprint, lease, keep

    def save(self, c: TrainingState, step: int, position: DataPosition, *, wait: bool = False) -> None:
        written = dcp.save(_step_folder(self.directory, step), c.model, c.optimizer)
        blobs = encode(dcp_objects(c, self.info, step, position))
        _write_and_commit(self.directory, self.info, step, blobs, self.fingerprint, self.lease, self.keep,
                          written=written, meta={"format": dcp.FORMAT, "layout": _layout_of(c)})

    @property
    def in_flight(self) -> bool:
        return False

    def wait(self) -> None:
        return None


def holds_dcp(directory: str) -> bool:
    """Whether the newest committed step whose marker can be read was written by DCP."""
    for step in reversed(checkpoint.committed_steps(directory)):
        try:
            meta = checkpoint.read_marker(directory, step).get("meta", {})
        except checkpoint.CheckpointError:
            continue  # the restore warns about it and falls back past it
        return meta.get("format") == dcp.FORMAT
    return False


def _dcp_refusal(c: TrainingState) -> str | None:
    """Why this run's model cannot take a DCP checkpoint (None: it can). DCP reshards into
    whole tensors (DDP, one process) and FSDP2's DTensor shards (zero3); the other modes keep
    their state in layouts `get_state_dict` does not map (flat buffers, partitioned optimizers,
    pipeline stages, DeepSpeed's engine)."""
    from torch.distributed.fsdp import FSDPModule

    strategy = getattr(c, "strategy", None)
    if strategy is None or isinstance(c.model, FSDPModule):
        return None
    return strategy.name


def _read_dcp_step(directory: str, step: int, info: DistInfo) -> tuple[dict[str, Any], dict[str, Any], Any, Any]:
    """(meta, train, rng, comm) of one committed DCP step, once this rank's share of its DCP
    files and the blobs it needs verify; raises CheckpointError naming what does not."""
    folder = _step_folder(directory, step)
    marker = checkpoint.read_marker(directory, step)
    meta, files = marker.get("meta", {}), marker.get("files", {})
    if meta.get("format") != dcp.FORMAT:
        raise checkpoint.CheckpointError(f"{folder}: not written by torch.distributed.checkpoint, and a "
                                         f"run resuming a DCP checkpoint falls back to DCP steps only")
    problem = dcp.verify_share(folder, files, info.rank, info.world_size)
    if problem is not None:
        raise checkpoint.CheckpointError(problem)
    if "train.pt" not in files:
        raise checkpoint.CheckpointError(f"{folder}: the commit marker lists no train.pt")

    def blob(name: str) -> Any:
        if name not in files:
            return None
        try:
            return from_bytes(dcp.read_verified(folder, name, files[name]))
        except _DECODE_ERRORS as e:
            raise checkpoint.CheckpointError(f"{folder}/{name}: does not load ({e})") from e

    return meta, blob("train.pt"), blob(f"rng-rank{info.rank}.pt"), blob(f"comm-rank{info.rank}.pt")


def _agreed(problem: str | None, info: DistInfo) -> str | None:
    """The first rank's problem with a step (None when every rank found it sound): all ranks
    take or skip a step together, since loading it is a collective."""
    if not info.distributed:
        return problem
    problems: list[str | None] = [None] * info.world_size
    dist.all_gather_object(problems, problem)
    return next((p for p in problems if p is not None), None)


def restore_dcp(directory: str, c: TrainingState, info: DistInfo,
                resume: Resume | None = None) -> tuple[int, DataPosition] | None:
    """Load the newest committed DCP step that verifies into `c`, resharded to this run's layout;
    returns (next step, data position), or None when there is none. Every rank checks a share of
    the step's files against the marker (sizes, CRC-32C) and its own blobs; a problem on any rank
    makes all of them warn, naming the file, and try the previous committed step. Raises
    `LayoutMismatch` for a run whose mode cannot load DCP state (zero1, zero2, tp, pp, DeepSpeed),
    and `ResumeMismatch` as `restore` does (``--allow-resume-change world_size`` for another
    number of processes)."""
    steps = checkpoint.committed_steps(directory)[::-1]
    for i, step in enumerate(steps):
        found, problem = None, None
        try:
            found = _read_dcp_step(directory, step, info)
        except checkpoint.CheckpointError as e:
            problem = str(e)
        problem = _agreed(problem, info)
        if problem is None:
            break
        fallback = (f"falling back to the previous committed step, {steps[i + 1]}" if i + 1 < len(steps)
                    else "no earlier committed step is left: the run starts from step 0")
        warnings.warn(f"ignoring checkpoint step {step} in {directory}: {problem}; {fallback}",
                      checkpoint.CheckpointWarning, stacklevel=3)
    else:
        return None
    meta, train, rng, comm = found
    refused = _dcp_refusal(c)
    if refused is not None:
        raise LayoutMismatch(f"checkpoint_dir: step {step} in {directory} was written by "
                             f"torch.distributed.checkpoint with layout {meta.get('layout')}, which "
                             f"--parallel {refused} cannot load: resume it with --parallel ddp or zero3")
    if resume is not None:
        resume.check(meta, directory)  # outside the fallback: a refusal is not a corrupt step
    dcp.load(_step_folder(directory, step), c.model, c.optimizer)
    _restore_the_rest(c, info, train, rng, comm, resume, step, meta.get("world_size"))
    return int(train["next_step"]), saved_position(train["data_position"], _step_folder(directory, step))
