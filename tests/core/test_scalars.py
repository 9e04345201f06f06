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
