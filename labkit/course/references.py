"""The benchmark results files a notebook quotes where it needs hardware the run may not have:
found in `labkit.hardware.results.results_dir()` (the repository's `benchmarks/results`, or
`LABKIT_RESULTS_DIR`), named in sentences by their place in the repository, and said to be
missing, never invented, when labkit is installed without them."""

from __future__ import annotations

from pathlib import Path

NO_RESULTS = ("benchmarks/results/ is not beside this labkit (installed without its repository): "
              "the reference figures are in the course's repository")


def results_path(name: str) -> Path | None:
    """The results file `name`, or None when it is not here."""
    from labkit.hardware.results import results_dir

    path = results_dir() / name
    return path if path.is_file() else None


def source(path: Path) -> str:
    """How a sentence names a results file."""
    return f"benchmarks/results/{path.name}"
