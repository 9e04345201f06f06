"""The TFRecord file format, without TensorFlow: write records, read them back verifying CRCs.

A TFRecord file is a sequence of records, each framed as

    uint64 length (little-endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

where `masked_crc32c` is CRC-32C rotated right by 15 bits plus 0xa282ead8. The whole file may
be GZIP- or ZLIB-compressed (TensorFlow's `compression_type`). Files written here are read by
`tf.data.TFRecordDataset` and files written by `tf.io.TFRecordWriter` are read here.

Reading is built for throughput: the file is read in large chunks into one reusable buffer,
records are sliced out as memoryviews (no per-record copy) and each CRC is one call into the
`crc32c` C extension. `read_records` yields `bytes`; `iter_views` yields memoryviews valid until
the next record, for callers that decode straight into a batch array.
"""

from __future__ import annotations

import gzip
import mmap
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, BinaryIO

import crc32c as _crc32c

from labkit.core.config import ParameterError

COMPRESSIONS = ("", "GZIP", "ZLIB")
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")  # length, masked crc of the length
_FOOTER = struct.Struct("<I")  # masked crc of the data
_U64 = struct.Struct("<Q")
CHUNK_BYTES = 8 << 20  # one read call per 8 MiB: big enough that syscalls do not matter
_crc = _crc32c.crc32c

PathLike = str | os.PathLike
Opener = Callable[[str], BinaryIO]


class CorruptRecordError(ValueError):
    """A record failed its length or data CRC, or the file ended inside a record.
    `.path` names the file, `.offset` the byte offset of the bad record (in the uncompressed
    stream for compressed files)."""

    def __init__(self, path: str, offset: int | None = None, problem: str = ""):
        if offset is None:  # rebuilt from its message alone (a DataLoader worker re-raising it)
            self.path, self.offset = None, None
            super().__init__(path)
            return
        self.path = path
        self.offset = offset
        super().__init__(f"corrupt TFRecord {path} at byte offset {offset}: {problem}")


