"""Where the processes of one machine train: the one rule every launcher, engine, recipe and demo
follows, as a pure function of the process count, the GPU count and the `device` asked for.

NCCL refuses two ranks on one GPU, and a rank told to use `cuda:LOCAL_RANK` past the last GPU
fails with "invalid device ordinal". So:

- `device="cpu"`: every process on the CPU, gloo between them.
- `device="auto"`: one process per GPU with NCCL when there are at least as many GPUs as
  processes; otherwise every process on the CPU with gloo, and the reason says so (a demo of two
  processes on a one-GPU machine runs on the CPU rather than crashing).
- `device="cuda"`: what a job that pays for GPUs passes. No GPU, or fewer GPUs than processes, is
  a `ParameterError` naming `device`: a GPU job never trains on the CPU without a word.

    p = place(processes=2, gpus=1)          # Placement(device='cpu', backend='gloo', ...)
    p.device_for(local_rank=1)              # 'cpu'
    print(p.reason)
    place_here(device="auto").device        # 'cuda' or 'cpu': one torch process on this machine

`DEVICES` are the choices of every `device` parameter and `--device` flag; `place_here` applies
the rule to the GPUs torch can use on this machine, for code that runs torch itself (a benchmark,
a profiled workload, a demo step); TensorFlow's set-up (`labkit.tf.runtime.configure`) applies it
to the GPUs TensorFlow sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.core.config import ParameterError, check_choice, check_int
from labkit.core.devices import torch_gpu_count

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement:
    """Where `processes` processes of one machine run: `device` "cuda" (process i on GPU i) or
    "cpu"; `backend` is the torch.distributed backend between them (None for one process)."""

    device: str
    backend: str | None
    processes: int
    gpus: int
    reason: str

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def visible_devices(self, local_rank: int, parent: str | None = None) -> str:
        """CUDA_VISIBLE_DEVICES for the process with this local rank when each process is a
        separate program that sees GPU 0 only (the emulated nodes of a Vertex job on one
        machine): its own GPU, or none at all on the CPU. `parent`: the launcher's own
        CUDA_VISIBLE_DEVICES, whose i-th entry is GPU i here."""
        if not self.on_gpu:
            return ""
        ids = [i.strip() for i in parent.split(",")] if parent else [str(i) for i in range(self.gpus)]
        return ids[local_rank]

    def device_for(self, local_rank: int) -> str:
        """The torch device string of the process with this local rank."""
        if not 0 <= local_rank < self.processes:
            raise ValueError(f"local_rank {local_rank} is outside 0..{self.processes - 1}")
        return f"cuda:{local_rank}" if self.on_gpu else "cpu"


def place(processes: int, gpus: int, *, device: str = "auto") -> Placement:
    """Place `processes` processes of one machine that has `gpus` visible GPUs (see the module
    docstring for the rule). Raises ParameterError naming `device` when `device="cuda"` cannot
    be honoured."""
    check_choice("device", device, DEVICES)
    check_int("processes", processes, minimum=1)
    check_int("gpus", gpus, minimum=0)
    backend_cpu = "gloo" if processes > 1 else None
    backend_gpu = "nccl" if processes > 1 else None
    each = "the process" if processes == 1 else f"each of the {processes} processes"
    if device == "cpu":
        return Placement("cpu", backend_cpu, processes, gpus, f"device='cpu': {each} runs on the CPU"
                         + (" with gloo" if processes > 1 else ""))
    if device == "cuda":
        if gpus == 0:
            raise ParameterError("device", device, "needs a CUDA GPU, and none is visible here "
                                 "(no NVIDIA driver reachable, or CUDA_VISIBLE_DEVICES hides them)")
        if processes > gpus:
            raise ParameterError("device", device, f"puts one process on each GPU, and {processes} "
                                 f"processes need {processes} GPUs; this machine has {gpus} (NCCL "
                                 f"refuses two ranks on one GPU). Use device='cpu' or fewer processes")
        return Placement("cuda", backend_gpu, processes, gpus, f"device='cuda': {each} on its own GPU"
                         + (" with NCCL" if processes > 1 else ""))
    if gpus == 0:
        return Placement("cpu", backend_cpu, processes, gpus, "no GPU is visible here, so "
                         + each + " runs on the CPU" + (" with gloo" if processes > 1 else ""))
    if processes > gpus:
        return Placement("cpu", backend_cpu, processes, gpus,
                         f"{processes} processes but {gpus} GPU{'s' if gpus > 1 else ''}: NCCL refuses two "
                         f"ranks on one GPU, so the processes run on the CPU with gloo")
    return Placement("cuda", backend_gpu, processes, gpus,
                     "one GPU" if processes == 1 else f"one process per GPU ({processes} of {gpus}) with NCCL")


def place_here(processes: int = 1, *, device: str = "auto") -> Placement:
    """`place` for `processes` torch processes of this machine, on the GPUs torch can use here."""
    return place(processes, torch_gpu_count(), device=device)
