"""A small `tf.train.Example` codec in pure Python, so the torch path never imports TensorFlow.

Why Example protos as the record payload: they are what TFRecord files hold everywhere else, so
shards written here are read by `tf.io.parse_example` (and any TF tool), and files from TF
pipelines are read by the torch path. Only the subset Example needs is implemented:

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      # map entry: key = 1, value = 2
    Feature   { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    *List     { repeated ... value = 1; }                # packed for floats and ints

Decoding returns bytes features as memoryviews into the record (no copy), so an image is copied
once, straight into its batch array. `example_layout` records where the values of one record
sit, so records of the same schema are then read at known offsets without walking their fields
(`labkit.data.reader` decodes whole runs of records that way). Large arrays travel as one bytes feature (raw little-endian
values), which both NumPy (`frombuffer`) and TensorFlow (`tf.io.decode_raw`) read at memory speed.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

import numpy as np

FeatureValue = bytes | bytearray | memoryview | int | float | Sequence[int] | Sequence[float] | np.ndarray


class ExampleDecodeError(ValueError):
    """The record is not a well-formed tf.train.Example."""


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 negatives are ten-byte two's complement varints
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(tag: int, payload) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + bytes(payload)


def _feature(value: FeatureValue) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _field(0x0A, _field(0x0A, value))
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return _field(0x12, _field(0x0A, value.astype("<f4").tobytes()))
    if isinstance(value, float):
        value = [value]
    if isinstance(value, (int, np.integer)):
        value = [int(value)]
    values = list(value)
    if values and all(isinstance(v, (bytes, bytearray, memoryview)) for v in values):
        return _field(0x0A, b"".join(_field(0x0A, v) for v in values))
    if values and all(isinstance(v, (float, np.floating)) for v in values):
        return _field(0x12, _field(0x0A, struct.pack(f"<{len(values)}f", *values)))
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise TypeError(f"feature value must be bytes, ints or floats, got {value!r:.80}")
    return _field(0x1A, _field(0x0A, b"".join(_varint(int(v)) for v in values)))


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize `{name: value}` as a tf.train.Example. bytes-like (or a list of them) →
    bytes_list; an int or a sequence of ints → int64_list; a float / float array → float_list."""
    entries = b"".join(
        _field(0x0A, _field(0x0A, name.encode()) + _field(0x12, _feature(value)))
        for name, value in features.items()
    )
    return _field(0x0A, entries)


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise ExampleDecodeError("varint runs past the end of the record")


def _fields(buf, pos: int, end: int):
    """(field number, wire type, start, stop-or-value) for each field in buf[pos:end]."""
    while pos < end:
        key = buf[pos]
        pos += 1
        if key >= 0x80:
            key, pos = _read_varint(buf, pos - 1, end)
        wire = key & 7
        if wire == 2:
            n = buf[pos]
            pos += 1
            if n >= 0x80:
                n, pos = _read_varint(buf, pos - 1, end)
            if pos + n > end:
                raise ExampleDecodeError("length-delimited field runs past the end of the record")
            yield key >> 3, 2, pos, pos + n
            pos += n
        elif wire == 0:
            value, pos = _read_varint(buf, pos, end)
            yield key >> 3, 0, value, value
        elif wire == 5:
            yield key >> 3, 5, pos, pos + 4
            pos += 4
        elif wire == 1:
            yield key >> 3, 1, pos, pos + 8
            pos += 8
        else:
            raise ExampleDecodeError(f"unsupported wire type {wire}")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _decode_feature(mv: memoryview, pos: int, end: int):
    if pos < end and mv[pos] in (0x0A, 0x1A):  # bytes_list / int64_list with packed values
        kind = mv[pos]
        llen, lpos = _length(mv, pos + 1, end)
        lend = lpos + llen
        if lend == end and (lpos == lend or mv[lpos] == 0x0A):
            if kind == 0x0A:  # bytes_list: each value is field 1, length-delimited
                values, p = [], lpos
                while p < lend:
                    if mv[p] != 0x0A:
                        break
                    n, p = _length(mv, p + 1, lend)
                    values.append(mv[p:p + n])
                    p += n
                else:
                    return values
            elif lpos < lend:  # int64_list, packed
                n, p = _length(mv, lpos + 1, lend)
                if p + n == lend:
                    ints = []
                    while p < lend:
                        b = mv[p]
                        if b < 0x80:
                            ints.append(b)
                            p += 1
                        else:
                            v, p = _read_varint(mv, p, lend)
                            ints.append(_signed(v))
                    return ints
    for kind, _wire, s, e in _fields(mv, pos, end):
        if kind == 1:  # bytes_list
            return [mv[a:b] for f, w, a, b in _fields(mv, s, e) if f == 1 and w == 2]
        if kind == 2:  # float_list (packed or not)
            out = []
            for f, _w, a, b in _fields(mv, s, e):
                if f == 1:
                    out.append(np.frombuffer(mv[a:b], dtype="<f4"))
            return np.concatenate(out) if out else np.zeros(0, np.float32)
        if kind == 3:  # int64_list (packed or not)
            ints = []
            for f, w, a, b in _fields(mv, s, e):
                if f != 1:
                    continue
                if w == 0:
                    ints.append(_signed(a))
                    continue
                p = a
                while p < b:
                    v, p = _read_varint(mv, p, b)
                    ints.append(_signed(v))
            return ints
    return []  # an empty Feature


