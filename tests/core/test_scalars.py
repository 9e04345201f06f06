"""TensorBoard event files: labkit frames its records exactly as the `tensorboard` package's own
writer does, and TensorBoard's own reader reads them back."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("tensorboard")

from labkit.core.scalars import ScalarWriter, frame  # noqa: E402


@pytest.mark.parametrize("data", [b"", b"x", bytes(range(256)) * 40])
def test_frames_are_the_tensorboard_record_writers_bytes(data):
    from tensorboard.summary.writer.record_writer import RecordWriter

    theirs = io.BytesIO()
    RecordWriter(theirs).write(data)
    assert frame(data) == theirs.getvalue()


def test_tensorboards_reader_reads_every_scalar_back(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    writer = ScalarWriter(str(tmp_path))
    for step in range(3):
        writer.add(step, {"train/loss": 1.0 / (step + 1), "train/lr": 0.5})
    writer.close()
    events = list(EventFileLoader(writer.path).Load())
    assert events[0].file_version == "brain.Event:2"
    # TensorBoard's loader turns simple_values into tensors on the way in
    seen = [(e.step, v.tag, v.tensor.float_val[0] if v.HasField("tensor") else v.simple_value)
            for e in events[1:] for v in e.summary.value]
    assert seen == [(s, tag, pytest.approx(x)) for s in range(3)
                    for tag, x in (("train/loss", 1.0 / (s + 1)), ("train/lr", 0.5))]


def _steps(logdir):
    from labkit.core.scalars import event_files, read_scalars

    return [step for path in event_files(logdir) for step, _ in read_scalars(path).get("train/loss", [])]


def test_event_files_for_cloud_storage_are_published_whole_while_training(tmp_path, monkeypatch):
    # Under the job's /gcs mount (here the emulator's stand-in) a file is an object only once
    # closed: the writer stages it locally and copies it whole on its cadence.
    monkeypatch.setenv("LABKIT_LOCAL_GCS", str(tmp_path / "gcs"))
    logdir = tmp_path / "gcs" / "bkt" / "run" / "logs"
    writer = ScalarWriter(str(logdir), sync_secs=0)
    assert writer.staged and writer.path.startswith(str(logdir))
    for step in range(3):
        writer.add(step, {"train/loss": 1.0})
        assert _steps(logdir) == list(range(step + 1))  # readable while the run goes on
    writer.close()
    assert _steps(logdir) == [0, 1, 2]


def test_a_slow_cadence_publishes_on_close_and_rotation_keeps_every_step(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_LOCAL_GCS", str(tmp_path / "gcs"))
    logdir = tmp_path / "gcs" / "bkt" / "logs"
    writer = ScalarWriter(str(logdir), sync_secs=3600)
    writer.add(0, {"train/loss": 1.0})
    assert _steps(logdir) == []  # not yet published
    writer.close()
    assert _steps(logdir) == [0]
    rotating = ScalarWriter(str(tmp_path / "gcs" / "bkt" / "rot"), sync_secs=3600, rotate_bytes=300)
    for step in range(120):
        rotating.add(step, {"train/loss": 1.0, "train/lr": 0.1})
    rotating.close()
    from labkit.core.scalars import event_files

    assert len(event_files(tmp_path / "gcs" / "bkt" / "rot")) > 10  # name order is step order
    assert _steps(tmp_path / "gcs" / "bkt" / "rot") == list(range(120))


def test_a_local_folder_is_written_in_place(tmp_path):
    writer = ScalarWriter(str(tmp_path / "tb"))
    assert not writer.staged
    writer.add(0, {"train/loss": 1.0})
    writer.flush()
    assert _steps(tmp_path / "tb") == [0]
    writer.close()
