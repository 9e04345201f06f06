"""Your own trainer in the course: notebooks 06 and 07 run `examples/` trainers (plain scripts
that import nothing from labkit) through `labkit emulate` (`labkit.vertex.own_job`) and read
back what they left, as a learner would read their own job.

`example(name)` is the folder of an example trainer. `epochs(run)` reads the ``Epoch N/M: ...
test loss X`` lines each replica printed (attempt by attempt), so a notebook can show the
curve, and `learning(rows)` gives the held-out loss after the first and the last epoch against
chance, with whether the model learned; `output_rows(run)` lists the files the job left in its
bucket; `restart_rows(run)` what happened to each replica across attempts. `run_example`
(06: the DDP example as a 2-node job; 12: its own script) and `preemption_comparison` (07:
undisturbed and preempted on Spot) run them. Their `report()` is what the job printed and
left (tables); the notebooks write what it shows from `learning` and `identical`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core.config import ParameterError
from labkit.course.tables import table
from labkit.vertex.images import source_root
from labkit.vertex.own_job import Emulated, JobRequest, cli_line, emulate

_EPOCH = re.compile(r"Epoch (\d+)/(\d+): train loss ([\d.]+), test loss ([\d.]+), test accuracy ([\d.]+)")
# Three classes (examples/ddp_trainer): a model that learned nothing scores ln 3 on held-out data.
CHANCE_LOSS = math.log(3)
LEARNED = "learned"
NOT_LEARNED = "did not learn"


def example(name: str) -> Path:
    """The folder of example trainer `name` (``ddp_trainer``, ``tf_trainer``, ``your_job``)."""
    folder = source_root() / "examples" / name
    if not folder.is_dir() or not any(folder.glob("*.py")):
        raise FileNotFoundError(f"no example trainer at {folder}: the examples/ folder comes with the "
                                "course's source tree (git clone), not with an installed labkit")
    return folder


def epochs(run: Emulated, replica: str = "workerpool0[0]") -> list[dict[str, Any]]:
    """Per epoch, as `replica` reported it (the latest attempt's report of an epoch wins):
    epoch, attempt, train loss, test loss, test accuracy."""
    by_epoch: dict[int, dict[str, Any]] = {}
    for r in run.job.runs if run.job else []:
        if r.name != replica:
            continue
        for m in _EPOCH.finditer(r.log()):
            by_epoch[int(m.group(1))] = {"epoch": int(m.group(1)), "attempt": r.job_attempt,
                                         "train_loss": float(m.group(3)), "test_loss": float(m.group(4)),
                                         "test_accuracy": float(m.group(5))}
    return [by_epoch[k] for k in sorted(by_epoch)]


@dataclass(frozen=True)
class Learning:
    """A run's held-out loss after its first and its last epoch, against chance (the loss of a
    model that learned nothing: ln of the number of classes)."""

    first_loss: float
    last_loss: float
    last_epoch: int
    epochs: int  # how many epochs were reported
    chance: float

    @property
    def learned(self) -> bool:
        """The held-out loss fell from the first epoch and ended below chance."""
        return self.epochs >= 2 and self.last_loss < self.first_loss and self.last_loss < self.chance

    @property
    def verdict(self) -> str:
        """`LEARNED` or `NOT_LEARNED`."""
        return LEARNED if self.learned else NOT_LEARNED


def learning(rows: list[dict[str, Any]], chance: float = CHANCE_LOSS) -> Learning:
    """The `Learning` of per-epoch rows (`epoch`, `test_loss`), in epoch order."""
    if not rows:
        raise ParameterError("rows", rows, "holds no epoch, so there is no held-out loss to read")
    return Learning(rows[0]["test_loss"], rows[-1]["test_loss"], rows[-1]["epoch"], len(rows), chance)


def learned(rows: list[dict[str, Any]], chance: float = CHANCE_LOSS) -> bool:
    """Whether the held-out loss fell from the first epoch and ended below chance."""
    return bool(rows) and learning(rows, chance).learned


def output_rows(run: Emulated) -> list[dict[str, Any]]:
    """The files under the job's base output directory: path, size, and which AIP_* folder."""
    folder = run.bucket_folder
    rows = []
    for name in run.outputs():
        top = name.split("/", 1)[0]
        rows.append({"file": f"{run.built.output_uri.rstrip('/')}/{name}",
                     "bytes": (folder / name).stat().st_size,
                     "written to": {"model": "AIP_MODEL_DIR", "checkpoints": "AIP_CHECKPOINT_DIR",
                                    "logs": "AIP_TENSORBOARD_LOG_DIR"}.get(top, "-")})
    return rows


