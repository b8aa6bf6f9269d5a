"""``fake``: random full-size images for throughput tests — no files, no TensorFlow.

A pool of ``pool`` (64) images, standard-normal float32 of shape
``(height, width, channels)`` = ``(224, 224, 3)`` (already "normalised"),
is drawn once from ``np.random.default_rng(0)``. Global training batch
``k`` picks pool images and labels (``[0, num_classes)``, 1000 classes) with
``np.random.default_rng([seed, k])``; process ``p`` takes its slice, as in
:mod:`orthojax.train.data._arrays`, so resuming at ``start_batch`` is O(1).
Sizes default to ImageNet's (1,281,167 train, 50,000 eval) so steps per
epoch match E1. Each batch costs one gather from the pool (a memory copy),
far below a training step's cost on an accelerator.
"""

from __future__ import annotations

import functools
import math
from typing import Iterator

import numpy as np

from orthojax.train.data._info import DatasetInfo

SPLITS = ("eval", "train")


def check_options(opts: dict) -> None:
  for key in ("height", "width", "channels", "num_classes", "num_train", "num_eval", "pool"):
    if opts[key] < 1:
      raise ValueError(f"fake: {key}={opts[key]}: must be >= 1")


@functools.lru_cache(maxsize=2)
def _pool(shape: tuple[int, ...], size: int) -> np.ndarray:
  pool = np.random.default_rng(0).standard_normal((size,) + shape, dtype=np.float32)
  pool.setflags(write=False)
  return pool


def _shape(opts: dict) -> tuple[int, int, int]:
  return (opts["height"], opts["width"], opts["channels"])


def _batch(opts: dict, entropy: list[int], size: int, lo: int, hi: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(entropy)
  idx = rng.integers(0, opts["pool"], size)[lo:hi]
  labels = rng.integers(0, opts["num_classes"], size)[lo:hi]
  return {"x": _pool(_shape(opts), opts["pool"])[idx], "y": labels.astype(np.int32)}


def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  check_options(opts)
  return DatasetInfo(name=name, task="classification", input_shape=_shape(opts),
                     num_classes=opts["num_classes"], num_train=opts["num_train"],
                     num_eval=opts["num_eval"], eval_split="eval")


def train_batches(name: str, opts: dict, *, batch_size: int | None, seed: int,
                  start_batch: int, data_dir: str | None, process_index: int,
                  process_count: int) -> Iterator[dict[str, np.ndarray]]:
  check_options(opts)
  b = opts["num_train"] // process_count if batch_size is None else batch_size
  global_batch = b * process_count
  if global_batch > opts["num_train"]:
    raise ValueError(f"fake: global batch {global_batch} > num_train {opts['num_train']}")
  if start_batch < 0:
    raise ValueError(f"start_batch={start_batch}: must be >= 0")

  def gen():
    k = int(start_batch)
    lo = process_index * b
    while True:
      yield _batch(opts, [int(seed) % 2**63, k], global_batch, lo, lo + b)
      k += 1

  return gen()


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  check_options(opts)
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
  n = opts["num_eval"] if split == "eval" else opts["num_train"]
  b = math.ceil(n / process_count) if batch_size is None else batch_size
  global_batch = b * process_count

  def gen():
    for j in range(math.ceil(n / global_batch)):
      lo = process_index * b
      out = _batch(opts, [2**62 + (split == "train"), j], global_batch, lo, lo + b)
      mask = (j * global_batch + lo + np.arange(b)) < n
      out["x"] = np.where(mask[:, None, None, None], out["x"], 0.0).astype(np.float32)
      out["y"] = np.where(mask, out["y"], 0).astype(np.int32)
      out["mask"] = mask.astype(np.float32)
      yield out

  return gen()
