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
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("torch")

ROOT = os.geteuid() == 0
TRAIN = ["--framework", "torch", "--model", "cnn", "--batch-size", "8", "--num-samples", "64",
         "--device", "cpu", "--no-progress"]


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


@probe("labkit.torch.engine.fit(TrainConfig(checkpoint_dir=A_FILE))",
       "ValueError/OSError naming the path, before the first step")
def probe_library_checkpoint_dir_is_a_file(tmp_path):
    from labkit.core.train_config import TrainConfig
    from labkit.torch.engine import fit

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
    from labkit.torch import data, engine

    monkeypatch.setattr(engine, "make_dataset", lambda *a, **k: _Recording(data.make_dataset(*a, **k), seen))
    base = dict(model="cnn", batch_size=8, num_samples=64, device="cpu", progress=False)
    return engine.fit(TrainConfig(**(base | settings)))


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


@probe("run_local_tuning, a trial whose code exits 2 for its value",
       "the trial runs once (a user-code error is permanent on Vertex); its record says why")
def probe_vertex_failing_trial_runs_once(tmp_path):
    from labkit import vertex

    bad = [{"parameter_id": "x", "categorical_value_spec": {"values": ["FAIL"]}}]
    (record,) = vertex.run_local_tuning(_echo_study(bad, trials=1), tmp_path)
    runs = len(list((tmp_path / "trial-1" / "logs").rglob("*.log")))
    why = "trial refuses its value FAIL" in record.error and "exited 2" in record.error
    return behaviour(record.state == "FAILED" and runs == 1 and why,
                     f"{record.state} after {runs} run(s): {record.error[:120]}")


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
