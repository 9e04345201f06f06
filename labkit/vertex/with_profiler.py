"""``python -m labkit.vertex.with_profiler -- python train.py ARGS`` (or ``-- python -m MODULE
ARGS``): start the Vertex AI TensorBoard Profiler in this process, then run the training command
in it with its own arguments (see `labkit.vertex.cloud_profile`)."""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from collections.abc import Mapping

from labkit.core.config import ParameterError
from labkit.vertex.cloud_profile import (
    EMULATED_ENV,
    PROFILER_PACKAGES,
    PROFILER_PAGE,
    PROFILER_VARIABLES,
    profiled,
)


def missing(env: Mapping[str, str] | None = None) -> list[str]:
    """What the profiler needs and this process lacks: variables, then packages."""
    env = os.environ if env is None else env
    out = [f"{v} (set by Vertex for a job with a TensorBoard)" for v in PROFILER_VARIABLES if not env.get(v)]
    out += [f"{module} (pip install {package})" for module, package in PROFILER_PACKAGES.items()
            if importlib.util.find_spec(module) is None]
    return out


def _start_profiler() -> None:
    from google.cloud.aiplatform.training_utils import cloud_profiler

    cloud_profiler.init()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    words = argv[1:] if argv[:1] == ["--"] else argv
    try:
        profiled(words)
    except ParameterError as e:
        print(f"labkit.vertex.with_profiler: {e}", file=sys.stderr)
        return 2
    lacking = missing()
    if lacking and os.environ.get(EMULATED_ENV):
        print("TensorBoard Profiler: not in the emulator (no profiler service here); training without it",
              file=sys.stderr, flush=True)
    elif lacking:
        print(f"TensorBoard Profiler: cannot start, missing {'; '.join(lacking)} ({PROFILER_PAGE})",
              file=sys.stderr)
        return 2
    else:
        _start_profiler()
    if words[1] == "-m":
        sys.argv = [words[2], *words[3:]]
        runpy.run_module(words[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = words[1:]
        sys.path.insert(0, os.path.dirname(os.path.abspath(words[1])))  # as `python SCRIPT` does
        runpy.run_path(words[1], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
