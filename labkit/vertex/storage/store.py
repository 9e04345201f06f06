"""Buckets as plain folders: object ``b/x/y`` of the local Cloud Storage is the file
``<root>/b/x/y``, so the same bytes are reached through the JSON API (`labkit.vertex.storage.api`)
and through the ``/gcs/b/x/y`` mount an emulated replica sees.

What a folder cannot hold is refused with `StoreError` (400): object names with empty, ``.``
or ``..`` segments, a leading ``/`` or a NUL, and an object and a "folder" of the same name.
A name ending in ``/`` is a folder marker (TensorFlow's ``makedirs`` writes them): writing one
makes the folder, reading one answers for an existing folder, deleting one removes an empty
folder. An empty folder lists as its marker, as the bucket would after a ``makedirs``.

Every write lands whole or not at all: bytes go to a file under `staging` (outside the buckets,
same file system) and are renamed into place, so a reader through the mount never sees half an
object, as Cloud Storage readers never do. The generation is the file's modification time in
nanoseconds; ``ifGenerationMatch`` preconditions are checked against it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_CHUNK = 1 << 20


class StoreError(Exception):
    """A request the store refuses: `code` is the HTTP status, `reason` the API's reason."""

    def __init__(self, code: int, message: str, reason: str = "invalid"):
        super().__init__(message)
        self.code, self.reason = code, reason


def not_found(what: str) -> StoreError:
    return StoreError(404, f"No such object: {what}", "notFound")


@dataclass(frozen=True)
class ObjectInfo:
    """What the API says about one object (or folder marker)."""

    bucket: str
    name: str
    size: int
    generation: int
    path: Path

    @property
    def updated(self) -> str:
        when = datetime.fromtimestamp(self.generation / 1e9, tz=timezone.utc)
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _crc32c(data_iter: Iterator[bytes]) -> int:
    import crc32c

    value = 0
    for chunk in data_iter:
        value = crc32c.crc32c(chunk, value)
    return value


