"""What each NVIDIA GPU a Vertex AI job or Workbench VM can have offers: memory, which tensor-core
number formats it has, and its datasheet peak rate per format, each GPU with the page the figures
come from and the date they were read.

The course sizes its full-scale runs from these facts (`labkit.course.sizing`): a batch that fits
the memory with headroom, only the precision rungs the GPU can run (a T4 has no bf16 or TF32
tensor cores; fp8 needs compute capability 8.9), and an expected run time from the peak rates.

    facts = for_gpu(devices.detect().gpus[0])   # the table's row, or one derived for an unknown GPU
    facts.supports("bf16"), facts.peak_tflops["bf16"], facts.memory_gib

Rates are dense (no structured sparsity) tensor-core TFLOP/s, except `fp32`, which is the plain
CUDA-core rate. A GPU not in the table gets a row derived from its compute capability and memory,
with no peak rates (`derived=True`): the course then plans with a short measured probe instead.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

READ_ON = dt.date(2026, 11, 26)
FORMATS = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GPUFacts:
    """One GPU model. `key` is short and stable (file names, tables); `names` are words that
    identify it in the name the driver reports ("NVIDIA H100 80GB HBM3" → H100 + 80GB)."""

    key: str
    label: str
    compute_capability: str
    memory_gib: float  # what the driver reports as total memory (a little under the marketed GB)
    memory_bw_gbs: float | None
    peak_tflops: dict[str, float] = field(default_factory=dict)
    names: tuple[str, ...] = ()
    accelerator_type: str | None = None  # Vertex AI's name for it
    source: str = ""
    read_on: dt.date = READ_ON
    derived: bool = False  # not a table row: built from what the driver reports

    @property
    def capability(self) -> float:
        major, _, minor = self.compute_capability.partition(".")
        return int(major) + int(minor or 0) / 10

    def supports(self, fmt: str) -> bool:
        """Whether matmuls in `fmt` run on tensor cores here (fp32 always runs, on CUDA cores).
        bf16 and TF32 arrived with Ampere (8.0), fp8 with Ada and Hopper (8.9); fp16 tensor
        cores with Volta (7.0)."""
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
        minimum = {"fp32": 0.0, "fp16": 7.0, "tf32": 8.0, "bf16": 8.0, "fp8": 8.9}[fmt]
        return self.capability >= minimum

    def why_not(self, fmt: str) -> str | None:
        """None when `fmt` runs here, else the sentence a notebook prints for a skipped rung."""
        if self.supports(fmt):
            return None
        need = {"fp16": "7.0 (Volta)", "tf32": "8.0 (Ampere)", "bf16": "8.0 (Ampere)",
                "fp8": "8.9 (Ada or Hopper)"}[fmt]
        return (f"{self.label} (compute capability {self.compute_capability}) has no {fmt} tensor cores; "
                f"they need {need} or newer")

    def peak(self, fmt: str) -> float | None:
        """Datasheet TFLOP/s for `fmt`, or None when unknown or unsupported."""
        return self.peak_tflops.get(fmt) if self.supports(fmt) else None

    def fastest_format(self) -> str:
        """The 16-bit format the course trains in here: bf16 where it exists, else fp16."""
        return "bf16" if self.supports("bf16") else "fp16"

    def cite(self) -> str:
        return f"{self.source} (read {self.read_on.isoformat()})" if self.source else "derived from the driver"


_NVIDIA = "https://www.nvidia.com/"

TABLE: tuple[GPUFacts, ...] = (
    GPUFacts("t4", "T4", "7.5", 15.0, 320, {"fp32": 8.1, "fp16": 65.0},
             ("T4",), "NVIDIA_TESLA_T4",
             _NVIDIA + "content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"),
    GPUFacts("v100", "V100 16GB", "7.0", 15.8, 900, {"fp32": 15.7, "fp16": 125.0},
             ("V100",), "NVIDIA_TESLA_V100",
             _NVIDIA + "en-us/data-center/v100/"),
    GPUFacts("l4", "L4", "8.9", 22.5, 300,
             {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.0},
             ("L4",), "NVIDIA_L4", _NVIDIA + "en-us/data-center/l4/"),
    GPUFacts("a100-40gb", "A100 40GB", "8.0", 39.4, 1555,
             {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
             ("A100", "40GB"), "NVIDIA_TESLA_A100",
             _NVIDIA + "content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    GPUFacts("a100-80gb", "A100 80GB", "8.0", 79.2, 2039,
             {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
             ("A100", "80GB"), "NVIDIA_A100_80GB",
             _NVIDIA + "content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    GPUFacts("h100", "H100 80GB", "9.0", 79.6, 3350,
             {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
             ("H100",), "NVIDIA_H100_80GB", _NVIDIA + "en-us/data-center/h100/"),
    GPUFacts("h200", "H200 141GB", "9.0", 139.8, 4800,
             {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
             ("H200",), "NVIDIA_H200_141GB", _NVIDIA + "en-us/data-center/h200/"),
)
# The A100 rows differ only in memory: a bare "A100" name is told apart by the memory reported.
_BY_KEY = {g.key: g for g in TABLE}


def by_key(key: str) -> GPUFacts:
    """The table's row with this key (t4, v100, l4, a100-40gb, a100-80gb, h100, h200)."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"no GPU {key!r} in the table (keys: {', '.join(_BY_KEY)})") from None


def _words(name: str) -> set[str]:
    return set("".join(c if c.isalnum() else " " for c in name.upper()).split())


def lookup(name: str, memory_gib: float | None = None) -> GPUFacts | None:
    """The table's row for a driver-reported name ("NVIDIA A100-SXM4-40GB", "Tesla T4"), or None.
    Two rows that share a name (A100 40GB and 80GB) are told apart by `memory_gib`."""
    words = _words(name)
    hits = [g for g in TABLE if all(w in words for w in g.names)]
    if len(hits) > 1 and memory_gib is not None:
        hits = [min(hits, key=lambda g: abs(g.memory_gib - memory_gib))]
    return hits[0] if len(hits) == 1 else None


def for_gpu(gpu) -> GPUFacts:
    """Facts for a `labkit.core.devices.GPU`: its table row (memory as reported, which is what
    fits), else a row derived from its compute capability and memory with no peak rates."""
    reported = gpu.memory_bytes / 2**30
    row = lookup(gpu.name, reported)
    if row is not None:
        return GPUFacts(row.key, row.label, row.compute_capability, min(row.memory_gib, reported),
                        row.memory_bw_gbs, dict(row.peak_tflops), row.names, row.accelerator_type,
                        row.source, row.read_on)
    cc = gpu.compute_capability or "0.0"
    key = "-".join(sorted(_words(gpu.name) - {"NVIDIA", "TESLA"})).lower() or "gpu"
    return GPUFacts(key, gpu.name, cc, reported, None, {}, (), None, "", READ_ON, derived=True)
