"""tfds plumbing: prepared builders, clear missing-data errors, streamed batches.

Two ways to read a tfds dataset:

* :func:`load_arrays` — the whole split into numpy, once per process (cached);
  for the small sets (MNIST, CIFAR-10, SVHN), which then go through the
  global-order pipeline of :mod:`orthojax.train.data._arrays`.
* :func:`stream_train` / :func:`stream_eval` — tf.data pipelines over this
  process's shard (``tfds.split_for_jax_process``), for ImageNet-sized sets.

Streamed training is deterministic from the seed and resumable exactly:

* epoch ``e`` gets seed ``s_e`` (``np.random.SeedSequence([seed, e])``):
  ``shuffle_files=True`` with ``tfds.ReadConfig(shuffle_seed=s_e)`` orders
  the record files, then ``Dataset.shuffle(buffer, seed=s_e)`` the records,
  with ``deterministic`` tf.data options (parallel interleave and map keep
  their order);
* each record is numbered by its position ``i`` in the epoch
  (``Dataset.enumerate``) and augmented with *stateless* random ops seeded
  by ``(s_e, i)`` — the same example at the same position gets the same crop
  and flip, however many threads run the map;
* a process's shard has the same size on every process (``drop_remainder``
  in ``split_for_jax_process``) and each epoch is cut to
  ``steps = shard // batch_size`` full batches, so all processes take the
  same number of steps per epoch;
* ``start_batch = k`` starts at epoch ``k // steps`` and skips
  ``(k mod steps)·batch_size`` records *before* decoding and augmentation
  (records are read and shuffled, JPEGs are not decoded): the stream then
  equals the uninterrupted one with ``k`` batches dropped.

Epochs are chained in Python (the next epoch's pipeline is built when the
previous one ends), which costs one shuffle-buffer fill per epoch.

With several processes each reads its own shard, so the *global* batch
depends on the number of processes (unlike the in-memory pipeline); resume
on the same number of processes for an exact continuation.
"""

from __future__ import annotations

import collections
import math
import os
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds
from tensorflow_datasets.core import dataset_builder as _tfds_builder
from tensorflow_datasets.core.download import resource as _tfds_resource

from orthojax.train.data import _reachable
from orthojax.train.data._info import DatasetNotFoundError
from orthojax.train.data._tf import tf

Batch = dict[str, np.ndarray]

_ARRAY_CACHE: "collections.OrderedDict[Any, dict[str, np.ndarray]]" = collections.OrderedDict()
_ARRAY_CACHE_SIZE = 6


def _root(builder: tfds.core.DatasetBuilder) -> str:
  return str(builder.data_dir_root)


def build_command(name: str, root: str) -> str:
  return f"tfds build {name} --data_dir={root}"


def prepared_builder(name: str, data_dir: str | None, *, download: bool = True,
                     manual_instructions: Callable[[str], str] | None = None
                     ) -> tfds.core.DatasetBuilder:
  """``tfds.builder(name)``, prepared (downloaded and converted) or a clear error.

  Args:
    name: tfds name, e.g. ``"mnist"``, ``"imagenet_resized/32x32"``.
    data_dir: tfds data directory; None = tfds' default
      (``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``).
    download: for datasets tfds can download itself, do so when missing.
    manual_instructions: for datasets tfds cannot download (ImageNet):
      ``root -> message`` with the manual steps; raised when missing.

  Raises:
    DatasetNotFoundError: the data is missing and cannot be fetched here.
  """
  builder = tfds.builder(name, data_dir=data_dir)
  if builder.is_prepared() or _readable(builder):
    return builder
  root = _root(builder)
  if manual_instructions is not None:
    raise DatasetNotFoundError(manual_instructions(root))
  if not download:
    raise DatasetNotFoundError(
        f"{name} is not prepared in {root} (tfds data_dir) and download=False. Run "
        f"`{build_command(name, root)}` on a machine with internet access and copy "
        f"{root}/{name.split('/')[0]} here, or drop download=False.")
  try:
    blocked = _reachable.unreachable(_pending_urls(builder))
    if blocked:   # fail now, not after tfds' retries (3 min 24 s)
      raise ConnectionError(f"cannot reach {blocked}")
    builder.download_and_prepare()
  except Exception as e:  # offline, missing optional packages, ...
    raise DatasetNotFoundError(
        f"{name} is not prepared in {root} (tfds data_dir) and downloading it failed: "
        f"{type(e).__name__}: {e}. Run `{build_command(name, root)}` on a machine with "
        f"internet access and copy {root}/{name.split('/')[0]} to this data_dir.") from e
  return builder


