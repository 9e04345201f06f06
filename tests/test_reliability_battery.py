"""The reliability battery: bad inputs and faults a hostile but realistic user tries, as a table.

Each row is one input (a command, a library call, a fault), the error or behaviour expected, and
what actually happened, judged as

- clear: the expected one-line error (exit code 2 from the CLI, a ValueError/OSError subclass
  from the library, naming the parameter or path and the cause, no traceback), or the expected
  clean behaviour;
- ugly: an error, but a traceback, several lines, another exit code, or a message that does not
  name what is wrong;
- silent: no error where one was due, or a wrong result (lost or repeated data, a setting that
  did not take effect, a file overwritten).

Every row must be clear. The table is printed at the end of the module (`-rA` not needed).
Rows marked `data` cover the `labkit data` commands; rows marked `slow` start several processes.
Most rows are CLI calls made in this process (`labkit.cli.main`), so the battery stays fast.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from tests.conftest import REPO, child_pids


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("torch")


ROOT = os.geteuid() == 0
# No held-out evaluation (a row that is about it gives its own --eval-samples, which comes later).
TRAIN = ["--framework", "torch", "--model", "cnn", "--batch-size", "8", "--num-samples", "64",
         "--eval-samples", "0", "--device", "cpu", "--no-progress"]


# ---------------------------------------------------------------- running an input

@dataclass
class Result:
    """What an input gave: the exit code (None when an exception escaped), everything printed,
    and the exception that escaped, if one did."""

    code: int | None
    out: str
    error: BaseException | None = None


def labkit(*argv: str) -> Result:
    """`labkit ARGV...` in this process (fast: torch is imported once for the whole battery)."""
    from labkit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = e.code if isinstance(e.code, int) else 2
        except Exception as e:  # noqa: BLE001 - what a user would see as a traceback
            return Result(None, out.getvalue() + err.getvalue(), e)
    return Result(code, out.getvalue() + err.getvalue())


@pytest.fixture
def read_only(tmp_path):
    """A folder this process cannot write: mode 0555, and for root (who writes through modes)
    also the immutable attribute."""
    path = tmp_path / "read-only"
    path.mkdir()
    path.chmod(0o555)
    immutable = ROOT and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    if ROOT and not immutable:
        pytest.skip("root without the immutable attribute can write any folder")
    yield path
    if immutable:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    path.chmod(0o755)


# ---------------------------------------------------------------- judging an outcome

@dataclass(frozen=True)
class Outcome:
    verdict: str  # clear | ugly | silent
    actual: str


def _message_lines(text: str) -> tuple[list[str], bool]:
    """The error's lines, without argparse's usage lines (its standard form: usage, then one
    `prog: error: ...` line); and whether that is one line."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("usage:"):
        errors = [line for line in lines if ": error: " in line]
        return errors or lines, len(errors) == 1
    return lines, len(lines) == 1


def cli_error(result: Result, *needles: str, forbidden: tuple[str, ...] = (),
              code: int | None = 2) -> Outcome:
    """Clear when the command failed with exit `code` (None: any non-zero) printing one line
    that matches every regex in `needles` (case-insensitive) and none in `forbidden`."""
    if result.error is not None:
        first = str(result.error).strip().splitlines()[0] if str(result.error).strip() else ""
        return Outcome("ugly", f"traceback: {type(result.error).__name__}: {first}")
    lines, one = _message_lines(result.out)
    message = lines[-1].strip() if lines else ""
    if "Traceback (most recent call last)" in result.out:
        last = [line for line in result.out.strip().splitlines() if line.strip()][-1]
        return Outcome("ugly", f"exit {result.code}, traceback: {last.strip()}")
    if result.code == 0:
        return Outcome("silent", f"exit 0: {message}")
    shown = f"exit {result.code}: " + (" / ".join(line.strip() for line in lines[-3:]) if not one else message)
    good = ((result.code == code) if code is not None else result.code != 0) and one
    good = good and all(re.search(n, message, re.I) for n in needles)
    good = good and not any(re.search(f, message, re.I) for f in forbidden)
    return Outcome("clear" if good else "ugly", shown)


def cli_report(result: Result, *needles: str) -> Outcome:
    """A check that found problems (`labkit data verify`): clear when it exits non-zero without
    a traceback, printing one line per problem (one of them matching every regex in `needles`)
    and then one summary line from the command."""
    lines = [line.strip() for line in result.out.strip().splitlines() if line.strip()]
    if result.error is not None or "Traceback (most recent call last)" in result.out:
        return cli_error(result)
    if result.code == 0:
        return Outcome("silent", f"exit 0: {lines[-1] if lines else ''}")
    named = [line for line in lines[:-1] if all(re.search(n, line, re.I) for n in needles)]
    good = bool(named) and lines[-1].startswith("labkit ")
    return Outcome("clear" if good else "ugly", f"exit {result.code}: " + " / ".join(lines[-2:]))


def library_error(call: Callable[[], object], *needles: str,
                  kinds: tuple[type[BaseException], ...] = (ValueError, OSError)) -> Outcome:
    """Clear when `call()` raises one of `kinds` with a one-line message matching `needles`."""
    try:
        call()
    except kinds as e:
        message = str(e)
        good = "\n" not in message.strip() and all(re.search(n, message, re.I) for n in needles)
        return Outcome("clear" if good else "ugly", f"{type(e).__name__}: {message}")
    except Exception as e:  # noqa: BLE001
        return Outcome("ugly", f"{type(e).__name__} (not ValueError/OSError): {e}")
    return Outcome("silent", "no error")


def behaviour(ok: bool, actual: str, *, error: Result | None = None) -> Outcome:
    if error is not None and (error.error is not None or error.code not in (0, None)):
        return Outcome("ugly", cli_error(error).actual)
    return Outcome("clear" if ok else "silent", actual)


# ---------------------------------------------------------------- fixtures the rows share

