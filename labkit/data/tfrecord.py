"""The TFRecord file format, without TensorFlow: write records, read them back verifying CRCs.

A TFRecord file is a sequence of records, each framed as

    uint64 length (little-endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

where `masked_crc32c` is CRC-32C rotated right by 15 bits plus 0xa282ead8. The whole file may
be GZIP- or ZLIB-compressed (TensorFlow's `compression_type`). Files written here are read by
`tf.data.TFRecordDataset` and files written by `tf.io.TFRecordWriter` are read here.

Reading is built for throughput: the file is read piece by piece into one reused buffer small
enough to stay in the CPU cache, records are sliced out of it without copies, each CRC is one
call into the `crc32c` C extension, and runs of records with the same header are framed and
compared against their stored CRCs with NumPy. `read_records` yields `bytes`; `iter_views`
yields memoryviews valid until the next record; `iter_record_chunks` hands out whole runs, for
decoders that copy many records into a batch at once. A bad record is a CorruptRecordError
naming the file and byte offset, raised after every record before it was handed out.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, BinaryIO, NamedTuple

import crc32c as _crc32c
import numpy as np

from labkit.core.config import ParameterError

COMPRESSIONS = ("", "GZIP", "ZLIB")
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")  # length, masked crc of the length
_FOOTER = struct.Struct("<I")  # masked crc of the data
_U64 = struct.Struct("<Q")
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
        raise ParameterError("compression", compression, "must be 'GZIP', 'ZLIB' or none")
    value = value.upper()
    return "" if value == "NONE" else value


def is_remote(path: str) -> bool:
    """A URL fsspec must handle (gs://, s3://, memory://...). `/gcs/...` is a local FUSE mount."""
    return "://" in path and not path.startswith("file://")


def expand_paths(paths: PathLike | Iterable[PathLike]) -> list[str]:
    """One path, a glob, or a list of them → the list of files, in order (a local file whose
    name holds glob characters is that file: `is_pattern`). Refuses an empty list and a path or
    pattern that names no file, saying which."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        p = os.fspath(p)
        if is_pattern(p):
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


def is_pattern(path: str) -> bool:
    """Whether `path` is a glob: it has ``*``, ``?`` or ``[`` and is not a local file or folder
    of that very name (``run[1]/data.tfrecord`` that exists is that file, not ``run1/...``)."""
    return any(ch in path for ch in "*?[") and (is_remote(path) or not os.path.exists(path.removeprefix("file://")))


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
#
# One loop serves every stream (local file, fsspec URL, custom opener, GZIP, ZLIB): read a piece
# of the stream into one reused buffer, frame the records in it, verify them, hand them on, read
# the next piece. Measured choices (benchmarks/bench_tfrecord_peers.py):
# - read() into a cache-sized buffer, not mmap: the copy out of the page cache lands in cache,
#   so the CRC then runs at cache speed; an mmap'ed page costs a page fault and its CRC reads
#   main memory, which together came out slower than the copy.
# - Runs: consecutive records with the same 12-byte header (same length, hence same length CRC)
#   are framed with one NumPy comparison and one length-CRC check, and their data CRCs are
#   compared to the stored ones in one NumPy expression: small records cost one crc32c call
#   each and almost nothing more. `iter_record_chunks` hands out whole runs, so a batch decoder
#   can copy a run's payloads into a batch with one NumPy copy.


class RecordChunk(NamedTuple):
    """Verified records in `buf` (reused: valid until the next chunk is requested), as runs
    `(first, stride, length, count)`: record i of a run has its data at
    `buf[first + i * stride : first + i * stride + length]`."""

    buf: bytearray
    runs: list[tuple[int, int, int, int]]


READ_BYTES = 512 << 10  # read 512 KiB at a time: few calls per record, and the piece stays in cache
RUN_MIN = 8  # records framed one by one below this many identical headers in a row
_DELTA32 = np.uint32(_MASK_DELTA)
_HEADER_DTYPE = np.dtype([("length", "<u8"), ("crc", "<u4")])  # packed: 12 bytes, as on disk


def _gzip_hint(head: bytes) -> str:
    """The compression a file's first bytes announce, as advice for a failed read."""
    if head[:2] == b"\x1f\x8b":
        return '; the file starts like a GZIP stream: read it with compression="GZIP"'
    if len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return '; the file starts like a ZLIB stream: read it with compression="ZLIB"'
    return ""


class _Inflater:
    """`readinto` over a GZIP (several members allowed, as `gzip` writes them) or ZLIB stream."""

    def __init__(self, raw: IO[bytes], wbits: int):
        self._raw, self._wbits = raw, wbits
        self._z = zlib.decompressobj(wbits)
        self._out = b""
        self._pos = 0

    def readinto(self, view) -> int:
        while self._pos >= len(self._out):
            if self._z.eof:
                if self._wbits < 16:  # ZLIB has one stream; GZIP may have more members
                    return 0
                rest = self._z.unused_data or self._raw.read(READ_BYTES)
                if not rest:
                    return 0
                self._z = zlib.decompressobj(self._wbits)
                self._out, self._pos = self._z.decompress(rest, READ_BYTES), 0
                continue
            data = self._z.unconsumed_tail or self._raw.read(READ_BYTES)
            if not data:
                raise EOFError("compressed stream ends before its end marker")
            self._out, self._pos = self._z.decompress(data, READ_BYTES), 0
        n = min(len(view), len(self._out) - self._pos)
        view[:n] = self._out[self._pos:self._pos + n]
        self._pos += n
        return n


def _open_stream(path: str, compression: str, opener: Opener | None):
    raw = opener(path) if opener is not None else open_binary(path, "rb")
    if compression == "GZIP":
        return _Inflater(raw, 16 + zlib.MAX_WBITS), raw
    if compression == "ZLIB":
        return _Inflater(raw, zlib.MAX_WBITS), raw
    return raw, raw


def _masked(crcs: np.ndarray) -> np.ndarray:
    """masked_crc32c over a uint32 array (rotations and the sum wrap mod 2**32)."""
    return ((crcs >> 15) | (crcs << 17)) + _DELTA32


def _first_bad_crc(view: memoryview, buf: bytearray, first: int, stride: int, length: int,
                   count: int) -> int | None:
    """Index of the first of `count` records (data at first + i*stride) whose data CRC does not
    match the stored one, or None. One crc32c call per record; the rest is one NumPy expression
    for long runs."""
    crc, footer = _crc, _FOOTER.unpack_from
    stop = first + count * stride
    if count < RUN_MIN:
        for i, s in enumerate(range(first, stop, stride)):
            c = crc(view[s:s + length])
            if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != footer(buf, s + length)[0]:
                return i
        return None
    crcs = np.array([crc(view[s:s + length]) for s in range(first, stop, stride)], np.uint32)
    stored = np.ndarray((count,), "<u4", buf, first + length, (stride,))
    wrong = np.flatnonzero(_masked(crcs) != stored)
    return int(wrong[0]) if len(wrong) else None


class _Buffer:
    """One file's stream read piece by piece into one reused buffer. The live bytes are
    `buf[start:end]`, `start` always a record's first byte; `base` is the stream offset of
    `buf[0]`; `stride_hint` the size of the last record framed, so a read ends on a record
    boundary when all records have that size."""

    def __init__(self, path: str, stream, compression: str, size: int):
        self.path, self.stream, self.compression = path, stream, compression
        self.buf = bytearray(max(64, size))
        self.view = memoryview(self.buf)
        self.start = self.end = self.base = self.stride_hint = 0
        self.eof = False

    def fill(self, need: int) -> None:
        """Move the live bytes to the front and read until `need` are live (or the buffer is
        full), or to the end of the stream."""
        view = self.view
        if self.start:
            view[: self.end - self.start] = view[self.start:self.end]
            self.base += self.start
            self.end -= self.start
            self.start = 0
        if need > len(self.buf):  # a record bigger than the buffer: grow it, at most doubling at a time
            grown = bytearray(min(need, 2 * len(self.buf)))
            grown[:self.end] = view[:self.end]
            self.buf, self.view = grown, memoryview(grown)
            view = self.view
        limit = len(self.buf)
        if 0 < self.stride_hint <= limit:
            limit -= limit % self.stride_hint
        limit = max(limit, min(need, len(self.buf)))
        while self.end < limit:
            try:
                n = self.stream.readinto(view[self.end:limit])
            except (OSError, EOFError, zlib.error) as e:
                if not self.compression:  # the storage failed: its own error says how
                    raise
                raise CorruptRecordError(self.path, self.base + self.end,
                                         f"cannot decompress ({self.compression}): {e}") from e
            if not n:
                self.eof = True
                return
            self.end += n

    def refill(self) -> bool:
        """Read on after the framed records; False at a clean end of the file. A file that ends
        inside a record raises CorruptRecordError."""
        live = self.end - self.start
        if self.eof:
            if not live:
                return False
            if live < 12:
                raise CorruptRecordError(self.path, self.base + self.start, "file ends inside a record header")
            length = _HEADER.unpack_from(self.buf, self.start)[0]
            raise CorruptRecordError(self.path, self.base + self.start,
                                     f"truncated: record of {length} bytes, file ends first")
        self.fill(_HEADER.unpack_from(self.buf, self.start)[0] + 16 if live >= 12 else 12)
        return True


class _Framed(NamedTuple):
    """What one pass over a buffer's live bytes found: the runs handed out, where framing
    stopped, the record count and last verified header so far, the size of the last record
    framed, and the error that stopped it (None: more bytes are needed)."""

    runs: list[tuple[int, int, int, int]]
    pos: int
    index: int
    checked: tuple[int, int] | None
    total: int
    error: CorruptRecordError | None


def _frame(b: _Buffer, index: int, checked: tuple[int, int] | None, verify: bool, every: int,
           offset: int) -> _Framed:
    """Frame and verify the complete records among `b`'s live bytes: single records one by one,
    runs of records with the same header at once (`_frame_run`)."""
    buf, view, end = b.buf, b.view, b.end
    header, footer, crc = _HEADER.unpack_from, _FOOTER.unpack_from, _crc
    runs: list[tuple[int, int, int, int]] = []
    total, pos = 0, b.start
    while (avail := end - pos) >= 12:
        head = header(buf, pos)
        length = head[0]
        if head != checked:  # a header equal to the last verified one needs no CRC call
            if verify:
                c = crc(view[pos:pos + 8])
                if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != head[1]:
                    hint = _gzip_hint(bytes(view[:2])) if b.base + pos == 0 and not b.compression else ""
                    error = CorruptRecordError(b.path, b.base + pos, "length CRC mismatch (not a TFRecord file?)" + hint)
                    return _Framed(runs, pos, index, checked, total, error)
            checked = head
        total = length + 16
        if avail < total:
            break
        if avail < RUN_MIN * total or view[pos + total:pos + total + 12] != view[pos:pos + 12]:
            # one record: the common case for large records, kept short
            if every == 1 or index % every == offset:
                if verify:
                    c = crc(view[pos + 12:pos + 12 + length])
                    if (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF != footer(buf, pos + 12 + length)[0]:
                        error = CorruptRecordError(b.path, b.base + pos, "data CRC mismatch")
                        return _Framed(runs, pos, index, checked, total, error)
                runs.append((pos + 12, total, length, 1))
            pos += total
            index += 1
            continue
        count, error = _frame_run(b, pos, index, head, verify, every, offset, runs)
        pos += count * total
        index += count
        if error is not None:
            return _Framed(runs, pos, index, checked, total, error)
    return _Framed(runs, pos, index, checked, total, None)


def _frame_run(b: _Buffer, pos: int, index: int, head: tuple[int, int], verify: bool, every: int,
               offset: int, runs: list[tuple[int, int, int, int]]) -> tuple[int, CorruptRecordError | None]:
    """The records from `pos` on that share the header `head`, framed with NumPy and their data
    CRCs compared in one expression; ours (every `every`-th) appended to `runs` as one run.
    Returns how many records were framed and the error at the first bad one, if any."""
    length, total = head[0], head[0] + 16
    heads = np.ndarray(((b.end - pos) // total,), _HEADER_DTYPE, b.buf, pos, (total,))
    same = (heads["length"] == length) & (heads["crc"] == head[1])
    count = len(same) if same.all() else int(same.argmin())
    first = (offset - index) % every  # the first record of this run that is ours
    kept = len(range(first, count, every))
    error = None
    if verify and kept:
        bad = _first_bad_crc(b.view, b.buf, pos + 12 + first * total, total * every, length, kept)
        if bad is not None:
            bad_index = first + bad * every
            error = CorruptRecordError(b.path, b.base + pos + bad_index * total, "data CRC mismatch")
            count, kept = bad_index, bad
    if kept:
        runs.append((pos + 12 + first * total, total * every, length, kept))
    return count, error


def iter_record_chunks(
    path: str, *, compression: str | None = None, verify: bool = True,
    opener: Opener | None = None, chunk_bytes: int = READ_BYTES, every: int = 1, offset: int = 0,
) -> Iterator[RecordChunk]:
    """The records of one file, verified, as `RecordChunk`s over one reused buffer. With
    `every` > 1 only records whose index i has i % every == offset are verified and handed out
    (the others are framed and their length CRC checked): record-level sharding without copies.
    A bad record raises CorruptRecordError after every record before it was handed out."""
    comp = normalize_compression(compression)
    stream, raw = _open_stream(path, comp, opener)
    b = _Buffer(path, stream, comp, chunk_bytes)
    index, checked = 0, None  # records framed so far; the last header whose length CRC was verified
    try:
        b.fill(12)
        while True:
            framed = _frame(b, index, checked, verify, every, offset)
            index, checked = framed.index, framed.checked
            if framed.total:
                b.stride_hint = framed.total
            b.start = framed.pos
            if framed.runs:
                yield RecordChunk(b.buf, framed.runs)
            if framed.error is not None:
                raise framed.error
            if not b.refill():
                return
    finally:
        if hasattr(stream, "close"):
            stream.close()
        if raw is not stream:
            raw.close()


def iter_views(
    path: str, *, compression: str | None = None, verify: bool = True,
    opener: Opener | None = None, chunk_bytes: int = READ_BYTES, every: int = 1, offset: int = 0,
) -> Iterator[memoryview]:
    """Yield each record's data of one file as a memoryview into a reused buffer: valid only
    until the next record is requested (copy it, or decode it, before asking for the next).
    With `every` > 1 only records whose index i has i % every == offset are verified and yielded
    (the others are framed and length-checked only): record-level sharding without copies."""
    for buf, runs in iter_record_chunks(path, compression=compression, verify=verify, opener=opener,
                                        chunk_bytes=chunk_bytes, every=every, offset=offset):
        view = memoryview(buf)
        for first, stride, length, count in runs:
            if count == 1:
                yield view[first:first + length]
                continue
            for s in range(first, first + count * stride, stride):
                yield view[s:s + length]


def read_records(
    paths: PathLike | Sequence[PathLike], compression: str | None = None, *,
    verify: bool = True, opener: Opener | None = None,
) -> Iterator[bytes]:
    """Yield the raw bytes of every record of the files, in order, verifying both CRCs.
    Raises CorruptRecordError (a ValueError) naming the file and byte offset on a bad record."""
    files = expand_paths(paths)
    comp = normalize_compression(compression)
    for path in files:
        for buf, runs in iter_record_chunks(path, compression=comp, verify=verify, opener=opener):
            view = memoryview(buf)
            for first, stride, length, count in runs:
                for s in range(first, first + count * stride, stride):
                    yield bytes(view[s:s + length])


def count_records(paths: PathLike | Sequence[PathLike], compression: str | None = None) -> int:
    """Number of records in the files (walks the framing; data CRCs are not checked)."""
    return sum(count for path in expand_paths(paths)
               for _, runs in iter_record_chunks(path, compression=compression, verify=False)
               for *_, count in runs)
