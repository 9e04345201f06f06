"""TensorBoard scalars for both engines, without torch or TensorFlow.

A TensorBoard event file is a TFRecord file of `Event` protocol buffers, the first one naming
the file version. `ScalarWriter` frames them with the `tensorboard` package's own `RecordWriter`
and protos (neither imports a framework; `torch.utils.tensorboard.SummaryWriter` and
`tf.summary` would each pull in their framework, and the first one TensorFlow too when it is
installed) and writes through fsspec, so a local folder, `gs://` or a `/gcs/` mount all work.
Scalars are `simple_value`s, which TensorBoard and Vertex AI TensorBoard read.

Local files are flushed every `flush_secs` and on close; on Cloud Storage an object appears
when the writer closes (objects are written whole).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import fsspec


class ScalarWriter:
    """One event file under `logdir`: `add(step, {"train/loss": 2.3, ...})`, then `close()`."""

    def __init__(self, logdir: str, flush_secs: float = 5.0):
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.record_writer import RecordWriter
        except ImportError as e:
            raise ImportError(f"tensorboard_dir={logdir!r} needs the tensorboard package "
                              f"(pip install tensorboard): {e}") from e
        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        fs, root = fsspec.core.url_to_fs(str(logdir))
        fs.makedirs(root, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = f"{root.rstrip('/')}/{name}"
        self._records = RecordWriter(fs.open(self.path, "wb"))
        self._flush_secs = flush_secs
        self._flushed = time.monotonic()
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))

    def _write(self, event) -> None:
        self._records.write(event.SerializeToString())

    def add(self, step: int, values: Mapping[str, float]) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(v))
                                       for tag, v in values.items()])
        self._write(self._event(wall_time=time.time(), step=step, summary=summary))
        if time.monotonic() - self._flushed > self._flush_secs:
            self.flush()

    def flush(self) -> None:
        self._records.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        if not self._records.closed:
            self._records.close()
