"""The repository's own benchmark results (`benchmarks/results/`), read from the files that the
benchmark scripts wrote, so a reference figure is never retyped: each one comes back with the
file, the device, the software, the date and the command that produced it.

    ladder = resnet_ladder()                # labkit's ResNet-50 ladder on one H100, per rung
    best_resnet()                           # the fastest rung: images/s, with its provenance
    gpt_mfu(datasheet_tflops=989.5)         # GPT-2 small MFU, against the datasheet and the GEMM

MFU comes in two kinds, and this module names which: against the **measured** bf16 GEMM peak
of the same run (what the benchmark files store), and against the **datasheet** peak (what
`labkit.hardware.cost` multiplies, so its default utilisation comes from here). The files live
in the source tree, not in an installed package: without them `ResultsUnavailable` says so.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RESNET_FILE = "2026-11-22-h100-bench-torch-resnet.json"
GPT_FILE = "2026-11-22-h100-bench-torch-gpt.json"

# Variant name in the ResNet file -> rung key of the course's precision ladder (which owns the
# rungs' labels); the last variant, CUDA graphs on top of compile, has no rung on the course's
# ladder. A reference is labelled with its variant's own name in the file.
RESNET_RUNGS = {
    "labkit fp32": "fp32",
    "labkit tf32": "tf32",
    "labkit bf16": "bf16",
    "labkit bf16 + channels_last": "bf16_channels_last",
    "labkit bf16 + channels_last + compile": "bf16_channels_last_compile",
    "labkit bf16 + channels_last + compile (reduce-overhead)": "bf16_channels_last_compile_graphs",
}
# The GPT rows the estimator's utilisation can come from: (workload, variant) -> what it is.
GPT_MFU_ROWS = {
    ("GPT b=12", "peer eager"): "a minimal GPT trainer, eager, batch 12",
    ("GPT b=48", "labkit bf16 + compile"): "labkit bf16 + torch.compile, batch 48",
    ("GPT b=48", "labkit bf16 + compile + fp8 head"): "labkit bf16 + torch.compile + fp8 head, batch 48",
}
DEFAULT_MFU_ROW = ("GPT b=48", "labkit bf16 + compile")


class ResultsUnavailable(FileNotFoundError):
    """The benchmark results are not where this installation looks (they ship with the source
    tree, not with an installed package); the message names the folder."""


@dataclass(frozen=True)
class ResultsFile:
    """One results file: its data and where it came from."""

    name: str
    data: dict[str, Any]

    @property
    def device(self) -> str:
        if "machine" in self.data:  # a course run: the machine it ran on
            return (self.data["machine"].get("gpu") or ["CPU"])[0]
        return str(self.data.get("device", "unknown device"))

    @property
    def software(self) -> str:
        if "machine" in self.data:
            v = self.data["machine"].get("versions", {})
            return ", ".join(f"{k} {v[k]}" for k in ("torch", "cuda") if v.get(k))
        return str(self.data.get("software") or (f"torch {self.data['torch']}" if "torch" in self.data else ""))

    @property
    def date(self) -> str:
        return str(self.data.get("date", ""))

    @property
    def command(self) -> str:
        return str(self.data.get("command", ""))

    def provenance(self) -> str:
        """`benchmarks/results/NAME: DEVICE, SOFTWARE, DATE, `COMMAND``."""
        parts = [p for p in (self.device, self.software, self.date) if p]
        return f"benchmarks/results/{self.name}: " + ", ".join(parts) + (f"; `{self.command}`" if self.command else "")


@dataclass(frozen=True)
class Reference:
    """A figure taken from a results file: `value` in `unit`, what was measured, and its file."""

    key: str
    label: str
    value: float
    unit: str
    source: ResultsFile
    note: str = ""  # what the run recorded beside the value (device, range, repeats)

    @property
    def range(self) -> str | None:
        """The range of repeated runs the note records ("range 2,855–2,879"), if any."""
        found = re.search(r"range ([\d,.]+\s*[–-]\s*[\d,.]+)", self.note)
        return found.group(1) if found else None

    def text(self, digits: int = 0) -> str:
        return f"{self.value:,.{digits}f} {self.unit} ({self.label}; {self.source.provenance()})"


def results_dir() -> Path:
    """`LABKIT_RESULTS_DIR` when set, else the source tree's `benchmarks/results`."""
    return Path(os.environ.get("LABKIT_RESULTS_DIR") or RESULTS_DIR)


