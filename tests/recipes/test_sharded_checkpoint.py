"""The sharded-checkpoint recipe (FSDP2 + torch.distributed.checkpoint) as a learner runs it:
under torchrun it gives `labkit train`'s losses, and a run cut short resumes from its DCP
checkpoint on the same 2 processes exactly and on 1 process with the same losses to within
float rounding."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import launch_output, recipe_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", autouse=True)
def _torch():
    """torch, imported when this module's first test runs rather than at collection."""
    pytest.importorskip("torch")


FLAGS = ["--model", "gpt", "--batch-size", "8", "--device", "cpu"]


def _run(*argv: str, nproc: int) -> str:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else []
    r = subprocess.run([sys.executable, *launcher, "-m", "labkit.recipes.sharded_checkpoint", *FLAGS, *argv],
                       env=recipe_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, launch_output(r)
    return r.stdout


def _losses(path: Path) -> list[float]:
    return [s["loss"] for s in json.loads(path.read_text())["steps"]]


def test_the_recipe_equals_the_engine_and_resumes_on_two_and_on_one_process(tmp_path):
    from labkit.course.recipe_view import engine_losses

    _run("--steps", "4", "--metrics-out", str(tmp_path / "whole.json"), nproc=2)
    whole = _losses(tmp_path / "whole.json")
    engine, _ = engine_losses("sharded_checkpoint", [*FLAGS, "--steps", "4"], nproc=2)
    assert max(abs(a - b) for a, b in zip(whole, engine, strict=True)) <= 1e-5

    ckpt = tmp_path / "ckpt"
    _run("--steps", "2", "--checkpoint-dir", str(ckpt), "--metrics-out", str(tmp_path / "a.json"), nproc=2)
    assert sorted(p.name for p in (ckpt / "step-00000001").iterdir()) == [
        ".metadata", "COMMITTED", "__0_0.distcp", "__1_0.distcp"]  # one data file per process
    shutil.copytree(ckpt, tmp_path / "copy")
    out = _run("--steps", "4", "--checkpoint-dir", str(ckpt), "--metrics-out", str(tmp_path / "b.json"), nproc=2)
    assert "on 2 process(es): continuing with step 2" in out
    assert _losses(tmp_path / "b.json") == whole[2:]  # exactly
    out = _run("--steps", "4", "--checkpoint-dir", str(tmp_path / "copy"), "--metrics-out",
               str(tmp_path / "c.json"), nproc=1)
    assert "on 1 process(es): continuing with step 2" in out
    assert _losses(tmp_path / "c.json") == pytest.approx(whole[2:], rel=1e-5)
    assert sorted(p.name for p in (tmp_path / "copy" / "step-00000003").iterdir()) == [
        ".metadata", "COMMITTED", "__0_0.distcp"]
