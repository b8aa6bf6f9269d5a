"""Batches from in-memory arrays: global order, per-process slices, exact resume.

Used for every dataset small enough to hold in host memory (MNIST, CIFAR-10,
SVHN, UCI, the toy sets, digits). Unlike a per-process shard of the data
(``tfds.split_for_jax_process``), here **every process computes the same
global order** and takes its own slice of each *global* batch:

* epoch ``e`` visits the examples in ``np.random.default_rng([seed, e])``
  order; global batch ``j`` of the epoch is the order's entries
  ``[j·G, (j+1)·G)`` with ``G = batch_size · process_count``
  (``drop_remainder``: the last ``n mod G`` of each epoch are skipped, a
  different set every epoch);
* process ``p`` yields rows ``[p·b, (p+1)·b)`` of that global batch, so the
  global batch that ``jax.make_array_from_process_local_data`` assembles is
  the same whatever the number of processes — a run can be resumed on a
  different topology and a 2-process run equals a 1-process run;
* ``start_batch = k`` starts at epoch ``k // steps_per_epoch``, batch
  ``k mod steps_per_epoch`` — O(1), nothing is read and dropped.

Evaluation pads the last global batch: every process yields the same number
of batches (``ceil(n / G)``), and a ``mask`` marks the real rows, so each
example is counted exactly once by a masked mean.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator

import numpy as np

Batch = dict[str, np.ndarray]
Transform = Callable[[np.ndarray], np.ndarray]


def resolve_process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  """``(index, count)``: the arguments, or ``jax.process_index()/process_count()``.

  Passing both explicitly simulates a multi-process run in one process
  (tests, data inspection); the defaults are the real JAX processes.
  """
  if process_index is None or process_count is None:
    import jax  # deferred: pure data users need not initialise a backend
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if process_count < 1 or not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index}, process_count={process_count}: "
                     f"need 0 <= process_index < process_count")
  return int(process_index), int(process_count)


def check_batch_size(batch_size: int | None) -> int | None:
  """The per-process batch size, or None for "the whole split" (``-1``/None)."""
  if batch_size is None or batch_size == -1:
    return None
  if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
    raise ValueError(f"batch_size={batch_size!r}: a positive per-process batch size, "
                     f"or -1/None for the whole split")
  return int(batch_size)


def epoch_seed(seed: int, epoch: int) -> list[int]:
  """SeedSequence entropy for one epoch (non-negative, any int ``seed``)."""
  return [int(seed) % 2**63, int(epoch)]


def train_batches(arrays: Batch, *, batch_size: int | None, seed: int, start_batch: int,
                  process_index: int, process_count: int,
                  transform: dict[str, Transform] | None = None) -> Iterator[Batch]:
  """Infinite, reshuffled-per-epoch training batches of this process.

  Args:
    arrays: name -> array with the examples on axis 0 (all the same length).
    batch_size: per-process batch size; None = the whole split (each process
      gets ``n // process_count`` examples a step).
    seed: shuffling seed (same seed, same order).
    start_batch: number of batches to skip (exact resume).
    process_index, process_count: this process and how many there are.
    transform: name -> function applied to each batch's array (e.g. uint8
      images to normalised float32), after slicing.

  Returns:
    An iterator of dicts of numpy arrays.

  Raises:
    ValueError: a global batch larger than the split, or ``start_batch < 0``.
  """
  n = len(next(iter(arrays.values())))
  b = n // process_count if batch_size is None else batch_size
  global_batch = b * process_count
  steps = n // global_batch if global_batch else 0
  if steps == 0:
    raise ValueError(f"global batch {global_batch} (batch_size {b} x {process_count} "
                     f"process(es)) is larger than the {n} training examples")
  if start_batch < 0:
    raise ValueError(f"start_batch={start_batch}: must be >= 0")
  transform = transform or {}

  def gen() -> Iterator[Batch]:
    epoch, offset = divmod(int(start_batch), steps)
    while True:
      order = np.random.default_rng(epoch_seed(seed, epoch)).permutation(n)
      for j in range(offset, steps):
        start = j * global_batch + process_index * b
        idx = order[start:start + b]
        yield {k: transform.get(k, _identity)(v[idx]) for k, v in arrays.items()}
      epoch, offset = epoch + 1, 0

  return gen()


def eval_batches(arrays: Batch, *, batch_size: int | None, process_index: int,
                 process_count: int, transform: dict[str, Transform] | None = None
                 ) -> Iterator[Batch]:
  """Every example exactly once, in order, padded; adds ``mask`` (float32 1/0).

  Padding rows are zeros (after ``transform``) with mask 0. All processes
  yield the same number of batches, ``ceil(n / (batch_size · count))``.

  Args:
    arrays, transform: as for :func:`train_batches`.
    batch_size: per-process batch size; None = one batch per process
      holding its share of the whole split (``ceil(n / count)`` rows).
    process_index, process_count: this process and how many there are.
  """
  n = len(next(iter(arrays.values())))
  b = max(math.ceil(n / process_count), 1) if batch_size is None else batch_size
  global_batch = b * process_count
  num_batches = math.ceil(n / global_batch)
  transform = transform or {}

  def gen() -> Iterator[Batch]:
    for j in range(num_batches):
      idx = j * global_batch + process_index * b + np.arange(b)
      valid = idx < n
      safe = np.where(valid, idx, 0)
      out = {}
      for k, v in arrays.items():
        part = np.array(transform.get(k, _identity)(v[safe]))
        part[~valid] = 0
        out[k] = part
      out["mask"] = valid.astype(np.float32)
      yield out

  return gen()


def _identity(x: np.ndarray) -> np.ndarray:
  return x
