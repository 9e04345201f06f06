"""All-reduce bandwidth: how fast this machine's processes (or GPUs) can sum a gradient buffer.

`allreduce_benchmark(AllReduceConfig(...))` starts `world_size` processes on loopback (gloo on
CPU, nccl with one process per GPU), all-reduces float32 buffers from kilobytes to hundreds of
megabytes, and reports for each size the median time, the algorithm bandwidth
(size / time) and the bus bandwidth (algbw x 2(n-1)/n: the traffic a ring all-reduce puts on
each link, comparable with the link's limit, as in nccl-tests). `labkit.course.multinode.plot_allreduce_bandwidth` draws it.

``python -m labkit.hardware.allreduce worker ...`` is the per-process entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.core.cluster import free_ports, local_processes
from labkit.core.config import ParameterError, check_choice, check_int
from labkit.core.devices import torch_gpu_count
from labkit.core.launcher import GroupConfig, ProcessSpec, child_env, run_group
from labkit.core.placement import place_here

KB, MB = 1024, 1024 * 1024


def size_ladder(min_bytes: int = 4 * KB, max_bytes: int = 256 * MB, factor: int = 4) -> list[int]:
    """Geometric sizes from `min_bytes` to `max_bytes` (inclusive when on the ladder)."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """Ring all-reduce moves 2(n-1)/n of the buffer over each link."""
    return algbw * 2 * (world_size - 1) / world_size if world_size > 1 else algbw


@dataclass
class AllReduceConfig:
    """Sizes in bytes (float32 buffers), processes, backend ("auto": nccl with GPUs, else gloo),
    timed iterations per size (fewer for big sizes: at least `min_iters`, about `target_s`
    seconds per size), warm-up iterations."""

    sizes: list[int] = field(default_factory=lambda: size_ladder(4 * KB, 16 * MB))
    world_size: int = 2
    backend: str = "auto"
    min_iters: int = 3
    max_iters: int = 50
    target_s: float = 0.5
    warmup: int = 2
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_int("world_size", self.world_size, minimum=1)
        check_choice("backend", self.backend, ("auto", "gloo", "nccl"))
        check_int("min_iters", self.min_iters, minimum=1)
        if not self.sizes or any(s < 4 for s in self.sizes):
            raise ValueError(f"sizes must be byte counts >= 4 (got {self.sizes!r})")


@dataclass
class AllReduceResult:
    size_bytes: int
    iters: int
    time_s: float  # median over iterations (slowest rank)
    algbw_gbps: float  # GB/s = 1e9 bytes/s
    busbw_gbps: float


@dataclass
class AllReduceReport:
    backend: str
    world_size: int
    device: str
    results: list[AllReduceResult]

    @property
    def peak_busbw_gbps(self) -> float:
        return max(r.busbw_gbps for r in self.results)

    def to_dict(self) -> dict:
        return asdict(self)




def measure(sizes: list[int], *, min_iters: int, max_iters: int, target_s: float, warmup: int,
            device: str) -> list[AllReduceResult]:
    """In an initialised process group: time all-reduce for each size (all ranks call it)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    cuda = device.startswith("cuda")
    out = []
    for size in sizes:
        buf = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf)
        if cuda:
            torch.cuda.synchronize()
        # Calibrate the iteration count on one timed call, then agree on it across ranks.
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        if cuda:
            torch.cuda.synchronize()
        guess = max(min_iters, min(max_iters, int(target_s / max(time.perf_counter() - t0, 1e-6))))
        n = torch.tensor([guess], device=device)
        dist.all_reduce(n, op=dist.ReduceOp.MIN)
        times = []
        for _ in range(int(n.item())):
            dist.barrier()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                dist.all_reduce(buf)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                times.append(time.perf_counter() - t0)
        slowest = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        t = float(slowest.item())
        algbw = size / t / 1e9
        out.append(AllReduceResult(size, int(n.item()), t, algbw, bus_bandwidth(algbw, world)))
    return out


def _worker(args) -> int:
    import torch
    import torch.distributed as dist

    from labkit.core.cluster import from_env

    info = from_env()
    if info.global_world_size < 2:
        raise SystemExit("the benchmark needs world_size >= 2")
    where = place_here(info.local_world_size)  # nccl only with a GPU for each process here
    backend = args.backend if args.backend != "auto" else (where.backend or "gloo")
    os.environ.update(info.torch_env())
    dist.init_process_group(backend, init_method="env://")
    device = f"cuda:{info.local_rank}" if backend == "nccl" else "cpu"
    torch.set_num_threads(1)
    results = measure(json.loads(args.sizes), min_iters=args.min_iters, max_iters=args.max_iters,
                      target_s=args.target_s, warmup=args.warmup, device=device)
    if info.global_rank == 0:
        name = torch.cuda.get_device_name(0) if backend == "nccl" else "CPU process"
        report = AllReduceReport(backend, info.global_world_size, name, results)
        Path(args.out).write_text(json.dumps(report.to_dict()))
    dist.barrier()  # tearing gloo down while a peer still talks to it can abort the process
    dist.destroy_process_group()
    return 0


def allreduce_benchmark(config: AllReduceConfig) -> AllReduceReport:
    """Launch `config.world_size` local processes and return rank 0's measurements."""
    backend = config.backend
    if backend == "auto":  # nccl only with a GPU per process (labkit.core.placement)
        backend = place_here(config.world_size).backend or "gloo"
    if backend == "nccl" and torch_gpu_count() < config.world_size:
        raise ParameterError("world_size", config.world_size,
                             f"nccl needs one GPU per process and this machine has {torch_gpu_count()}; "
                             "use backend='gloo' or fewer processes")
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory(prefix="labkit-allreduce-") as tmp:
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "labkit.hardware.allreduce", "worker", "--backend", backend,
               "--sizes", json.dumps(config.sizes), "--min-iters", str(config.min_iters),
               "--max-iters", str(config.max_iters), "--target-s", str(config.target_s),
               "--warmup", str(config.warmup), "--out", str(out)]
        specs = [ProcessSpec(f"rank {info.global_rank}", cmd,
                             child_env({**info.torch_env(), "OMP_NUM_THREADS": "1"}))
                 for info in local_processes(config.world_size, port)]
        # A LaunchTimeout is a TimeoutError, a LaunchError a RuntimeError.
        run_group(specs, GroupConfig(timeout_s=config.timeout_s)).check("all-reduce benchmark process")
        if not out.exists():
            raise RuntimeError("all-reduce benchmark: rank 0 wrote no report")
        data = json.loads(out.read_text())
    data["results"] = [AllReduceResult(**r) for r in data["results"]]
    return AllReduceReport(**data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.hardware.allreduce")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="one rank of the benchmark (env:// variables set)")
    w.add_argument("--backend", default="auto")
    w.add_argument("--sizes", required=True, help="JSON list of byte sizes")
    w.add_argument("--min-iters", type=int, default=3)
    w.add_argument("--max-iters", type=int, default=50)
    w.add_argument("--target-s", type=float, default=0.5)
    w.add_argument("--warmup", type=int, default=2)
    w.add_argument("--out", required=True)
    return _worker(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