def masked_crc32c(data) -> int:
    """TFRecord's masked CRC-32C of a bytes-like object."""
    crc = _crc(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def normalize_compression(compression: str | None) -> str:
    """None, "" or "NONE" → ""; "GZIP"/"ZLIB" (any case) as TensorFlow spells them."""
    value = "" if compression is None else compression
    if not isinstance(value, str) or value.upper() not in COMPRESSIONS + ("NONE",):
        raise ParameterError("compression", compression, "must be None, 'GZIP' or 'ZLIB'")
    value = value.upper()
    return "" if value == "NONE" else value


def is_remote(path: str) -> bool:
    """A URL fsspec must handle (gs://, s3://, memory://...). `/gcs/...` is a local FUSE mount."""
    return "://" in path and not path.startswith("file://")


def expand_paths(paths: PathLike | Iterable[PathLike]) -> list[str]:
    """One path, a glob, or a list of them → the list of files, in order. Refuses an empty list
    and a path or pattern that names no file, saying which."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if any(ch in p for ch in "*?["):
            matches = _glob(p)
            if not matches:
                raise FileNotFoundError(f"no TFRecord shard matches {p!r}")
            out.extend(matches)
        else:
            if not is_remote(p) and not os.path.exists(p.removeprefix("file://")):
                raise FileNotFoundError(f"TFRecord file not found: {p}")
            out.append(p)
    if not out:
        raise ValueError("no TFRecord shards given (the shard list is empty)")
    return out


def _glob(pattern: str) -> list[str]:
    if is_remote(pattern):
        import fsspec

        fs, _, _ = fsspec.get_fs_token_paths(pattern)
        protocol = pattern.split("://", 1)[0]
        return sorted(f"{protocol}://{p}" if "://" not in p else p for p in fs.glob(pattern))
    import glob

    return sorted(glob.glob(pattern))


def open_binary(path: str, mode: str = "rb") -> IO[bytes]:
    """Open a local path (unbuffered: we read in big chunks ourselves) or an fsspec URL."""
    if is_remote(path):
        import fsspec

        return fsspec.open(path, mode).open()
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "w" in mode:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
    try:
        return open(path, mode, buffering=0)
    except FileNotFoundError:
        raise FileNotFoundError(f"TFRecord file not found: {path}") from None


# ---------------------------------------------------------------------------------------------
# Writing


def encode_record(data) -> bytes:
    """One framed record (length, CRCs and data) as bytes."""
    header = _U64.pack(len(data))
    return b"".join((header, _FOOTER.pack(masked_crc32c(header)), data,
                     _FOOTER.pack(masked_crc32c(data))))


class RecordWriter:
    """Appends records to one TFRecord file (optionally GZIP/ZLIB-compressed). Use as a context
    manager; `write(data)` takes any bytes-like object."""

    def __init__(self, path: PathLike, compression: str | None = None, *, opener: Opener | None = None):
        self.path = os.fspath(path)
        self.compression = normalize_compression(compression)
        self._raw = opener(self.path) if opener is not None else open_binary(self.path, "wb")
        self._zlib = None
        if self.compression == "GZIP":
            self._out: IO[bytes] = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0)
        else:
            self._out = self._raw
            if self.compression == "ZLIB":
                self._zlib = zlib.compressobj()
        self.records = 0
        self.bytes_written = 0

    def write(self, data) -> None:
        header = _U64.pack(len(data))
        parts = (header, _FOOTER.pack(masked_crc32c(header)), data, _FOOTER.pack(masked_crc32c(data)))
        for part in parts:
            self._write(part)
        self.records += 1
        self.bytes_written += len(data) + 16

    def _write(self, part) -> None:
        if self._zlib is not None:
            part = self._zlib.compress(part)
        if part:
            self._out.write(part)

    def close(self) -> None:
        if self._zlib is not None:
            self._out.write(self._zlib.flush())
            self._zlib = None
        if self._out is not self._raw:
            self._out.close()
        self._raw.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def write_records(path: PathLike, records: Iterable, compression: str | None = None) -> int:
    """Write an iterable of bytes-like records as one TFRecord file; returns the record count."""
    with RecordWriter(path, compression) as w:
        for r in records:
            w.write(r)
    return w.records


# ---------------------------------------------------------------------------------------------
# Reading


class _ZlibReader:
    """A file-like `readinto` over a zlib stream (TensorFlow's ZLIB compression)."""

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self._z = zlib.decompressobj()
        self._pending = b""

    def readinto(self, view) -> int:
        while not self._pending:
            if self._z.eof:
                return 0
            chunk = self._raw.read(CHUNK_BYTES)
            if not chunk:
                self._pending = self._z.flush()
                if not self._pending:
                    return 0
                break
            self._pending = self._z.decompress(chunk)
        n = min(len(view), len(self._pending))
        view[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._raw.close()


def _open_stream(path: str, compression: str, opener: Opener | None):
    raw = opener(path) if opener is not None else open_binary(path, "rb")
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if compression == "ZLIB":
        return _ZlibReader(raw), raw
    return raw, raw


def iter_views(
    path: str, *, compression: str | None = None, verify: bool = True,
    opener: Opener | None = None, chunk_bytes: int = CHUNK_BYTES, every: int = 1, offset: int = 0,
) -> Iterator[memoryview]:
    """Yield each record's data of one file as a memoryview into a reused buffer: valid only
    until the next record is requested (copy it, or decode it, before asking for the next).
    With `every` > 1 only records whose index i has i % every == offset are verified and yielded
    (the others are framed and length-checked only): record-level sharding without copies."""
    comp = normalize_compression(compression)
    if not comp and opener is None and not is_remote(path):
        yield from _iter_mapped(path, verify, every, offset)
        return
    stream, raw = _open_stream(path, comp, opener)
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    start = end = 0  # live bytes are buf[start:end]
    base = 0  # stream offset of buf[0]
    index = 0  # records framed so far
    header, footer, crc = _HEADER.unpack_from, _FOOTER.unpack_from, _crc

    def fill(need: int) -> int:
        """Make at least `need` live bytes available if the stream has them; return live count."""
        nonlocal buf, view, start, end, base
        if start:  # move the live tail to the front
            view[: end - start] = view[start:end]
            base += start
            end -= start
            start = 0
        if need > len(buf):  # a record bigger than the buffer: grow it
            newbuf = bytearray(max(need, 2 * len(buf)))
            newbuf[:end] = view[:end]
            buf, view = newbuf, memoryview(newbuf)
        while end < need:
            try:
                n = stream.readinto(view[end:])
            except (OSError, EOFError, zlib.error) as e:  # bad gzip/zlib data
                raise CorruptRecordError(path, base + end, f"cannot decompress ({comp}): {e}") from e
            if not n:
                break
            end += n
        return end

    try:
        while True:
            if end - start < 12 and fill(12) < 12:
                if end == start:
                    return
                raise CorruptRecordError(path, base + start, "file ends inside a record header")
            length, length_crc = header(buf, start)
            if verify and masked_crc32c(view[start:start + 8]) != length_crc:
                raise CorruptRecordError(path, base + start, "length CRC mismatch (not a TFRecord file?)")
            total = 16 + length
            if end - start < total and fill(total) < total:
                raise CorruptRecordError(path, base + start,
                                         f"truncated: record of {length} bytes, file ends first")
            index += 1
            if every > 1 and (index - 1) % every != offset:
                start += total
                continue
            data = view[start + 12:start + 12 + length]
            if verify:
                (data_crc,) = footer(buf, start + 12 + length)
                c = crc(data)
                if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != data_crc:
                    raise CorruptRecordError(path, base + start, "data CRC mismatch")
            start += total
            yield data
    finally:
        stream.close()
        if raw is not stream:
            raw.close()


def _iter_mapped(path: str, verify: bool, every: int, offset: int) -> Iterator[memoryview]:
    """Local uncompressed files are memory-mapped: records are views straight into the page
    cache, which saves the copy a read() makes (the slowest pass over the bytes)."""
    f = open_binary(path, "rb")
    try:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    finally:
        f.close()
    if hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_SEQUENTIAL)
    view = memoryview(mm)
    header, footer, crc = _HEADER.unpack_from, _FOOTER.unpack_from, _crc
    start = index = 0
    try:
        while start < size:
            if size - start < 12:
                raise CorruptRecordError(path, start, "file ends inside a record header")
            length, length_crc = header(view, start)
            if verify and masked_crc32c(view[start:start + 8]) != length_crc:
                raise CorruptRecordError(path, start, "length CRC mismatch (not a TFRecord file?)")
            total = 16 + length
            if size - start < total:
                raise CorruptRecordError(path, start, f"truncated: record of {length} bytes, file ends first")
            index += 1
            if every > 1 and (index - 1) % every != offset:
                start += total
                continue
            data = view[start + 12:start + 12 + length]
            if verify:
                (data_crc,) = footer(view, start + 12 + length)
                c = crc(data)
                if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != data_crc:
                    raise CorruptRecordError(path, start, "data CRC mismatch")
            start += total
            yield data
    finally:
        # A consumer still holding a record view keeps the mapping alive; it is freed with it.
        try:
            view.release()
            mm.close()
        except BufferError:
            pass


def read_records(
    paths: PathLike | Sequence[PathLike], compression: str | None = None, *,
    verify: bool = True, opener: Opener | None = None,
) -> Iterator[bytes]:
    """Yield the raw bytes of every record of the files, in order, verifying both CRCs.
    Raises CorruptRecordError (a ValueError) naming the file and byte offset on a bad record."""
    files = expand_paths(paths)
    comp = normalize_compression(compression)
    for path in files:
        for view in iter_views(path, compression=comp, verify=verify, opener=opener):
            yield bytes(view)


def count_records(paths: PathLike | Sequence[PathLike], compression: str | None = None) -> int:
    """Number of records in the files (walks the framing; data CRCs are not checked)."""
    files = expand_paths(paths)
    return sum(sum(1 for _ in iter_views(p, compression=compression, verify=False)) for p in files)
