"""labkit.core.checkpoint: blobs first, marker last; uncommitted steps ignored; corrupt ones skipped."""

from __future__ import annotations

import json
import re
from pathlib import Path

import crc32c
import pytest

from labkit.core import checkpoint


def test_save_then_load_newest(tmp_path):
    d = str(tmp_path / "ck")
    checkpoint.save(d, 1, {"a.bin": b"one"}, {"note": "x"})
    checkpoint.save(d, 5, {"a.bin": b"five", "b.bin": b"\x00" * 10})
    ck = checkpoint.load(d)
    assert ck.step == 5 and ck.files == {"a.bin": b"five", "b.bin": b"\x00" * 10}
    assert checkpoint.load(d, 1).meta == {"note": "x"}
    assert checkpoint.committed_steps(d) == [1, 5]


def test_empty_or_missing_directory_gives_none(tmp_path):
    assert checkpoint.load(str(tmp_path / "nothing")) is None
    assert checkpoint.committed_steps(str(tmp_path)) == []


def test_step_without_marker_is_ignored(tmp_path):
    d = str(tmp_path)
    checkpoint.save(d, 2, {"s": b"committed"})
    checkpoint.write_blob(d, 4, "s", b"written but never committed")  # a save cut off mid-way
    assert checkpoint.committed_steps(d) == [2]
    assert checkpoint.load(d).files["s"] == b"committed"


def test_truncated_blob_falls_back_with_warning(tmp_path):
    d = str(tmp_path)
    checkpoint.save(d, 1, {"s": b"old state"})
    folder = checkpoint.save(d, 3, {"s": b"new state, longer"})
    with open(f"{folder}/s", "r+b") as f:
        f.truncate(5)
    with pytest.warns(checkpoint.CheckpointWarning, match=r"step 3.*truncated, 5 of 17 bytes.*previous"):
        ck = checkpoint.load(d)
    assert ck.step == 1 and ck.files["s"] == b"old state"
    with pytest.raises(checkpoint.CheckpointError, match="truncated"):
        checkpoint.read_step(d, 3)


def test_corrupt_blob_same_size_is_detected(tmp_path):
    d = str(tmp_path)
    folder = checkpoint.save(d, 7, {"s": b"abcdef"})
    with open(f"{folder}/s", "wb") as f:
        f.write(b"abcdeX")
    with pytest.warns(checkpoint.CheckpointWarning, match="digest"):
        assert checkpoint.load(d) is None


def test_the_marker_records_each_blobs_size_and_crc32c(tmp_path):
    folder = checkpoint.save(str(tmp_path), 1, {"s": b"123456789"})
    marker = json.loads(Path(folder, checkpoint.MARKER).read_text())
    # CRC-32C check value of "123456789" (RFC 3720, appendix B.4)
    assert marker["files"] == {"s": {"size": 9, "crc32c": "e3069283"}}


def test_a_marker_without_crc32c_digests_is_refused_naming_its_path(tmp_path):
    d = str(tmp_path)
    entry = checkpoint.write_blob(d, 2, "s", b"state")
    folder = checkpoint.commit(d, 2, {"s": {"size": entry["size"], "sha256": "0" * 64}})
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.read_step(d, 2)
    assert str(Path(folder, checkpoint.MARKER)) in str(err.value) and "'crc32c'" in str(err.value)


def test_prune_keeps_newest(tmp_path):
    d = str(tmp_path)
    for step in (1, 2, 3, 4):
        checkpoint.save(d, step, {"s": bytes([step])}, keep=2)
    assert checkpoint.committed_steps(d) == [3, 4]


