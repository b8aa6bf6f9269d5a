"""``views=None`` on the ``nnx.Optimizer`` path: the views the model's Variables record.

``nnx.Optimizer(model, tx, wrt=nnx.Param)`` hands ``tx.init`` the Variables
themselves (``nnx.state(model, wrt)``), whose metadata says each parameter's
matrix view (``matrix_view``: a view, or False for GmP's angles, biases, scales
— not a matrix); ``tx.update`` gets their bare values (``nnx.as_pure``), which
cannot say it. So an orthojax transformation built without ``views=`` reads the
views at ``init`` (:func:`orthojax.linalg.recorded_views`) and keeps them in its
state — :class:`RecordedViewsState`, whose ``views`` is static: no arrays, part
of the tree structure — and ``update`` makes them current
(:func:`orthojax.linalg.recording`) for every ``views=None`` inside it. The
default then agrees with ``oj.nn.matrix_views(model)``.

Where ``init`` gets bare arrays (a plain parameter dict, the trainer), or
Variables that record no view (``nnx.Linear``), the state is the wrapped
transformation's own and nothing changes: views are inferred as documented. An
explicit ``views=`` is used as given.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple

import optax

from orthojax import linalg


class RecordedViewsState(NamedTuple):
  """State of an orthojax transformation built without ``views=`` and initialised on
  Flax NNX Variables that record matrix views (the ``nnx.Optimizer`` path).

  Attributes:
    inner: the transformation's own state.
    views: the :class:`orthojax.linalg.RecordedViews` read at ``init`` (static: no
      leaves), current while ``update`` runs.
  """

  inner: optax.OptState
  views: linalg.RecordedViews


def with_recorded_views(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """``tx`` (built with ``views=None``) run under the views its ``init`` params record."""

  def init_fn(params):
    # Inside another such transformation (a chain's links), the outer one keeps them.
    views = None if linalg.current_recorded_views() else linalg.recorded_views(params)
    if views is None:
      return tx.init(params)
    with linalg.recording(views):
      return RecordedViewsState(inner=tx.init(params), views=views)

  def update_fn(updates, state, params=None, **extra_args):
    if not isinstance(state, RecordedViewsState):
      return _update(tx, updates, state, params, extra_args)
    with linalg.recording(state.views):
      updates, inner = _update(tx, updates, state.inner, params, extra_args)
    return updates, RecordedViewsState(inner=inner, views=state.views)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _update(tx, updates, state, params, extra_args):
  if isinstance(tx, optax.GradientTransformationExtraArgs):
    return tx.update(updates, state, params, **extra_args)
  return tx.update(updates, state, params)


def reads_recorded_views(constructor: Callable[..., optax.GradientTransformation]
                         ) -> Callable[..., optax.GradientTransformation]:
  """Decorate a constructor with a ``views`` argument: built without one, its
  transformation follows the views the Variables it is initialised on record."""
  signature = inspect.signature(constructor)

  @functools.wraps(constructor)
  def build(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
    tx = constructor(*args, **kwargs)
    if signature.bind(*args, **kwargs).arguments.get("views") is not None:
      return tx
    return with_recorded_views(tx)

  return build