def _notebook(path: Path, parameters: str, body: str = "x = 1") -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def course_dir(tmp_path) -> Path:
    """Two notebooks: only the second declares `size` (an int)."""
    d = tmp_path / "notebooks"
    d.mkdir()
    _notebook(d / "00_first.ipynb", 'scale = "auto"')
    _notebook(d / "01_second.ipynb", "size = 512")
    return d


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished 3-step run (batch 8): its checkpoint folder `ck` and metrics `m.json`."""
    d = tmp_path_factory.mktemp("trained")
    r = labkit("train", *TRAIN, "--steps", "3", "--checkpoint-dir", d / "ck", "--metrics-out",
               d / "m.json")
    assert r.code == 0, r.out
    return d


def copy_run(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


def hello() -> Path:
    from labkit.course.tour import HELLO_NOTEBOOK

    return HELLO_NOTEBOOK


def has_field(name: str) -> bool:
    from labkit.core.train_config import TrainConfig

    return name in {f.name for f in fields(TrainConfig)}


# ---------------------------------------------------------------- the rows

@dataclass(frozen=True)
class Probe:
    id: str
    input: str
    expected: str
    run: Callable[..., Outcome]
    marks: tuple = field(default=())


PROBES: list[Probe] = []


def probe(input: str, expected: str, *marks):
    def register(fn):
        PROBES.append(Probe(fn.__name__.removeprefix("probe_"), input, expected, fn, marks))
        return fn
    return register


# notebooks: `labkit run` and `labkit course`

@probe("labkit course -p sizee 64", "exit 2 naming 'sizee': no notebook declares it")
def probe_course_unknown_parameter(tmp_path, course_dir):
    r = labkit("course", "--notebooks", course_dir, "-o", tmp_path / "out", "-p", "sizee", "64")
    return cli_error(r, "sizee", "not a parameter")


@probe("labkit course -p size big (only the 2nd notebook declares size, an int)",
       "exit 2 naming 'size' and 01_second before any notebook runs")
def probe_course_later_notebook_rejects(tmp_path, course_dir):
    r = labkit("course", "--notebooks", course_dir, "-o", tmp_path / "out", "-p", "size", "big")
    outcome = cli_error(r, "size", "01_second")
    ran = list((tmp_path / "out").glob("*.ipynb"))
    if outcome.verdict == "clear" and ran:
        return Outcome("silent", f"{outcome.actual}, but ran {[p.name for p in ran]} first")
    return outcome


@probe("labkit course -o READ_ONLY_DIR", "exit 2 naming the folder: not writable")
def probe_course_output_not_writable(course_dir, read_only):
    r = labkit("course", "--notebooks", course_dir, "-o", read_only / "out")
    return cli_error(r, re.escape(str(read_only)), "writ")


@probe("labkit run hello.ipynb -p size true", "exit 2: 'size' must be an integer (not 'a bool')")
def probe_run_bool_for_int(tmp_path):
    r = labkit("run", hello(), "-p", "size", "true", "-o", tmp_path / "o.ipynb")
    return cli_error(r, "'size'", "integer", forbidden=("True or False",))


@probe("labkit run hello.ipynb -p size 1.5", "exit 2 naming 'size' (an integer) before a kernel starts")
def probe_run_float_for_int(tmp_path):
    r = labkit("run", hello(), "-p", "size", "1.5", "-o", tmp_path / "o.ipynb")
    return cli_error(r, "'size'", "integer")


@probe("labkit run hello.ipynb -o EXISTING_DIR", "exit 2 naming the path: a directory")
def probe_run_output_is_directory(tmp_path):
    r = labkit("run", hello(), "-o", tmp_path)
    return cli_error(r, re.escape(str(tmp_path)), "folder|director")


@probe("labkit run hello.ipynb -o READ_ONLY_DIR/out.ipynb", "exit 2 naming the path: not writable")
def probe_run_output_read_only(read_only):
    r = labkit("run", hello(), "-o", read_only / "out.ipynb")
    return cli_error(r, re.escape(str(read_only)), "writ")


@probe("labkit run hello.ipynb -o A_FILE/out.ipynb", "exit 2 naming the path: not a folder")
def probe_run_output_under_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    r = labkit("run", hello(), "-o", tmp_path / "file" / "out.ipynb")
    return cli_error(r, re.escape(str(tmp_path / "file")), "not a (folder|directory)")


@probe("labkit run notes.ipynb (not JSON)", "exit 2 naming the file: not a notebook")
def probe_run_not_json(tmp_path):
    bad = tmp_path / "notes.ipynb"
    bad.write_text("print('hello')\n")
    r = labkit("run", bad, "-o", tmp_path / "o.ipynb")
    return cli_error(r, "notes.ipynb", "notebook|JSON")


@probe("labkit run missing.ipynb", "exit 2 naming the file")
def probe_run_missing_notebook(tmp_path):
    return cli_error(labkit("run", tmp_path / "missing.ipynb"), "missing.ipynb")


@probe("labkit course --only nomatch", "exit 2 naming what matched nothing")
def probe_course_only_matches_nothing(tmp_path, course_dir):
    r = labkit("course", "--notebooks", course_dir, "-o", tmp_path / "out", "--only", "nomatch")
    return cli_error(r, "nomatch")


# train: flags that cannot work together

@probe("labkit train --steps 5 --preempt-at 5", "exit 2 naming preempt_at and steps")
def probe_preempt_at_beyond_steps(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "5", "--preempt-at", "5", "--checkpoint-dir", tmp_path / "ck")
    return cli_error(r, "preempt_at", "steps")


@probe("labkit train --preempt-at 2 (no --checkpoint-dir)", "exit 2: preempt_at needs checkpoint_dir")
def probe_preempt_without_checkpoint_dir(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "5", "--preempt-at", "2")
    return cli_error(r, "preempt_at", "checkpoint_dir")


@probe("labkit train --num-samples 4 --batch-size 8", "exit 2 naming num_samples: fewer than one batch")
def probe_fewer_samples_than_a_batch(tmp_path):
    r = labkit("train", *TRAIN, "--num-samples", "4", "--steps", "2")  # the last flag wins
    return cli_error(r, "num_samples")


@probe("TrainConfig(steps=5, preempt_at=7)", "ParameterError naming preempt_at and steps")
def probe_library_preempt_at_beyond_steps(tmp_path):
    from labkit.core.train_config import TrainConfig

    return library_error(lambda: TrainConfig(steps=5, preempt_at=7), "preempt_at", "steps")


# train: output locations

def _nothing_trained(outcome: Outcome, metrics: Path) -> Outcome:
    """An output error is clear only if it came before training (no metrics of a finished run)."""
    if outcome.verdict == "clear" and metrics.exists():
        return Outcome("ugly", outcome.actual + " (after training)")
    return outcome


@probe("labkit train --checkpoint-dir A_FILE", "exit 2 naming checkpoint_dir before the first step")
def probe_checkpoint_dir_is_a_file(tmp_path):
    (tmp_path / "ck").write_text("x")
    r = labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", tmp_path / "ck",
               "--metrics-out", tmp_path / "m.json")
    return _nothing_trained(cli_error(r, "checkpoint_dir", re.escape(str(tmp_path / "ck"))),
                            tmp_path / "m.json")


@probe("labkit train --checkpoint-dir READ_ONLY_DIR", "exit 2 naming checkpoint_dir before the first step")
def probe_checkpoint_dir_read_only(tmp_path, read_only):
    r = labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", read_only / "ck",
               "--metrics-out", tmp_path / "m.json")
    return _nothing_trained(cli_error(r, "checkpoint_dir", re.escape(str(read_only))),
                            tmp_path / "m.json")


@probe("labkit train --metrics-out EXISTING_DIR", "exit 2 naming metrics_out before the first step")
def probe_metrics_out_is_a_directory(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "2", "--metrics-out", tmp_path)
    return cli_error(r, "metrics_out", re.escape(str(tmp_path)))


@probe("labkit train --metrics-out READ_ONLY_DIR/m.json", "exit 2 naming metrics_out before the first step")
def probe_metrics_out_read_only(read_only):
    r = labkit("train", *TRAIN, "--steps", "2", "--metrics-out", read_only / "m.json")
    return cli_error(r, "metrics_out", re.escape(str(read_only)))


@probe("labkit train --tensorboard-dir A_FILE", "exit 2 naming tensorboard_dir before the first step")
def probe_tensorboard_dir_is_a_file(tmp_path):
    (tmp_path / "tb").write_text("x")
    r = labkit("train", *TRAIN, "--steps", "2", "--tensorboard-dir", tmp_path / "tb",
               "--metrics-out", tmp_path / "m.json")
    return _nothing_trained(cli_error(r, "tensorboard_dir", re.escape(str(tmp_path / "tb"))),
                            tmp_path / "m.json")


@probe("labkit.torch.trainer.fit(TrainConfig(checkpoint_dir=A_FILE))",
       "ValueError/OSError naming the path, before the first step")
def probe_library_checkpoint_dir_is_a_file(tmp_path):
    from labkit.core.train_config import TrainConfig
    from labkit.torch.trainer import fit

    (tmp_path / "ck").write_text("x")
    config = TrainConfig(model="cnn", steps=2, batch_size=8, num_samples=64, device="cpu",
                         progress=False, checkpoint_dir=str(tmp_path / "ck"))
    steps: list[int] = []
    outcome = library_error(lambda: fit(config, on_step=lambda step, row: steps.append(step)),
                            re.escape(str(tmp_path / "ck")))
    if outcome.verdict == "clear" and steps:
        return Outcome("ugly", outcome.actual + f" (after training steps {steps})")
    return outcome


# train: resuming a checkpoint under other settings

def _resume_with(trained: Path, tmp_path: Path, *changes: str) -> Result:
    run = copy_run(trained, tmp_path)
    return labkit("train", *TRAIN, "--steps", "5", "--checkpoint-dir", run / "ck", "--metrics-out",
                  run / "m2.json", *changes)


@probe("resume a batch-8 checkpoint with --batch-size 16",
       "exit 2 naming batch_size 8 -> 16 and --allow-resume-change")
def probe_resume_other_batch_size(tmp_path, trained):
    r = _resume_with(trained, tmp_path, "--batch-size", "16")
    return cli_error(r, "batch_size", r"\b8\b", r"\b16\b", "--allow-resume-change")


@probe("resume with --seed 1", "exit 2 naming seed 0 -> 1")
def probe_resume_other_seed(tmp_path, trained):
    return cli_error(_resume_with(trained, tmp_path, "--seed", "1"), "seed", "--allow-resume-change")


@probe("resume with --lr 0.002", "exit 2 naming lr")
def probe_resume_other_lr(tmp_path, trained):
    return cli_error(_resume_with(trained, tmp_path, "--lr", "0.002"), r"\blr\b", "--allow-resume-change")


@probe("resume a cnn checkpoint with --model gpt", "exit 2 naming the model fields that differ")
def probe_resume_other_model(tmp_path, trained):
    return cli_error(_resume_with(trained, tmp_path, "--model", "gpt"), "model", "checkpoint")


@probe("labkit train --framework torch into a folder holding a TF checkpoint",
       "exit 2 naming the framework, nothing written over it")
def probe_resume_other_framework(tmp_path):
    from labkit.core import checkpoint

    ck = tmp_path / "ck"
    checkpoint.save(str(ck), 4, {"model.npz": b"weights"}, {"framework": "tf", "world_size": 1})
    r = labkit("train", *TRAIN, "--steps", "6", "--checkpoint-dir", ck)
    outcome = cli_error(r, "checkpoint_dir", r"\btf\b")
    if outcome.verdict == "clear" and checkpoint.committed_steps(str(ck)) != [4]:
        return Outcome("silent", outcome.actual + f"; but wrote steps {checkpoint.committed_steps(str(ck))}")
    return outcome


@probe("resume with --allow-resume-change model", "exit 2: the model cannot change on resume")
def probe_allow_model_change(tmp_path, trained):
    return cli_error(_resume_with(trained, tmp_path, "--model", "gpt", "--allow-resume-change", "model"),
                     "allow_resume_change", "model")


@probe("labkit train --allow-resume-change colour", "exit 2 naming allow_resume_change and 'colour'")
def probe_allow_unknown_field(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "2", "--allow-resume-change", "colour")
    return cli_error(r, "allow.resume.change", "colour")


class _Recording:
    """The engine's dataset, recording every sample index it is asked for."""

    def __init__(self, dataset, seen: list[int]):
        self.dataset, self.seen = dataset, seen

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, indices):
        self.seen.extend(int(i) for i in indices)
        return self.dataset[indices]


