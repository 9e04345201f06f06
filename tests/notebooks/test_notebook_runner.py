import shutil
import subprocess

import nbformat
import pytest

from labkit.core import notebook_params
from labkit.core.config import ParameterError
from labkit.course.summary import write_report
from labkit.course.tour import HELLO_NOTEBOOK
from labkit.notebooks import course_run as course
from labkit.notebooks import execute as notebook


def test_parse_value():
    assert notebook_params.parse_value("12") == 12
    assert notebook_params.parse_value("0.5") == 0.5
    assert notebook_params.parse_value("true") is True and notebook_params.parse_value("None") is None
    assert notebook_params.parse_value("smoke") == "smoke"
    assert notebook_params.parse_value("['bf16', 'fp32']") == ["bf16", "fp32"]


def test_parameters_are_checked_before_a_kernel_starts():
    assert notebook_params.notebook_parameters(HELLO_NOTEBOOK) == {"size": 512, "repeats": 3}
    with pytest.raises(ParameterError, match=r"'sise' is not a parameter of hello.ipynb \(it has: repeats, size\)"):
        notebook_params.check_parameters(HELLO_NOTEBOOK, {"sise": 3})
    with pytest.raises(ParameterError, match="'size' of hello.ipynb must be an integer like its default 512"):
        notebook_params.check_parameters(HELLO_NOTEBOOK, {"size": "big"})


@pytest.mark.parametrize(("default", "value", "problem"), [
    (512, True, "must be an integer"), (512, 1.5, "must be an integer"), (512, "x", "must be an integer"),
    (0.5, True, "must be a number"), (True, 1, "must be True or False"), ("a", 1, "must be a string"),
    (512, 7, None), (0.5, 2, None), (True, False, None), ("a", "b", None), (None, 3, None), ([1], "x", None)])
def test_a_value_must_be_of_its_defaults_kind(default, value, problem):
    found = notebook_params.type_problem(default, value)
    assert (found is None) if problem is None else (problem in found)


def test_a_file_that_is_not_a_notebook_is_named(tmp_path):
    bad = tmp_path / "notes.ipynb"
    bad.write_text("print('hello')\n")
    with pytest.raises(ParameterError, match="'notebook' is not a Jupyter notebook: its file is not JSON"):
        notebook.run_notebook(bad, tmp_path / "out.ipynb")


def test_an_output_that_cannot_be_written_is_refused_before_a_kernel_starts(tmp_path):
    (tmp_path / "file").write_text("x")
    for output in (tmp_path, tmp_path / "file" / "out.ipynb"):
        with pytest.raises(ParameterError, match="parameter 'output'"):
            notebook.run_notebook(HELLO_NOTEBOOK, output)


def test_a_notebook_is_never_its_own_output(tmp_path):
    mine = tmp_path / "mine.ipynb"
    shutil.copy(HELLO_NOTEBOOK, mine)
    before = mine.read_bytes()
    with pytest.raises(ValueError, match="is the notebook itself"):
        notebook.run_notebook(mine, tmp_path / "." / "mine.ipynb", {"size": 8})
    assert mine.read_bytes() == before


def test_values_a_second_parameters_cell_would_overwrite_are_refused(tmp_path):
    nb = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    first = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    nb.cells.insert(first + 2, nbformat.v4.new_code_cell("size = 1024", metadata={"tags": ["parameters"]}))
    twice = tmp_path / "twice.ipynb"
    nbformat.write(nb, twice)
    with pytest.raises(ParameterError, match=r"has 2 cells tagged 'parameters' \(cells"):
        notebook_params.check_parameters(twice, {"size": 8})
    notebook_params.check_parameters(twice, {})  # run as it is: nothing is overwritten