def load(name: str) -> ResultsFile:
    """The JSON results file `name` from `results_dir()`."""
    path = results_dir() / name
    if not path.exists():
        raise ResultsUnavailable(f"{path}: benchmark results not found (they ship with labkit's "
                                 "source tree; set LABKIT_RESULTS_DIR to the folder that holds them)")
    return ResultsFile(name, json.loads(path.read_text(encoding="utf-8")))


def resnet_ladder() -> list[Reference]:
    """labkit's ResNet-50 ladder (batch 256) on one H100, one Reference per rung, in climbing
    order, in images/s."""
    f = load(RESNET_FILE)
    rows = {r["variant"]: r for r in f.data["rows"]}
    return [Reference(key, variant.removeprefix("labkit "), float(rows[variant]["rate"]), rows[variant]["unit"], f)
            for variant, key in RESNET_RUNGS.items() if variant in rows]


def best_resnet() -> Reference:
    """The fastest rung of `resnet_ladder()`."""
    return max(resnet_ladder(), key=lambda r: r.value)


@dataclass(frozen=True)
class MfuReference:
    """GPT-2 small's model FLOPs utilisation in one measured configuration, against both peaks:
    `of_measured` the bf16 GEMM timed in the same run (`measured_tflops`), `of_datasheet` the
    datasheet figure (`datasheet_tflops`)."""

    key: str
    label: str
    tokens_per_s: float
    of_measured: float
    measured_tflops: float
    datasheet_tflops: float
    source: ResultsFile

    @property
    def of_datasheet(self) -> float:
        return self.of_measured * self.measured_tflops / self.datasheet_tflops

    def text(self) -> str:
        return (f"{self.label}: {self.tokens_per_s:,.0f} tokens/s = {self.of_datasheet:.1%} of the "
                f"{self.datasheet_tflops:,.0f} TFLOP/s datasheet peak ({self.of_measured:.1%} of the "
                f"{self.measured_tflops:,.0f} TFLOP/s bf16 GEMM measured in the same run); "
                f"{self.source.provenance()}")


def gpt_mfu(datasheet_tflops: float, rows: tuple[tuple[str, str], ...] | None = None) -> list[MfuReference]:
    """The GPT-2 small rows of `GPT_MFU_ROWS` (or `rows`) with their MFU against both peaks."""
    f = load(GPT_FILE)
    measured = float(f.data["peak_tflops"])
    by_key = {(r["workload"], r["variant"]): r for r in f.data["rows"]}
    out = []
    for wanted in rows or tuple(GPT_MFU_ROWS):
        r = by_key[wanted]
        out.append(MfuReference(" / ".join(wanted), GPT_MFU_ROWS.get(wanted, " ".join(wanted)),
                                float(r["rate"]), float(r["mfu"]), measured, datasheet_tflops, f))
    return out


def default_mfu(datasheet_tflops: float) -> MfuReference:
    """The utilisation the cost estimator assumes unless told otherwise: labkit's GPT-2 small
    with bf16 and torch.compile at batch 48 on one H100, against the datasheet peak."""
    return gpt_mfu(datasheet_tflops, (DEFAULT_MFU_ROW,))[0]


# ---------------------------------------------------------------- the course run on a GPU

COURSE_SUFFIX = "-course.json"  # written by benchmarks/course_gpu.py: <date>-<gpu>-course.json