def _fit_recording(monkeypatch, seen: list[int], **settings):
    from labkit.core.train_config import TrainConfig
    from labkit.torch import data, trainer

    monkeypatch.setattr(trainer, "make_dataset", lambda *a, **k: _Recording(data.make_dataset(*a, **k), seen))
    base = dict(model="cnn", batch_size=8, num_samples=64, device="cpu", progress=False)
    return trainer.fit(TrainConfig(**(base | settings)))


@probe("resume batch 8 -> 16 with --allow-resume-change batch_size",
       "samples 24..55 of the uninterrupted order: none lost, none repeated")
def probe_batch_change_keeps_the_sample_order(tmp_path, monkeypatch):
    allow = {"allow_resume_change": "batch_size"} if has_field("allow_resume_change") else {}
    uninterrupted: list[int] = []
    _fit_recording(monkeypatch, uninterrupted, steps=7)
    before, after = [], []
    ck = str(tmp_path / "ck")
    _fit_recording(monkeypatch, before, steps=3, checkpoint_dir=ck)
    try:
        _fit_recording(monkeypatch, after, steps=5, batch_size=16, checkpoint_dir=ck, **allow)
    except (ValueError, OSError) as e:
        return Outcome("ugly", f"{type(e).__name__}: {e}")
    ok = before + after == uninterrupted[:56]
    lost = sorted(set(uninterrupted[:56]) - set(before + after))
    return behaviour(ok, f"{len(before)} + {len(after)} samples; "
                         + ("the uninterrupted order" if ok else f"{len(lost)} of 56 lost or repeated"))


@probe("resume with --lr 0.002 --allow-resume-change lr",
       "the metrics config and every resumed step's lr say 0.002")
def probe_allowed_lr_change_is_what_runs(tmp_path, trained):
    allow = ("--allow-resume-change", "lr") if has_field("allow_resume_change") else ()
    r = _resume_with(trained, tmp_path, "--lr", "0.002", *allow)
    path = tmp_path / "run" / "m2.json"
    if r.code != 0 or not path.exists():
        return behaviour(False, "", error=r)
    data = json.loads(path.read_text())
    used = {s["lr"] for s in data["steps"]}
    ok = data["run"]["config"]["lr"] == 0.002 and used == {0.002}
    return behaviour(ok, f"config lr {data['run']['config']['lr']}, steps ran with lr {sorted(used)}")


@probe("rerun a finished run (same command)", "exit 0, says it was complete; metrics file kept")
def probe_rerun_finished_run(tmp_path, trained):
    run = copy_run(trained, tmp_path)
    before = json.loads((run / "m.json").read_text())["steps"]
    r = labkit("train", *TRAIN, "--steps", "3", "--checkpoint-dir", run / "ck", "--metrics-out", run / "m.json")
    after = json.loads((run / "m.json").read_text())["steps"]
    said = "complete" in r.out
    return behaviour(after == before and said,
                     f"exit {r.code}: metrics steps {len(before)} -> {len(after)}; "
                     f"{'says' if said else 'does not say'} the run was complete", error=r)


# one writer per checkpoint folder

