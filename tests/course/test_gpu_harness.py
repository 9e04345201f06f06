"""`benchmarks/course_gpu.py`, the harness that runs the course at full size on a GPU machine, run
here at smoke size on one notebook so it cannot rot: the executed notebook, its log and the
results JSON with the machine, versions, plan, status, time and key figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

HARNESS = REPO / "benchmarks" / "course_gpu.py"


@pytest.fixture(scope="module", autouse=True)
def _papermill():
    """papermill (and the cloud storage clients under it), imported when this module's first test
    runs rather than at collection."""
    pytest.importorskip("papermill")


@pytest.mark.slow
def test_the_harness_runs_a_notebook_and_writes_its_results(tmp_path):
    out = tmp_path / "course"
    run = subprocess.run([sys.executable, str(HARNESS), "--scale", "smoke", "--notebooks", "00_tour",
                          "--out", str(out), "--timeout-per-notebook", "600"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    (report_path,) = out.glob("*-course.json")
    report = json.loads(report_path.read_text())
    if not report["machine"]["gpu"]:
        assert report_path.name == f"{report['date']}-cpu-course.json"
    assert report["scale"] == "smoke" and report["ok"] == 1
    assert report["machine"]["versions"]["torch"] and report["machine"]["python"]
    tour = report["notebooks"]["00_tour"]
    assert tour["status"] == "ok" and tour["seconds"] > 0
    assert tour["plan"]["notebook"] == "00_tour" and tour["plan"]["expected_s"] > 0
    assert {f["name"] for f in tour["figures"]} >= {"GPUs", "course forecast here"}
    assert (tour["output"], tour["log"]) == ("notebooks/00_tour.ipynb", "notebooks/00_tour.log")  # under --out
    assert (out / "notebooks" / "00_tour.ipynb").exists() and (out / "notebooks" / "00_tour.log").exists()
    assert not list((REPO / "benchmarks" / "results").glob(f"{report['date']}-cpu-course.json"))


def test_bad_flags_are_refused_on_one_line(tmp_path):
    for flags, what in ((["--budget", "0"], "--budget"), (["--notebooks", "99_nothing"], "99_nothing"),
                        (["--timeout-per-notebook", "-5"], "--timeout-per-notebook")):
        run = subprocess.run([sys.executable, str(HARNESS), "--scale", "smoke", "--out", str(tmp_path), *flags],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0 and what in run.stderr, (flags, run.stderr)
        assert "Traceback" not in run.stderr


def test_the_gpu_check_script_parses_and_asks_for_its_folder():
    """`benchmarks/gpu_check.sh` runs only where a GPU is; here: valid bash, and a usage line."""
    script = REPO / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert run.returncode != 0 and "usage: benchmarks/gpu_check.sh OUT" in run.stderr