def test_the_course_checks_every_notebooks_parameters_before_running_any(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    shutil.copy(HELLO_NOTEBOOK, nbs / "01_hello.ipynb")
    first = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    first.cells[1].source = "repeats = 3"  # this one has no `size`
    nbformat.write(first, nbs / "00_first.ipynb")
    plan = course.course_parameters(sorted(nbs.glob("*.ipynb")), {"size": 64})
    assert [(nb.name, params) for nb, params in plan] == [("00_first.ipynb", {}), ("01_hello.ipynb", {"size": 64})]
    with pytest.raises(ParameterError, match="'sizee' is not a parameter of any notebook run here"):
        course.run_course(tmp_path / "out", {"sizee": 64}, notebook_dir=nbs)
    with pytest.raises(ParameterError, match="'size' of 01_hello.ipynb must be an integer"):
        course.run_course(tmp_path / "out", {"size": "big"}, notebook_dir=nbs)
    assert not list((tmp_path / "out").glob("*.ipynb"))  # nothing ran


@pytest.mark.slow
def test_papermill_run_injects_parameters_and_collects_figures(tmp_path):
    run = notebook.run_notebook(HELLO_NOTEBOOK, tmp_path / "out.ipynb", {"size": 64, "repeats": 1})
    assert run.ok, run.error
    nb = nbformat.read(run.output, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "size = 64" in injected[0].source
    assert len(run.figures) == 1 and run.figures[0].name == "NumPy float32 matmul 64³"
    assert run.figures[0].value > 0


def _failing_copy(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    shutil.copy(HELLO_NOTEBOOK, nbs / "01_hello.ipynb")
    bad = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    bad.cells.append(nbformat.v4.new_code_cell("raise RuntimeError('boom')"))
    nbformat.write(bad, nbs / "02_broken.ipynb")
    return nbs


@pytest.mark.slow
def test_course_runs_all_notebooks_reports_and_survives_a_failure(tmp_path):
    nbs = _failing_copy(tmp_path)
    runs = course.run_course(tmp_path / "run", {"size": 32, "repeats": 1},
                             notebook_dir=nbs, echo=lambda *a, **k: None)
    report = write_report(runs, tmp_path / "run")
    assert [r.ok for r in runs] == [True, False]
    assert "RuntimeError: boom" in runs[1].error
    text = report.read_text()
    assert "1 of 2 succeeded" in text and "NumPy float32 matmul 32³" in text
    assert (tmp_path / "run" / "summary.json").exists()
    assert (tmp_path / "run" / "01_hello.ipynb").exists()


@pytest.mark.slow
def test_cli_run_reports_a_bad_parameter_by_name(python, tmp_path):
    proc = subprocess.run([python, "-m", "labkit", "run", str(HELLO_NOTEBOOK), "-p", "colour", "red",
                           "-o", str(tmp_path / "x.ipynb")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "'colour' is not a parameter of hello.ipynb" in proc.stdout


@pytest.mark.slow
def test_kernel_stderr_goes_to_a_log_beside_the_output(tmp_path):
    nb = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import os, sys\nos.write(2, b'fd-level chatter\\n')\nprint('python-level chatter', file=sys.__stderr__, flush=True)"))
    src = tmp_path / "noisy.ipynb"
    nbformat.write(nb, src)
    run = notebook.run_notebook(src, tmp_path / "out" / "noisy.ipynb", {"size": 16, "repeats": 1},
                                kernel_log=True)
    assert run.ok, run.error
    assert run.log == tmp_path / "out" / "noisy.log"
    text = run.log.read_text()
    assert "fd-level chatter" in text and "python-level chatter" in text


FLAKY_KERNEL = """import pathlib, sys
marker = pathlib.Path(sys.argv[1])
if int(marker.read_text() if marker.exists() else 0) < int(sys.argv[2]):  # end before answering
    marker.write_text(str(int(marker.read_text() if marker.exists() else 0) + 1))
    sys.exit(1)
from ipykernel.kernelapp import launch_new_instance
launch_new_instance(argv=sys.argv[3:])
"""


def _kernel_that_dies_at_start(tmp_path, monkeypatch, times: int):
    """A registered kernel whose process ends at once the first `times` starts, as one does when
    another process took one of its ports first; the notebook names it."""
    import json
    import sys

    spec = tmp_path / "share" / "jupyter" / "kernels" / "flaky"
    spec.mkdir(parents=True)
    (tmp_path / "flaky.py").write_text(FLAKY_KERNEL)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(tmp_path / "flaky.py"), str(tmp_path / "starts"), str(times),
                 "-f", "{connection_file}"], "display_name": "flaky", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "share" / "jupyter"))
    nb = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    nb.metadata["kernelspec"] = {"name": "flaky", "display_name": "flaky", "language": "python"}
    nbformat.write(nb, tmp_path / "hello.ipynb")
    return tmp_path / "hello.ipynb"


@pytest.mark.slow
def test_a_kernel_that_ends_before_it_starts_is_started_once_more(tmp_path, monkeypatch):
    nb = _kernel_that_dies_at_start(tmp_path, monkeypatch, times=1)
    run = notebook.run_notebook(nb, tmp_path / "out.ipynb", {"size": 32, "repeats": 1})
    assert run.ok, run.error
    assert (tmp_path / "starts").read_text() == "1" and run.figures


@pytest.mark.slow
def test_a_kernel_that_never_starts_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    nb = _kernel_that_dies_at_start(tmp_path, monkeypatch, times=notebook.KERNEL_START_TRIES)
    run = notebook.run_notebook(nb, tmp_path / "out.ipynb", {"size": 32, "repeats": 1})
    assert not run.ok
    assert run.error == "the kernel 'flaky' ended before it started, 2 times"
