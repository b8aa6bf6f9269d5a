"""TensorBoard event files, written without TensorFlow.

An event file is a sequence of records, each an ``Event`` protocol buffer framed as
``uint64 length, uint32 masked CRC-32C of the length, the bytes, uint32 masked CRC-32C
of the bytes`` (little-endian; TensorFlow's TFRecord framing). The first event names the
format (``file_version="brain.Event:2"``); each later one holds a ``Summary`` of scalars
at a step. TensorBoard's scalar dashboard reads a scalar's ``simple_value``, as it does
for PyTorch's ``SummaryWriter``. The protocol buffers and the framing are tensorboard's
own (``tensorboard.compat.proto``, ``tensorboard.summary.writer.record_writer``). The
file goes through ``etils.epath``, so a ``gs://`` workdir works as it does for the
checkpoints.

Why not ``tf.summary``, or tensorboard's ``EventFileWriter``: both import TensorFlow,
the latter for ``tf.io.gfile`` wherever TensorFlow is installed. That import takes
about 9 s on a 2-core machine before a run's first step, although synthetic,
scikit-learn or in-memory data need no TensorFlow. An accelerator image without
TensorFlow would also write no events at all.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from typing import Mapping

from etils import epath
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

_UID = itertools.count()


class EventFile:
  """One TensorBoard event file in ``logdir``, scalars appended step by step.

  The name follows TensorBoard's convention,
  ``events.out.tfevents.<unix seconds>.<host>.<pid>.<n>``; TensorBoard reads every such
  file in the directory, so a resumed run adds a file beside the earlier ones (it shows
  the latest value per step).
  """

  def __init__(self, logdir: str):
    path = epath.Path(logdir)
    path.mkdir(parents=True, exist_ok=True)
    name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_UID)}")
    self.path = path / name
    self._records = RecordWriter(self.path.open("wb"))
    self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

  def _write(self, event: event_pb2.Event) -> None:
    self._records.write(event.SerializeToString())

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    """One event at ``step`` holding every ``tag: value`` of ``values``."""
    summary = summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
        for tag, value in values.items()])
    self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def flush(self) -> None:
    self._records.flush()

  def close(self) -> None:
    self._records.close()