def _length(mv, pos: int, end: int) -> tuple[int, int]:
    """A length varint at `pos`: (value, position after it); one byte is the common case."""
    b = mv[pos]
    if b < 0x80:
        return b, pos + 1
    return _read_varint(mv, pos, end)


def decode_example(record) -> dict[str, list | np.ndarray]:
    """Parse a serialized tf.train.Example: `{name: [memoryview, ...] | [int, ...] | float32 array}`.
    Bytes values are views into `record`: copy them before the record's buffer is reused.

    The common layout (what TensorFlow and `encode_example` write) is walked inline, one byte
    per tag and length where possible; anything unusual falls back to the general field walk."""
    mv = record if isinstance(record, memoryview) else memoryview(record)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    out: dict[str, list | np.ndarray] = {}
    end = len(mv)
    try:
        pos = 0
        while pos < end:
            tag = mv[pos]
            if tag != 0x0A:  # not `features`: skip any other top-level field
                return _decode_general(mv)
            flen, pos = _length(mv, pos + 1, end)
            fend = pos + flen
            while pos < fend:  # map entries
                if mv[pos] != 0x0A:
                    return _decode_general(mv)
                elen, pos = _length(mv, pos + 1, fend)
                eend = pos + elen
                if mv[pos] != 0x0A:
                    return _decode_general(mv)
                klen, kpos = _length(mv, pos + 1, eend)
                key = bytes(mv[kpos:kpos + klen]).decode()
                pos = kpos + klen
                if pos >= eend:
                    out[key] = []
                    continue
                if mv[pos] != 0x12:
                    return _decode_general(mv)
                vlen, vpos = _length(mv, pos + 1, eend)
                out[key] = _decode_feature(mv, vpos, vpos + vlen)
                pos = eend
            if pos > end:
                raise ExampleDecodeError("record ends inside a field")
    except IndexError as e:
        raise ExampleDecodeError("record ends inside a field") from e
    return out


def _decode_general(mv: memoryview) -> dict[str, list | np.ndarray]:
    """Any valid Example, fields in any order, unknown fields skipped."""
    out: dict[str, list | np.ndarray] = {}
    try:
        for f, w, s, e in _fields(mv, 0, len(mv)):
            if f != 1 or w != 2:
                continue
            for f2, w2, s2, e2 in _fields(mv, s, e):  # map entries
                if f2 != 1 or w2 != 2:
                    continue
                key = value = None
                for f3, w3, s3, e3 in _fields(mv, s2, e2):
                    if f3 == 1 and w3 == 2:
                        key = bytes(mv[s3:e3]).decode()
                    elif f3 == 2 and w3 == 2:
                        value = (s3, e3)
                if key is not None:
                    out[key] = _decode_feature(mv, *value) if value else []
    except IndexError as e:
        raise ExampleDecodeError("record ends inside a field") from e
    return out


# ---------------------------------------------------------------------------------------------
# Layouts: decoding many records of one shape without walking each of them


