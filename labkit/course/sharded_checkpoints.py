"""What one checkpoint costs a ZeRO-3 (FSDP2) run, three ways, measured on local processes.

`measure(config, nproc)` starts `nproc` processes (gloo on CPU, NCCL with a GPU each) that build
the engine's zero3 run of `config` (`labkit.torch.engine.build`), train two steps, then save the
same state again and again, the formats taking turns after one discarded save of each
(`labkit.core.stats.round_robin`):

- `full state`: the whole state gathered to rank 0 (`get_state_dict` with
  `full_state_dict=True, cpu_offload=True`), written by rank 0 as labkit's full checkpoint
  (`model.pt`, `train.pt`): one file any number of processes can read, but one process holds
  and writes all of it;
- `rank files`: labkit's `ShardedSaver`, one `torch.save` file per rank (no gather; only the
  same layout can resume it);
- `dcp`: labkit's `DcpSaver`, every rank's shards through `torch.distributed.checkpoint` (no
  gather; any number of processes can resume it).

A save's time is the slowest rank's, from a barrier until the save returned: every format here
is synchronous and collective, so that is the training time it costs. Bytes per rank are the
sizes the commit markers list, each file counted for the rank that wrote it. After the timed
saves the newest DCP checkpoint is loaded back into the model (its weights and AdamW moments
zeroed first) and must give back the gathered state bit for bit, or the measurement fails.
Every format commits with `keep=1`, so each save also deletes the previous one, as a long run
with `--keep-checkpoints` does. The full-state save leaves out the RNG blobs (a few KB).

`rows`, `time_comparison`, `bytes_ratio` and `findings` turn the report into the notebook's
table, its verdict and the numbers its sentences need; `reference()` reads the repository's
benchmark of the same measurement (`benchmarks/bench_sharded_checkpoint.py`) at larger states,
and `reference_rows` makes a table of it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from labkit.core import stats
from labkit.core.models import GPTConfig
from labkit.core.train_config import TrainConfig
from labkit.course import ladder

FORMATS = ("full state", "rank files", "dcp")
RESUMABLE_ON = {"full state": "any number of processes", "rank files": "the same layout only",
                "dcp": "any number of processes"}
WARMUP_SAVES = 1
_RANK_OF_FILE = (re.compile(r"^__(\d+)_\d+\.distcp$"), re.compile(r"rank(\d+)\.pt$"))


def bytes_by_rank(files: dict[str, dict[str, Any]], world_size: int) -> list[int]:
    """Bytes each rank wrote, from a commit marker's `files` ({name: {size, crc32c}}): a DCP data
    file `__R_i.distcp` and a `…rankR.pt` blob are rank R's; everything else (`model.pt`,
    `train.pt`, DCP's `.metadata`) is rank 0's."""
    out = [0] * world_size
    for name, entry in files.items():
        match = next((m for m in (p.search(name) for p in _RANK_OF_FILE) if m), None)
        out[int(match.group(1)) if match else 0] += int(entry["size"])
    return out


# ---------------------------------------------------------------- the processes


def _full_state_saver(directory: str, info):
    """The full-state save of a sharded run: gather to rank 0, which writes labkit's full
    checkpoint (model.pt, train.pt) and commits."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    from labkit.core import checkpoint
    from labkit.torch import state

    def save(c, step: int, position) -> None:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # rank 0 gets it all
        model_state, optimizer_state = get_state_dict(c.model, c.optimizer, options=options)
        if info.is_main:
            train = {"optimizer": optimizer_state, "scheduler": c.scheduler.state_dict(),
                     "scaler": c.scaler.state_dict(), "next_step": step + 1,
                     "data_position": {"epoch": position.epoch, "sample": position.sample}}
            checkpoint.save(directory, step, {"model.pt": state.to_bytes(model_state),
                                              "train.pt": state.to_bytes(train)},
                            {"world_size": info.world_size, "framework": "torch"}, keep=1)
        dist.barrier()

    return save


def _gathered(c) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optimizer_state = get_state_dict(c.model, c.optimizer,
                                                  options=StateDictOptions(full_state_dict=True))
    return {"model": model_state, "optim": optimizer_state["state"]}


