"""What each worker pool of a CustomJob runs, as a command on this machine.

A pool runs one of (https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec,
read 2026-11-28):

- a ``container_spec``: ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD, as
  Docker does; a spec with only ``args`` runs the image's ENTRYPOINT with them, so the emulator
  must be told that entrypoint (`Image.entrypoint`: ``--entrypoint``, or read from the user's
  Dockerfile) or refuses the spec naming the field, unless the args start with a program (an
  image without an ENTRYPOINT, such as labkit's own, runs them as the command);
- a ``python_package_spec``: the prebuilt image pip-installs ``package_uris`` and runs
  ``python -m python_module args``. Here the packages (a ``gs://`` or ``/gcs/`` address in the
  emulated bucket, or a local sdist, wheel or source folder) are installed with pip into a
  folder of the job's own (``<workdir>/python``), put first on ``PYTHONPATH``; requirements they
  declare that this environment lacks are installed there too, from the package index;
- Google's Reduction Server image, which cannot run here: an idle process keeps its place.

`Program` is the result: the local command line, the pool's own environment, and the folder
the command starts in (a fresh copy of `Image.files`, the local folder standing in for what the
image holds at its working directory, or the replica's empty container disk). `python`,
``python3`` and ``papermill`` run from this interpreter's environment; everything else is found
on ``PATH``, which starts with this environment's ``bin`` (so ``torchrun`` and ``labkit`` are
there, inside a shell command too).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core.cluster import is_reduction_server_image
from labkit.core.config import ParameterError
from labkit.vertex.fields import field_of
from labkit.vertex.images import is_labkit_image
from labkit.vertex.specs import SETUP_MARKER

_IDLE = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nwhile True: time.sleep(0.2)"
# Folders never copied into a replica's working directory: version control, caches and
# environments, which no image holds and which can be large.
SKIPPED_FOLDERS = (".git", ".hg", ".svn", "__pycache__", ".ipynb_checkpoints", ".venv", "venv",
                   ".tox", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules")
MAX_IMAGE_FILES_BYTES = 1 << 30
# Written into every emulated job's folder: such a folder is never copied as the user's code.
JOB_MARKER = "LABKIT_EMULATED_JOB.json"


@dataclass(frozen=True)
class Image:
    """What the emulator knows of a container image beyond its name: its ENTRYPOINT and CMD
    (for specs with only ``args``), its ENV, its working directory as a path inside the image
    (`workdir`), and `files`, the local folder whose contents the image holds there. `root`,
    when set, is a local folder laid out as the image's whole file system (what a Dockerfile's
    COPY instructions put in it, `labkit.vertex.dockerfile`), `files` being inside it."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str | None = None
    files: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    root: Path | None = None

    def layout(self) -> tuple[Path | None, str, bool]:
        """(folder copied for each replica, where the replica starts inside the copy, whether
        the copy is laid out as the image's root)."""
        if self.root is not None and self.files is not None:
            return self.root, os.path.relpath(self.files, self.root).replace(os.sep, "/").strip("."), True
        return self.files, "", False


@dataclass
class Program:
    """One pool's command here, its environment from the spec, and where it starts: in a fresh
    copy of `files` (at `start_in` inside it; `as_root`: the copy is laid out as the image's
    root), which is `container_workdir` inside the image."""

    argv: list[str]
    env: dict[str, str]
    files: Path | None = None
    container_workdir: str | None = None
    pythonpath: list[str] = field(default_factory=list)
    idle: bool = False
    start_in: str = ""
    as_root: bool = False
    notes: list[str] = field(default_factory=list)


def split_command(value: str | Sequence[str], name: str) -> list[str]:
    """A command given as a JSON list, a shell-style string or a list of words."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                words = json.loads(text)
            except json.JSONDecodeError as e:
                raise ParameterError(name, value, f"is not a JSON list of words ({e})") from None
        else:
            try:
                words = shlex.split(text)
            except ValueError as e:
                raise ParameterError(name, value, f"cannot be split into words ({e})") from None
    else:
        words = list(value)
    if not words or not all(isinstance(w, str) for w in words):
        raise ParameterError(name, value, "must name a command (one or more words)")
    return words


def _is_program(word: str) -> bool:
    """Whether `word` reads as a program to run rather than a flag or a script's argument."""
    return not word.startswith("-") and (word in ("python", "python3", "papermill")
                                         or shutil.which(word) is not None)


def _local_command(argv: list[str]) -> list[str]:
    if argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    if argv[0] == "papermill":
        return [sys.executable, "-m", "papermill", *argv[1:]]
    return argv


def _env_of(items: Any, where: str) -> dict[str, str]:
    out = {}
    for i, item in enumerate(items or []):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not name:
            raise ParameterError(f"{where}.env[{i}].name", item, "is required")
        out[str(name)] = str(item.get("value", ""))
    return out


def container_program(container: Mapping[str, Any], image: Image, where: str) -> Program:
    """A ``container_spec`` as a local command (`where` names it in errors)."""
    uri = field_of(container, "image_uri") or ""
    env = {**image.env, **_env_of(field_of(container, "env"), where)}
    if is_reduction_server_image(uri):
        return Program([sys.executable, "-c", _IDLE], env, idle=True)
    command = list(field_of(container, "command") or [])
    args = list(field_of(container, "args") or [])
    if len(command) == 4 and command[:2] == ["bash", "-c"] and command[3] == SETUP_MARKER:
        command = []  # labkit's set-up wrapper only pip-installs what this environment has
        argv = args
    elif command:
        argv = command + args
    elif image.entrypoint:
        argv = list(image.entrypoint) + (args or list(image.cmd))
    elif image.cmd and not args:
        argv = list(image.cmd)
    elif args and (is_labkit_image(uri) or _is_program(args[0])):
        argv = args  # an image without an ENTRYPOINT runs its args as the command (labkit's do)
    else:
        raise ParameterError(f"{where}.command", None,
                             f"is not set, so the image's ENTRYPOINT would run with the args; the "
                             f"emulator cannot read {uri or 'the image'}: give that entrypoint with "
                             "--entrypoint (or --dockerfile), or put the whole command in command")
    if not argv:
        raise ParameterError(f"{where}.command", None, "and args are both empty: nothing to run")
    files, start_in, as_root = image.layout()
    return Program(_local_command(argv), env, files, image.workdir, start_in=start_in, as_root=as_root)