def test_commit_with_keep_also_clears_saves_cut_off_before_the_newest(tmp_path):
    d = str(tmp_path)
    checkpoint.save(d, 1, {"s": b"1"})
    checkpoint.write_blob(d, 2, "s", b"never committed")  # a save a crash cut off
    checkpoint.save(d, 3, {"s": b"3"}, keep=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001", "step-00000003"]


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda m: m.update(files=list(m["files"])), "'files' must map file names to entries, not be a list"),
    (lambda m: m["files"].update(s={}), "the entry of 's' has no valid 'size'"),
    (lambda m: m["files"]["s"].pop("crc32c"), "the entry of 's' has no 'crc32c' checksum"),
    (lambda m: m.update(meta=[]), "'meta' must be an object"),
])
def test_a_malformed_marker_reads_as_a_corrupt_step(tmp_path, edit, problem):
    d = str(tmp_path)
    folder = checkpoint.save(d, 3, {"s": b"state"})
    marker = json.loads(Path(folder, "COMMITTED").read_text())
    edit(marker)
    Path(folder, "COMMITTED").write_text(json.dumps(marker))
    with pytest.raises(checkpoint.CheckpointError, match="malformed commit marker: " + re.escape(problem)):
        checkpoint.read_marker(d, 3)
    with pytest.warns(checkpoint.CheckpointWarning, match="no earlier committed step is left: the run starts from step 0"):
        assert checkpoint.load(d) is None


def test_a_failed_write_names_the_file_and_leaves_nothing_half_written(tmp_path):
    def writer(f) -> None:
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(checkpoint.CheckpointWriteError,
                       match=r"cannot write checkpoint file .*step-00000005/s: No space left on device"):
        checkpoint.write_blob(str(tmp_path), 5, "s", writer)
    assert not (tmp_path / "step-00000005" / "s").exists()


def test_fsspec_memory_filesystem_url():
    # Any fsspec URL works the same way (gs:// needs gcsfs and credentials; memory:// is local).
    d = "memory://labkit-test-ckpt"
    checkpoint.save(d, 10, {"x": b"remote bytes"})
    assert checkpoint.load(d).files["x"] == b"remote bytes"


def test_restore_decodes_the_newest_step_and_falls_back_past_one_that_does_not_decode(tmp_path):
    d = str(tmp_path)
    checkpoint.save(d, 1, {"s.json": b'{"step": 1}'})
    checkpoint.save(d, 2, {"s.json": b"{not json"})  # verifies against its marker, does not decode

    def decode(ck):
        return json.loads(ck.files["s.json"])["step"]

    with pytest.warns(checkpoint.CheckpointWarning, match=r"step 2 .*falling back"):
        assert checkpoint.restore(d, decode, (json.JSONDecodeError,)) == 1
    with pytest.raises(json.JSONDecodeError):  # an error the caller did not name is no corruption
        checkpoint.restore(d, decode)
    assert checkpoint.restore(str(tmp_path / "empty"), decode) is None


def test_background_write_runs_one_at_a_time_and_hands_back_its_error(tmp_path):
    d = str(tmp_path)
    writes = checkpoint.BackgroundWrite(d)
    writes.start(1, lambda: checkpoint.save(d, 1, {"s": b"one"}))
    writes.start(2, lambda: checkpoint.save(d, 2, {"s": b"two"}))  # waits for step 1 first
    writes.wait()
    assert checkpoint.committed_steps(d) == [1, 2] and not writes.in_flight

    def fail() -> None:
        raise OSError("disk full")

    writes.start(3, fail)
    with pytest.raises(RuntimeError, match=f"writing a checkpoint to {d} failed: disk full"):
        writes.wait()
    writes.wait()  # the error is handed over once


def test_a_blob_streamed_by_a_writer_is_recorded_as_its_bytes_would_be(tmp_path):
    """A writer function (a serialiser streaming into the file) gets the same marker entry and
    file as the same bytes written at once, in however many pieces it writes them."""
    data = bytes(range(256)) * 1000
    direct = checkpoint.write_blob(str(tmp_path / "a"), 1, "s", data)

    def in_pieces(f):
        for start in range(0, len(data), 4099):
            f.write(memoryview(data)[start:start + 4099])

    streamed = checkpoint.write_blob(str(tmp_path / "b"), 1, "s", in_pieces)
    assert streamed == direct == {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}
    checkpoint.commit(str(tmp_path / "b"), 1, {"s": streamed})
    assert checkpoint.load(str(tmp_path / "b"), 1).files["s"] == data