def _reload_is_identical(c, directory: str, info) -> bool:
    """Zero the weights and AdamW moments, restore the newest DCP step, compare with the state
    gathered before (every rank compares the whole state)."""
    import torch

    from labkit.torch import state

    before = _gathered(c)
    with torch.no_grad():
        for p in c.model.parameters():
            p.zero_()
        for entries in c.optimizer.state.values():
            for value in entries.values():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    value.zero_()
    state.restore_dcp(directory, c, info)
    after = _gathered(c)
    same = [torch.equal(before["model"][k], after["model"][k]) for k in before["model"]]
    same += [torch.equal(v, after["optim"][fqn][key]) for fqn, entries in before["optim"].items()
             for key, v in entries.items() if isinstance(v, torch.Tensor)]
    return all(same)


def _worker(config: TrainConfig, model_config: GPTConfig | None, saves: int, root: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from labkit.core import checkpoint
    from labkit.torch import distributed, engine, state, trainer
    from labkit.torch.data import DataPosition, ResumableLoader, make_dataset

    info = distributed.info_from_env()
    device = engine.resolve_device(config.device, info)
    info = distributed.init(device.type, info)
    c = engine.build(config, info, device, model_config)
    loader = ResumableLoader(make_dataset(c.model_config, config.num_samples_or_default(), config.seed),
                             engine.micro_batch_size(config, info.world_size), world_size=info.world_size,
                             rank=info.rank, seed=config.seed)
    for _ in range(2):  # AdamW's moments exist from the first step on
        trainer.train_step(c, [engine.to_device(next(loader), c, False)], config.grad_clip)
    position = DataPosition(0, 2 * config.batch_size)
    dirs = {name: f"{root}/{name.replace(' ', '-')}" for name in FORMATS}
    savers = {"full state": _full_state_saver(dirs["full state"], info),
              "rank files": state.ShardedSaver(dirs["rank files"], info, keep=1).save,
              "dcp": state.DcpSaver(dirs["dcp"], info, keep=1).save}
    steps = iter(range(10**6))

    def timed(name: str):
        def run() -> float:
            dist.barrier()
            start = time.perf_counter()
            savers[name](c, next(steps), position)
            seconds = torch.tensor(time.perf_counter() - start, dtype=torch.float64, device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
            return float(seconds)
        return run

    seconds = stats.round_robin({name: timed(name) for name in FORMATS}, repeats=saves, warmup=WARMUP_SAVES)
    identical = _reload_is_identical(c, dirs["dcp"], info)
    if info.is_main:
        markers = {name: checkpoint.read_marker(d, checkpoint.committed_steps(d)[-1]) for name, d in dirs.items()}
        report = {"world_size": info.world_size, "device": str(device), "parameters": sum(
                      p.numel() for p in c.model.parameters()),
                  "model": asdict(c.model_config), "saves": saves, "seconds": seconds,
                  "bytes_by_rank": {name: bytes_by_rank(m["files"], info.world_size) for name, m in markers.items()},
                  "files": {name: sorted(m["files"]) for name, m in markers.items()},
                  "dcp_reload_identical": identical}
        Path(out).write_text(json.dumps(report))
    dist.barrier()
    distributed.exit_if_replica(0 if identical else 1)


def measure(config: TrainConfig, *, nproc: int = 2, saves: int = 5, model_config: GPTConfig | None = None,
            workdir: str | Path | None = None, timeout_s: float | None = None) -> dict[str, Any]:
    """Run the measurement on `nproc` local processes (`config` as zero3, `model_config` for a GPT
    size other than `config.scale`'s) and return rank 0's report: each format's save times in
    seconds (`saves` each), the bytes each rank wrote, the files, and whether the DCP checkpoint
    loaded back bit for bit. Checkpoints go to `workdir` (default: a temporary folder), deleted
    after."""
    from labkit.core.config import check_int
    from labkit.torch.launch import launch_replicas

    check_int("saves", saves, minimum=stats.MIN_REPEATS)
    config = replace(config, parallel="zero3", checkpoint_format="dcp")
    config.check_world_size(nproc)
    with tempfile.TemporaryDirectory(prefix="labkit-sharded-ckpt-", dir=workdir) as tmp:
        out = Path(tmp) / "report.json"
        argv = [sys.executable, "-m", "labkit.course.sharded_checkpoints", "--config", json.dumps(asdict(config)),
                "--saves", str(saves), "--root", str(Path(tmp) / "ckpt"), "--out", str(out)]
        if model_config is not None:
            argv += ["--gpt", json.dumps(asdict(model_config))]
        launch_replicas(argv, nproc, timeout_s=timeout_s, what="checkpoint measurement")
        report = json.loads(out.read_text())
    if not report["dcp_reload_identical"]:
        raise AssertionError("the DCP checkpoint did not load back bit for bit")
    return report


# ---------------------------------------------------------------- what the notebook shows


def _ms(report: dict[str, Any], name: str) -> stats.Spread:
    return stats.Spread(tuple(1000 * s for s in report["seconds"][name]))


def rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per format: time per save (median, range), MB each rank wrote, who can resume it."""
    out = []
    for name in FORMATS:
        per_rank = report["bytes_by_rank"][name]
        ms = _ms(report, name)
        out.append({"format": name, "ms per save": round(ms.median, 1), "range ms": ms.range_text(),
                    **{f"MB rank {r}": round(b / 1e6, 2) for r, b in enumerate(per_rank)},
                    "files": len(report["files"][name]), "resumable on": RESUMABLE_ON[name]})
    return out


def time_comparison(report: dict[str, Any], against: str = "full state") -> stats.Comparison:
    """The DCP save's time in ms against `against`'s (lower is better): a verdict only when
    the ranges of the repeated saves part."""
    return stats.compare(_ms(report, against).values, _ms(report, "dcp").values, higher_is_better=False)


def bytes_ratio(report: dict[str, Any]) -> float:
    """The busiest rank's bytes per checkpoint under DCP over the full-state save's."""
    return max(report["bytes_by_rank"]["dcp"]) / max(report["bytes_by_rank"]["full state"])


@dataclass(frozen=True)
class CheckpointFindings:
    """What the measurement shows (`findings`): the bytes each rank wrote with the full-state
    save and with DCP, the busiest rank's DCP bytes over the full-state save's (`bytes_ratio`),
    the DCP save's time against the full-state save's (`time`, in ms) with its verdict
    (`labkit.course.ladder.verdict`: "faster" only when every DCP save beat every full-state
    one), and whether the DCP checkpoint loaded back bit for bit."""

    world_size: int
    full_by_rank: tuple[int, ...]
    dcp_by_rank: tuple[int, ...]
    bytes_ratio: float
    time: stats.Comparison
    verdict: str
    reload_identical: bool


def findings(report: dict[str, Any]) -> CheckpointFindings:
    """The numbers and the verdict of a `measure` report."""
    time = time_comparison(report)
    return CheckpointFindings(report["world_size"], tuple(report["bytes_by_rank"]["full state"]),
                              tuple(report["bytes_by_rank"]["dcp"]), bytes_ratio(report), time,
                              ladder.verdict(time), report["dcp_reload_identical"])


def reference() -> dict[str, Any] | None:
    """The newest `benchmarks/results/*-cpu-sharded-checkpoint.json` (None when labkit is
    installed without its repository's results)."""
    from labkit.hardware.results import results_dir

    found = sorted(results_dir().glob("*-cpu-sharded-checkpoint.json"))
    return json.loads(found[-1].read_text()) | {"file": f"benchmarks/results/{found[-1].name}"} if found else None


def reference_rows(ref: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per state size of a `reference()` benchmark: its parameters and full-state bytes,
    each format's median ms per save, the DCP save against the full-state save (its verdict)
    and the busiest rank's bytes under DCP over the full-state save's."""
    out = []
    for size, r in ref["sizes"].items():
        row = {"state": size, "M parameters": round(r["parameters"] / 1e6, 1),
               "full state MB": round(sum(r["bytes_by_rank"]["full state"]) / 1e6, 1)}
        row |= {f"{name} ms": round(_ms(r, name).median) for name in FORMATS}
        row |= {"dcp vs full state": ladder.verdict(time_comparison(r)),
                "busiest rank bytes, dcp / full": round(bytes_ratio(r), 2)}
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="one process of labkit.course.sharded_checkpoints.measure")
    p.add_argument("--config", required=True, help="TrainConfig fields as JSON")
    p.add_argument("--gpt", default=None, help="GPTConfig fields as JSON")
    p.add_argument("--saves", type=int, required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    model_config = GPTConfig(**json.loads(args.gpt)) if args.gpt else None
    _worker(replace(TrainConfig(), **json.loads(args.config)), model_config, args.saves, args.root, args.out)


if __name__ == "__main__":
    main()
