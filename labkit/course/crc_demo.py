"""Notebook 03's CRC demo: every TFRecord carries CRC-32C checksums, and labkit verifies them on
every read, so a flipped bit on disk is an error naming the file and byte offset."""

from __future__ import annotations


def corruption_demo(path: str, out_path: str) -> str:
    """Copy a shard with one payload byte flipped in its second record and read it back: the
    error message (which names the file and byte offset)."""
    from labkit.data.tfrecord import CorruptRecordError, read_records

    with open(path, "rb") as f:
        raw = bytearray(f.read())
    first_len = int.from_bytes(raw[:8], "little")
    raw[16 + first_len + 12 + 5] ^= 0x40
    with open(out_path, "wb") as f:
        f.write(bytes(raw))
    try:
        for _ in read_records(out_path):
            pass
    except CorruptRecordError as e:
        return str(e)
    raise AssertionError("a flipped byte went unnoticed")
