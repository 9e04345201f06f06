"""What each NVIDIA GPU a Vertex AI job or Workbench VM can have offers: memory, which tensor-core
number formats it has, and its datasheet peak rate per format, each GPU with the page the figures
come from and the date they were read.

The figures live in one file, `gpus.csv` beside this module (`GPU_TABLE_PATH`), one row per GPU:
`TABLE` is read from it, and the accelerator catalog (`labkit.hardware.catalog`) takes each GPU
row's memory, rates and bandwidth from it too. Which formats a GPU runs on tensor cores follows
from its compute capability and `labkit.core.precisions` (the one list of formats).

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

import csv
import datetime as dt
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from labkit.core import precisions

GPU_TABLE_PATH = Path(__file__).with_name("gpus.csv")
FORMATS = precisions.FORMAT_NAMES
PEAK_COLUMNS = {f: f"peak_{f}_tflops" for f in FORMATS}
COLUMNS = ("key", "label", "accelerator_type", "names", "compute_capability", "memory_gb",
           "driver_memory_gib", "memory_bw_gbs", *PEAK_COLUMNS.values(), "datasheet_source", "read_on", "note")


@dataclass(frozen=True)
class GPUFacts:
    """One GPU model. `key` is short and stable (file names, tables); `names` are words that
    identify it in the name the driver reports ("NVIDIA H100 80GB HBM3" → H100 + 80GB).
    `memory_gib` is what the driver reports as total memory (a little under the marketed
    `memory_gb`, the datasheet's figure)."""

    key: str
    label: str
    compute_capability: str
    memory_gib: float
    memory_bw_gbs: float | None
    peak_tflops: dict[str, float] = field(default_factory=dict)
    names: tuple[str, ...] = ()
    accelerator_type: str | None = None  # Vertex AI's name for it
    source: str = ""
    read_on: dt.date | None = None
    derived: bool = False  # not a table row: built from what the driver reports
    memory_gb: float | None = None

    @property
    def capability(self) -> float:
        major, _, minor = self.compute_capability.partition(".")
        return int(major) + int(minor or 0) / 10

    def supports(self, fmt: str) -> bool:
        """Whether matmuls in `fmt` run on tensor cores here (fp32 always runs, on CUDA cores):
        from the compute capability whose tensor cores first ran it (`labkit.core.precisions`)."""
        return self.capability >= precisions.get(fmt).tensor_cores_from

    def why_not(self, fmt: str) -> str | None:
        """None when `fmt` runs here, else the sentence a notebook prints for a skipped rung."""
        if self.supports(fmt):
            return None
        f = precisions.get(fmt)
        return (f"{self.label} (compute capability {self.compute_capability}) has no {fmt} tensor cores; "
                f"they need {f.tensor_cores_from:.1f} ({f.architecture}) or newer")

    def peak(self, fmt: str) -> float | None:
        """Datasheet TFLOP/s for `fmt`, or None when unknown or unsupported."""
        return self.peak_tflops.get(fmt) if self.supports(fmt) else None

    def fastest_format(self) -> str:
        """The 16-bit format the course trains in here: bf16 where it exists, else fp16."""
        return "bf16" if self.supports("bf16") else "fp16"

    def cite(self) -> str:
        if not self.source:
            return "derived from the driver"
        return self.source + (f" (read {self.read_on.isoformat()})" if self.read_on else "")


class GPUTableError(ValueError):
    """The GPU table file is malformed; the message names the file, the row and the column."""


def _cell(row: dict[str, str], column: str, path: Path, line: int, *, number: bool = False,
          required: bool = True) -> str | float | None:
    raw = (row.get(column) or "").strip()
    where = f"{path}: row {line}, column {column!r}"
    if not raw:
        if required:
            raise GPUTableError(f"{where} is empty; every row needs it")
        return None
    if not number:
        return raw
    try:
        value = float(raw)
    except ValueError:
        raise GPUTableError(f"{where} is not a number: {raw!r}") from None
    if value <= 0:
        raise GPUTableError(f"{where} must be positive, got {raw!r}")
    return value


def _row(row: dict[str, str], path: Path, line: int) -> GPUFacts:
    text = {c: _cell(row, c, path, line) for c in ("key", "label", "accelerator_type", "names",
                                                    "compute_capability", "datasheet_source", "read_on")}
    nums = {c: _cell(row, c, path, line, number=True) for c in ("memory_gb", "driver_memory_gib", "memory_bw_gbs")}
    peaks = {f: _cell(row, c, path, line, number=True, required=f == "fp32") for f, c in PEAK_COLUMNS.items()}
    if not str(text["datasheet_source"]).startswith("https://"):
        raise GPUTableError(f"{path}: row {line}, column 'datasheet_source' must be a URL")
    try:
        read_on = dt.date.fromisoformat(str(text["read_on"]))
    except ValueError:
        raise GPUTableError(f"{path}: row {line}, column 'read_on' must be an ISO date (YYYY-MM-DD)") from None
    return GPUFacts(str(text["key"]), str(text["label"]), str(text["compute_capability"]),
                    nums["driver_memory_gib"], nums["memory_bw_gbs"],  # type: ignore[arg-type]
                    {f: v for f, v in peaks.items() if v is not None}, tuple(str(text["names"]).split()),
                    str(text["accelerator_type"]), str(text["datasheet_source"]), read_on,
                    memory_gb=nums["memory_gb"])  # type: ignore[arg-type]


def load_table(path: str | os.PathLike | None = None) -> tuple[GPUFacts, ...]:
    """Read and check a GPU table (default: the one shipped with labkit, `GPU_TABLE_PATH`); a
    malformed file raises GPUTableError naming the file, the row and the column."""
    path = Path(path) if path else GPU_TABLE_PATH
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise GPUTableError(f"{path}: missing column(s) {', '.join(missing)}")
        rows = tuple(_row(r, path, i) for i, r in enumerate(reader, start=2))
    for column in ("key", "accelerator_type"):
        values = [getattr(g, column) for g in rows]
        dupes = sorted({v for v in values if values.count(v) > 1})
        if dupes:
            raise GPUTableError(f"{path}: more than one row with {column} {', '.join(dupes)}")
    return rows


TABLE: tuple[GPUFacts, ...] = load_table()
READ_ON = max(g.read_on for g in TABLE if g.read_on)  # when the table's newest figures were read
# The A100 rows differ only in memory: a bare "A100" name is told apart by the memory reported.
_BY_KEY = {g.key: g for g in TABLE}


def by_key(key: str) -> GPUFacts:
    """The table's row with this key (t4, v100, l4, a100-40gb, a100-80gb, h100, h200)."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"no GPU {key!r} in the table (keys: {', '.join(_BY_KEY)})") from None


def by_accelerator_type(accelerator_type: str) -> GPUFacts | None:
    """The table's row for a Vertex AI accelerator type ("NVIDIA_H100_80GB"), or None."""
    return next((g for g in TABLE if g.accelerator_type == accelerator_type), None)


def _words(name: str) -> set[str]:
    return set("".join(c if c.isalnum() else " " for c in name.upper()).split())


def lookup(name: str, memory_gib: float | None = None) -> GPUFacts | None:
    """The table's row for a driver-reported name ("NVIDIA A100-SXM4-40GB", "Tesla T4"), or None.
    Two rows that share a name (A100 40GB and 80GB) are told apart by `memory_gib`."""
    words = _words(name)
    hits = [g for g in TABLE if g.names[0] in words]  # the model word: T4, L4, A100, H100, ...
    if len(hits) > 1:
        exact = [g for g in hits if all(w in words for w in g.names)]  # "40GB" in the name
        if exact:
            hits = exact
        elif memory_gib is not None:
            hits = [min(hits, key=lambda g: abs(g.memory_gib - memory_gib))]
    return hits[0] if len(hits) == 1 else None


def for_gpu(gpu) -> GPUFacts:
    """Facts for a `labkit.core.devices.GPU`: its table row (memory as reported, which is what
    fits), else a row derived from its compute capability and memory with no peak rates."""
    reported = gpu.memory_bytes / 2**30
    row = lookup(gpu.name, reported)
    if row is not None:
        return replace(row, memory_gib=min(row.memory_gib, reported), peak_tflops=dict(row.peak_tflops))
    cc = gpu.compute_capability or "0.0"
    key = "-".join(sorted(_words(gpu.name) - {"NVIDIA", "TESLA"})).lower() or "gpu"
    return GPUFacts(key, gpu.name, cc, reported, None, {}, (), None, "", None, derived=True)
