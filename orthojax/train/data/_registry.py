"""Dataset names -> implementing module and options; option checking; dispatch.

Modules are imported on first use, so naming a dataset that needs no
TensorFlow (UCI, toy sets, digits, fake) never imports it.
"""

from __future__ import annotations

import importlib
from typing import Any, Iterator

import numpy as np

from orthojax.train.data import _arrays
from orthojax.train.data import _published
from orthojax.train.data import text
from orthojax.train.data._info import DatasetInfo

_PKG = "orthojax.train.data"
_IMAGENET = {"image_size": 224, "min_scale": 256, "max_scale": 480, "eval_resize": 256,
             "color_jitter": 0.4, "lighting": 0.1, "shuffle_buffer": 10_000}
_IMAGENET32 = {"flip": True, "shuffle_buffer": 50_000, "download": True}
_IMAGES = {"flatten": False, "download": True}
_MNIST = {"view": "row", "source": "tfds", "permutation_seed": 0, "download": True}
_UCI = {"csv_path": "", "split_index": 0, "test_fraction": 0.2, "validation_fraction": 0.2,
        "standardize_y": True, "download": True}

# name -> (module in this package, options with their defaults). The one table
# of options: validating them needs no import of a (TensorFlow-using) module. The text
# sets' come from their module (text.OPTIONS), which imports no TensorFlow at load.
# What each option means is documented in the module.
_TABLE: dict[str, tuple[str, dict[str, Any]]] = {
    "imagenet2012": ("imagenet", _IMAGENET),
    "imagenet_resized/32x32": ("imagenet", _IMAGENET32),
    "cifar10": ("images", _IMAGES),
    "svhn_cropped": ("images", _IMAGES),
    "mnist": ("mnist", _MNIST),
    **{f"uci/{k}": ("uci", _UCI) for k in ("boston", "concrete", "energy", "power", "wine",
                                          "yacht")},
    "levy": ("toy", {"num_train": 1000, "num_test": 1000, "noise": 0.0, "low": -10.0,
                     "high": 10.0, "data_seed": 0}),
    "banana": ("toy", {"num_train": 1000, "num_test": 1000, "noise": 0.1, "data_seed": 0}),
    "fake": ("fake", {"height": 224, "width": 224, "channels": 3, "num_classes": 1000,
                      "num_train": 1_281_167, "num_eval": 50_000, "pool": 64}),
    "digits": ("digits", {"flatten": False}),
    **{name: ("text", options) for name, options in text.OPTIONS.items()},
}

DATASETS: tuple[str, ...] = tuple(_TABLE)


def default_options(name: str) -> dict[str, Any]:
  """The options ``name`` accepts, with their defaults."""
  return dict(_entry(name)[1])


def _entry(name: str) -> tuple[str, dict[str, Any]]:
  if name not in _TABLE:
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
  return _TABLE[name]


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
  def bad() -> ValueError:
    return ValueError(f"{name}: option {key}={value!r} should be a {type(default).__name__}")

  if isinstance(default, bool):
    if isinstance(value, (bool, np.bool_)):
      return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
      return value.lower() in ("true", "1")
    if isinstance(value, (int, np.integer)) and value in (0, 1):
      return bool(value)
    raise bad()
  if isinstance(default, int):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, str)):
      raise bad()
    try:
      number = float(value)
    except ValueError:
      raise bad() from None
    if number != int(number):
      raise bad()
    return int(number)
  if isinstance(default, float):
    if isinstance(value, bool):
      raise bad()
    try:
      return float(value)
    except (TypeError, ValueError):
      raise bad() from None
  return str(value)


def check_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
  """``options`` with defaults filled in; ValueError on unknown names/options or bad types."""
  _, defaults = _entry(name)
  unknown = sorted(set(options) - set(defaults))
  if unknown:
    raise ValueError(f"{name}: unknown option(s) {unknown}; valid options: "
                     + ", ".join(f"{k}={v!r}" for k, v in defaults.items()))
  return {k: _coerce(name, k, options.get(k, v), v) for k, v in defaults.items()}


def check_splits(name: str, splits: tuple[str, ...]) -> None:
  """ValueError unless every one of ``splits`` is ``"eval"`` or a split of dataset
  ``name`` (its module's ``SPLITS``; imported here, as building the run would)."""
  known = ("eval",) + tuple(s for s in importlib.import_module(
      f"{_PKG}.{_entry(name)[0]}").SPLITS if s != "eval")
  for split in splits:
    if split not in known:
      raise ValueError(f"{name} has no split {split!r}; choose from {', '.join(known)}")


def resolve(name: str, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
  """``(module, options with defaults filled in)``; ValueError on unknown names/options."""
  opts = check_options(name, options)
  return importlib.import_module(f"{_PKG}.{_entry(name)[0]}"), opts


def dataset_info(name: str, *, data_dir: str | None = None, published: bool = False,
                 **options: Any) -> DatasetInfo:
  """What the model sees of dataset ``name`` (shapes, classes, split sizes).

  Args:
    published: take the tfds catalogue's numbers instead of reading the
      prepared dataset (:mod:`._published`), for building a run where the
      data is not (the pod compile check). Sets generated in memory read no
      files either way.
  """
  if published and name in _published.PUBLISHED:
    return _published.PUBLISHED[name](name, check_options(name, options))
  module, opts = resolve(name, options)
  return module.info(name, opts, data_dir or None)


def train_batches(name: str, *, batch_size: int | None, seed: int, start_batch: int = 0,
                  data_dir: str | None = None, process_index: int | None = None,
                  process_count: int | None = None, **options: Any
                  ) -> Iterator[dict[str, np.ndarray]]:
  module, opts = resolve(name, options)
  batch_size = _arrays.check_batch_size(batch_size)
  index, count = _arrays.resolve_process(process_index, process_count)
  if int(start_batch) != start_batch or start_batch < 0:
    raise ValueError(f"start_batch={start_batch!r}: must be an integer >= 0")
  return module.train_batches(name, opts, batch_size=batch_size, seed=int(seed),
                              start_batch=int(start_batch), data_dir=data_dir or None,
                              process_index=index, process_count=count)


def eval_batches(name: str, *, batch_size: int | None, split: str = "eval",
                 data_dir: str | None = None, process_index: int | None = None,
                 process_count: int | None = None, **options: Any
                 ) -> Iterator[dict[str, np.ndarray]]:
  module, opts = resolve(name, options)
  batch_size = _arrays.check_batch_size(batch_size)
  index, count = _arrays.resolve_process(process_index, process_count)
  return module.eval_batches(name, opts, split=split, batch_size=batch_size,
                             data_dir=data_dir or None, process_index=index,
                             process_count=count)
