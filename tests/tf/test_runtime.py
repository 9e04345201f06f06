"""TensorFlow's device set-up (`labkit.tf.runtime.configure`) follows `labkit.core.placement` for
one process on the GPUs TensorFlow sees: the same choices, the same refusal of `cuda` without a
GPU (with TensorFlow's own cause), and nothing configured by a refused call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
from labkit.core.config import ParameterError
from labkit.tf import runtime
for device in ("tpu", "cuda"):
    try:
        runtime.configure(device)
    except ParameterError as e:
        print(device, "refused:", e.name, "|", e)
print("auto ->", runtime.configure("auto"))
"""


@pytest.mark.slow
def test_configure_follows_the_placement_rule_with_tensorflows_cause():
    pytest.importorskip("tensorflow")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("tpu refused: device |") and "'tpu'" in lines[0]
    assert lines[1].startswith("cuda refused: device |") and "needs a GPU that TensorFlow can use" in lines[1]
    assert lines[2] == "auto -> cpu"  # the refusals configured nothing
