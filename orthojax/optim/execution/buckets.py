"""Bucketing, applied explicitly: :func:`bucketed` and :func:`per_leaf`.

orthojax's transformations run their per-matrix work through
:func:`orthojax.linalg.map_views` with ``bucket=True``: leaves whose matrix views share
shape, dtype and view are stacked on a new batch axis and updated by one batched
program, then scattered back — a ResNet-50's 53 conv kernels become 20 buckets, and a
GPU launches one chain of kernels per bucket instead of per leaf. The results equal the
per-leaf ones to rounding and the state stays per leaf.

Whether the leaves are bucketed is decided while a transformation is traced. On by
default; :func:`bucketed` fixes it for one transformation, like optax's wrappers:
``per_leaf(tx)`` traces ``tx``'s ``init`` and ``update`` with one chain of kernels per
leaf (to measure, or to compare). It composes with :func:`orthojax.optim.shard_update`
either way round: an owner buckets its own matrices. The mechanism underneath is
:func:`orthojax.linalg.bucketing`, which the wrapper enters around each call.
"""

from __future__ import annotations

from typing import Any

import optax

from orthojax import linalg


def bucketed(tx: optax.GradientTransformation, enabled: bool = True
             ) -> optax.GradientTransformationExtraArgs:
  """``tx`` with its same-shape buckets on (``enabled``) or off, whoever traces it.

  Example::

      tx = oj.optim.bucketed(oj.optim.radam(1e-3, views=views), False)   # per leaf

  Args:
    tx: any transformation; orthojax's bucket their matrices (``map_views`` with
      ``bucket=True``), others are unaffected.
    enabled: stack same-shape matrices (the default everywhere) or not.

  Returns:
    The same updates (to rounding) and the same state as ``tx``.
  """
  tx = optax.with_extra_args_support(tx)
  enabled = bool(enabled)

  def init_fn(params: Any) -> Any:
    with linalg.bucketing(enabled):
      return tx.init(params)

  def update_fn(updates: Any, state: Any, params: Any = None, **extra_args: Any) -> Any:
    with linalg.bucketing(enabled):
      return tx.update(updates, state, params, **extra_args)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def per_leaf(tx: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
  """``tx`` with one chain of kernels per leaf: :func:`bucketed` ``(tx, False)``."""
  return bucketed(tx, False)