def restart_rows(run: Emulated) -> list[dict[str, Any]]:
    """Each run of each replica: attempt, exit code, the signal it got, the epochs it printed."""
    rows = []
    for r in run.job.runs if run.job else []:
        printed = [int(m.group(1)) for m in _EPOCH.finditer(r.log())]
        rows.append({"attempt": r.job_attempt, "replica": r.name, "exit": r.exit_code,
                     "signal": r.signal_sent or "-",
                     "epochs": f"{printed[0]}-{printed[-1]}" if printed else "-"})
    return rows


# ---------------------------------------------------------------- what the notebooks run

def ddp_request(workdir: Path, name: str, *, replicas: int, epochs: int, spot: bool = False,
                preempt_at_epoch: int | None = None) -> JobRequest:
    """`examples/ddp_trainer` as a `replicas`-node job from its Dockerfile (what the learner
    types: `cli_line`), optionally on Spot with a preemption when a replica prints that epoch."""
    return JobRequest(dockerfile=str(example("ddp_trainer") / "Dockerfile"), workers=replicas - 1, spot=spot,
                      output=f"gs://my-bucket/{name}", workdir=str(workdir / name),
                      preempt_at_step=preempt_at_epoch, step_pattern=r"Epoch (\d+)/" if spot else None,
                      command=["--epochs", str(epochs)])


@dataclass
class ExampleRun:
    """An example trainer run as your own job: the request, what it left, what it printed, and
    how many classes its data has (chance is ln of it)."""

    request: JobRequest
    run: Emulated
    classes: int = 3

    @property
    def epochs(self) -> list[dict[str, Any]]:
        return epochs(self.run)

    @property
    def learning(self) -> Learning:
        """The primary replica's held-out loss, first epoch to last, against chance."""
        return learning(self.epochs, math.log(self.classes))

    def report(self) -> str:
        """The command, the job's state, the epochs the primary printed and the files in the bucket."""
        return "\n".join([
            cli_line(self.request), self.run.job.summary().splitlines()[0], "",
            table(self.epochs, title="what the primary replica printed"), "",
            table(output_rows(self.run), title=f"in the emulated bucket ({self.run.bucket_folder})")])


def run_example(request: JobRequest, classes: int = 3) -> ExampleRun:
    """`request` run by `labkit emulate`; `classes`: how many classes the trainer's data has."""
    return ExampleRun(request, emulate(request), classes)


@dataclass
class PreemptionComparison:
    """The same example job undisturbed and preempted (Spot), epoch by epoch."""

    undisturbed: ExampleRun
    preempted: ExampleRun

    @property
    def identical(self) -> bool:
        """Whether every epoch's held-out loss is the same in both (an exact resume)."""
        return [r["test_loss"] for r in self.undisturbed.epochs] == [r["test_loss"] for r in self.preempted.epochs]

    def report(self) -> str:
        """The preempted job: its command, each replica's attempts, the signals and the epochs."""
        return "\n".join([
            cli_line(self.preempted.request), "",
            table(restart_rows(self.preempted.run), title="the preempted job, replica by replica"),
            *(e for e in self.preempted.run.job.events if "SIG" in e or "preempted" in e), "",
            table(self.preempted.epochs, title="epochs as the primary replica reported them")])


def preemption_comparison(workdir: Path, *, replicas: int, epochs: int, at_epoch: int = 1) -> PreemptionComparison:
    """Run `examples/ddp_trainer` on Spot twice: undisturbed, and preempted at `at_epoch`."""
    runs = [run_example(ddp_request(workdir, f"own-{name}", replicas=replicas, epochs=epochs, spot=True,
                                    preempt_at_epoch=at))
            for name, at in (("undisturbed", None), ("preempted", at_epoch))]
    return PreemptionComparison(*runs)
