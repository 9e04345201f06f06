"""What notebook 00 demonstrates: a tiny notebook executed for real by papermill."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from labkit.notebooks import NotebookRun, key_figure, run_notebook

HELLO_NOTEBOOK = Path(__file__).resolve().parents[1] / "assets" / "hello.ipynb"


def hello_matmul(size: int = 512, repeats: int = 3) -> float:
    """Time a float32 `size`³ NumPy matmul (best of `repeats`) and record GFLOP/s."""
    rng = np.random.default_rng(0)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    a @ b  # warm-up: BLAS thread pool start-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    gflops = 2 * size**3 / best / 1e9
    key_figure(f"NumPy float32 matmul {size}³", gflops, "GFLOP/s")
    return gflops


def papermill_demo(out_dir: str | Path, size: int = 256) -> tuple[NotebookRun, str]:
    """Run the hello notebook headless with `size` as a parameter; return the run and the source
    of the cell papermill injected, so the reader sees exactly what `-p size N` does. The child
    kernel's own stderr goes to `hello_executed.log` beside it, not into the lesson."""
    import nbformat

    out = Path(out_dir) / "hello_executed.ipynb"
    run = run_notebook(HELLO_NOTEBOOK, out, {"size": size}, kernel_log=True)
    nb = nbformat.read(out, as_version=4)
    injected = next(c.source for c in nb.cells
                    if "injected-parameters" in c.get("metadata", {}).get("tags", []))
    return run, injected
