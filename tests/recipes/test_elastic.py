"""The fault-tolerant DDP recipe under torchrun: a worker killed mid-run is restarted with its
group, every worker resumes from the snapshot, and the metrics file holds each step once with
the losses of an uninterrupted `labkit train` run; without restarts the failure is not hidden."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import launch_output, recipe_env
from tests.recipes.test_torch import SMALL, _assert_equal, _engine


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    global torch
    torch = pytest.importorskip("torch")


def _torchrun(max_restarts: int, *argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           f"--max-restarts={max_restarts}", "-m", "labkit.recipes.elastic_ddp", *argv]
    return subprocess.run(cmd, env=recipe_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_run_equals_the_uninterrupted_one(tmp_path):
    """Rank 1 exits in step 3 of the first attempt; snapshots every 2 steps, so the group
    resumes at step 2 and trains step 2 twice. The metrics file: steps 0-6 once each, the
    engine's losses, and the restart recorded."""
    argv = ["--model", "cnn", "--steps", "7", *SMALL, "--snapshot", str(tmp_path / "snapshot.pt"),
            "--snapshot-every", "2", "--fail-at-step", "3", "--metrics-out", str(tmp_path / "m.json")]
    r = _torchrun(2, *argv)
    assert r.returncode == 0, launch_output(r)
    assert "rank 1: exiting abruptly at step 3 (attempt 0)" in r.stdout
    assert "attempt 1: resumed from" in r.stdout and "at step 2" in r.stdout
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["run"]["restart_count"] == 1 and data["run"]["resumed_at_step"] == 2
    assert [s["step"] for s in data["steps"]] == list(range(7))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "snapshot.pt"]  # no temp file left
    assert torch.load(tmp_path / "snapshot.pt", weights_only=True)["next_step"] == 7
    _assert_equal([s["loss"] for s in data["steps"]], _engine(argv, nproc=2))


@pytest.mark.slow
def test_without_restarts_the_failure_fails_the_run(tmp_path):
    r = _torchrun(0, "--model", "cnn", "--steps", "4", *SMALL, "--snapshot", str(tmp_path / "s.pt"),
                  "--fail-at-step", "1", "--metrics-out", str(tmp_path / "m.json"))
    assert r.returncode != 0 and "rank 1: exiting abruptly at step 1" in r.stdout
    assert "attempt 1" not in r.stdout


def test_bad_drill_flags_fail_with_one_line_naming_the_flag(capsys):
    from labkit.recipes import elastic_ddp

    with pytest.raises(SystemExit):
        elastic_ddp.main(["--snapshot", "s.pt", "--steps", "4", "--fail-at-step", "4"])
    assert "--fail-at-step 4 must be a step of the run, 0 to 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        elastic_ddp.main(["--snapshot", "s.pt", "--snapshot-every", "0"])
    assert "--snapshot-every 0 must be >= 1" in capsys.readouterr().err
