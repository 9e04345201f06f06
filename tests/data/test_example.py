"""The pure-Python tf.train.Example codec (TensorFlow cross-checks live in test_data_tf_interop)."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.data.example import ExampleDecodeError, _field, _varint, decode_example, encode_example


def test_round_trip_of_every_kind():
    img = np.arange(48, dtype=np.uint8)
    rec = encode_example({"index": 300, "neg": -5, "big": [2**40, -(2**62), 0], "image": img.tobytes(),
                          "two": [b"a", b""], "w": np.array([0.25, -3.0], np.float32), "empty": []})
    got = decode_example(rec)
    assert got["index"] == [300] and got["neg"] == [-5] and got["big"] == [2**40, -(2**62), 0]
    assert bytes(got["image"][0]) == img.tobytes()
    assert [bytes(v) for v in got["two"]] == [b"a", b""]
    np.testing.assert_array_equal(got["w"], [0.25, -3.0])
    assert got["empty"] == []


def test_bytes_values_are_views_not_copies():
    rec = bytearray(encode_example({"image": b"xyz"}))
    view = decode_example(rec)["image"][0]
    assert isinstance(view, memoryview)
    rec[rec.index(b"xyz")] = ord("Q")
    assert bytes(view) == b"Qyz"


def test_unusual_layouts_fall_back_to_the_general_walk():
    # map entry with the value before the key, an unpacked int64 list, and an unknown top-level field
    int_list = bytes([0x08]) + _varint(7) + bytes([0x08]) + _varint(9)
    feature = _field(0x1A, int_list)
    entry = _field(0x12, feature) + _field(0x0A, b"ids")
    rec = _field(0x0A, _field(0x0A, entry)) + bytes([0x10, 0x01])
    assert decode_example(rec) == {"ids": [7, 9]}


def test_truncated_example_is_an_error():
    rec = encode_example({"image": b"x" * 100})
    with pytest.raises(ExampleDecodeError):
        decode_example(rec[:50])
