"""Download the wheels `benchmarks/course_gpu.py` needs to run the course on a GPU machine that has
Python and torch but no network and no Jupyter (papermill, ipykernel and what they need, crc32c
for labkit's TFRecord reader, Optuna for notebook 11), for that machine's Python and platform.

    python benchmarks/fetch_course_wheels.py                      # into .whl/, for CPython 3.12 x86-64
    python benchmarks/fetch_course_wheels.py --python-version 3.11 --dest wheels/
    # then, on the GPU machine:
    python benchmarks/course_gpu.py --wheels .whl

pip resolves the whole set for the target interpreter (`--python-version`, manylinux x86-64
wheels only); packages the target image already has (`--skip`; the default names the numeric
and torch stack a GPU image ships) are dropped, so the folder stays small. The harness installs
the rest with `pip install --no-index --no-deps --target`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

PACKAGES = ("papermill>=2.5", "nbformat>=5.9", "ipykernel>=6.25", "nbclient", "jupyter_client",
            "crc32c>=2.3", "optuna>=4.0", "matplotlib-inline")
# What a PyTorch GPU image already has; shadowing them with other versions helps nothing.
ALREADY_THERE = ("numpy", "torch", "triton", "sympy", "mpmath", "networkx", "filelock", "fsspec", "jinja2",
                 "markupsafe", "typing-extensions", "packaging", "psutil", "pyyaml", "requests", "urllib3",
                 "idna", "certifi", "charset-normalizer", "tqdm", "click", "attrs", "six", "setuptools",
                 "python-dateutil", "pygments", "aiohttp", "aiosignal", "aiohappyeyeballs", "frozenlist",
                 "multidict", "yarl", "propcache", "matplotlib", "pillow", "contourpy", "cycler",
                 "fonttools", "kiwisolver", "pyparsing", "nvidia-*")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def _project(wheel: Path) -> str:
    """The normalised project name of a wheel file (PEP 503: lower case, runs of -_. as -)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()


def _skipped(project: str, skip: tuple[str, ...]) -> bool:
    return any(project == s or (s.endswith("*") and project.startswith(s[:-1])) for s in skip)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", default=".whl", help="folder for the wheels (default .whl)")
    p.add_argument("--python-version", default="3.12", help="the target machine's Python (default 3.12)")
    p.add_argument("--skip", nargs="*", default=list(ALREADY_THERE),
                   help="projects the target already has (a trailing * matches a prefix)")
    args = p.parse_args(argv)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation", "cp",
           "--python-version", args.python_version, "-d", str(dest), "--quiet"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    subprocess.run(cmd + ["--platform", "any", *PACKAGES], check=True)
    kept, dropped = [], []
    for wheel in sorted(dest.glob("*.whl")):
        if _skipped(_project(wheel), tuple(args.skip)):
            wheel.unlink()
            dropped.append(_project(wheel))
        else:
            kept.append(wheel)
    size = sum(w.stat().st_size for w in kept) / 1e6
    print(f"{len(kept)} wheels, {size:.1f} MB in {dest} (dropped, the target has them: {', '.join(dropped) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
