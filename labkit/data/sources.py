"""A learner's own data, listed as records to shard: an image folder, a CSV of image paths and
labels, or tables (CSV, JSON Lines, Parquet), from a local folder, a ``/gcs/`` mount or ``gs://``.

    images = image_folder("photos/")                  # photos/<class>/<file>.jpg
    images = image_list("labels.csv", label_column="label", path_column="path")
    table = read_table("rows.parquet")                 # or .csv, .jsonl, or a folder of them

An image source lists files (path, size, label) without opening them: the bytes are read when
their shard is written, and kept as they are (a JPEG stays the JPEG it was, no re-encode). A
table is read whole and each row encoded as a `tf.train.Example` (ints, floats, text as bytes),
so its size is known before it is cut into shards. Errors name the path or column and the cause
(`SourceError`, a ValueError).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from labkit.data.example import encode_example
from labkit.data.shards import join_path
from labkit.data.tfrecord import is_remote, open_binary

IMAGE_FORMATS = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png"}
TABLE_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".pq": "parquet"}
PATH_COLUMNS = ("path", "file", "filename", "file_name", "image", "image_path", "filepath")
RESERVED = ("index",)  # a feature every labkit record carries: its place in the shard set


class SourceError(ValueError):
    """The source cannot be sharded as asked: `.where` is the path, column or flag at fault."""

    def __init__(self, where: str, cause: str):
        self.where = where
        super().__init__(f"{where}: {cause}")


@dataclass(frozen=True)
class ImageFile:
    path: str  # where the bytes are (local path or URL)
    name: str  # the path relative to the source, kept in the record
    size: int
    label: int
    format: str  # "jpeg" or "png"


@dataclass(frozen=True)
class ImageSource:
    """Image files and their integer labels; `classes[label]` is the label's name."""

    root: str
    files: list[ImageFile]
    classes: list[str]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def fingerprint(self) -> str:
        """Changes when any file, size or label changes (a resumed write checks it)."""
        h = hashlib.sha256()
        for f in self.files:
            h.update(f"{f.name}\0{f.size}\0{f.label}\n".encode())
        return h.hexdigest()


@dataclass(frozen=True)
class TableSource:
    """Rows of a table, each already encoded as a tf.train.Example (without its `index`);
    `columns` maps each column to its feature type: "int64", "float" or "bytes"."""

    root: str
    columns: dict[str, str]
    rows: list[dict]

    def fingerprint(self) -> str:
        h = hashlib.sha256(json.dumps(self.columns, sort_keys=True).encode())
        for row in self.rows:
            h.update(encode_example(row))
        return h.hexdigest()


class _Files:
    """Listing and reading under a local folder (a /gcs/ mount included) or a gs:// URL."""

    def __init__(self, root: str):
        self.root = root.rstrip("/") if root not in ("/",) else root
        self.remote = is_remote(root)
        if self.remote:
            import fsspec

            self.fs, self._path = fsspec.core.url_to_fs(root)
            self.protocol = root.split("://", 1)[0]

    def url(self, path: str) -> str:
        return path if not self.remote or "://" in path else f"{self.protocol}://{path}"

    def is_dir(self) -> bool:
        return self.fs.isdir(self._path) if self.remote else os.path.isdir(self.root)

    def exists(self) -> bool:
        return self.fs.exists(self._path) if self.remote else os.path.exists(self.root)

    def walk(self) -> list[tuple[str, str, int]]:
        """(url, relative name, size) of every file under the root, sorted by name."""
        out = []
        if self.remote:
            for path, info in self.fs.find(self._path, detail=True).items():
                rel = posixpath.relpath(path, self._path)
                out.append((self.url(path), rel, int(info.get("size") or 0)))
        else:
            for folder, dirs, names in os.walk(self.root):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for n in names:
                    p = os.path.join(folder, n)
                    out.append((p, os.path.relpath(p, self.root).replace(os.sep, "/"), os.path.getsize(p)))
        return sorted((o for o in out if not posixpath.basename(o[1]).startswith(".")), key=lambda o: o[1])

    def size(self, url: str) -> int:
        return int(self.fs.size(url)) if self.remote else os.path.getsize(url)


def _format_of(name: str, formats: dict[str, str]) -> str | None:
    return formats.get(os.path.splitext(name)[1].lower())