def package_program(spec: Mapping[str, Any], where: str, resolve, install_dir: Path) -> Program:
    """A ``python_package_spec`` as a local command: its packages installed into
    `install_dir` (once per job), then ``python -m MODULE ARGS``. `resolve` maps a package URI
    (``gs://``, ``/gcs/`` or local) to a local path."""
    module = field_of(spec, "python_module")
    if not module or not isinstance(module, str):
        raise ParameterError(f"{where}.python_module", module, "is required (e.g. 'trainer.task')")
    uris = field_of(spec, "package_uris") or []
    if not uris:
        raise ParameterError(f"{where}.package_uris", uris,
                             "is required: the sdist or wheel that holds the module")
    local = []
    for i, uri in enumerate(uris):
        path = Path(resolve(str(uri)))
        if not path.exists():
            raise ParameterError(f"{where}.package_uris[{i}]", uri,
                                 f"was not found (looked at {path}): copy the package into the emulated "
                                 "bucket first, or give a local sdist, wheel or folder")
        local.append((f"{where}.package_uris[{i}]", path))
    notes = install_packages(local, install_dir)
    argv = [sys.executable, "-m", module, *[str(a) for a in field_of(spec, "args") or []]]
    return Program(argv, _env_of(field_of(spec, "env"), where), pythonpath=[str(install_dir)], notes=notes)


def install_packages(packages: Sequence[tuple[str, Path]], target: Path) -> list[str]:
    """pip-install `packages` (name for errors, path) into `target`, then the requirements they
    declare that this environment lacks altogether (from the package index, as the service's
    pip would; one at a time, so no second copy of a package this environment has shadows it).
    Returns notes on requirements met here by another version (the emulator runs
    with this environment's; the image may differ). One line naming the package when pip fails."""
    target.mkdir(parents=True, exist_ok=True)
    for name, path in packages:
        _pip([str(path)], target, name, offline=True)
    absent, other_versions = missing_requirements(target)
    rounds = 0
    while absent and rounds < 8:  # what is missing, then what that needs, never what is here
        _pip(absent, target, f"the requirements of {', '.join(n for n, _ in packages)}", offline=False,
             deps=False)
        absent, more = missing_requirements(target)
        other_versions += [m for m in more if m not in other_versions]
        rounds += 1
    return [f"{need} is asked for; this environment has {have}, which the emulated job uses"
            for need, have in other_versions]


def _pip(what: list[str], target: Path, name: str, *, offline: bool, deps: bool = False) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-warn-script-location", "--target", str(target), "--upgrade"]
    argv += ["--no-build-isolation", "--no-index"] if offline else []
    argv += [] if deps else ["--no-deps"]
    out = subprocess.run([*argv, *what], capture_output=True, text=True)
    if out.returncode != 0:
        lines = [line.strip() for line in (out.stderr + out.stdout).splitlines()
                 if line.strip() and not line.startswith(" ")]
        reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
        raise ParameterError(name, " ".join(what), f"could not be installed with pip: {reason}")


_CHECK = """
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement
target = sys.argv[1]
have = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in md.distributions()}
absent, other = [], []
for dist in md.distributions(path=[target]):
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        version = have.get(req.name.lower().replace("_", "-"))
        if version is None:
            absent.append(str(req))
        elif req.specifier and not req.specifier.contains(version, prereleases=True):
            other.append([str(req), f"{req.name} {version}"])
print(json.dumps([sorted(set(absent)), other]))
"""


def missing_requirements(target: Path) -> tuple[list[str], list[list[str]]]:
    """(requirements this environment lacks, [requirement, the version here] for those it
    meets with another version) of the distributions in `target`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _CHECK, str(target)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return [], []
    absent, other = json.loads(out.stdout or "[[], []]")
    return absent, other


def skipped(folder: str | os.PathLike, name: str) -> bool:
    """Whether entry `name` of `folder` is left out of an image's files."""
    return name in SKIPPED_FOLDERS or os.path.isfile(os.path.join(folder, name, JOB_MARKER))


def image_files_size(folder: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not skipped(root, d)]
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def check_image_files(folder: Path, name: str, skip: Path | None = None) -> Path:
    """The local folder that stands for an image's files: it must exist and be of a size an
    image holds (each replica gets a fresh copy)."""
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise ParameterError(name, str(folder), "is not a folder here: give the local folder that holds "
                             "what the image has in its working directory (code and small data)")
    size = image_files_size(folder)
    if size > MAX_IMAGE_FILES_BYTES:
        raise ParameterError(name, str(folder), f"holds {size / 2**30:.1f} GiB, copied for every replica: "
                             "give the folder with just your code and small files (what an image holds; "
                             "keep data in the bucket) with --code or --container-workdir")
    return folder


def copy_image_files(src: Path, dest: Path, skip: Sequence[Path] = ()) -> None:
    """A fresh copy of the image's files for one replica (symlinks kept as links)."""
    skip_resolved = {Path(s).resolve() for s in skip}

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if skipped(folder, n) or (Path(folder) / n).resolve() in skip_resolved]

    shutil.copytree(src, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)
