"""The GmP illustrations' toy sets (E4): 1-D Levy regression, 2-D "banana" classification.

Both are generated, deterministically from ``data_seed`` (default 0; not the
training seed, so every training seed sees the same data). Inputs are left
in their raw coordinates — E4 plots the units' characteristic points
``φ = −λ·u(θ)`` in input space.

``levy``: the Levy function in one dimension (Laguna & Martí 2005; the
sum term is empty for d = 1)::

    w = 1 + (x − 1)/4,    f(x) = sin²(πw) + (w − 1)²·(1 + sin²(2πw)),

on ``[low, high] = [−10, 10]`` (its usual domain; f ∈ [0, ≈ 15.6], minimum 0 at
x = 1). ``train``: ``num_train`` (1000) x's uniform on the interval, targets
``f(x) + noise·ε``, ε ~ N(0, 1) (``noise=0`` by default); ``test``:
``num_test`` (1000) evenly spaced x's with noiseless targets (for plotting
the fit and the test RMSE). ``x`` float32 ``(1,)``, ``y`` float32.

``banana``: two interleaved crescents ("bananas"), in the spirit of the
banana benchmark of Rätsch et al. (2001), which the GmP paper's Figure 3
uses but does not ship; our generator, not that data. Class 0:
``(cos t, sin t)``, class 1: ``(1 − cos t, ½ − sin t)``, ``t ~ U[0, π]``,
both shifted by ``(−½, −¼)`` so the data is centred at the origin, plus
isotropic Gaussian noise of std ``noise`` (0.1). Balanced classes;
``num_train`` = ``num_test`` = 1000 by default. ``x`` float32 ``(2,)``,
``y`` int32 in {0, 1}.

References:
  Laguna & Martí, "Experimental testing of advanced scatter search designs
  for global optimization of multimodal functions", J. Global Optim. 2005.
  Rätsch, Onoda & Müller, "Soft margins for AdaBoost", Machine Learning 2001.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from orthojax.train.data import _arrays
from orthojax.train.data._info import DatasetInfo
from orthojax.train.data._info import resolve_split

SPLITS = ("test", "train")


def levy(x: np.ndarray) -> np.ndarray:
  """The 1-D Levy function."""
  w = 1.0 + (x - 1.0) / 4.0
  return np.sin(np.pi * w) ** 2 + (w - 1.0) ** 2 * (1.0 + np.sin(2.0 * np.pi * w) ** 2)


def make_levy(num_train: int = 1000, num_test: int = 1000, noise: float = 0.0,
              low: float = -10.0, high: float = 10.0, data_seed: int = 0
              ) -> dict[str, dict[str, np.ndarray]]:
  """``{"train": {"x", "y"}, "test": {...}}`` for the Levy regression set."""
  if not low < high:
    raise ValueError(f"levy: need low < high, got [{low}, {high}]")
  rng = np.random.default_rng(data_seed)
  x_train = rng.uniform(low, high, num_train)
  y_train = levy(x_train) + noise * rng.standard_normal(num_train)
  x_test = np.linspace(low, high, num_test)
  return {"train": {"x": x_train[:, None].astype(np.float32), "y": y_train.astype(np.float32)},
          "test": {"x": x_test[:, None].astype(np.float32),
                   "y": levy(x_test).astype(np.float32)}}


def _bananas(n: int, noise: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  y = rng.permutation(np.arange(n) % 2)
  t = rng.uniform(0.0, np.pi, n)
  upper = np.stack([np.cos(t), np.sin(t)], 1)
  lower = np.stack([1.0 - np.cos(t), 0.5 - np.sin(t)], 1)
  x = np.where(y[:, None] == 0, upper, lower) - np.array([0.5, 0.25])
  return x + noise * rng.standard_normal((n, 2)), y


def make_banana(num_train: int = 1000, num_test: int = 1000, noise: float = 0.1,
                data_seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
  """``{"train": {"x", "y"}, "test": {...}}`` for the banana classification set."""
  rng = np.random.default_rng(data_seed)
  out = {}
  for split, n in (("train", num_train), ("test", num_test)):
    x, y = _bananas(n, noise, rng)
    out[split] = {"x": x.astype(np.float32), "y": y.astype(np.int32)}
  return out


def _make(name: str, opts: dict) -> dict[str, dict[str, np.ndarray]]:
  for key in ("num_train", "num_test"):
    if opts[key] < 1:
      raise ValueError(f"{name}: {key}={opts[key]}: must be >= 1")
  return make_levy(**opts) if name == "levy" else make_banana(**opts)


def _split(split: str) -> str:
  return resolve_split(split, SPLITS, eval_split="test")


def info(name: str, opts: dict, data_dir: str | None) -> DatasetInfo:
  del data_dir
  _make(name, opts)  # validates
  if name == "levy":
    return DatasetInfo(name=name, task="regression", input_shape=(1,), num_classes=None,
                       num_train=opts["num_train"], num_eval=opts["num_test"])
  return DatasetInfo(name=name, task="classification", input_shape=(2,), num_classes=2,
                     num_train=opts["num_train"], num_eval=opts["num_test"])


def train_batches(name: str, opts: dict, *, batch_size: int | None, seed: int,
                  start_batch: int, data_dir: str | None, process_index: int,
                  process_count: int) -> Iterator[dict[str, np.ndarray]]:
  return _arrays.train_batches(_make(name, opts)["train"], batch_size=batch_size, seed=seed,
                               start_batch=start_batch, process_index=process_index,
                               process_count=process_count)


def eval_batches(name: str, opts: dict, *, split: str, batch_size: int | None,
                 data_dir: str | None, process_index: int, process_count: int
                 ) -> Iterator[dict[str, np.ndarray]]:
  split = _split(split)
  return _arrays.eval_batches(_make(name, opts)[split], batch_size=batch_size,
                              process_index=process_index, process_count=process_count)
