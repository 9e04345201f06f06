"""Host memory for training on the CPU: glibc's malloc told to reuse the blocks a step frees.

A training step on the CPU allocates and frees the same large tensors every step (activations,
gradients, the batch). glibc's malloc serves a block above its mmap threshold with a fresh `mmap`
and returns it with `munmap` when freed, and trims freed memory at the top of its heap back to
the kernel, so the next step faults in and zeroes those pages again. Both thresholds start low
(128 KiB) and rise only as large mmapped blocks are freed, so whether a process settles into
reusing its memory depends on what it allocated before: the same smoke-size loop measured 0 page
faults per step in one process and 2,000-2,500 (about 4 ms of kernel time in a 20 ms step) in
another (benchmarks/bench_engine_overhead.py). `keep_freed_memory()` sets the thresholds to where
glibc's own adjustment would end: blocks up to 32 MiB come from the heap, and up to 64 MiB of
freed memory at its top is kept for the next step. Larger blocks are still mapped and unmapped.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt parameters (malloc.h) and glibc's ceiling for the dynamic mmap threshold on 64-bit
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # glibc's own rule: trim above twice the mmap threshold

_applied = False


def keep_freed_memory() -> bool:
    """Fix glibc malloc's mmap and trim thresholds for this process (once); returns whether they
    are set: False where the C library is not glibc (nothing is changed there)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # another C library: its mallopt means other things
        return False
    # mallopt returns 1 on success; setting either threshold also stops glibc adjusting both
    _applied = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