@dataclass(frozen=True)
class CourseRun:
    """A full-size run of the whole course on one GPU (`benchmarks/course_gpu.py`): each
    notebook's status, seconds, plan and key figures, and the machine it ran on."""

    file: ResultsFile

    @property
    def device(self) -> str:
        return self.file.device

    def provenance(self) -> str:
        d = self.file.data
        trimmed = f", time budget {d['budget_s']:g} s" if d.get("budget_s") else ""
        return (f"benchmarks/results/{self.file.name}: the course at scale {d.get('scale')} on "
                f"{self.device} ({self.file.software}), {d.get('date')}{trimmed}; `{d.get('command', '')}`")

    def _record(self, notebook: str) -> tuple[str, dict] | None:
        """(stem, record) of `notebook` ("04" or its full stem) when it finished ok in this run."""
        for stem, record in self.file.data.get("notebooks", {}).items():
            if stem.startswith(notebook[:2]) and record.get("status") == "ok":
                return stem, record
        return None

    def ran(self, notebook: str) -> bool:
        """Whether `notebook` ran in this run and finished ok."""
        return self._record(notebook) is not None

    def figures(self, notebook: str) -> list[Reference]:
        """Key figures one notebook recorded in this run (`notebook`: "04" or its full stem)."""
        found = self._record(notebook)
        if found is None:
            return []
        stem, record = found
        return [Reference(stem, f["name"], f["value"], f.get("unit", ""), self.file, f.get("note", ""))
                for f in record.get("figures", []) if isinstance(f.get("value"), (int, float))]


def course_run(notebook: str | None = None) -> CourseRun | None:
    """The newest full-size course run on a GPU in `results_dir()`, or None. With `notebook`
    ("04" or its full stem): the newest in which that notebook ran and finished ok; a later run
    of other notebooks does not hide it."""
    if not results_dir().exists():
        return None
    runs = []
    for path in results_dir().glob(f"*{COURSE_SUFFIX}"):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("scale") == "full" and data.get("machine", {}).get("gpu"):
            run = CourseRun(ResultsFile(path.name, data))
            if notebook is None or run.ran(notebook):
                runs.append(((str(data.get("date", "")), str(data.get("finished_at", "")), path.name), run))
    return max(runs, key=lambda r: r[0])[1] if runs else None


# ---------------------------------------------------------------- utilisation by kind of model

# The measured run that stands for a kind of model at a precision: (file, workload, variant).
# Convolutional networks: labkit's ResNet-50 ladder; matmul-bound ones (transformers, MLPs):
# labkit's GPT-2 small. No fp32 transformer run was measured: an fp32 estimate of one needs
# the user's own utilisation.
KIND_MFU_ROWS = {
    ("convolutional", "fp32"): (RESNET_FILE, "ResNet-50 b=256", "labkit fp32"),
    ("convolutional", "bf16"): (RESNET_FILE, "ResNet-50 b=256", "labkit bf16 + channels_last + compile"),
    ("matmul", "bf16"): (GPT_FILE, "GPT b=48", "labkit bf16 + compile"),
}


@dataclass(frozen=True)
class KindMfu:
    """The FLOP rate one measured training run reached (`achieved_tflops`: its MFU times the
    bf16 GEMM peak measured in the same run), to restate against any datasheet peak."""

    kind: str
    precision: str
    label: str
    rate: float
    unit: str
    achieved_tflops: float
    source: ResultsFile

    def of_datasheet(self, datasheet_tflops: float) -> float:
        return self.achieved_tflops / datasheet_tflops

    def text(self, datasheet_tflops: float) -> str:
        return (f"{self.label} ({self.rate:,.0f} {self.unit}, {self.achieved_tflops:,.0f} TFLOP/s = "
                f"{self.of_datasheet(datasheet_tflops):.1%} of the {datasheet_tflops:,.0f} TFLOP/s datasheet "
                f"peak); {self.source.provenance()}")


def kind_mfu(kind: str, precision: str) -> KindMfu | None:
    """The measured run standing for `kind` ("convolutional" or "matmul") at `precision`
    ("fp32", or "bf16" which fp16 shares), or None when labkit measured none."""
    key = (kind, "bf16" if precision == "fp16" else precision)
    if key not in KIND_MFU_ROWS:
        return None
    name, workload, variant = KIND_MFU_ROWS[key]
    f = load(name)
    row = next(r for r in f.data["rows"] if r["workload"] == workload and r["variant"] == variant)
    achieved = float(row["mfu"]) * float(f.data["peak_tflops"])
    return KindMfu(kind, key[1], f"labkit {workload.split(' ')[0]} {variant.removeprefix('labkit ')}, "
                   f"{workload.split(' ', 1)[1]}, on {f.device}", float(row["rate"]), row["unit"], achieved, f)
