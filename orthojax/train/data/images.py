"""CIFAR-10 and SVHN (E5, deep critical tanh networks): small tfds image sets in memory.

The tfds splits are loaded into host memory once per process (150 MB /
225 MB of uint8) and batched by :mod:`orthojax.train.data._arrays` (global
order from the seed, O(1) resume, process-count-independent global
batches). No augmentation — E5 studies optimisation and the Fisher/Jacobian
spectra of plain networks.

``x``: float32, ``(pixel/255 − mean_c) / std_c`` with the per-channel
training-set statistics below; ``(32, 32, 3)``, or ``(3072,)`` with
``flatten=True`` (the deep MLP of E5). ``y``: int32 in ``[0, 10)``.
SVHN is tfds' ``svhn_cropped`` (the 32×32 digits; ``train`` 73,257,
``test`` 26,032; the ``extra`` split is not used). ``eval`` is ``test``.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from orthojax.train.data import _arrays
from orthojax.train.data import _tfds
from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import resolve_split

# Per-channel mean / std of the training images in [0, 1].
STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "svhn_cropped": ((0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
}
SPLITS = ("test", "train")


def _split(split: str) -> str:
  return resolve_split(split, SPLITS, eval_split="test")


def _transforms(name: str, opts: dict) -> dict[str, _arrays.Transform]:
  mean, std = (np.asarray(s, np.float32) for s in STATS[name])

  def x(images: np.ndarray) -> np.ndarray:
    out = (images.astype(np.float32) / 255.0 - mean) / std
    return out.reshape(len(out), -1) if opts["flatten"] else out

  return {"x": x, "y": lambda y: y.astype(np.int32)}


def _arrays_for(name: str, split: str, opts: dict, data_dir: str | None) -> dict[str, np.ndarray]:
  builder = _tfds.prepared_builder(name, data_dir, download=opts["download"])
  raw = _tfds.load_arrays(builder, split)
  return {"x": raw["image"], "y": raw["label"]}


def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  builder = _tfds.prepared_builder(name, data_dir, download=opts["download"])
  shape = (32 * 32 * 3,) if opts["flatten"] else (32, 32, 3)
  return DatasetInfo(name=name, task="classification", input_shape=shape, num_classes=10,
                     num_train=_tfds.num_examples(builder, "train"),
                     num_eval=_tfds.num_examples(builder, "test"), eval_split="test")


def train_batches(name: str, opts: dict, *, batch_size: int | None, seed: int,
                  start_batch: int, data_dir: str | None, process_index: int,
                  process_count: int) -> Iterator[dict[str, np.ndarray]]:
  return _arrays.train_batches(
      _arrays_for(name, "train", opts, data_dir), batch_size=batch_size, seed=seed,
      start_batch=start_batch, process_index=process_index, process_count=process_count,
      transform=_transforms(name, opts))


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  split = _split(split)
  return _arrays.eval_batches(
      _arrays_for(name, split, opts, data_dir), batch_size=batch_size,
      process_index=process_index, process_count=process_count,
      transform=_transforms(name, opts))