def image_folder(root: str | os.PathLike) -> ImageSource:
    """Images in one subfolder per class (`root/<class>/.../<file>.jpg|.png`); labels are the
    class folders in sorted order, as torchvision's ImageFolder numbers them."""
    root = os.fspath(root)
    files = _Files(root)
    if not files.exists():
        raise SourceError(root, "no such folder")
    if not files.is_dir():
        raise SourceError(root, "is a file, not a folder of class subfolders (for a CSV of paths and "
                                "labels use --labels csv:COLUMN)")
    listed = [(url, rel, size) for url, rel, size in files.walk() if _format_of(rel, IMAGE_FORMATS)]
    loose = [rel for _u, rel, _s in listed if "/" not in rel]
    if loose:
        raise SourceError(root, f"images must sit in one subfolder per class, but {loose[0]} is at the top")
    if not listed:
        raise SourceError(root, "holds no .jpg, .jpeg or .png files in class subfolders")
    classes = sorted({rel.split("/", 1)[0] for _u, rel, _s in listed})
    label = {c: i for i, c in enumerate(classes)}
    return ImageSource(root, [ImageFile(url, rel, size, label[rel.split("/", 1)[0]], _format_of(rel, IMAGE_FORMATS))
                              for url, rel, size in listed], classes)


def image_list(csv_path: str | os.PathLike, *, label_column: str, path_column: str | None = None) -> ImageSource:
    """Images listed in a CSV: one row per image, a path column (relative to the CSV's folder,
    absolute, or gs://) and a label column (integers are kept; names are numbered in sorted order)."""
    csv_path = os.fspath(csv_path)
    header, rows = _csv_rows(csv_path)
    if label_column not in header:
        raise SourceError(csv_path, f"has no column {label_column!r} for the labels (columns: {', '.join(header)})")
    if path_column is None:
        path_column = next((c for c in header if c.lower() in PATH_COLUMNS), None)
        if path_column is None:
            raise SourceError(csv_path, f"no column of image paths found (looked for {', '.join(PATH_COLUMNS)}; "
                                        f"name it with --path-column)")
    elif path_column not in header:
        raise SourceError(csv_path, f"has no column {path_column!r} for the image paths (columns: {', '.join(header)})")
    if not rows:
        raise SourceError(csv_path, "lists no images")
    base = _Files(posixpath.dirname(csv_path) if is_remote(csv_path) else os.path.dirname(os.path.abspath(csv_path)))
    raw_labels = [r[label_column] for r in rows]
    numeric = all(_is_int(v) for v in raw_labels)
    classes = sorted({int(v) for v in raw_labels}) if numeric else sorted(set(raw_labels))
    number = {c: i for i, c in enumerate(classes)}
    out = []
    for line, row in enumerate(rows, start=2):
        rel = row[path_column]
        fmt = _format_of(rel, IMAGE_FORMATS)
        if not rel or fmt is None:
            raise SourceError(f"{csv_path}:{line}", f"{rel!r} is not a .jpg, .jpeg or .png path")
        url = rel if is_remote(rel) or os.path.isabs(rel) else join_path(base.root, rel)
        try:
            size = base.size(url)
        except (FileNotFoundError, OSError):
            raise SourceError(f"{csv_path}:{line}", f"image {url} not found") from None
        value = int(row[label_column]) if numeric else row[label_column]
        out.append(ImageFile(url, rel, size, value if numeric else number[value], fmt))
    names = [str(c) for c in classes] if not numeric else [str(i) for i in range(max(classes) + 1)]
    if numeric and min(classes) < 0:
        raise SourceError(csv_path, f"column {label_column!r} holds a negative label ({min(classes)})")
    return ImageSource(csv_path, out, names)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except (TypeError, ValueError):
        return False
    return True