class ExampleLayout:
    """Where the values of some features sit in a serialized Example, and the bytes around them.

    Records written from one schema differ only in their values: a record of the same size
    whose every other byte equals this layout's reference record, and whose varint values have
    the same continuation bits (so each varint has the same length), parses exactly like the
    reference, field for field. Checking that takes a few slice comparisons per record, or a
    few NumPy comparisons over a whole run of records, instead of a walk over every field.

    `varints[name]`: span of the single varint of a one-value int64 feature; `blobs[name]`: span
    of the payload of a one-value bytes feature. Everything else (tags, lengths, keys, other
    features) belongs to `fixed`, the spans every matching record shares byte for byte."""

    def __init__(self, reference: bytes, varints: dict[str, tuple[int, int]],
                 blobs: dict[str, tuple[int, int]]):
        self.reference = reference
        self.size = len(reference)
        self.varints = varints
        self.blobs = blobs
        holes = sorted([*varints.values(), *blobs.values()])
        fixed, at = [], 0
        for lo, hi in holes:
            if lo > at:
                fixed.append((at, lo))
            at = hi
        if at < self.size:
            fixed.append((at, self.size))
        self.fixed = [(lo, hi, reference[lo:hi]) for lo, hi in fixed]
        self._marks = {name: [b & 0x80 for b in reference[lo:hi]] for name, (lo, hi) in varints.items()}
        ref = np.frombuffer(reference, np.uint8)
        self._fixed_np = [(lo, hi, ref[lo:hi].view(f"V{hi - lo}")[0]) for lo, hi in fixed]
        self._marks_np = {name: ref[lo:hi] & 0x80 for name, (lo, hi) in varints.items()}

    def matches(self, record: memoryview) -> bool:
        """Does this one record (a flat memoryview) parse exactly like the reference?"""
        if len(record) != self.size:
            return False
        for lo, hi, want in self.fixed:
            if record[lo:hi] != want:
                return False
        for name, (lo, _hi) in self.varints.items():
            for i, mark in enumerate(self._marks[name]):
                if record[lo + i] & 0x80 != mark:
                    return False
        return True

    def int64(self, record: memoryview, name: str) -> int:
        """The value of a varint feature of a matching record."""
        lo, hi = self.varints[name]
        value = shift = 0
        for i in range(lo, hi):
            value |= (record[i] & 0x7F) << shift
            shift += 7
        return _signed(value & 0xFFFFFFFFFFFFFFFF)

    def leading_matches(self, rows: np.ndarray) -> int:
        """How many of the records `rows` (a (n, size) uint8 array whose rows are contiguous),
        counted from the first, parse exactly like the reference."""
        ok = np.ones(len(rows), bool)
        for lo, hi, want in self._fixed_np:  # each span compared as one opaque value per row
            ok &= rows[:, lo:hi].view(f"V{hi - lo}")[:, 0] == want
        for name, (lo, _hi) in self.varints.items():
            for i, mark in enumerate(self._marks_np[name]):
                ok &= (rows[:, lo + i] & 0x80) == mark
        return len(ok) if ok.all() else int(ok.argmin())

    def int64_column(self, rows: np.ndarray, name: str) -> np.ndarray:
        """The values of a varint feature over matching records `rows`, as int64."""
        lo, hi = self.varints[name]
        value = np.zeros(len(rows), np.uint64)
        for i in range(hi - lo):
            value |= (rows[:, lo + i] & 0x7F).astype(np.uint64) << np.uint64(7 * i)
        return value.view(np.int64)


def example_layout(record, varints: Sequence[str] = (), blobs: Sequence[str] = ()) -> ExampleLayout | None:
    """The layout of `record` with holes for the named one-value int64 (`varints`) and bytes
    (`blobs`) features, or None when the record does not have that common shape (then decode
    records one by one with `decode_example`)."""
    mv = record if isinstance(record, memoryview) else memoryview(record)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    end = len(mv)
    wanted = {**{n: 0x1A for n in varints}, **{n: 0x0A for n in blobs}}
    found: dict[str, tuple[int, int]] = {}
    try:
        if end < 2 or mv[0] != 0x0A:
            return None
        flen, pos = _length(mv, 1, end)
        if pos + flen != end:
            return None
        while pos < end:  # map entries: key = 1, value = 2
            if mv[pos] != 0x0A:
                return None
            elen, pos = _length(mv, pos + 1, end)
            eend = pos + elen
            if mv[pos] != 0x0A:
                return None
            klen, kpos = _length(mv, pos + 1, eend)
            key = bytes(mv[kpos:kpos + klen]).decode()
            pos = kpos + klen
            if key in wanted:
                if pos >= eend or mv[pos] != 0x12:
                    return None
                vlen, vpos = _length(mv, pos + 1, eend)
                if vpos + vlen != eend or mv[vpos] != wanted[key]:
                    return None
                llen, lpos = _length(mv, vpos + 1, eend)
                if lpos + llen != eend or lpos >= eend or mv[lpos] != 0x0A:
                    return None
                n, p = _length(mv, lpos + 1, eend)
                if p + n != eend:  # more than one value (or packed field) in the list
                    return None
                if wanted[key] == 0x1A:  # packed int64: exactly one varint
                    if not 1 <= n <= 10 or any(mv[i] < 0x80 for i in range(p, p + n - 1)) or mv[p + n - 1] >= 0x80:
                        return None
                found[key] = (p, p + n)
            pos = eend
    except (IndexError, UnicodeDecodeError, ExampleDecodeError):
        return None
    if pos != end or set(found) != set(wanted):
        return None
    return ExampleLayout(bytes(mv), {n: found[n] for n in varints}, {n: found[n] for n in blobs})
