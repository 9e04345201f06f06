"""Your own trainer in the course: notebooks 06 and 07 run `examples/` trainers (plain scripts
that import nothing from labkit) through `labkit emulate` (`labkit.vertex.own_job`) and read
back what they left, as a learner would read their own job.

`example(name)` is the folder of an example trainer. `epochs(run)` reads the ``Epoch N/M: ...
test loss X`` lines each replica printed (attempt by attempt), so a notebook can show the
curve and check the model learned; `output_rows(run)` lists the files the job left in its
bucket; `restart_rows(run)` what happened to each replica across attempts. `run_example`
(06: the DDP example as a 2-node job) and `preemption_comparison` (07: undisturbed and
preempted on Spot) run them and say what they show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.course.tables import table
from labkit.vertex.images import source_root
from labkit.vertex.own_job import Emulated, JobRequest, cli_line, emulate

_EPOCH = re.compile(r"Epoch (\d+)/(\d+): train loss ([\d.]+), test loss ([\d.]+), test accuracy ([\d.]+)")
# Three classes: a model that learned nothing scores ln 3 on held-out data.
CHANCE_LOSS = 1.0986


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


def learned(rows: list[dict[str, Any]]) -> bool:
    """Whether the held-out loss fell from the first epoch and ended below chance."""
    return len(rows) >= 2 and rows[-1]["test_loss"] < rows[0]["test_loss"] and rows[-1]["test_loss"] < CHANCE_LOSS


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
    """An example trainer run as your own job: the request, what it left, what it printed."""

    request: JobRequest
    run: Emulated

    @property
    def epochs(self) -> list[dict[str, Any]]:
        return epochs(self.run)

    def text(self) -> str:
        rows = self.epochs
        verdict = "learned" if learned(rows) else "did NOT learn"
        return "\n".join([
            cli_line(self.request), self.run.job.summary().splitlines()[0], "",
            table(rows, title="what the primary replica printed"), "",
            table(output_rows(self.run), title=f"in the emulated bucket ({self.run.bucket_folder})"), "",
            f"held-out loss {rows[0]['test_loss']:.3f} after epoch 1, {rows[-1]['test_loss']:.3f} after epoch "
            f"{rows[-1]['epoch']} (chance {CHANCE_LOSS:.3f}): {verdict}"])


def run_example(request: JobRequest) -> ExampleRun:
    return ExampleRun(request, emulate(request))


@dataclass
class PreemptionComparison:
    """The same example job undisturbed and preempted (Spot), epoch by epoch."""

    undisturbed: ExampleRun
    preempted: ExampleRun

    @property
    def identical(self) -> bool:
        """Whether every epoch's held-out loss is the same in both (an exact resume)."""
        return [r["test_loss"] for r in self.undisturbed.epochs] == [r["test_loss"] for r in self.preempted.epochs]

    def text(self) -> str:
        job = self.preempted.run.job
        calm, hit = self.undisturbed.epochs, self.preempted.epochs
        return "\n".join([
            cli_line(self.preempted.request), "",
            table(restart_rows(self.preempted.run), title="the preempted job, replica by replica"),
            *(e for e in job.events if "SIG" in e or "preempted" in e), "",
            table(hit, title="epochs as the primary replica reported them"), "",
            f"final held-out loss: undisturbed {calm[-1]['test_loss']:.4f}, preempted and resumed "
            f"{hit[-1]['test_loss']:.4f}: " + ("identical at every epoch" if self.identical else "they differ")])


def preemption_comparison(workdir: Path, *, replicas: int, epochs: int, at_epoch: int = 1) -> PreemptionComparison:
    """Run `examples/ddp_trainer` on Spot twice: undisturbed, and preempted at `at_epoch`."""
    runs = [run_example(ddp_request(workdir, f"own-{name}", replicas=replicas, epochs=epochs, spot=True,
                                    preempt_at_epoch=at))
            for name, at in (("undisturbed", None), ("preempted", at_epoch))]
    return PreemptionComparison(*runs)
