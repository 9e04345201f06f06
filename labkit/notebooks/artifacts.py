"""Where a notebook writes the files it makes (shards, checkpoints, traces, plots)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# Set by the runners (`labkit course`, a Vertex notebook job) for the kernels they start.
ARTIFACTS_ENV = "LABKIT_ARTIFACTS"


def artifacts_dir(name: str) -> Path:
    """A folder for the files a notebook makes: `name` under $LABKIT_ARTIFACTS when a runner
    sets it, else a fresh temporary folder, so a run never litters the repository."""
    base = os.environ.get(ARTIFACTS_ENV)
    if base:
        path = Path(base) / name
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"labkit-{name}-"))