class BucketStore:
    """Buckets under `root` (one folder each); writes staged under `staging`."""

    def __init__(self, root: str | os.PathLike, staging: str | os.PathLike):
        self.root = Path(root).resolve()
        self.staging = Path(staging).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)
        self._hashes: dict[tuple[str, int, int], tuple[str, str]] = {}
        self._lock = threading.Lock()
        # Folders made as objects (``name/`` markers): they stay when emptied, as markers do.
        self._markers: set[Path] = set()

    # ------------------------------------------------------------ buckets

    def bucket_path(self, bucket: str) -> Path:
        if not isinstance(bucket, str) or "/" in bucket or bucket in ("", ".", "..") or "\0" in bucket:
            raise StoreError(400, f"Invalid bucket name: {bucket!r}")
        return self.root / bucket

    def has_bucket(self, bucket: str) -> bool:
        return self.bucket_path(bucket).is_dir()

    def require_bucket(self, bucket: str) -> Path:
        path = self.bucket_path(bucket)
        if not path.is_dir():
            raise StoreError(404, f"The specified bucket does not exist: {bucket}", "notFound")
        return path

    def create_bucket(self, bucket: str) -> None:
        if not _BUCKET.match(bucket or ""):
            raise StoreError(400, f"Invalid bucket name: {bucket!r}")
        path = self.bucket_path(bucket)
        if path.is_dir():
            raise StoreError(409, f"The bucket {bucket} already exists", "conflict")
        path.mkdir(parents=True)

    def buckets(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def bucket_created(self, bucket: str) -> int:
        return self.require_bucket(bucket).stat().st_mtime_ns

    # ------------------------------------------------------------ objects

    def path_of(self, bucket: str, name: str) -> Path:
        """The file (or, for a ``/``-terminated name, the folder) object `name` lives in."""
        base = self.require_bucket(bucket)
        if not name or name.startswith("/") or "\0" in name:
            raise StoreError(400, f"Invalid object name: {name!r}")
        parts = name[:-1].split("/") if name.endswith("/") else name.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise StoreError(400, f"Object name {name!r} cannot be held by the local bucket folder "
                             "(empty, '.' or '..' path segments)")
        return base.joinpath(*parts)

    def info(self, bucket: str, name: str) -> ObjectInfo:
        path = self.path_of(bucket, name)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise not_found(f"{bucket}/{name}") from None
        is_dir = path.is_dir()
        if is_dir != name.endswith("/"):
            raise not_found(f"{bucket}/{name}")
        return ObjectInfo(bucket, name, 0 if is_dir else st.st_size, st.st_mtime_ns, path)

    def hashes(self, info: ObjectInfo) -> tuple[str, str]:
        """(crc32c, md5) of an object, base64 as the API writes them (cached per version)."""
        key = (str(info.path), info.generation, info.size)
        with self._lock:
            cached = self._hashes.get(key)
        if cached is not None:
            return cached
        if info.path.is_dir():
            chunks: list[bytes] = [b""]
        else:
            with open(info.path, "rb") as f:
                chunks = list(iter(lambda: f.read(_CHUNK), b""))
        md5 = hashlib.md5(usedforsecurity=False)
        for chunk in chunks:
            md5.update(chunk)
        crc = _crc32c(iter(chunks)).to_bytes(4, "big")
        out = (base64.b64encode(crc).decode(), base64.b64encode(md5.digest()).decode())
        with self._lock:
            self._hashes[key] = out
        return out

    def check_generation(self, bucket: str, name: str, match: str | None, not_match: str | None = None) -> None:
        """``ifGenerationMatch`` (0: only if absent) and ``ifGenerationNotMatch``."""
        if match is None and not_match is None:
            return
        try:
            current = self.info(bucket, name).generation
        except StoreError:
            current = 0
        if match is not None and int(match) != current:
            raise StoreError(412, "At least one of the pre-conditions you specified did not hold.",
                             "conditionNotMet")
        if not_match is not None and int(not_match) == current:
            raise StoreError(304, "Not modified", "notModified")

    def staged_file(self) -> tuple[int, str]:
        """A new file under `staging` for an object being written: (fd, path)."""
        return tempfile.mkstemp(dir=self.staging, prefix="upload-")

    def commit(self, bucket: str, name: str, staged: str) -> ObjectInfo:
        """Move a staged file into place as object `name` (replacing the object, atomically)."""
        path = self.path_of(bucket, name)
        if name.endswith("/"):
            os.unlink(staged)
            return self.make_folder(bucket, name)
        if path.is_dir():
            os.unlink(staged)
            raise StoreError(409, f"{bucket}/{name}: a folder of that name holds other objects here, "
                             "and the local bucket folder cannot hold both", "conflict")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            os.unlink(staged)
            raise StoreError(409, f"{bucket}/{name}: an object is named like one of its folders, "
                             "which the local bucket folder cannot hold", "conflict") from None
        os.chmod(staged, 0o644)
        os.replace(staged, path)
        return self.info(bucket, name)

    def write(self, bucket: str, name: str, data: bytes) -> ObjectInfo:
        fd, staged = self.staged_file()
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return self.commit(bucket, name, staged)

    def make_folder(self, bucket: str, name: str) -> ObjectInfo:
        path = self.path_of(bucket, name if name.endswith("/") else name + "/")
        self._markers.add(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise StoreError(409, f"{bucket}/{name}: an object of that name exists", "conflict") from None
        return self.info(bucket, name if name.endswith("/") else name + "/")

    def read(self, info: ObjectInfo, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes [start, end) of an object, in chunks."""
        if info.path.is_dir():
            return
        end = info.size if end is None else min(end, info.size)
        with open(info.path, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                chunk = f.read(min(_CHUNK, left))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk

    def delete(self, bucket: str, name: str) -> None:
        """Delete an object; folders it leaves empty go too (a bucket's folders exist only
        through the objects in them), unless they were made as markers."""
        info = self.info(bucket, name)
        self._markers.discard(info.path)
        if info.path.is_dir():
            try:
                info.path.rmdir()
            except OSError:  # a marker of a folder that holds objects: they stay, as in a bucket
                return
        else:
            info.path.unlink()
        top = self.bucket_path(bucket)
        folder = info.path.parent
        while folder != top and folder not in self._markers:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def copy(self, src_bucket: str, src: str, dst_bucket: str, dst: str) -> ObjectInfo:
        info = self.info(src_bucket, src)
        if info.path.is_dir():
            return self.make_folder(dst_bucket, dst)
        fd, staged = self.staged_file()
        os.close(fd)
        shutil.copyfile(info.path, staged)
        return self.commit(dst_bucket, dst, staged)

    def compose(self, bucket: str, sources: list[str], dst: str) -> ObjectInfo:
        infos = [self.info(bucket, s) for s in sources]
        fd, staged = self.staged_file()
        with os.fdopen(fd, "wb") as out:
            for info in infos:
                for chunk in self.read(info):
                    out.write(chunk)
        return self.commit(bucket, dst, staged)

    # ------------------------------------------------------------ listing

    def names(self, bucket: str, prefix: str = "") -> list[tuple[str, bool]]:
        """Every object name under `prefix` (string prefix, as the API means it), sorted, with
        whether it is a folder marker (an empty folder, or one made as an object)."""
        base = self.require_bucket(bucket)
        head, _, _ = prefix.rpartition("/")
        start = base.joinpath(*head.split("/")) if head else base
        if not start.is_dir():
            return []
        found = []
        for folder, dirs, files in os.walk(start):
            rel = os.path.relpath(folder, base).replace(os.sep, "/")
            rel = "" if rel == "." else rel + "/"
            if rel and (not dirs and not files or Path(folder) in self._markers):
                found.append((rel, True))
            found.extend((rel + f, False) for f in files)
        return sorted((n, d) for n, d in found if n.startswith(prefix))

    def list(self, bucket: str, prefix: str = "", delimiter: str = "", *, include_trailing: bool = False,
             start_offset: str = "", end_offset: str = "") -> tuple[list[str], list[str]]:
        """(object names, prefixes) as objects.list answers them (before paging)."""
        items, prefixes = [], set()
        for name, _ in self.names(bucket, prefix):
            if (start_offset and name < start_offset) or (end_offset and name >= end_offset):
                continue
            rest = name[len(prefix):]
            if delimiter and delimiter in rest:
                cut = rest.index(delimiter) + len(delimiter)
                prefixes.add(prefix + rest[:cut])
                if include_trailing and cut == len(rest):
                    items.append(name)
                continue
            items.append(name)
        # A folder that holds objects still shows as a prefix (the names above cover it).
        return items, sorted(prefixes)