def _is_float(text: str) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def _read_text(path: str) -> str:
    try:
        with open_binary(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SourceError(path, "no such file") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SourceError(path, f"is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _csv_rows(path: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(_read_text(path)))
    header = list(reader.fieldnames or [])
    if not header:
        raise SourceError(path, "is empty (a CSV needs a header row)")
    rows = []
    for line, row in enumerate(reader, start=2):
        if None in row or any(v is None for v in row.values()):  # too many fields, or too few
            raise SourceError(f"{path}:{line}", f"does not have the header's {len(header)} fields")
        rows.append(row)
    return header, rows


def _table_files(root: str) -> list[tuple[str, str]]:
    """(url, format) of the table files SRC names: the file itself, or every table file in the folder."""
    files = _Files(root)
    if not files.exists():
        raise SourceError(root, "no such file or folder")
    if not files.is_dir():
        fmt = _format_of(root, TABLE_FORMATS)
        if fmt is None:
            raise SourceError(root, f"is not a table ({', '.join(sorted(TABLE_FORMATS))})")
        return [(root, fmt)]
    found = [(url, _format_of(rel, TABLE_FORMATS)) for url, rel, _size in files.walk() if _format_of(rel, TABLE_FORMATS)]
    if not found:
        raise SourceError(root, f"holds no table files ({', '.join(sorted(TABLE_FORMATS))})")
    kinds = {fmt for _u, fmt in found}
    if len(kinds) > 1:
        raise SourceError(root, f"mixes table formats ({', '.join(sorted(kinds))}); shard one format at a time")
    return found


def read_table(src: str | os.PathLike) -> TableSource:
    """Every row of a CSV, JSON Lines or Parquet file (or of every such file in a folder, in
    name order), with each column's feature type inferred: integers, floats, else text."""
    src = os.fspath(src)
    rows: list[dict] = []
    columns: dict[str, str] | None = None
    for url, fmt in _table_files(src):
        header, values, types = _READERS[fmt](url)
        if columns is not None and header != list(columns):
            raise SourceError(url, f"has columns {header}, where the first file has {list(columns)}")
        columns = dict(columns or {})
        for name in header:
            columns[name] = _wider(columns.get(name), types[name])
        rows.extend(values)
    assert columns is not None
    for name in columns:
        if name in RESERVED:
            raise SourceError(src, f"column {name!r} is reserved (every record's own place in the set); rename it")
    if not rows:
        raise SourceError(src, "holds no rows")
    return TableSource(src, columns, [_typed(row, columns, src) for row in rows])


_ORDER = ("int64", "float", "bytes")


def _wider(a: str | None, b: str) -> str:
    return b if a is None else _ORDER[max(_ORDER.index(a), _ORDER.index(b))]


def _infer(values: Sequence) -> str:
    """int64 when every value is an integer (none missing), float when every present value is a
    number (a missing one becomes NaN), else bytes (text as UTF-8)."""
    present = [v for v in values if v is not None and v != ""]
    if present and len(present) == len(values) and all(_int_like(v) for v in present):
        return "int64"
    if present and all(_float_like(v) for v in present):
        return "float"
    return "bytes"


def _int_like(v) -> bool:
    return isinstance(v, (bool, int)) or isinstance(v, str) and _is_int(v)


def _float_like(v) -> bool:
    return isinstance(v, (bool, int, float)) or isinstance(v, str) and _is_float(v)


def _read_csv(url: str):
    header, rows = _csv_rows(url)
    return header, rows, {c: _infer([r[c] for r in rows]) for c in header}


def _read_jsonl(url: str):
    rows, header = [], []
    for line, text in enumerate(_read_text(url).splitlines(), start=1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as e:
            raise SourceError(f"{url}:{line}", f"is not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise SourceError(f"{url}:{line}", "is not a JSON object")
        for k in row:
            if k not in header:
                header.append(k)
        rows.append(row)
    return header, rows, {c: _infer([r.get(c) for r in rows]) for c in header}


def _read_parquet(url: str):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SourceError(url, "reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        with open_binary(url, "rb") as f:
            table = pq.read_table(f)
    except FileNotFoundError:
        raise SourceError(url, "no such file") from None
    except Exception as e:  # pyarrow's own error types: a file that is not Parquet
        raise SourceError(url, f"is not a Parquet file ({str(e).splitlines()[0]})") from None
    header = list(table.column_names)
    rows = table.to_pylist()
    return header, rows, {c: _infer([r[c] for r in rows]) for c in header}


_READERS: dict[str, Callable] = {"csv": _read_csv, "jsonl": _read_jsonl, "parquet": _read_parquet}


def _typed(row: dict, columns: dict[str, str], where: str) -> dict:
    out = {}
    for name, kind in columns.items():
        v = row.get(name)
        if kind == "int64":
            out[name] = int(v)
        elif kind == "float":
            out[name] = [math.nan if v is None or v == "" else float(v)]
        elif isinstance(v, (bytes, bytearray)):
            out[name] = bytes(v)
        elif isinstance(v, (list, dict)):
            out[name] = json.dumps(v).encode()
        else:
            out[name] = b"" if v is None else str(v).encode()
    return out
