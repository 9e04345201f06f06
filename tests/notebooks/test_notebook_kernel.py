"""One Jupyter kernel for the whole course, registered where `make setup` builds the
environment; a lesson free of library and child-process noise on stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.course.tour import HELLO_NOTEBOOK
from labkit.notebooks import execute, kernel, stderr
from tests.conftest import NOTEBOOK_DIR, REPO

NOTEBOOKS = [*sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")), HELLO_NOTEBOOK]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_names_the_course_kernel(path):
    spec = nbformat.read(path, as_version=4).metadata.get("kernelspec", {})
    assert spec.get("name") == kernel.KERNEL_NAME, f"{path.name} names kernel {spec.get('name')!r}"
    assert spec.get("display_name") == kernel.KERNEL_DISPLAY_NAME


def test_the_course_kernel_is_registered_in_this_environment():
    spec = kernel.kernel_spec()
    assert spec is not None, f"no {kernel.KERNEL_NAME!r} kernel: run `make setup`"
    assert Path(spec.resource_dir).resolve().is_relative_to(Path(sys.prefix).resolve()), \
        f"the kernel is registered in {spec.resource_dir}, outside this environment ({sys.prefix})"
    assert os.path.samefile(spec.argv[0], sys.executable), \
        f"the kernel starts {spec.argv[0]}, not this environment's {sys.executable}"
    assert spec.display_name == kernel.KERNEL_DISPLAY_NAME


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_setup_workbench_and_readme_register_the_same_kernel():
    makefile = (REPO / "Makefile").read_text()
    assert f"KERNEL_NAME := {kernel.KERNEL_NAME}\n" in makefile
    assert f"KERNEL_DISPLAY_NAME := {kernel.KERNEL_DISPLAY_NAME}\n" in makefile
    workbench = kernel.kernel_install_command(user=True)
    assert workbench in _words((REPO / "environment.yml").read_text())
    assert workbench in _words((REPO / "README.md").read_text().replace("`", ""))


def test_a_missing_kernel_is_named_with_the_command_that_registers_it(tmp_path):
    nb = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    nb.metadata["kernelspec"] = {"name": "no-such-kernel", "display_name": "x", "language": "python"}
    nbformat.write(nb, tmp_path / "other.ipynb")
    with pytest.raises(kernel.KernelNotFound, match="other.ipynb names the Jupyter kernel 'no-such-kernel'"):
        execute.run_notebook(tmp_path / "other.ipynb", tmp_path / "out.ipynb")
    assert kernel.require_kernel(HELLO_NOTEBOOK) == kernel.KERNEL_NAME


def test_stderr_in_a_lesson_is_found_unless_the_cell_allows_it():
    nb = nbformat.v4.new_notebook()
    noisy = nbformat.v4.new_code_cell("x", outputs=[nbformat.v4.new_output("stream", name="stderr", text="W tf\n")])
    taught = nbformat.v4.new_code_cell("y", metadata={"tags": [stderr.STDERR_TAG]},
                                       outputs=[nbformat.v4.new_output("stream", name="stderr", text="Warning!\n")])
    quiet = nbformat.v4.new_code_cell("z", outputs=[nbformat.v4.new_output("stream", name="stdout", text="ok\n")])
    nb.cells = [nbformat.v4.new_markdown_cell("m"), noisy, taught, quiet]
    assert stderr.unexpected_stderr(nb) == [(1, "W tf\n")]


def test_the_log_file_follows_the_runner_then_the_notebook_name(tmp_path):
    assert stderr.kernel_log_path({"LABKIT_KERNEL_LOG": str(tmp_path / "a.log")}) == tmp_path / "a.log"
    assert stderr.kernel_log_path({"LABKIT_ARTIFACTS": str(tmp_path), "JPY_SESSION_NAME": "/x/04_mixed.ipynb"}) \
        == tmp_path / "04_mixed.log"
    assert stderr.route_kernel_stderr() is None  # not a kernel: stderr left alone


# A process that looks like a Jupyter kernel to labkit (an IPython shell of the kernel's class),
# so importing labkit there would route stderr if anything did it on import.
_FAKE_KERNEL = """
import os, sys
from IPython.core.interactiveshell import InteractiveShell
class ZMQInteractiveShell(InteractiveShell):
    pass
