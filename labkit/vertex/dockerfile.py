"""What a user's Dockerfile says about the image the emulator cannot build: ENTRYPOINT, CMD,
WORKDIR, ENV, and the files COPY (or ADD) puts into it.

`read_dockerfile(path, staging)` applies the final stage's instructions as Docker would
(https://docs.docker.com/reference/dockerfile/, read 2026-11-28): exec (JSON) and shell forms of
ENTRYPOINT and CMD (the shell form runs under ``/bin/sh -c``), WORKDIR relative to the one before,
ENV and ARG values substituted in later instructions, line continuations. The files each COPY
or ADD takes from the build context (the Dockerfile's folder) are copied into `staging`, laid
out as they would be in the image; `Image.files` is the image's working directory there. What
comes from other images (``COPY --from``, the base image's own files), URLs and archives ADD
would unpack are not reproduced, and `notes` says so.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from labkit.core.config import ParameterError
from labkit.vertex.programs import Image

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


@dataclass
class DockerImage:
    """The image as read from its Dockerfile: `image` for the emulator, and what could not be
    reproduced here."""

    image: Image
    staging: Path
    notes: list[str] = field(default_factory=list)


def instructions(text: str) -> list[tuple[str, str]]:
    """A Dockerfile's (INSTRUCTION, arguments) pairs, continuations joined and comments dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        head, _, rest = line.partition(" ")
        out.append((head.upper(), rest.strip()))
    if pending.strip():
        head, _, rest = pending.strip().partition(" ")
        out.append((head.upper(), rest.strip()))
    return out


def _substitute(text: str, variables: dict[str, str]) -> str:
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        return variables.get(name) or (m.group(2) or "")

    return _VAR.sub(value, text)


def _command(args: str) -> tuple[str, ...]:
    """ENTRYPOINT / CMD arguments in exec (JSON list) or shell form."""
    if args.startswith("["):
        try:
            words = json.loads(args)
        except json.JSONDecodeError:
            words = None
        if isinstance(words, list) and all(isinstance(w, str) for w in words):
            return tuple(words)
    return ("/bin/sh", "-c", args) if args else ()


def _ignored(context: Path) -> list[str]:
    path = context / ".dockerignore"
    if not path.is_file():
        return []
    return [line.strip().lstrip("/") for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#") and not line.startswith("!")]


def _copy_from_context(sources: list[str], dest: str, context: Path, staging: Path, ignore: list[str],
                       notes: list[str]) -> None:
    target = staging / dest.lstrip("/")
    into_folder = dest.endswith("/") or len(sources) > 1
    for source in sources:
        if re.match(r"^[a-z]+://", source):
            notes.append(f"ADD {source}: URLs are not fetched here")
            continue
        matches = sorted(context.glob(source)) if any(c in source for c in "*?[") else [context / source]
        for src in matches:
            if not src.exists():
                raise ParameterError("--dockerfile", str(context / source),
                                     "COPY names a file that is not in the build context")
            if src.is_dir():
                def skip(folder: str, names: list[str]) -> list[str]:
                    rel = os.path.relpath(folder, context)
                    return [n for n in names if any(fnmatch.fnmatch(os.path.normpath(os.path.join(rel, n)), p)
                                                    for p in ignore)]

                shutil.copytree(src, target, symlinks=True, ignore=skip, dirs_exist_ok=True)
            else:
                path = target / src.name if into_folder or target.is_dir() else target
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, path)


def read_dockerfile(path: str | os.PathLike, staging: str | os.PathLike) -> DockerImage:
    """The image `path` builds, as far as the emulator needs it (see the module docstring)."""
    dockerfile = Path(path).resolve()
    if not dockerfile.is_file():
        raise ParameterError("--dockerfile", str(path), "is not a file")
    context, staging = dockerfile.parent, Path(staging)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    stages = [[]]
    for name, args in instructions(dockerfile.read_text(encoding="utf-8", errors="replace")):
        if name == "FROM":
            stages.append([])
        stages[-1].append((name, args))
    notes: list[str] = []
    if len(stages) > 2:
        notes.append("only the final build stage is reproduced")
    variables: dict[str, str] = {}
    env: dict[str, str] = {}
    workdir, entrypoint, cmd = "/", (), ()
    ignore = _ignored(context)
    for name, args in [("FROM", "")] + stages[-1][1:] if len(stages) > 1 else stages[0]:
        if name in ("ARG", "ENV"):
            pairs = shlex.split(args)
            if name == "ENV" and len(pairs) >= 2 and "=" not in pairs[0]:
                pairs = [f"{pairs[0]}={' '.join(pairs[1:])}"]
            for pair in pairs:
                key, sep, value = pair.partition("=")
                value = _substitute(value, {**variables, **env}) if sep else variables.get(key, "")
                (env if name == "ENV" else variables)[key] = value
        elif name == "WORKDIR":
            workdir = str(PurePosixPath(workdir) / _substitute(args, {**variables, **env}))
            (staging / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif name == "ENTRYPOINT":
            entrypoint, cmd = _command(args), ()
        elif name == "CMD":
            cmd = _command(args)
        elif name in ("COPY", "ADD"):
            words = shlex.split(_substitute(args, {**variables, **env}))
            if args.lstrip().startswith("["):
                words = json.loads(args)
            flags = [w for w in words if w.startswith("--")]
            words = [w for w in words if not w.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                notes.append(f"{name} {args}: files from another stage or image are not reproduced")
                continue
            if len(words) < 2:
                continue
            *sources, dest = words
            if not dest.startswith("/"):
                dest = str(PurePosixPath(workdir) / dest) + ("/" if dest.endswith("/") else "")
            _copy_from_context(sources, dest, context, staging, ignore, notes)
    files = staging / workdir.lstrip("/")
    files.mkdir(parents=True, exist_ok=True)
    return DockerImage(Image(entrypoint=entrypoint, cmd=cmd, workdir=workdir, files=files, env=env,
                             root=staging), staging, notes)
