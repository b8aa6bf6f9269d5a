"""End to end on mocked tfds for every tfds-backed dataset.

In-memory sets (CIFAR-10, SVHN, MNIST views) run on ``tfds.testing.mock_data``;
the streamed ImageNets on :func:`numbered_mock`, whose examples carry their
index as label and honour ``split_for_jax_process`` sub-splits (tfds' own mock
returns the same examples for every sub-split).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow_datasets as tfds

from orthojax.train import data
from orthojax.train.data import images
from orthojax.train.data import mnist
from tests.train.data._mock import imagenet_like
from tests.train.data._mock import numbered_mock

STREAMED = ("imagenet2012", "imagenet_resized/32x32")
N_STREAMED, N_MOCK = 24, 40
CASES = [("cifar10", {}), ("cifar10", {"flatten": True}), ("svhn_cropped", {}),
         ("mnist", {"view": "row"}), ("mnist", {"view": "pixel"}),
         ("mnist", {"view": "permuted"}), ("imagenet2012", {}), ("imagenet_resized/32x32", {})]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for n, o in CASES]


def _mocked(name: str, num_examples: int | None = None):
  if name in STREAMED:
    return numbered_mock(num_examples or N_STREAMED, imagenet_like)
  return tfds.testing.mock_data(num_examples=num_examples or N_MOCK)


def _ids(name: str, batch: dict) -> list:
  """Identities of the real rows: the label (= index) for streamed sets, else the bytes."""
  rows = np.ones(len(batch["y"]), bool) if "mask" not in batch else batch["mask"] > 0
  if name in STREAMED:
    return batch["y"][rows].tolist()
  return [r.tobytes() for r in batch["x"][rows]]


def _take(it, k: int) -> list[dict]:
  return [next(it) for _ in range(k)]


def _assert_same(a: list[dict], b: list[dict]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_shapes_dtypes_labels(name, opts):
  with _mocked(name):
    info = data.dataset_info(name, **opts)
    batch = next(data.train_batches(name, batch_size=4, seed=0, **opts))
    ev = next(data.eval_batches(name, batch_size=3, **opts))
  assert info.task == "classification" and info.num_classes in (10, 1000)
  assert batch["x"].shape == (4,) + info.input_shape and batch["x"].dtype == np.float32
  assert np.all(np.isfinite(batch["x"]))
  assert batch["y"].shape == (4,) and batch["y"].dtype == np.int32
  assert np.all((batch["y"] >= 0) & (batch["y"] < info.num_classes))
  assert ev["x"].shape == (3,) + info.input_shape and ev["x"].dtype == np.float32
  assert ev["mask"].dtype == np.float32 and set(ev["mask"].tolist()) <= {0.0, 1.0}
  expected = {"mnist": {"row": (28, 28), "pixel": (784, 1), "permuted": (784, 1)}.get(
      opts.get("view")), "cifar10": (3072,) if opts.get("flatten") else (32, 32, 3),
      "svhn_cropped": (32, 32, 3), "imagenet2012": (224, 224, 3),
      "imagenet_resized/32x32": (32, 32, 3)}[name]
  assert info.input_shape == expected
  # What the pod compile check builds from (no files): same model-facing fields, and
  # the batch spec the steps are compiled for is what the pipelines yield.
  published = data.dataset_info(name, published=True, **opts)
  for field in ("task", "input_shape", "num_classes", "eval_split"):
    assert getattr(published, field) == getattr(info, field), field
  for b, size, is_eval in ((batch, 4, False), (ev, 3, True)):
    spec = published.batch_spec(size, eval=is_eval)
    assert {k: (v.shape, v.dtype) for k, v in b.items()} == spec


def test_published_sizes_are_the_tfds_catalogue_numbers():
  assert data.dataset_info("imagenet2012", published=True).num_train == 1_281_167
  assert data.dataset_info("imagenet_resized/32x32", published=True).num_eval == 50_000
  assert data.dataset_info("cifar10", published=True).num_eval == 10_000
  assert data.dataset_info("svhn_cropped", published=True).num_train == 73_257
  mnist_info = data.dataset_info("mnist", published=True)
  assert (mnist_info.num_train, mnist_info.num_eval) == (48_000, 12_000)   # SPEC E6 splits
  with pytest.raises(ValueError, match="unknown option"):
    data.dataset_info("cifar10", published=True, bogus=1)


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_eval_two_processes_count_every_example_once(name, opts):
  with _mocked(name):
    info = data.dataset_info(name, **opts)
    everything = [i for b in data.eval_batches(name, batch_size=-1, process_index=0,
                                               process_count=1, **opts) for i in _ids(name, b)]
    per_process = [list(data.eval_batches(name, batch_size=3, process_index=p,
                                          process_count=2, **opts)) for p in range(2)]
  assert len(everything) == info.num_eval == len(set(everything))
  assert len(per_process[0]) == len(per_process[1]) > 0
  seen = [i for batches in per_process for b in batches for i in _ids(name, b)]
  assert sorted(seen) == sorted(everything)          # each example exactly once
  for b in (b for batches in per_process for b in batches):
    assert not np.any(b["x"][b["mask"] == 0])        # padding rows are zeros


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_train_order_deterministic_and_resumable(name, opts):
  with _mocked(name):
    info = data.dataset_info(name, **opts)
    steps = info.num_train // 4
    first = _take(data.train_batches(name, batch_size=4, seed=7, **opts), steps + 3)
    again = _take(data.train_batches(name, batch_size=4, seed=7, **opts), steps + 3)
    other = _take(data.train_batches(name, batch_size=4, seed=8, **opts), 2)
    resumed = _take(data.train_batches(name, batch_size=4, seed=7, start_batch=steps + 1,
                                       **opts), 2)
  _assert_same(first, again)
  assert not all(np.array_equal(a["x"], b["x"]) for a, b in zip(first, other))
  _assert_same(resumed, first[steps + 1:steps + 3])  # across an epoch boundary
  # Epochs are reshuffled.
  assert [_ids(name, b) for b in first[:steps]] != [_ids(name, b) for b in first[steps:2 * steps]]


@pytest.mark.parametrize("name,opts", CASES, ids=IDS)
def test_two_processes_read_disjoint_shards_covering_the_data(name, opts):
  with _mocked(name):
    info = data.dataset_info(name, **opts)
    all_train = {i for b in data.eval_batches(name, split="train", batch_size=-1,
                                              process_index=0, process_count=1, **opts)
                 for i in _ids(name, b)}
    steps = info.num_train // 8
    procs = [_take(data.train_batches(name, batch_size=4, seed=3, process_index=p,
                                      process_count=2, **opts), steps) for p in range(2)]
    single = _take(data.train_batches(name, batch_size=8, seed=3, process_index=0,
                                      process_count=1, **opts), steps)
  epoch = [[i for b in batches for i in _ids(name, b)] for batches in procs]
  assert not set(epoch[0]) & set(epoch[1])
  union = epoch[0] + epoch[1]
  assert len(union) == len(set(union)) == steps * 8 == len(all_train)  # one epoch: all, once
  assert set(union) == all_train
  if name not in STREAMED:  # one global order: the global batch ignores the process count
    for j in range(steps):
      np.testing.assert_array_equal(np.concatenate([procs[0][j]["x"], procs[1][j]["x"]]),
                                    single[j]["x"])


def test_streamed_eval_uneven_shards_are_padded_alike():
  with numbered_mock(23):
    batches = [list(data.eval_batches("imagenet_resized/32x32", batch_size=4, process_index=p,
                                      process_count=2)) for p in range(2)]
  assert [len(b) for b in batches] == [3, 3]                      # shards of 12 and 11
  assert [sum(b["mask"].sum() for b in bs) for bs in batches] == [12, 11]
  labels = sorted(i for bs in batches for b in bs for i in b["y"][b["mask"] > 0].tolist())
  assert labels == list(range(23))


@pytest.mark.parametrize("name", ["cifar10", "svhn_cropped", "mnist"])
def test_in_memory_normalisation_statistics(name):
  # tfds' mock pixels are uniform on {0..254}: mean ≈ 0.498, std ≈ 0.2887 of 255.
  mean, std = ((mnist.MEAN,), (mnist.STD,)) if name == "mnist" else images.STATS[name]
  with tfds.testing.mock_data(num_examples=200):
    x = np.concatenate([b["x"] for b in data.eval_batches(name, split="test", batch_size=-1)])
  x = x.reshape(-1, len(mean))
  np.testing.assert_allclose(x.mean(0), (127 / 255 - np.array(mean)) / std, atol=0.02)
  np.testing.assert_allclose(x.std(0), 73.6 / 255 / np.array(std), rtol=0.02)


@pytest.mark.parametrize("name", STREAMED)
def test_streamed_normalisation_statistics(name):
  # Constant-colour images with ImageNet's pixel statistics: eval ≈ N(0, 1) per
  # channel; training adds colour jitter (wider, still centred).
  with numbered_mock(48, imagenet_like):
    ev = np.concatenate([b["x"] for b in data.eval_batches(name, batch_size=-1)])
    tr = next(data.train_batches(name, batch_size=48, seed=0))["x"]
  ev, tr = ev.mean((1, 2)), tr.mean((1, 2))          # per-image colour (constant images)
  assert np.all(np.abs(ev.mean(0)) < 0.4) and np.all(np.abs(ev.std(0) - 1) < 0.3), ev.std(0)
  assert np.all(np.abs(tr.mean(0)) < 0.45) and np.all((tr.std(0) > 0.8) & (tr.std(0) < 1.8))