def _start_writer(ck: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "labkit", "train", *TRAIN, "--steps", "100000",
                             "--input-latency-ms", "30", "--checkpoint-dir", str(ck),
                             "--checkpoint-every", "1", *extra], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _first_commit(ck: Path, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        steps = sorted(int(p.parent.name.split("-")[1]) for p in ck.glob("step-*/COMMITTED"))
        if steps:
            return steps[-1]
        time.sleep(0.1)
    raise AssertionError("the first writer did not checkpoint")


@probe("a second labkit train on a checkpoint folder another run is writing",
       "exit 2 naming the holder (pid, host)", pytest.mark.slow)
def probe_second_writer(tmp_path):
    ck = tmp_path / "ck"
    first = _start_writer(ck)
    try:
        last = _first_commit(ck, first)
        r = labkit("train", *TRAIN, "--steps", "100000", "--checkpoint-dir", ck,
                   "--preempt-at", str(last + 3))
    finally:
        first.kill()
        first.wait()
    return cli_error(r, "checkpoint_dir", rf"\b{first.pid}\b")


@probe("resume a folder whose writer was SIGKILLed", "resumes; warns that the stale lease of the dead pid "
       "was taken over", pytest.mark.slow)
def probe_stale_lease_taken_over(tmp_path):
    ck = tmp_path / "ck"
    first = _start_writer(ck)
    last = _first_commit(ck, first)
    first.kill()
    first.wait()
    steps = sorted(int(p.parent.name.split("-")[1]) for p in ck.glob("step-*/COMMITTED"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = labkit("train", *TRAIN, "--steps", str(steps[-1] + 3), "--checkpoint-dir", ck)
    said = [str(w.message) for w in caught if str(first.pid) in str(w.message)]
    return behaviour(r.code == 0 and bool(said) and last >= 0,
                     f"exit {r.code}; " + (said[0] if said else "no warning about the earlier writer"), error=r)


# cluster identity (fixed on the base branch)

@probe("CLUSTER_SPEC task.index 0.7", "ValueError naming task.index")
def probe_cluster_spec_fractional_index(tmp_path):
    from labkit.core.cluster import from_env

    spec = {"cluster": {"workerpool0": ["a:1"], "workerpool1": ["b:1", "c:1"]},
            "task": {"type": "workerpool1", "index": 0.7}}
    return library_error(lambda: from_env({"CLUSTER_SPEC": json.dumps(spec)}), "index")


# labkit data (fixed on the data branch)

def _write_shards(d: Path, *extra: str) -> Result:
    return labkit("data", "write", "images", d, "--num-samples", "64", "--image-size", "8",
                  "--records-per-shard", "16", *extra)


def _shards(d: Path) -> list[Path]:
    return sorted(d.glob("data-*.tfrecord*"))


@probe("labkit data verify DIR (a good shard set)", "exit 0: every shard matches the manifest", pytest.mark.data)
def probe_data_verify_dir(tmp_path):
    _write_shards(tmp_path / "d")
    r = labkit("data", "verify", tmp_path / "d")
    return behaviour(r.code == 0, cli_error(r).actual, error=r)


@probe("labkit data verify DIR with an emptied shard",
       "non-zero exit; a line naming the short shard, then a summary", pytest.mark.data)
def probe_data_verify_emptied_shard(tmp_path):
    _write_shards(tmp_path / "d")
    shard = _shards(tmp_path / "d")[1]
    shard.write_bytes(b"")
    return cli_report(labkit("data", "verify", tmp_path / "d"), re.escape(shard.name), "short|records")


@probe("labkit data verify DIR with a shard cut at a record boundary",
       "non-zero exit; a line naming the short shard, then a summary", pytest.mark.data)
def probe_data_verify_cut_shard(tmp_path):
    _write_shards(tmp_path / "d")
    shard = _shards(tmp_path / "d")[2]
    data = shard.read_bytes()
    first = 16 + int.from_bytes(data[:8], "little")  # length, its CRC, payload, payload CRC
    shard.write_bytes(data[:first])
    return cli_report(labkit("data", "verify", tmp_path / "d"), re.escape(shard.name), "short|records")


@probe("labkit data write into a folder holding another shard set",
       "refused, or the old set replaced whole: no stale shards left", pytest.mark.data)
def probe_data_rewrite_mixes_sets(tmp_path):
    _write_shards(tmp_path / "d")
    r = labkit("data", "write", "images", tmp_path / "d", "--num-samples", "32", "--image-size", "8",
               "--records-per-shard", "16")
    if r.code == 2:
        return cli_error(r, re.escape(str(tmp_path / "d")))
    names = [p.name for p in _shards(tmp_path / "d")]
    return behaviour(len(names) == 2, f"exit {r.code}; shards now: {names}", error=r)


@probe("labkit data write --records-per-shard 0", "exit 2 naming records_per_shard", pytest.mark.data)
def probe_data_records_per_shard_zero(tmp_path):
    return cli_error(_write_shards(tmp_path / "d", "--records-per-shard", "0"), "records.per.shard")


@probe("labkit data write --num-samples 0", "exit 2 naming num_samples", pytest.mark.data)
def probe_data_num_samples_zero(tmp_path):
    return cli_error(_write_shards(tmp_path / "d", "--num-samples", "0"), "num.samples")


@probe("labkit data write --compression LZ4", "exit 2 naming compression", pytest.mark.data)
def probe_data_compression_lz4(tmp_path):
    return cli_error(_write_shards(tmp_path / "d", "--compression", "LZ4"), "compression", "LZ4")


@probe("labkit data write into a file", "exit 2 naming the path", pytest.mark.data)
def probe_data_write_into_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    return cli_error(_write_shards(tmp_path / "f"), re.escape(str(tmp_path / "f")))


@probe("labkit data write into a read-only folder", "exit 2 naming the path", pytest.mark.data)
def probe_data_write_read_only(read_only):
    return cli_error(_write_shards(read_only / "d"), re.escape(str(read_only)))


@probe("labkit data verify a GZIP shard renamed .tfrecord, without --compression",
       "non-zero exit; the error line suggests GZIP", pytest.mark.data)
def probe_data_gzip_without_compression(tmp_path):
    _write_shards(tmp_path / "d", "--compression", "GZIP")
    renamed = tmp_path / "renamed.tfrecord"  # a name that does not say it is compressed
    renamed.write_bytes(_shards(tmp_path / "d")[0].read_bytes())
    return cli_report(labkit("data", "verify", renamed), "renamed.tfrecord", "(?-i:GZIP)")


# ---------------------------------------------------------------- issue 25: reliability under real use

def _cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `labkit` subprocess: this checkout's labkit first on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def _committed(ck: Path) -> list[int]:
    return sorted(int(p.parent.name.split("-")[1]) for p in ck.glob("step-*/COMMITTED"))


def _one_line(text: str) -> Outcome:
    """A subprocess's output judged as `cli_error` judges an in-process call's."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if "Traceback (most recent call last)" in text:
        return Outcome("ugly", f"traceback: {lines[-1] if lines else ''}")
    if len(lines) != 1:
        return Outcome("ugly", " / ".join(lines[-3:]))
    return Outcome("clear", lines[0])


# processes: the launcher, Ctrl-C, leases

@probe("labkit train --nproc-per-node 2 (no --timeout): the launcher's wall-clock limit",
       "none: GroupConfig, run_local and launch-tf default to no limit")
def probe_no_fixed_launch_timeout():
    import inspect

    from labkit.core.launcher import GroupConfig
    from labkit.tf.launch import LaunchConfig
    from labkit.torch.launch import launch_replicas, run_local

    limits = {"GroupConfig": GroupConfig().timeout_s, "LaunchConfig": LaunchConfig().timeout_s,
              "torch run_local": inspect.signature(run_local).parameters["timeout_s"].default,
              "launch_replicas": inspect.signature(launch_replicas).parameters["timeout_s"].default}
    fixed = {k: v for k, v in limits.items() if v is not None}
    return behaviour(not fixed, f"fixed limits: {fixed}" if fixed else "no fixed limit anywhere")


@probe("labkit train --nproc-per-node 2 --timeout 30 --steps 100000",
       "the replicas checkpoint and stop; exit 143, one line naming --timeout", pytest.mark.slow)
def probe_timeout_flag_checkpoints(tmp_path):
    ck = tmp_path / "ck"
    # 30 s: the replicas must be training (past start-up) when the limit comes.
    r = subprocess.run([sys.executable, "-m", "labkit", "train", *TRAIN, "--steps", "100000",
                        "--input-latency-ms", "30", "--nproc-per-node", "2", "--timeout", "30",
                        "--checkpoint-dir", str(ck)], env=_cli_env(), cwd=tmp_path,
                       capture_output=True, text=True, timeout=240)
    outcome = _one_line(r.stdout + r.stderr)
    if outcome.verdict != "clear":
        return outcome
    ok = r.returncode == 143 and "--timeout" in outcome.actual and bool(_committed(ck))
    return behaviour(ok, f"exit {r.returncode}: {outcome.actual}; committed {_committed(ck)}")


def _start_ddp(ck: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "labkit", "train", *TRAIN, "--steps", "100000",
                             "--input-latency-ms", "30", "--nproc-per-node", "2", "--checkpoint-dir",
                             str(ck), "--checkpoint-every", "5", *extra], cwd=REPO, env=_cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _running(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@probe("SIGKILL the launcher of a 2-process run, then rerun",
       "both replicas stop within 30 s; the rerun resumes (no lease held)", pytest.mark.slow)
def probe_replicas_die_with_their_launcher(tmp_path):
    if not sys.platform.startswith("linux"):
        pytest.skip("parent-death signals are Linux's")
    ck = tmp_path / "ck"
    launcher = _start_ddp(ck)
    try:
        _first_commit(ck, launcher)
        replicas = child_pids(launcher.pid)
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 30
    while any(_running(p) for p in replicas) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [p for p in replicas if _running(p)]
    for p in alive:
        os.kill(p, 9)
    if alive or len(replicas) != 2:
        return Outcome("silent", f"replicas {replicas}: {alive} still training 30 s after the launcher died")
    from labkit.core.lease import check_free

    try:
        check_free(str(ck))  # what a rerun checks first
    except OSError as e:
        return Outcome("silent", f"replicas stopped, but a rerun is refused: {e}")
    return behaviour(True, f"replicas {replicas} stopped; committed {_committed(ck)}; the folder is free")


@probe("labkit train (Ctrl-C during training)",
       "checkpoint, exit 143, one line saying Ctrl-C, no traceback", pytest.mark.slow)
def probe_ctrl_c_checkpoints(tmp_path):
    ck = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "train", *TRAIN, "--steps", "100000",
                             "--input-latency-ms", "30", "--checkpoint-dir", str(ck), "--checkpoint-every", "2"],
                            cwd=REPO, env=_cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = _first_commit(ck, proc)  # training, past start-up
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    outcome = _one_line(out)
    if outcome.verdict != "clear":
        return outcome
    ok = proc.returncode == 143 and "Ctrl-C" in out and _committed(ck)[-1] > first
    return behaviour(ok, f"exit {proc.returncode}: {outcome.actual}; committed {_committed(ck)}")


@probe("a lease whose holder has exited but is not reaped yet (a zombie)",
       "taken over with a warning, as for a process that is gone")
def probe_zombie_lease_is_stale(tmp_path):
    from labkit.core.lease import Lease, LeaseWarning

    folder = tmp_path / "ck"
    # The child takes the lease and exits without releasing it; unwaited, it stays a zombie.
    child = subprocess.Popen([sys.executable, "-c", "import os, sys; from labkit.core.lease import Lease; "
                              "Lease(sys.argv[1]).acquire(); print('held', flush=True); os._exit(0)", str(folder)],
                             env=_cli_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        deadline = time.monotonic() + 30
        while _running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                Lease(str(folder)).acquire().release()
            except OSError as e:
                return Outcome("silent", f"{type(e).__name__}: {e}")
    finally:
        child.wait()
    said = [str(w.message) for w in caught if issubclass(w.category, LeaseWarning)]
    return behaviour(bool(said), said[0] if said else "taken over without a word")


@probe("a second run on a folder held by a live process on this host",
       "LeaseHeld naming the pid; no heartbeat rule quoted (the process can be asked)")
def probe_same_host_lease_message(tmp_path):
    from labkit.core.lease import check_free

    folder = str(tmp_path / "ck")
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys, time; from labkit.core.lease import Lease; "
                                "Lease(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)", folder],
                               env=_cli_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout.readline().strip() == "held"
        outcome = library_error(lambda: check_free(folder), rf"\b{sleeper.pid}\b", "exited")
    finally:
        sleeper.kill()
        sleeper.wait()
    if outcome.verdict == "clear" and re.search(r"heartbeat is \d+s old", outcome.actual):
        return Outcome("ugly", outcome.actual)
    return outcome


@probe("labkit train --nproc-per-node 0", "exit 2 naming --nproc-per-node")
def probe_nproc_zero():
    return cli_error(labkit("train", *TRAIN, "--steps", "2", "--nproc-per-node", "0"), "--nproc-per-node", ">= 1")


@probe("labkit train --nproc-per-node -2", "exit 2 naming --nproc-per-node")
def probe_nproc_negative():
    return cli_error(labkit("train", *TRAIN, "--steps", "2", "--nproc-per-node", "-2"), "--nproc-per-node")


@probe("labkit train --nproc-per-node (more than 4 per usable core)", "exit 2 naming --nproc-per-node and the cores")
def probe_nproc_far_above_cores():
    from labkit.core import launcher
    from labkit.core.devices import usable_cpu_count

    n = getattr(launcher, "MAX_PROCESSES_PER_CORE", 4) * usable_cpu_count() + 1
    return cli_error(labkit("train", *TRAIN, "--steps", "2", "--nproc-per-node", str(n)),
                     "--nproc-per-node", "core")


@probe("check_process_count('nproc_per_node', 3, cores=2)", "a warning: the processes share the cores")
def probe_nproc_above_cores_warns():
    from labkit.core import launcher

    if not hasattr(launcher, "check_process_count"):
        return Outcome("silent", "no rule for the number of local processes: 3 start on 2 cores without a word")
    said = launcher.check_process_count("nproc_per_node", 3, cores=2)
    return behaviour(bool(said) and "2 usable CPU cores" in said, said or "no warning")


@probe("labkit launch-tf --workers 0", "exit 2 naming --workers (not num_workers)")
def probe_launch_tf_zero_workers():
    return cli_error(labkit("launch-tf", "--workers", "0"), "--workers", forbidden=("num_workers",))


@probe("labkit launch-tf -- --batch-size 0", "exit 2, the error printed once (not once per worker)")
def probe_launch_tf_bad_train_flag():
    return cli_error(labkit("launch-tf", "--workers", "2", "--", "--batch-size", "0"), "batch_size")


# train: flags and environments

@probe("labkit train --checkpoint-dir ''", "exit 2 naming checkpoint_dir")
def probe_checkpoint_dir_empty(tmp_path):
    return cli_error(labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", ""), "'checkpoint_dir'")


@probe("labkit train --metrics-out ''", "exit 2 naming metrics_out")
def probe_metrics_out_empty(tmp_path):
    return cli_error(labkit("train", *TRAIN, "--steps", "2", "--metrics-out", ""), "'metrics_out'")


@probe("labkit train --metrics-out out/ (a trailing slash)", "exit 2 naming metrics_out: a folder, no file 'out'")
def probe_metrics_out_trailing_slash(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "2", "--metrics-out", f"{tmp_path}/out/")
    outcome = cli_error(r, "'metrics_out'", "folder")
    if outcome.verdict == "clear" and (tmp_path / "out").exists():
        return Outcome("silent", outcome.actual + " (but wrote out)")
    return outcome


@probe("labkit train --lr -inf", "exit 2 naming lr: not a finite number (not argparse's 'expected one argument')")
def probe_lr_minus_inf():
    return cli_error(labkit("train", *TRAIN, "--steps", "2", "--lr", "-inf"), r"\blr\b", "finite")


@probe("labkit train --lr 1e30 (torch)", "exit 2, one line: the loss diverged, naming --lr")
def probe_lr_diverges_torch(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "3", "--lr", "1e30", "--metrics-out", tmp_path / "m.json")
    return cli_error(r, "diverged", "--lr")


@probe("labkit train --framework tf --lr 1e30", "exit 2, one line: the loss diverged, naming --lr", pytest.mark.slow)
def probe_lr_diverges_tf(tmp_path):
    pytest.importorskip("tensorflow")
    r = subprocess.run([sys.executable, "-m", "labkit", "train", *TRAIN, "--framework", "tf", "--steps", "3",
                        "--lr", "1e30"], env=_cli_env(TF_CPP_MIN_LOG_LEVEL="3"), cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    if "Traceback" in r.stdout + r.stderr:
        return Outcome("ugly", "traceback: " + (r.stdout + r.stderr).strip().splitlines()[-1])
    ok = r.returncode == 2 and len(lines) == 1 and "diverged" in lines[0] and "--lr" in lines[0]
    return Outcome("clear" if ok else "ugly", f"exit {r.returncode}: {' / '.join(lines[-2:])}")


@probe("MASTER_PORT=70000 (WORLD_SIZE=2, RANK=0)", "ValueError naming MASTER_PORT and the port range")
def probe_master_port_out_of_range():
    from labkit.core.cluster import from_env

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000", "WORLD_SIZE": "2", "RANK": "0"}
    return library_error(lambda: from_env(env), "MASTER_PORT", "65535")


@contextlib.contextmanager
def _nothing_left_under_gcs():
    """Yields a list that receives what a row wrote under /gcs (removed again at once)."""
    existed = os.path.exists("/gcs")
    left: list[str] = []
    try:
        yield left
    finally:
        bucket = Path("/gcs/labkit-battery-bucket")
        if bucket.exists():
            left.append(str(bucket))
            shutil.rmtree(bucket, ignore_errors=True)
        if not existed and os.path.isdir("/gcs"):
            left.append("/gcs")
            with contextlib.suppress(OSError):
                os.rmdir("/gcs")


@probe("labkit train --checkpoint-dir /gcs/BUCKET/ck (no Cloud Storage mount here)",
       "exit 2 naming checkpoint_dir: /gcs is not mounted; nothing written under /gcs")
def probe_gcs_path_without_mount(tmp_path, monkeypatch):
    if os.path.ismount("/gcs"):
        pytest.skip("this machine has a mount at /gcs")
    monkeypatch.delenv("LABKIT_LOCAL_GCS", raising=False)
    with _nothing_left_under_gcs() as left:
        r = labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", "/gcs/labkit-battery-bucket/ck")
    outcome = cli_error(r, "'checkpoint_dir'", "mount")
    return Outcome("silent", f"{outcome.actual} (and wrote {left})") if left else outcome


@probe("AIP_CHECKPOINT_DIR=gs://bkt/ck (read by the run through /gcs, not mounted here)",
       "exit 2 naming AIP_CHECKPOINT_DIR: /gcs is not mounted")
def probe_aip_checkpoint_dir_without_mount(tmp_path, monkeypatch):
    if os.path.ismount("/gcs"):
        pytest.skip("this machine has a mount at /gcs")
    monkeypatch.delenv("LABKIT_LOCAL_GCS", raising=False)
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", "gs://labkit-battery-bucket/run/checkpoints/")
    with _nothing_left_under_gcs() as left:
        r = labkit("train", *TRAIN, "--steps", "2")
    outcome = cli_error(r, "(?-i:AIP_CHECKPOINT_DIR)", "mount")
    return Outcome("silent", f"{outcome.actual} (and wrote {left})") if left else outcome


@probe("AIP_CHECKPOINT_DIR=gs://bkt/ck whose folder cannot be written", "exit 2 naming AIP_CHECKPOINT_DIR")
def probe_aip_checkpoint_dir_unwritable(read_only, monkeypatch):
    monkeypatch.setenv("LABKIT_LOCAL_GCS", str(read_only))  # the buckets' stand-in folder
    monkeypatch.setenv("AIP_CHECKPOINT_DIR", "gs://bkt/run/checkpoints/")
    r = labkit("train", *TRAIN, "--steps", "2")
    return cli_error(r, "(?-i:AIP_CHECKPOINT_DIR)", "writ")


@probe("labkit train --checkpoint-dir gs://bkt/ck with Cloud Storage unreachable",
       "exit 2 within 15 s naming checkpoint_dir and the endpoint, no retry pages")
def probe_unreachable_gs_checkpoint_dir(monkeypatch):
    monkeypatch.delenv("LABKIT_LOCAL_GCS", raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens there
    start = time.monotonic()
    r = labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", "gs://labkit-battery-bucket/ck")
    took = time.monotonic() - start
    outcome = cli_error(r, "'checkpoint_dir'", "reach")
    if outcome.verdict == "clear" and took > 15:
        return Outcome("ugly", outcome.actual + f" (after {took:.0f}s)")
    return outcome


@probe("labkit train --checkpoint-dir s3://b/ck (s3fs not installed)", "exit 2 naming checkpoint_dir and s3")
def probe_checkpoint_dir_s3():
    import importlib.util

    if importlib.util.find_spec("s3fs"):
        pytest.skip("s3fs is installed here")
    return cli_error(labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", "s3://b/ck"),
                     "'checkpoint_dir'", "s3")


@probe("labkit train --checkpoint-dir DANGLING_SYMLINK", "exit 2 naming the link and its missing target")
def probe_checkpoint_dir_dangling_link(tmp_path):
    (tmp_path / "ck").symlink_to(tmp_path / "gone")
    r = labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", tmp_path / "ck")
    return cli_error(r, "'checkpoint_dir'", "symbolic link", "does not exist", forbidden=("File exists",))


# train: checkpoints and metrics across a resume

@probe("--preempt-at 5 --metrics-out m.json, then the same command again",
       "m.json holds steps 0..11, each once")
def probe_resumed_metrics_hold_every_step(tmp_path):
    argv = ("train", *TRAIN, "--steps", "12", "--checkpoint-dir", tmp_path / "ck", "--metrics-out",
            tmp_path / "m.json", "--preempt-at", "5")
    first, second = labkit(*argv), labkit(*argv)
    if first.code != 143:
        return behaviour(False, "", error=first)
    steps = [s["step"] for s in json.loads((tmp_path / "m.json").read_text())["steps"]]
    return behaviour(steps == list(range(12)), f"steps in m.json: {steps}", error=second)


@probe("a 12-step run with --checkpoint-every 1", "the newest 3 checkpoints kept (--keep-checkpoints default)")
def probe_old_checkpoints_pruned(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "12", "--checkpoint-every", "1", "--checkpoint-dir", tmp_path / "ck")
    folders = sorted(p.name for p in (tmp_path / "ck").glob("step-*"))
    return behaviour(folders == ["step-00000009", "step-00000010", "step-00000011"], f"left: {folders}", error=r)


@probe("rerun a finished 3-step run with --steps 2", "exit 0, says 3 steps are checkpointed (not 2)")
def probe_rerun_with_fewer_steps(tmp_path, trained):
    run = copy_run(trained, tmp_path)
    r = labkit("train", *TRAIN, "--steps", "2", "--checkpoint-dir", run / "ck")
    said = r.out.strip().splitlines()[-1] if r.out.strip() else ""
    return behaviour(r.code == 0 and "3 steps checkpointed" in said, said, error=r)


def _resume_warnings(ck: Path, steps: int = 4) -> tuple[Result, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = labkit("train", *TRAIN, "--steps", str(steps), "--checkpoint-dir", ck)
    return r, [str(w.message) for w in caught if "checkpoint" in str(w.message)]


def _edit_marker(ck: Path, edit: Callable[[dict], None]) -> None:
    marker = next(ck.glob("step-*/COMMITTED"))
    data = json.loads(marker.read_text())
    edit(data)
    marker.write_text(json.dumps(data))


@probe("resume a folder whose only commit marker has `files` as a list",
       "a warning naming the marker as malformed; training starts from step 0 and says so")
def probe_marker_files_a_list(tmp_path, trained):
    run = copy_run(trained, tmp_path)
    _edit_marker(run / "ck", lambda m: m.update(files=list(m["files"])))
    r, said = _resume_warnings(run / "ck")
    ok = r.code == 0 and any("malformed" in s and "step 0" in s for s in said)
    return behaviour(ok, said[0] if said else f"exit {r.code}, no warning", error=r)


@probe("resume a folder whose marker has an entry {}", "a warning naming the entry and its missing size")
def probe_marker_entry_empty(tmp_path, trained):
    run = copy_run(trained, tmp_path)
    _edit_marker(run / "ck", lambda m: m["files"].update({"model.pt": {}}))
    r, said = _resume_warnings(run / "ck")
    ok = r.code == 0 and any("'model.pt'" in s and "size" in s and "malformed" in s for s in said)
    return behaviour(ok, said[0] if said else f"exit {r.code}, no warning", error=r)


@probe("resume a folder whose only committed step is corrupt",
       "the warning says no earlier step is left and the run starts from step 0")
def probe_fallback_with_nothing_to_fall_back_to(tmp_path, trained):
    run = copy_run(trained, tmp_path)
    blob = next((run / "ck").glob("step-*/model.pt"))
    blob.write_bytes(b"x" + blob.read_bytes()[1:])
    r, said = _resume_warnings(run / "ck")
    ok = r.code == 0 and any("step 0" in s and "falling back to the previous" not in s for s in said)
    return behaviour(ok, said[0] if said else f"exit {r.code}, no warning", error=r)


# a full disk (a 2 MiB tmpfs in a mount namespace of its own)

def _on_full_disk(size: str, script: str, listing: str = "/mnt") -> subprocess.CompletedProcess:
    """Run `script` (sh) with a fresh tmpfs of `size` at /mnt (in a user and mount namespace of
    its own, so nothing outside sees it); skips where such namespaces are not allowed."""
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
                           capture_output=True)
    if shutil.which("unshare") is None or probe.returncode != 0:
        pytest.skip("no unprivileged user and mount namespaces here (unshare -Urm)")
    return subprocess.run(["unshare", "-Urm", "sh", "-c", f"mount -t tmpfs -o size={size} none /mnt && cd /mnt && "
                           f"{script}; echo \"exit=$?\"; ls -a {listing}"], env=_cli_env(), capture_output=True,
                          text=True, timeout=300)


def _full_disk_outcome(r: subprocess.CompletedProcess, *needles: str, left_out: tuple[str, ...] = ()) -> Outcome:
    out = r.stdout.split("exit=")[0]
    code = r.stdout.split("exit=")[1].split()[0] if "exit=" in r.stdout else "?"
    listing = r.stdout.split("exit=")[1].split()[1:] if "exit=" in r.stdout else []
    outcome = _one_line(out + r.stderr)
    if outcome.verdict != "clear":
        return outcome
    good = code == "2" and all(re.search(n, outcome.actual, re.I) for n in needles)
    left = [name for name in listing if any(re.search(p, name) for p in left_out)]
    if good and left:
        return Outcome("ugly", outcome.actual + f" (left {left})")
    return Outcome("clear" if good else "ugly", f"exit {code}: {outcome.actual}")


TRAIN_ARGS = " ".join(TRAIN)


@probe("labkit train, checkpoints to a full disk (2 MiB)",
       "exit 2, one line naming the checkpoint file and 'No space left on device'", pytest.mark.slow)
def probe_full_disk_checkpoint():
    r = _on_full_disk("2m", f"{sys.executable} -m labkit train {TRAIN_ARGS} --steps 40 --checkpoint-every 1 "
                            "--keep-checkpoints 0 --checkpoint-dir /mnt/ck")
    return _full_disk_outcome(r, "/mnt/ck/step-", "No space left on device")


@probe("labkit train --preempt-at 3, the preemption's checkpoint on a full disk",
       "exit 2, one line: stopped by SIGTERM, its checkpoint failed (file, 'No space left')", pytest.mark.slow)
def probe_full_disk_preemption_save():
    r = _on_full_disk("200k", f"{sys.executable} -m labkit train {TRAIN_ARGS} --steps 10 --preempt-at 3 "
                              "--checkpoint-dir /mnt/ck")
    return _full_disk_outcome(r, "SIGTERM", "checkpoint failed", "/mnt/ck/", "No space left on device")


@probe("MetricsLog.write on a full disk", "OSError naming the file and 'No space left on device'; no .tmp left",
       pytest.mark.slow)
def probe_full_disk_metrics(tmp_path):
    script = tmp_path / "write_metrics.py"
    script.write_text(
        "import sys\n"
        "from labkit.core.metrics import MetricsLog, StepMetrics\n"
        "open('/mnt/pad', 'wb').write(bytes(60000))\n"
        "log = MetricsLog()\n"
        "for i in range(200):\n"
        "    log.append(StepMetrics(i, 1.0))\n"
        "try:\n"
        "    log.write('/mnt/m.json')\n"
        "except OSError as e:\n"
        "    print(f'labkit: {e}')\n"
        "    sys.exit(2)\n")
    r = _on_full_disk("64k", f"{sys.executable} {script}")
    return _full_disk_outcome(r, "/mnt/m.json", "No space left", left_out=(r"\.tmp$", r"^m\.json$"))


@probe("labkit data write onto a full disk", "exit 2 naming the shard file and 'No space left'; no shards left",
       pytest.mark.slow, pytest.mark.data)
def probe_full_disk_data_write():
    r = _on_full_disk("64k", f"{sys.executable} -m labkit data write images /mnt/d --num-samples 256 "
                             "--image-size 16 --records-per-shard 32 2>/dev/null", listing="/mnt/d")
    return _full_disk_outcome(r, r"/mnt/d/data-\d+", "No space left", left_out=(r"^data-",))


@probe("labkit run hello.ipynb -o FULL_DISK/o.ipynb", "exit 2 naming o.ipynb and 'No space left'; no empty notebook",
       pytest.mark.slow)
def probe_full_disk_notebook_output():
    r = _on_full_disk("16k", f"head -c 15500 /dev/zero > /mnt/pad && {sys.executable} -m labkit run {hello()} "
                             "-o /mnt/o.ipynb")
    return _full_disk_outcome(r, "/mnt/o.ipynb", "No space left", left_out=(r"^o\.ipynb$",))


# labkit data: shard contents pinned by the manifest

@probe("labkit data verify DIR, a shard replaced by the same-named shard of a set with another seed",
       "non-zero exit; a line naming the shard: its contents are not the ones written", pytest.mark.data)
def probe_data_verify_other_seed(tmp_path):
    _write_shards(tmp_path / "d")
    _write_shards(tmp_path / "other", "--seed", "1")
    shard = _shards(tmp_path / "d")[2]
    shard.write_bytes((tmp_path / "other" / shard.name).read_bytes())
    return cli_report(labkit("data", "verify", tmp_path / "d"), re.escape(shard.name), "contents|sha")


@probe("labkit data verify DIR, a shard copied over its neighbour (records 0-15 twice, 16-31 gone)",
       "non-zero exit; a line naming the shard and the samples out of place", pytest.mark.data)
def probe_data_verify_copied_neighbour(tmp_path):
    _write_shards(tmp_path / "d")
    first, second = _shards(tmp_path / "d")[:2]
    second.write_bytes(first.read_bytes())
    return cli_report(labkit("data", "verify", tmp_path / "d"), re.escape(second.name), "sample")


@probe("labkit data write gs://bkt/d with Cloud Storage unreachable", "exit 2 within 15 s naming the folder",
       pytest.mark.data)
def probe_data_write_unreachable_gs(monkeypatch):
    monkeypatch.delenv("LABKIT_LOCAL_GCS", raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    start = time.monotonic()
    outcome = cli_error(_write_shards("gs://labkit-battery-bucket/d"), "gs://labkit-battery-bucket/d", "reach")
    if outcome.verdict == "clear" and time.monotonic() - start > 15:
        return Outcome("ugly", outcome.actual + " (slow)")
    return outcome


# notebooks

@probe("labkit course -p scale huge", "exit 2 naming 'scale' and its values, before any kernel starts")
def probe_course_scale_huge(tmp_path, course_dir):
    r = labkit("course", "--notebooks", course_dir, "-o", tmp_path / "out", "-p", "scale", "huge")
    outcome = cli_error(r, "'scale'", "smoke")
    ran = list((tmp_path / "out").glob("*.ipynb"))
    if outcome.verdict == "clear" and ran:
        return Outcome("silent", f"{outcome.actual}, but ran {[p.name for p in ran]} first")
    return outcome


@probe("labkit run 01.ipynb -p steps '[10, 20]' (steps = None there, an int in 00)",
       "exit 2 naming 'steps': an integer, before a kernel starts")
def probe_run_none_default_takes_the_course_kind(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    _notebook(d / "00_first.ipynb", "steps = 0")
    nb = _notebook(d / "01_second.ipynb", "steps = None\nflag = None")
    r = labkit("run", nb, "-p", "steps", "[10, 20]", "-o", tmp_path / "o.ipynb")
    return cli_error(r, "'steps'", "integer")


@probe("labkit run NB -p flag '[1]' (flag = None, declared nowhere else)", "exit 2 naming 'flag': a single value")
def probe_run_none_default_refuses_a_list(tmp_path):
    nb = _notebook(tmp_path / "nb.ipynb", "flag = None")
    r = labkit("run", nb, "-p", "flag", "[1]", "-o", tmp_path / "o.ipynb")
    return cli_error(r, "'flag'", "single value")


# Vertex AI jobs and studies (fixed on the vertex branch)

def _echo_study(parameters: list, algorithm: str | None = None, trials: int = 4) -> dict:
    """A tuning study whose trial is a one-line script: it reports its value as the metric, and
    exits 2 saying why when the value is FAIL."""
    from labkit import vertex

    script = ("import sys\nfrom labkit.core.hypertune import report_metric\n"
              "value = sys.argv[-1].split('=')[1]\n"
              "if value == 'FAIL':\n    print('trial refuses its value FAIL', flush=True)\n    sys.exit(2)\n"
              "report_metric('loss', float(value), 1)\n")
    trial = vertex.custom_job_spec(vertex.PoolConfig(image_uri="gcr.io/p/img", args=["python", "-c", script]),
                                   output_uri="gs://bkt/study")
    study = {"metrics": [{"metric_id": "loss", "goal": "MINIMIZE"}], "parameters": parameters}
    if algorithm:
        study["algorithm"] = algorithm
    return {"study_spec": study, "max_trial_count": trials, "parallel_trial_count": 1, "trial_job_spec": trial}


@probe("labkit run notebooks/00_tour.ipynb --vertex -p scale huge",
       "exit 2 naming 'scale' and the values it takes; no spec printed")
def probe_vertex_notebook_job_bad_value(tmp_path):
    r = labkit("run", REPO / "notebooks" / "00_tour.ipynb", "--vertex", "-p", "scale", "huge")
    outcome = cli_error(r, "scale", "huge", "smoke")
    if outcome.verdict == "clear" and "workerPoolSpecs" in r.out:
        return Outcome("silent", f"{outcome.actual}, but printed a spec")
    return outcome


@probe('training_job({}, output_uri="b/run")', "ParameterError naming output_uri: gs:// required")
def probe_vertex_output_uri_not_gcs(tmp_path):
    from labkit import vertex

    return library_error(lambda: vertex.training_job({}, output_uri="b/run"), "output_uri", "gs://")


@probe("run_local_tuning, GRID_SEARCH over 2 values with max_trial_count 4",
       "the grid's 2 trials, each with its record and metric; no error")
def probe_vertex_grid_search_keeps_records(tmp_path):
    from labkit import vertex

    grid = [{"parameter_id": "x", "discrete_value_spec": {"values": [1.0, 2.0]}}]
    try:
        records = vertex.run_local_tuning(_echo_study(grid, "GRID_SEARCH"), tmp_path)
    except Exception as e:  # noqa: BLE001
        return Outcome("silent", f"{type(e).__name__}: {e} (every trial record lost)")
    got = [(r.state, r.parameters.get("x"), r.metric) for r in records]
    return behaviour(got == [("SUCCEEDED", 1.0, 1.0), ("SUCCEEDED", 2.0, 2.0)], f"records {got}")


# A trial process: slow, as tests/vertex/test_tuning.py checks the same run in make check.
@probe("run_local_tuning, a trial whose code exits 2 for its value",
       "the trial runs once (a user-code error is permanent on Vertex); its record says why", pytest.mark.slow)
def probe_vertex_failing_trial_runs_once(tmp_path):
    from labkit import vertex

    bad = [{"parameter_id": "x", "categorical_value_spec": {"values": ["FAIL"]}}]
    (record,) = vertex.run_local_tuning(_echo_study(bad, trials=1), tmp_path)
    runs = len(list((tmp_path / "trial-1" / "logs").rglob("*.log")))
    why = "trial refuses its value FAIL" in record.error and "exited 2" in record.error
    return behaviour(record.state == "FAILED" and runs == 1 and why,
                     f"{record.state} after {runs} run(s): {record.error[:120]}")


# one owner per output, resumes that carry every state, errors at the door (grown this round)

@probe("labkit train --metrics-out m.json, where m.json holds another finished run",
       "exit 2 naming metrics_out: it holds a run; --overwrite or another path")
def probe_train_fresh_run_over_a_metrics_file(tmp_path, trained):
    shutil.copy(trained / "m.json", tmp_path / "m.json")
    before = (tmp_path / "m.json").read_bytes()
    r = labkit("train", *TRAIN, "--steps", "2", "--metrics-out", tmp_path / "m.json")
    outcome = cli_error(r, "metrics_out", "already holds a run", "--overwrite")
    if outcome.verdict == "clear" and (tmp_path / "m.json").read_bytes() != before:
        return Outcome("silent", outcome.actual + ", but the file was replaced")
    return outcome


@probe("labkit train --overwrite --metrics-out m.json (m.json from another run)",
       "the fresh run replaces the file, as asked")
def probe_train_overwrite_replaces_the_metrics_file(tmp_path, trained):
    shutil.copy(trained / "m.json", tmp_path / "m.json")
    r = labkit("train", *TRAIN, "--steps", "2", "--overwrite", "--metrics-out", tmp_path / "m.json")
    steps = [row["step"] for row in json.loads((tmp_path / "m.json").read_text())["steps"]]
    return behaviour(r.code == 0 and steps == [0, 1], f"exit {r.code}, steps {steps}", error=r)


@probe("labkit train --metrics-out notes.json (a JSON file that is not a metrics file)",
       "exit 2 naming the file: not a labkit metrics file, would be replaced")
def probe_train_metrics_out_is_another_json(tmp_path):
    (tmp_path / "notes.json").write_text('{"mine": true}')
    r = labkit("train", *TRAIN, "--steps", "1", "--metrics-out", tmp_path / "notes.json")
    return cli_error(r, "metrics_out", "not a labkit metrics file")


@probe("resume a checkpoint with --metrics-out pointing at another run's metrics (other --lr)",
       "exit 2 naming metrics_out: it holds another run's steps")
def probe_train_resume_into_another_runs_metrics(tmp_path, trained):
    other = labkit("train", *TRAIN, "--steps", "2", "--lr", "0.01", "--metrics-out", tmp_path / "other.json")
    assert other.code == 0, other.out
    cut = labkit("train", *TRAIN, "--steps", "4", "--checkpoint-dir", tmp_path / "ck", "--preempt-at", "1",
                 "--metrics-out", tmp_path / "mine.json")
    assert cut.code == 143, cut.out
    r = labkit("train", *TRAIN, "--steps", "4", "--checkpoint-dir", tmp_path / "ck", "--metrics-out",
               tmp_path / "other.json")
    return cli_error(r, "metrics_out", "another run", "lr")


@probe("resume a checkpoint with another --grad-compression", "exit 2 naming grad_compression")
def probe_train_resume_with_other_compression(tmp_path):
    cut = labkit("train", *TRAIN, "--steps", "3", "--checkpoint-dir", tmp_path / "ck", "--preempt-at", "1")
    assert cut.code == 143, cut.out
    r = labkit("train", *TRAIN, "--steps", "3", "--checkpoint-dir", tmp_path / "ck", "--grad-compression", "fp16")
    return cli_error(r, "grad_compression", "allow-resume-change")


@probe("labkit train --metrics-out NAME_OF_300_CHARACTERS.json",
       "exit 2 naming metrics_out and the file system's limit, before training")
def probe_train_metrics_name_too_long(tmp_path):
    r = labkit("train", *TRAIN, "--steps", "1", "--metrics-out", tmp_path / ("m" * 300 + ".json"))
    return cli_error(r, "metrics_out", "allows 255|allows \\d+")


@probe("labkit train --eval-samples 100000000000", "exit 2 naming eval_samples: more memory than the machine has")
def probe_train_eval_samples_beyond_memory():
    return cli_error(labkit("train", *TRAIN, "--steps", "1", "--eval-samples", "100000000000"),
                     "eval_samples", "GB")


@probe("labkit train --batch-size 100000000", "exit 2 naming batch_size: more memory than the machine has")
def probe_train_batch_beyond_memory():
    return cli_error(labkit("train", *TRAIN, "--steps", "1", "--batch-size", "100000000"), "batch_size", "GB")


@probe("labkit train --num-workers 4 under ulimit -n 32 (hard)", "exit 2 naming num_workers and the limit",
       pytest.mark.slow)
def probe_train_workers_beyond_open_file_limit(tmp_path):
    import resource

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))

    r = subprocess.run([sys.executable, "-m", "labkit", "train", *TRAIN, "--steps", "1", "--num-workers", "4"],
                       capture_output=True, text=True, timeout=120, preexec_fn=low_limit, cwd=tmp_path)
    return cli_error(Result(r.returncode, r.stdout + r.stderr), "num_workers", "open files", "ulimit")


@probe("labkit profile --trace FOLDER_WITHOUT_TRACES", "exit 2 naming --trace: a folder with no trace file")
def probe_profile_trace_empty_folder(tmp_path):
    return cli_error(labkit("profile", "--trace", tmp_path), "--trace", "folder")


@probe("labkit course, first notebook's kernel dies (os.kill self, SIGKILL)",
       "the course goes on, writes its summary with that notebook failed, exit 1", pytest.mark.slow)
def probe_course_goes_on_past_a_dead_kernel(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    _notebook(d / "00_dies.ipynb", 'scale = "auto"', "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    _notebook(d / "01_ok.ipynb", 'scale = "auto"')
    r = labkit("course", "--notebooks", d, "-o", tmp_path / "out")
    summary = tmp_path / "out" / "summary.json"
    if r.error is not None or not summary.exists():
        return Outcome("ugly", cli_error(r).actual if r.error or r.code else "no summary written")
    rows = {n["notebook"] if isinstance(n, dict) and "notebook" in n else str(n): n
            for n in json.loads(summary.read_text()).get("notebooks", [])}
    text = summary.read_text()
    ok = r.code == 1 and "DeadKernelError" in text and (tmp_path / "out" / "01_ok.ipynb").exists()
    return behaviour(ok, f"exit {r.code}, summary of {len(rows)} notebook(s)")


@probe("labkit run NB (its metadata names no kernel)", "runs in labkit's kernel, exit 0")
def probe_run_notebook_without_kernelspec(tmp_path):
    nb = _notebook(tmp_path / "bare.ipynb", 'scale = "auto"')
    data = json.loads(nb.read_text())
    data["metadata"].pop("kernelspec", None)
    nb.write_text(json.dumps(data))
    r = labkit("run", nb, "-o", tmp_path / "o.ipynb")
    return behaviour(r.code == 0 and (tmp_path / "o.ipynb").exists(), f"exit {r.code}", error=r)


@probe('training_job({"checkpoint_dir": "/tmp/ck"}, output_uri=gs://...)',
       "ParameterError naming checkpoint_dir: on the VM's disk a restart loses it")
def probe_vertex_local_checkpoint_dir():
    from labkit import vertex

    return library_error(lambda: vertex.training_job({"checkpoint_dir": "/tmp/ck"}, output_uri="gs://bkt/run"),
                         "checkpoint_dir", "gs://BUCKET", "restart")


@probe("training_job on a TPU VM (ct5lp-hightpu-4t, 2x2)", "ParameterError naming machine_type: no TPU path")
def probe_vertex_tpu_for_labkit_training():
    from labkit import vertex

    return library_error(lambda: vertex.training_job({}, output_uri="gs://bkt/run", machine_type="ct5lp-hightpu-4t",
                                                     tpu_topology="2x2"), "machine_type", "no TPU path")


@probe("training_job on 1 V100 with labkit's torch image", "ParameterError naming accelerator_type: no kernels")
def probe_vertex_gpu_the_image_cannot_run():
    from labkit import vertex

    return library_error(lambda: vertex.training_job({}, output_uri="gs://bkt/run", machine_type="n1-standard-8",
                                                     accelerator_type="NVIDIA_TESLA_V100", accelerator_count=1),
                         "accelerator_type", "no kernels")


def _started(argv: list[str], cwd: Path, ready: Callable[[], bool]) -> subprocess.Popen:
    """A `labkit` command started in the background, once `ready()` says it holds its output."""
    job = subprocess.Popen([sys.executable, "-m", "labkit", *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not ready() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return job


@probe("two labkit data write images OUT at once (the second starts while the first writes)",
       "the second exits 2 naming OUT_DIR and the first writer; the first's set verifies",
       pytest.mark.slow)
def probe_data_write_concurrent_writers(tmp_path):
    out = tmp_path / "shards"
    first = _started(["data", "write", "images", str(out), "--num-samples", "40000"], tmp_path,
                     lambda: (out / "LEASE").exists())
    try:
        r = labkit("data", "write", "images", out, "--num-samples", "100")
    finally:
        first.wait(timeout=300)
    outcome = cli_error(r, "OUT_DIR", "being written by another run", f"pid {first.pid}")
    check = labkit("data", "verify", out)
    if outcome.verdict == "clear" and check.code != 0:
        return Outcome("silent", outcome.actual + f"; but verify: {check.out.strip().splitlines()[-1]}")
    return outcome


@probe("two labkit course -o OUT --overwrite at once", "the second exits 2 naming -o and the first run",
       pytest.mark.slow)
def probe_course_concurrent_runs(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    _notebook(d / "00_slow.ipynb", 'scale = "auto"', "import time\ntime.sleep(6)")
    out = tmp_path / "out"
    first = _started(["course", "--notebooks", str(d), "-o", str(out)], tmp_path, lambda: (out / "LEASE").exists())
    try:
        r = labkit("course", "--notebooks", d, "-o", out, "--overwrite")
    finally:
        first.wait(timeout=300)
    return cli_error(r, "-o", "being written by another run")


@probe("labkit course -o OUT, where OUT holds an earlier course run", "exit 2 naming out: --overwrite or another folder")
def probe_course_into_an_earlier_run(tmp_path, course_dir):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "summary.json").write_text("{}")
    r = labkit("course", "--notebooks", course_dir, "-o", tmp_path / "out")
    return cli_error(r, "out", "another course run", "--overwrite")


# ---------------------------------------------------------------- the table

_RESULTS: dict[str, tuple[Probe, Outcome]] = {}


def _table() -> str:
    rows = [(p.id, p.input, p.expected, o.verdict, o.actual) for p, o in _RESULTS.values()]
    counts = {v: sum(r[3] == v for r in rows) for v in ("clear", "ugly", "silent")}
    width = (28, 60, 60, 6)
    lines = [" | ".join(h.ljust(w) for h, w in zip(("probe", "input", "expected", "result"), width, strict=True))
             + " | actual"]
    for r in rows:
        lines.append(" | ".join(str(c)[:w].ljust(w) for c, w in zip(r[:4], width, strict=True)) + " | " + r[4][:160])
    lines.append(f"probes {len(rows)} / clear {counts['clear']} / ugly {counts['ugly']} / "
                 f"silent {counts['silent']}")
    return "\n".join(lines)


@pytest.fixture(scope="module", autouse=True)
def _print_table(request):
    yield
    if _RESULTS:
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print("\n\nreliability battery\n" + _table(), flush=True)


@pytest.mark.parametrize("p", [pytest.param(p, id=p.id, marks=p.marks) for p in PROBES])
def test_probe(p: Probe, request):
    wanted = {name: request.getfixturevalue(name)
              for name in p.run.__code__.co_varnames[:p.run.__code__.co_argcount]}
    outcome = p.run(**wanted)
    _RESULTS[p.id] = (p, outcome)
    assert outcome.verdict == "clear", f"{p.input}: expected {p.expected}; got {outcome.actual}"
