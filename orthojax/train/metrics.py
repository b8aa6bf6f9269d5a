"""Metrics: console progress, TensorBoard event files and a JSONL log.

Only process 0 writes (the values are global — reduced over the mesh inside
the jitted step — so every process holds the same numbers). The JSONL log
(``<workdir>/metrics.jsonl``, one ``{"step": …, "split": …, name: value}``
object per line) is what the report and plot scripts read. It always reads
as one uninterrupted run: a run resumed from step ``s`` first drops the rows
past ``s`` (logged after that checkpoint, about to be logged again), a row
for a ``(step, split)`` already present replaces it (the final evaluation of
a finished run, rerun), and the open logging interval's partial sums travel
in the checkpoint (:meth:`IntervalMean.state_dict`), so the first mean after a
resume covers the whole interval. A fresh run starts an empty log. TensorBoard
event files are appended as they are (TensorBoard shows the latest value per
step). TensorBoard files are written by :mod:`orthojax.train.events`, without
TensorFlow. Paths go through ``etils.epath``, so the workdir may be
local or on a cloud bucket (``gs://…``) like the checkpoints.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable, Mapping, TextIO

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

_LOG = logging.getLogger(__name__)


def _scalar(value: Any) -> float:
  return float(np.asarray(value))


def read_jsonl(path: str) -> list[dict[str, Any]]:
  """All records of a metrics log (skipping a torn last line after a crash)."""
  records = []
  path = epath.Path(path)
  if not path.exists():
    return records
  for line in path.read_text().splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return records


@jax.jit
def _accumulate(sums: Any, counts: Any, metrics: Any) -> tuple[Any, Any]:
  finite = jax.tree.map(jnp.isfinite, metrics)
  sums = jax.tree.map(lambda s, m, f: s + jnp.where(f, m, 0.0), sums, metrics, finite)
  counts = jax.tree.map(lambda c, f: c + f.astype(jnp.int32), counts, finite)
  return sums, counts


class IntervalMean:
  """Means of per-step scalar metrics over the steps since the last :meth:`result`.

  Accumulated on the device (one small asynchronous jitted add per step, no
  host sync), so a logged train loss is the mean over the logging interval,
  as in the Flax examples, not one noisy batch. Non-finite values (steps the
  ``nan_policy="skip"`` guard dropped) are left out of the means; a metric
  with no finite value in the interval comes out NaN.
  """

  def __init__(self):
    self._sums = self._counts = None

  def add(self, metrics: Mapping[str, Any]) -> None:
    if self._sums is None:
      self._sums = jax.tree.map(lambda m: jnp.zeros((), jnp.float32), dict(metrics))
      self._counts = jax.tree.map(lambda m: jnp.zeros((), jnp.int32), dict(metrics))
    self._sums, self._counts = _accumulate(self._sums, self._counts, dict(metrics))

  def result(self) -> dict[str, float]:
    """The interval means (host floats); starts a new interval."""
    if self._sums is None:
      return {}
    sums, counts = jax.device_get((self._sums, self._counts))
    self._sums = self._counts = None
    return {k: float(sums[k]) / int(counts[k]) if counts[k] else math.nan for k in sums}

  def state_dict(self) -> dict[str, list[float]]:
    """The open interval's partial sums and counts (JSON), for a checkpoint: a run
    resumed mid-interval logs the mean over the whole interval, as if uninterrupted."""
    if self._sums is None:
      return {}
    sums, counts = jax.device_get((self._sums, self._counts))
    return {k: [float(sums[k]), int(counts[k])] for k in sums}

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    if not state:
      self._sums = self._counts = None
      return
    self._sums = {k: jnp.float32(v[0]) for k, v in state.items()}
    self._counts = {k: jnp.int32(v[1]) for k, v in state.items()}


class MetricsWriter:
  """Writes scalars to the console, TensorBoard and ``metrics.jsonl``.

  Args:
    workdir: output directory (None: console only).
    total_steps: for the ETA.
    tensorboard: also write TensorBoard event files under ``workdir/tb``.
    is_writer: defaults to ``jax.process_index() == 0``.
    print_fn: called with each console line alone; None: this module's logger at INFO.
    resume_step: the step a resumed run restarts from (the log keeps the rows up to it);
      None: a fresh run, the log starts empty.
  """

  def __init__(self, workdir: str | None, total_steps: int, *, tensorboard: bool = True,
               is_writer: bool | None = None, print_fn: Callable[[str], Any] | None = None,
               resume_step: int | None = None):
    self.is_writer = jax.process_index() == 0 if is_writer is None else is_writer
    self.total_steps = total_steps
    self.print_fn = _LOG.info if print_fn is None else print_fn
    self._jsonl: TextIO | None = None
    self._tb = {}
    self._tensorboard = tensorboard and workdir is not None
    self.workdir = workdir
    self._last: tuple[int, float] | None = None
    self._keys: set[tuple[int, str]] = set()
    if self.is_writer and workdir is not None:
      epath.Path(workdir).mkdir(parents=True, exist_ok=True)
      self._keys = self._keep_until(-1 if resume_step is None else resume_step)
      self._jsonl = self._path.open("a")

  @property
  def _path(self) -> epath.Path:
    return epath.Path(self.workdir) / "metrics.jsonl"

  def _keep_until(self, step: int, drop: tuple[int, str] | None = None) -> set[tuple[int, str]]:
    """Rewrite the log without rows past ``step`` (what a resumed run will log
    again) and without the row ``drop``; returns the ``(step, split)`` keys kept.
    A fresh run (``step`` −1) keeps nothing."""
    records = [r for r in read_jsonl(str(self._path))
               if 0 <= step and r.get("step", 0) <= step and (r.get("step"), r.get("split")) != drop]
    tmp = self._path.with_name("metrics.jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(self._path)
    return {(r.get("step"), r.get("split")) for r in records}

  @property
  def jsonl_path(self) -> str | None:
    return None if self.workdir is None else os.path.join(self.workdir, "metrics.jsonl")

  def _events(self, split: str) -> Any:
    """The split's TensorBoard event file (:class:`orthojax.train.events.EventFile`), or
    None (said once) where the ``tensorboard`` package does not import: the run still
    logs every scalar to ``metrics.jsonl``."""
    if split not in self._tb:
      try:
        from orthojax.train import events  # pylint: disable=g-import-not-at-top
      except ImportError as e:
        self.print_fn(f"TensorBoard events off: tensorboard does not import ({e}); "
                      f"metrics.jsonl has every scalar")
        self._tensorboard = False
        return None
      self._tb[split] = events.EventFile(os.path.join(self.workdir, "tb", split))
    return self._tb[split]

  def write(self, step: int, scalars: Mapping[str, Any], split: str = "train",
            console: bool = True) -> dict[str, float]:
    """Record ``scalars`` at ``step``; returns them as Python floats."""
    values = {k: _scalar(v) for k, v in scalars.items()}
    if split == "train":
      now = time.perf_counter()
      if self._last is not None and step > self._last[0]:
        rate = (step - self._last[0]) / max(now - self._last[1], 1e-9)
        values.setdefault("steps_per_sec", rate)
    try:
      return self._write(step, values, split, console)
    finally:   # the next interval starts after this line is written: steps/s and the ETA
      if split == "train":   # count training, not the first TensorBoard write's set-up
        self._last = (step, time.perf_counter())

  def _write(self, step: int, values: dict[str, float], split: str,
             console: bool) -> dict[str, float]:
    if not self.is_writer:
      return values
    if self._jsonl is not None:
      key = (int(step), split)
      if key in self._keys:   # e.g. the final evaluation of a finished run, rerun
        self._jsonl.close()
        self._keep_until(int(step), drop=key)
        self._jsonl = self._path.open("a")
      self._keys.add(key)
      self._jsonl.write(json.dumps({"step": int(step), "split": split, **values}) + "\n")
      self._jsonl.flush()
    if self._tensorboard and (events := self._events(split)) is not None:
      events.scalars(step, values)
    if console:
      self.print_fn(self._line(step, split, values))
    return values

  def _line(self, step: int, split: str, values: Mapping[str, float]) -> str:
    parts = [f"[{split}] step {step}/{self.total_steps}"]
    for name, value in values.items():
      if name == "steps_per_sec":
        continue
      parts.append(f"{name} {value:.4g}")
    rate = values.get("steps_per_sec")
    if rate:
      eta = (self.total_steps - step) / rate
      parts.append(f"{rate:.2f} steps/s, ETA {_duration(eta)}")
    return " | ".join(parts)

  def flush(self) -> None:
    for writer in self._tb.values():
      writer.flush()

  def close(self) -> None:
    self.flush()
    for writer in self._tb.values():
      writer.close()
    self._tb = {}
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds) or seconds < 0:
    return "?"
  h, rem = divmod(int(seconds), 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
