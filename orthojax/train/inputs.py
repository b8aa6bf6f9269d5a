"""Where the training loop's batches come from: a registered dataset or your own.

The loop asks an :class:`Input` for two things: the training stream from a
given batch on (the exact-resume position) and the evaluation batches of a
split. :class:`RegisteredInput` serves the datasets of
:mod:`orthojax.train.data` by name; :class:`IterableInput` serves a user's
own batches (:func:`orthojax.train.fit`). Batches are per process: numpy
dicts with ``x``, ``y`` (and ``mask`` for evaluation), each process yielding
its ``global batch / process count`` rows.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

import numpy as np

from orthojax.train import data as data_lib
from orthojax.train.data import DatasetInfo

Batch = dict[str, np.ndarray]


class Input(Protocol):
  """What the training loop reads."""

  def train(self, *, batch_size: int, start_batch: int, seed: int) -> Iterator[Batch]:
    """Training batches of ``batch_size`` rows per process, from batch ``start_batch`` on."""

  def eval(self, *, batch_size: int, split: str) -> Iterable[Batch] | None:
    """Every example of ``split`` once (padded, ``mask`` 0 on padding); None: no evaluation."""


@dataclasses.dataclass(frozen=True)
class RegisteredInput:
  """A dataset of :data:`orthojax.train.data.DATASETS`, by name and options."""

  name: str
  options: dict[str, Any]
  data_dir: str | None = None

  def train(self, *, batch_size: int, start_batch: int, seed: int) -> Iterator[Batch]:
    return data_lib.train_batches(self.name, batch_size=batch_size, seed=seed,
                                  start_batch=start_batch, data_dir=self.data_dir, **self.options)

  def eval(self, *, batch_size: int, split: str) -> Iterable[Batch]:
    return data_lib.eval_batches(self.name, batch_size=batch_size, split=split,
                                 data_dir=self.data_dir, **self.options)


TrainSource = Callable[[int], Iterable[Batch]] | Iterable[Batch]
EvalSource = Callable[[], Iterable[Batch]] | None


@dataclasses.dataclass(frozen=True)
class IterableInput:
  """Your own batches.

  Attributes:
    train_data: ``start_batch -> iterable of batches`` (resumes exactly from any
      batch), or a re-iterable of batches that yields the same stream each
      pass, iterated pass after pass like epochs (resuming skips the batches
      already consumed).
    eval_data: ``() -> iterable of batches`` or a re-iterable (None: no evaluation).
  """

  train_data: TrainSource
  eval_data: EvalSource | Iterable[Batch] = None
  example: Batch | None = None   # the first batch: every later one has its dtypes and shapes

  def train(self, *, batch_size: int, start_batch: int, seed: int) -> Iterator[Batch]:
    del seed   # the user's stream fixes its own order
    if callable(self.train_data):
      stream = iter(self.train_data(start_batch))
    else:
      passes = itertools.chain.from_iterable(itertools.repeat(self.train_data))
      stream = itertools.islice(passes, start_batch, None)
    for index, batch in enumerate(stream, start_batch):
      _check_keys(batch, "train_data")
      rows = len(batch["y"])
      if rows != batch_size:
        raise ValueError(f"train_data: a batch of {rows} rows; each process must yield "
                         f"config.batch_size / process count = {batch_size}")
      if self.example is not None:
        for key in ("x", "y"):
          want, got = np.asarray(self.example[key]), np.asarray(batch[key])
          if got.dtype != want.dtype or got.shape[1:] != want.shape[1:]:
            raise ValueError(f"train_data: batch {index} has {key} {got.dtype}"
                             f"{list(got.shape)}, the first had {want.dtype}"
                             f"{list(want.shape)}; every batch has the first's dtypes and "
                             f"shapes (the step is compiled for them)")
      yield batch

  def eval(self, *, batch_size: int, split: str) -> Iterable[Batch] | None:
    if self.eval_data is None:
      return None
    if split != "eval":
      raise ValueError(f"eval split {split!r}: your own eval_data is the only split")
    batches = self.eval_data() if callable(self.eval_data) else self.eval_data
    return (_masked(b, batch_size) for b in batches)


def _masked(batch: Batch, batch_size: int) -> Batch:
  """A user's eval batch padded to ``batch_size`` rows, with ``mask`` marking the real ones."""
  _check_keys(batch, "eval_data")
  rows = len(batch["y"])
  if rows > batch_size:
    raise ValueError(f"eval_data: a batch of {rows} rows; at most {batch_size} per process")
  mask = np.asarray(batch.get("mask", np.ones(rows, np.float32)), np.float32)
  pad = lambda a: np.concatenate([a, np.zeros((batch_size - rows,) + a.shape[1:], a.dtype)])
  return {"x": pad(np.asarray(batch["x"])), "y": pad(np.asarray(batch["y"])), "mask": pad(mask)}


def _check_keys(batch: Any, argument: str) -> None:
  if not isinstance(batch, Mapping) or not {"x", "y"} <= set(batch):
    got = f"keys {sorted(batch)}" if isinstance(batch, Mapping) else type(batch).__name__
    raise ValueError(f"{argument}: each batch is a dict {{'x': float32 (batch, ...), 'y': "
                     f"(batch,)}}; got {got}")


def info_from_batch(batch: Batch, num_train: int) -> DatasetInfo:
  """A :class:`DatasetInfo` read off one batch: integer ``y`` means classification.

  ``x`` float32 features with ``y`` ``(batch,)`` int32 labels or float32
  targets; or int32 token ids ``x`` with int32 labels ``(batch,)`` or
  ``(batch, ...)`` (a language model's next-token labels: per-position
  classification, ``target_shape = y.shape[1:]``).

  Raises:
    ValueError: anything else, in one line.
  """
  _check_keys(batch, "train_data")
  x, y = np.asarray(batch["x"]), np.asarray(batch["y"])
  tokens = x.dtype == np.int32
  if not (x.dtype == np.float32 or tokens) or y.ndim < 1 or (y.ndim > 1 and not tokens):
    raise ValueError(f"train_data: batches are {{'x': float32 (batch, ...), 'y': (batch,)}} "
                     f"or, for token ids, {{'x': int32 (batch, ...), 'y': int32 (batch, ...)}}; "
                     f"got x {x.dtype} {x.shape}, y {y.dtype} {y.shape}")
  classification = np.issubdtype(y.dtype, np.integer)
  if not classification and y.dtype != np.float32:
    raise ValueError(f"train_data: y must be int32 labels or float32 targets, got {y.dtype}")
  if classification and y.dtype != np.int32:
    raise ValueError(f"train_data: integer labels must be int32, got {y.dtype}")
  if tokens and not classification and y.ndim > 1:
    raise ValueError(f"train_data: per-position targets must be int32 labels, got {y.dtype}")
  return DatasetInfo(name="user", task="classification" if classification else "regression",
                     input_shape=tuple(x.shape[1:]), num_classes=None, num_train=num_train,
                     num_eval=0, eval_split="eval", input_dtype=str(x.dtype),
                     target_shape=tuple(y.shape[1:]))
