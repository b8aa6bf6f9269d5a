"""Argument checks shared by the optimizer constructors: one line naming the argument."""

from __future__ import annotations

import math
from typing import Any

import jax

from orthojax.linalg import BUCKETS, leaf_names, views_for
from orthojax.manifolds import Manifold


def check_rate(who: str, value: Any, name: str = "learning_rate", *,
               allow_zero: bool = False) -> None:
  """Raise ValueError unless ``value`` is a schedule (a callable, not checked) or a finite
  number above zero (at least zero with ``allow_zero``).

  A negative learning rate turns a descent method into an ascent one and a negative
  penalty strength rewards what the penalty measures; neither is ever what a constructor
  call means, so they are refused here as the command line refuses them. (A schedule may
  return anything: it is the user's own function.)
  """
  if callable(value) or traced(value):   # a schedule; inject_hyperparams
    return
  try:
    number = float(value)
  except (TypeError, ValueError):
    raise ValueError(f"{who}: {name}={value!r}; pass a positive number or an optax "
                     f"schedule") from None
  if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
    bound = "at least 0" if allow_zero else "above 0"
    why = ("would reward what the penalty measures" if name == "strength"
           else "would ascend the loss")
    raise ValueError(f"{who}: {name}={value!r} must be a finite number {bound} (a negative "
                     f"{name.replace('_', ' ')} {why}); pass e.g. 1e-3, or an optax "
                     f"schedule")


def traced(value: Any) -> bool:
  """Whether a constructor's argument arrives traced (``optax.inject_hyperparams`` hands
  every numeric argument over as an array, traced in a jitted update): its range cannot
  be checked up front."""
  return isinstance(value, jax.core.Tracer)


def injected(value: Any) -> bool:
  """Whether a constructor's argument is an array, as ``optax.inject_hyperparams`` hands
  every numeric one over (concrete at ``init``, traced in a jitted ``update``): a choice of
  program made from it must not depend on its value, or ``init`` and ``update`` differ."""
  return isinstance(value, (jax.Array, jax.core.Tracer))


def check_decay(who: str, value: Any, name: str) -> None:
  """Raise ValueError in one line unless ``value`` — a momentum or moment decay, which
  weighs the past against the new gradient — is a number in [0, 1): at 1 or above the
  average grows without bound, below 0 it alternates sign. A traced value passes."""
  if traced(value):
    return
  try:
    ok = 0.0 <= float(value) < 1.0
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"{who}: {name} must be in [0, 1), got {value!r}")


def check_static(who: str, value: Any, name: str) -> None:
  """Raise ValueError in one line if ``value``, which sets the program's structure (a loop
  count), is an array rather than a Python number."""
  if injected(value):
    raise ValueError(f"{who}: {name} sets the program's structure and must be a Python int, "
                     f"not an array (under optax.inject_hyperparams pass "
                     f"static_args=({name!r},))")


def check_matrices(who: str, params: Any, views: Any) -> None:
  """Raise ValueError, naming the leaves, if a view says a leaf of ``params`` is not a
  matrix (``False``: GmP's angles, biases, norm gains and scales as the ``oj.nn`` layers
  record them). Called by the links that keep a state per matrix (momentum, Adam's
  moments, Cayley's): such a leaf belongs to a Euclidean optimizer, where
  :func:`orthojax.optim.partition` routes it. The stateless links (projection,
  retraction) pass it through unchanged, so ``rsgd`` without momentum gives it an SGD step.
  """
  bad = [name for name, view in zip(leaf_names(params), views_for(params, views))
         if view is False]
  if bad:
    raise ValueError(f"{who}: leaves {bad} are not matrices; route them to a Euclidean "
                     "optimizer with orthojax.optim.partition")


def check_bucket(who: str, bucket: Any) -> None:
  """Raise ValueError in one line unless ``bucket`` is one of
  :data:`orthojax.linalg.BUCKETS` (how the update runs over many matrices)."""
  if bucket not in BUCKETS:
    raise ValueError(f"{who}: bucket={bucket!r}; choose one of {BUCKETS} (zero-padded stacks "
                     f"of a shared small side, stacks of one shape, or one program per leaf)")


def check_manifold(who: str, manifold: Any) -> None:
  """Raise TypeError in one line unless ``manifold`` is an orthojax manifold."""
  if not isinstance(manifold, Manifold):
    raise TypeError(f"{who}: manifold must be an orthojax.manifolds.Manifold, got {manifold!r}")


def require_params(who: str, params: Any) -> None:
  """Raise ValueError in one line when ``update`` was called without the params (every
  manifold step needs the point it starts from)."""
  if params is None:
    raise ValueError(f"{who} needs the current params: call tx.update(updates, state, params)")


SECOND_MOMENTS = ("elementwise", "matrix", "matrix_sum")
"""Riemannian Adam's second moments (:func:`orthojax.optim.scale_by_riemannian_adam`)."""


def check_second_moment(who: str, second_moment: Any) -> None:
  """Raise ValueError in one line unless ``second_moment`` is one of :data:`SECOND_MOMENTS`."""
  if second_moment not in SECOND_MOMENTS:
    raise ValueError(f"{who}: unknown second_moment={second_moment!r}; "
                     f"choose one of {SECOND_MOMENTS}")