ZMQInteractiveShell.instance()
def where():
    st = os.fstat(2)
    return (st.st_dev, st.st_ino)
before = where()
import labkit.course, labkit.notebooks, labkit.cli, labkit.vertex.entry
assert where() == before, "importing labkit moved file descriptor 2"
os.write(2, b"still-on-stderr\\n")
from labkit.notebooks import route_kernel_stderr
assert route_kernel_stderr() is not None and where() != before, "the explicit call did not route"
os.write(2, b"routed-to-the-log\\n")
"""


def test_importing_labkit_in_a_kernel_leaves_stderr_alone_until_asked(python, tmp_path):
    log = tmp_path / "kernel.log"
    env = {k: v for k, v in os.environ.items() if k != stderr.KERNEL_STDERR_ENV}
    env[stderr.KERNEL_LOG_ENV] = str(log)
    proc = subprocess.run([python, "-c", _FAKE_KERNEL], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "still-on-stderr" in proc.stderr and "routed-to-the-log" not in proc.stderr
    assert log.read_text() == "routed-to-the-log\n"


@pytest.mark.slow
@pytest.mark.parametrize("routed", [True, False], ids=["routed", "not-routed"])
def test_labkit_run_keeps_fd_noise_out_of_the_cells_only_when_the_notebook_asks(python, tmp_path, routed):
    """`labkit run` outside pytest: the kernel forwards its file descriptor 2 into the cells (ipykernel
    does not under pytest), so only a notebook that calls route_kernel_stderr() keeps C-level and
    child-process stderr in its log; without the call the noise reaches the cell (the control)."""
    nb = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    if routed:
        nb.cells.append(nbformat.v4.new_code_cell(
            "from labkit.notebooks import route_kernel_stderr\nroute_kernel_stderr()"))
    nb.cells.append(nbformat.v4.new_code_cell(
        "import os, subprocess, sys, time\nos.write(2, b'fd-level chatter\\n')\n"
        "subprocess.run([sys.executable, '-c', 'import sys; sys.stderr.write(\"child chatter\\\\n\")'])\n"
        "time.sleep(0.5)  # the kernel forwards fd output from a thread"))
    nbformat.write(nb, tmp_path / "noisy.ipynb")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", stderr.KERNEL_STDERR_ENV)}
    proc = subprocess.run([python, "-m", "labkit", "run", str(tmp_path / "noisy.ipynb"), "-p", "size", "16",
                           "-p", "repeats", "1", "-o", str(tmp_path / "out" / "noisy.ipynb")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = "".join(text for _, text in stderr.unexpected_stderr(
        nbformat.read(tmp_path / "out" / "noisy.ipynb", as_version=4)))
    log = (tmp_path / "out" / "noisy.log").read_text()
    for noise in ("fd-level chatter", "child chatter"):
        assert (noise in log and noise not in cells) if routed else (noise in cells), (noise, cells, log)


@pytest.mark.slow
def test_a_headless_kernel_keeps_noise_in_the_log_and_draws_text_bars(tmp_path):
    """A real kernel run by papermill: C-level and child-process stderr land in the log, not in
    the cell; a progress bar is plain text on stdout (no widget a saved notebook cannot draw)."""
    nb = nbformat.read(HELLO_NOTEBOOK, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import os, subprocess, sys\nos.write(2, b'fd-level chatter\\n')\n"
        "subprocess.run([sys.executable, '-c', 'import sys; sys.stderr.write(\"child chatter\")'])"))
    nb.cells.append(nbformat.v4.new_code_cell(
        "from labkit.core.progress import track\nfor _ in track(range(3), 'demo'):\n    pass"))
    nbformat.write(nb, tmp_path / "noisy.ipynb")
    run = execute.run_notebook(tmp_path / "noisy.ipynb", tmp_path / "out" / "noisy.ipynb",
                                {"size": 16, "repeats": 1}, kernel_log=True)
    assert run.ok, run.error
    executed = nbformat.read(run.output, as_version=4)
    assert stderr.unexpected_stderr(executed) == []
    log = run.log.read_text()
    assert "fd-level chatter" in log and "child chatter" in log
    bar = executed.cells[-1].outputs
    assert {(o.output_type, o.get("name")) for o in bar} == {("stream", "stdout")}
    text = "".join(o.text for o in bar)
    assert "demo: 100%" in text and "3/3" in text
