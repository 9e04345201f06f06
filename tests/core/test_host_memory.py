"""glibc malloc keeps the blocks a training step frees once `keep_freed_memory()` has run: blocks
freed and allocated again cost no fresh page faults (each process is new, so no earlier
allocation has moved glibc's thresholds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.core import host_memory

REPO = Path(__file__).resolve().parents[2]

# Allocate, touch and free blocks of these sizes in turn (MiB): the heap reaches its peak at 24.
SIZES_MB = (4, 8, 16, 24, 8, 24, 16, 4)
CHILD = f"""
import ctypes, json, resource, sys
from labkit.core import host_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "keep":
    assert host_memory.keep_freed_memory()
faults = []
for mb in {SIZES_MB!r}:
    n = mb << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _faults(mode: str) -> list[int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_freed_blocks_are_reused_without_new_page_faults():
    import ctypes

    try:
        if not hasattr(ctypes.CDLL("libc.so.6"), "gnu_get_libc_version"):
            pytest.skip("glibc only")
    except OSError:
        pytest.skip("glibc only")
    kept, default = _faults("keep"), _faults("default")
    page_mb = os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    # Once the heap has grown to the largest block, allocating again faults in nothing new ...
    assert sum(kept[4:]) < 0.05 * sum(SIZES_MB[4:]) / page_mb, kept
    # ... where glibc's defaults map and unmap those blocks, or trim them, and fault them in again.
    assert sum(default[4:]) > 0.5 * SIZES_MB[4] / page_mb, default


def test_keeping_freed_memory_is_idempotent():
    first = host_memory.keep_freed_memory()
    assert host_memory.keep_freed_memory() == first
