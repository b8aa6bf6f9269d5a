"""TensorBoard event files: the records' framing, the scalars, and no TensorFlow import."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest
from tensorboard.compat.proto import event_pb2

from orthojax.train import metrics


def _crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit: an
  implementation of its own, not the writer's."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
  """TFRecord's mask: rotate right by 15 bits, add 0xa282ead8 (mod 2^32)."""
  return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _events(path) -> list[event_pb2.Event]:
  """Every record of an event file, each CRC checked."""
  data, events, at = path.read_bytes(), [], 0
  while at < len(data):
    header = data[at:at + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[at + 8:at + 12])
    body = data[at + 12:at + 12 + length]
    (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
    assert header_crc == _masked(_crc32c(header)) and body_crc == _masked(_crc32c(body))
    events.append(event_pb2.Event.FromString(body))
    at += 16 + length
  return events


def _scalars(logdir) -> dict[tuple[int, str], float]:
  files = sorted(logdir.glob("events.out.tfevents.*"))
  assert files
  out = {}
  for path in files:
    events = _events(path)
    assert events[0].file_version == "brain.Event:2"
    for event in events[1:]:
      out.update({(event.step, v.tag): v.simple_value for v in event.summary.value})
  return out


def test_event_files_hold_every_scalar_of_the_jsonl_log_per_split(tmp_path):
  writer = metrics.MetricsWriter(str(tmp_path), total_steps=4, print_fn=lambda line: None)
  for step in (1, 2, 3):
    writer.write(step, {"loss": 1.0 / step, "lr": 0.1})
  writer.write(3, {"top1": 0.25, "loss": 2.5}, split="eval")
  writer.close()
  logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  for split in ("train", "eval"):
    expected = {(r["step"], k): v for r in logged if r["split"] == split
                for k, v in r.items() if k not in ("step", "split")}
    got = _scalars(tmp_path / "tb" / split)
    assert set(got) == set(expected), split
    for key, value in expected.items():   # stored as float32
      assert got[key] == pytest.approx(value, rel=1e-7), key
  assert ("steps_per_sec" in {k for _, k in _scalars(tmp_path / "tb" / "train")})


def test_a_resumed_writer_adds_a_file_and_tensorboard_off_writes_none(tmp_path):
  for steps in ((1, 2), (3,)):   # two sittings of one run
    writer = metrics.MetricsWriter(str(tmp_path), total_steps=3, print_fn=lambda line: None,
                                   resume_step=None if steps[0] == 1 else 2)
    for step in steps:
      writer.write(step, {"loss": float(step)})
    writer.close()
  assert len(list((tmp_path / "tb" / "train").glob("events.out.tfevents.*"))) == 2
  assert {k: v for k, v in _scalars(tmp_path / "tb" / "train").items() if k[1] == "loss"} == {
      (1, "loss"): 1.0, (2, "loss"): 2.0, (3, "loss"): 3.0}
  off = tmp_path / "off"
  writer = metrics.MetricsWriter(str(off), total_steps=1, tensorboard=False,
                                 print_fn=lambda line: None)
  writer.write(1, {"loss": 1.0})
  writer.close()
  assert (off / "metrics.jsonl").exists() and not (off / "tb").exists()


def test_writing_events_does_not_import_tensorflow(tmp_path):
  script = ("import sys\nfrom orthojax.train import metrics\n"
            f"w = metrics.MetricsWriter({str(tmp_path)!r}, total_steps=1, print_fn=print)\n"
            "w.write(1, {'loss': 1.0}); w.close()\n"
            "print('tensorflow' in sys.modules)\n")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
  assert out.strip().splitlines()[-1] == "False"
  assert list((tmp_path / "tb" / "train").glob("events.out.tfevents.*"))