def _pending_urls(builder: tfds.core.DatasetBuilder) -> list[str]:
  """The URLs of ``builder``'s checksums file that ``download_and_prepare`` would fetch:
  those not already in its download directory (``<root>/downloads[/<name>]``, under
  tfds' name for the file) nor, by file name, in ``downloads/manual``. Empty where tfds
  records no URLs for the set, or its layout is not the one read here (then tfds is left
  to find out itself)."""
  try:
    downloads = os.path.join(_root(builder), "downloads")
    pending = []
    for url, info in (builder.url_infos or {}).items():
      name = _tfds_resource.get_dl_fname(url, info.checksum)
      places = [os.path.join(downloads, name), os.path.join(downloads, builder.name, name),
                os.path.join(downloads, "manual", info.filename or name)]
      if not any(os.path.exists(p) for p in places):
        pending.append(url)
    return pending
  except Exception:  # pylint: disable=broad-except  (tfds internals moved: no probe)
    return []


def _readable(builder: tfds.core.DatasetBuilder) -> bool:
  """Whether ``as_dataset`` works although the builder reports no files.

  True under ``tfds.testing.mock_data``, which patches ``as_dataset`` but
  not ``is_prepared``.
  """
  try:
    splits = list(builder.info.splits) or ["train"]
    builder.as_dataset(split=splits[0])
  except (AssertionError, FileNotFoundError, ValueError, KeyError):
    return False
  return True


def num_examples(builder: tfds.core.DatasetBuilder, split: Any) -> int:
  """Examples in ``split`` (a name, a sub-split string or a ``tfds.even_splits`` part)."""
  if isinstance(split, str):
    try:
      count = builder.info.splits[split].num_examples
      if count > 0:
        return int(count)
    except (KeyError, ValueError, TypeError):
      pass  # unknown metadata (mock data): ask the dataset
  count = int(builder.as_dataset(split=split).cardinality())
  if count < 0:
    raise ValueError(f"{builder.name}: the size of split {split!r} is unknown")
  return count


def _cache_key(builder: tfds.core.DatasetBuilder, split: str) -> tuple:
  # The current as_dataset implementations are part of the key: under
  # tfds.testing.mock_data they are patched, so mocked and real data (and two
  # mock contexts) never share an entry. Holding the functions keeps ids unique.
  return (builder.info.full_name, str(builder.data_dir), split,
          _tfds_builder.DatasetBuilder.as_dataset,
          _tfds_builder.FileReaderBuilder._as_dataset)


def load_arrays(builder: tfds.core.DatasetBuilder, split: str,
                keys: tuple[str, ...] = ("image", "label")) -> dict[str, np.ndarray]:
  """The whole ``split`` as numpy arrays (cached per process, read-only)."""
  key = _cache_key(builder, split) + (keys,)
  if key in _ARRAY_CACHE:
    _ARRAY_CACHE.move_to_end(key)
    return _ARRAY_CACHE[key]
  ds = builder.as_dataset(split=split, shuffle_files=False)
  ds = ds.map(lambda ex: {k: ex[k] for k in keys}).batch(8192).prefetch(2)
  parts = list(ds.as_numpy_iterator())
  arrays = {k: np.concatenate([p[k] for p in parts]) if parts else np.zeros((0,))
            for k in keys}
  for v in arrays.values():
    v.setflags(write=False)
  _ARRAY_CACHE[key] = arrays
  while len(_ARRAY_CACHE) > _ARRAY_CACHE_SIZE:
    _ARRAY_CACHE.popitem(last=False)
  return arrays


def _epoch_seed(seed: int, epoch: int) -> int:
  return int(np.random.SeedSequence([int(seed) % 2**63, epoch]).generate_state(1, np.uint32)[0])


def _options() -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = True
  return options


