"""A small `tf.train.Example` codec in pure Python, so the torch path never imports TensorFlow.

Why Example protos as the record payload: they are what TFRecord files hold everywhere else, so
shards written here are read by `tf.io.parse_example` (and any TF tool), and files from TF
pipelines are read by the torch path. Only the subset Example needs is implemented:

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      # map entry: key = 1, value = 2
    Feature   { oneof { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    *List     { repeated ... value = 1; }                # packed for floats and ints

Decoding returns bytes features as memoryviews into the record (no copy), so an image is copied
once, straight into its batch array. Large arrays travel as one bytes feature (raw little-endian
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
