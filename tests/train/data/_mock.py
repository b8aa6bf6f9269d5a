"""``tfds.testing.mock_data`` with numbered examples that honour sub-splits.

tfds' own mock yields the same random examples for every split, including
``tfds.split_for_jax_process`` sub-splits, so it cannot show that two
processes read disjoint shards. :func:`numbered_mock` replaces the mocked
reader: each split has ``num_examples`` examples; example ``i`` has label
``i`` (so ids must stay below the number of classes) and the image
``image_fn(i, feature_shape)``; a sub-split (``train[2:5]``, ``tfds.even_splits`` parts)
yields only its own range, and the dataset's cardinality is set.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import splits as splits_lib

from orthojax.train.data._tf import tf

SPLIT_NAMES = ("train", "validation", "test")


def random_image(i: int, shape: tuple, *, low: int = 40, high: int = 90) -> np.ndarray:
  """uint8 uniform random pixels, fixed by ``i``; unknown sides in ``[low, high)``."""
  rng = np.random.default_rng(i)
  shape = tuple(int(rng.integers(low, high)) if s is None else s for s in shape)
  return rng.integers(0, 256, shape, dtype=np.uint8)


def _example(features, i: int, image_fn: Callable[[int, tuple], np.ndarray]) -> dict:
  out = {}
  for key, feature in features.items():
    if isinstance(feature, tfds.features.ClassLabel):
      out[key] = i
    elif isinstance(feature, tfds.features.Image):
      out[key] = image_fn(i, feature.shape)
    else:
      out[key] = f"example_{i}"
  return out


def _ids(split, num_examples: int) -> np.ndarray:
  split_infos = splits_lib.SplitDict(
      [splits_lib.SplitInfo(name=s, shard_lengths=[num_examples], num_bytes=0)
       for s in SPLIT_NAMES])
  if isinstance(split, str):
    split = splits_lib.AbstractSplit.from_spec(split)
  parts = [np.arange(a.from_ or 0, num_examples if a.to is None else a.to)
           for a in split.to_absolute(split_infos)]
  return np.concatenate(parts)


@contextlib.contextmanager
def numbered_mock(num_examples: int, image_fn: Callable[[int, tuple], np.ndarray] = random_image
                  ) -> Iterator[None]:
  """Mock tfds; see the module docstring."""

  def as_dataset(self, split, decoders=None, read_config=None, shuffle_files=False):
    del read_config, shuffle_files
    features = self.info.features
    ids = _ids(split, num_examples)
    specs = features.get_serialized_info()
    signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.tf_dtype), specs)
    gen = lambda: (features.encode_example(_example(features, int(i), image_fn)) for i in ids)
    ds = tf.data.Dataset.from_generator(gen, output_signature=signature)
    ds = ds.apply(tf.data.experimental.assert_cardinality(len(ids)))
    return ds.map(functools.partial(features.decode_example, decoders=decoders))

  with tfds.testing.mock_data(num_examples=num_examples, as_dataset_fn=as_dataset):
    yield


def imagenet_like(i: int, shape: tuple, *, low: int = 40, high: int = 90) -> np.ndarray:
  """A constant-colour uint8 image whose colour is drawn from ImageNet's per-channel
  pixel statistics (``MEAN_RGB``/``STDDEV_RGB`` × 255): normalised, a batch of
  them has per-channel mean ≈ 0 and std ≈ 1."""
  from orthojax.train.data.imagenet import MEAN_RGB, STDDEV_RGB
  rng = np.random.default_rng(i)
  shape = tuple(int(rng.integers(low, high)) if s is None else s for s in shape)
  colour = rng.normal(np.asarray(MEAN_RGB) * 255, np.asarray(STDDEV_RGB) * 255)
  return np.broadcast_to(np.clip(np.round(colour), 0, 255), shape).astype(np.uint8)