def stream_train(builder: tfds.core.DatasetBuilder, *, split: str, batch_size: int, seed: int,
                 start_batch: int, process_index: int, process_count: int,
                 preprocess: Callable[[dict, tf.Tensor], tuple[tf.Tensor, tf.Tensor]],
                 shuffle_buffer: int, decoders: dict | None = None) -> Iterator[Batch]:
  """Infinite training batches of this process's shard (see the module docstring).

  Args:
    builder: a prepared builder.
    split: the global training split (``"train"``).
    batch_size: per-process batch size.
    seed: shuffling/augmentation seed.
    start_batch: batches to skip (exact resume).
    process_index, process_count: this process and how many there are.
    preprocess: ``(example, seed[2] int64) -> (x, y)``, stateless random ops
      only (seeded by ``seed``), static output shapes.
    shuffle_buffer: records in the shuffle buffer.
    decoders: tfds decoders, e.g. ``{"image": tfds.decode.SkipDecoding()}``.

  Raises:
    ValueError: a batch larger than the shard, or ``start_batch < 0``.
  """
  local = tfds.split_for_jax_process(split, process_index=process_index,
                                     process_count=process_count, drop_remainder=True)
  n_local = num_examples(builder, local)
  steps = n_local // batch_size
  if steps == 0:
    raise ValueError(f"{builder.name}: batch_size {batch_size} per process is larger than "
                     f"this process's {n_local} training examples")
  if start_batch < 0:
    raise ValueError(f"start_batch={start_batch}: must be >= 0")

  def epoch_dataset(epoch: int, offset: int) -> tf.data.Dataset:
    s = _epoch_seed(seed, epoch)
    read_config = tfds.ReadConfig(shuffle_seed=s, try_autocache=False, skip_prefetch=True,
                                  options=_options())
    ds = builder.as_dataset(split=local, shuffle_files=True, decoders=decoders,
                            read_config=read_config)
    ds = ds.shuffle(shuffle_buffer, seed=s, reshuffle_each_iteration=False)
    ds = ds.enumerate().take(steps * batch_size).skip(offset * batch_size)

    def fn(i, example):
      x, y = preprocess(example, tf.stack([tf.constant(s, tf.int64), i]))
      return {"x": x, "y": y}

    ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    return ds.with_options(_options())

  def gen() -> Iterator[Batch]:
    epoch, offset = divmod(int(start_batch), steps)
    while True:
      yield from epoch_dataset(epoch, offset).as_numpy_iterator()
      epoch, offset = epoch + 1, 0

  return gen()


def stream_eval(builder: tfds.core.DatasetBuilder, *, split: str, batch_size: int | None,
                process_index: int, process_count: int,
                preprocess: Callable[[dict], tuple[tf.Tensor, tf.Tensor]],
                decoders: dict | None = None) -> Iterator[Batch]:
  """This process's shard of ``split``, each example once, padded with ``mask``.

  The shards (``split_for_jax_process`` without ``drop_remainder``) differ
  by at most one example; every process yields
  ``ceil(ceil(n / count) / batch_size)`` batches, the missing rows being
  zeros with ``mask`` 0.

  Args:
    builder, split, process_index, process_count: as for :func:`stream_train`.
    batch_size: per-process batch size; None = one batch with the whole shard.
    preprocess: ``example -> (x, y)`` with static output shapes.
    decoders: tfds decoders.
  """
  local = tfds.split_for_jax_process(split, process_index=process_index,
                                     process_count=process_count, drop_remainder=False)
  n_local = num_examples(builder, local)
  per_process = max(math.ceil(num_examples(builder, split) / process_count), n_local)
  b = max(per_process, 1) if batch_size is None else batch_size
  num_batches = math.ceil(per_process / b)
  ds = builder.as_dataset(split=local, shuffle_files=False, decoders=decoders,
                          read_config=tfds.ReadConfig(skip_prefetch=True, options=_options()))

  def fn(example):
    x, y = preprocess(example)
    return {"x": x, "y": y, "mask": tf.constant(1.0, tf.float32)}

  ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  pad = num_batches * b - n_local
  if pad:
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), ds.element_spec)
    ds = ds.concatenate(tf.data.Dataset.from_tensors(zeros).repeat(pad))
  ds = ds.batch(b, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
  return ds.with_options(_options()).as_numpy_iterator()
