"""``digits``: scikit-learn's bundled 8×8 handwritten digits — offline, tiny, fast.

The default dataset of :class:`orthojax.train.config.Config` and of the
trainer's tests: 1,797 images (``sklearn.datasets.load_digits``, UCI
optdigits test set), 10 classes, no download. ``test`` is the last
``n // 5`` = 359 entries of ``np.random.default_rng(0).permutation(1797)``,
``train`` the other 1,438 (no validation split; ``eval`` means ``test``).
Each of the 64 pixels is standardised with the mean and std of ``train``
(a constant pixel's std becomes 1). ``x``: float32 ``(8, 8, 1)``, or
``(64,)`` with ``flatten=True``; ``y``: int32 in ``[0, 10)``.
"""

from __future__ import annotations

import functools
from typing import Iterator

import numpy as np

from orthojax.train.data import _arrays
from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import resolve_split

SPLITS = ("test", "train")
NUM_IMAGES = 1797   # load_digits' (a fixed file): info() knows the sizes without loading it


@functools.lru_cache(maxsize=1)
def _splits() -> dict[str, dict[str, np.ndarray]]:
  from sklearn.datasets import load_digits  # bundled with scikit-learn
  x, y = load_digits(return_X_y=True)
  order = np.random.default_rng(0).permutation(len(x))
  n_test = len(x) // 5
  idx = {"train": np.sort(order[:len(x) - n_test]), "test": np.sort(order[len(x) - n_test:])}
  mean, std = x[idx["train"]].mean(0), x[idx["train"]].std(0)
  x = (x - mean) / np.where(std > 0, std, 1.0)
  out = {k: {"x": x[i].astype(np.float32), "y": y[i].astype(np.int32)} for k, i in idx.items()}
  for split in out.values():
    for v in split.values():
      v.setflags(write=False)
  return out


def _split(split: str) -> str:
  return resolve_split(split, SPLITS, eval_split="test")


def _transform(opts: dict) -> dict[str, _arrays.Transform]:
  shape = (64,) if opts["flatten"] else (8, 8, 1)
  return {"x": lambda x: x.reshape((len(x),) + shape)}


def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  num_eval = NUM_IMAGES // 5
  return DatasetInfo(name=name, task="classification",
                     input_shape=(64,) if opts["flatten"] else (8, 8, 1), num_classes=10,
                     num_train=NUM_IMAGES - num_eval, num_eval=num_eval)


def train_batches(name: str, opts: dict, *, batch_size: int | None, seed: int,
                  start_batch: int, data_dir: str | None, process_index: int,
                  process_count: int) -> Iterator[dict[str, np.ndarray]]:
  return _arrays.train_batches(_splits()["train"], batch_size=batch_size, seed=seed,
                               start_batch=start_batch, process_index=process_index,
                               process_count=process_count, transform=_transform(opts))


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  return _arrays.eval_batches(_splits()[_split(split)], batch_size=batch_size,
                              process_index=process_index, process_count=process_count,
                              transform=_transform(opts))
