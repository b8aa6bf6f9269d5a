"""``views=None``: the views a model's Variables record, read at ``init`` and kept in the state.

``nnx.Optimizer(model, tx, wrt=nnx.Param)`` hands ``tx.init`` the Variables themselves
(``nnx.state(model, wrt)``), whose metadata says each parameter's matrix view
(``matrix_view``: a view, or False for GmP's angles, biases, scales — not a matrix);
``tx.update`` gets their bare values, which cannot say it. So an orthojax transformation
built without ``views=`` is a :class:`ViewsFromInit`: it is a function of the views
(``build(views) -> GradientTransformation``), and the views are an input of ``init``:

* ``init`` reads them from the Variables (:func:`orthojax.linalg.recorded_views`), builds
  the transformation for them and keeps them in its state, :class:`RecordedViewsState`,
  whose ``views`` is static (no arrays: part of the tree structure, so ``jax.jit``,
  checkpoints and sharding see only the inner state's arrays);
* ``update`` builds the transformation for ``state.views`` and runs it.

Nothing is ambient: the views travel as an argument (``build``'s) and in the state. Where
``init`` gets bare arrays (a plain parameter dict, the trainer) or Variables that record
no view (``nnx.Linear``), the state is the transformation's own and every view is
inferred (``INFERRED``). An explicit ``views=`` builds the transformation at once,
with no wrapper.

A wrapper that runs a transformation on parts of the tree
(:func:`orthojax.optim.shard_update`) asks a :class:`ViewsFromInit` for the
transformation of given views (:meth:`ViewsFromInit.with_views`), so that the parts
follow the same views.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import optax

from orthojax import linalg

INFERRED = linalg.RecordedViews(())
"""The views of a tree whose Variables record none: every leaf's view is inferred
(:func:`orthojax.linalg.infer_view`)."""

Build = Callable[[Any], optax.GradientTransformation]


class RecordedViewsState(NamedTuple):
  """State of a :class:`ViewsFromInit` initialised on Flax NNX Variables that record views.

  Attributes:
    inner: the transformation's own state.
    views: the :class:`orthojax.linalg.RecordedViews` read at ``init`` (static: no
      leaves), which ``update`` builds the transformation for.
  """

  inner: optax.OptState
  views: linalg.RecordedViews


class ViewsFromInit(optax.GradientTransformationExtraArgs):
  """A transformation whose matrix views are read at ``init`` (module docstring).

  What an orthojax constructor returns when ``views`` is None; an
  ``optax.GradientTransformationExtraArgs`` like any other, plus :meth:`with_views`.
  """

  def __new__(cls, init: Any, update: Any, build: Build | None = None) -> "ViewsFromInit":
    self = super().__new__(cls, init, update)
    self.build = build
    self._built = {}
    return self

  def with_views(self, views: Any) -> optax.GradientTransformation:
    """The transformation for ``views`` (a :class:`orthojax.linalg.RecordedViews`, or any
    ``views=`` value), built once per recorded value."""
    if not isinstance(views, linalg.RecordedViews):
      return self.build(views)
    if views not in self._built:
      self._built[views] = self.build(views)
    return self._built[views]


def views_from_init(build: Build, views: Any) -> optax.GradientTransformation:
  """``build(views)``; for ``views=None``, a :class:`ViewsFromInit` over ``build``.

  Args:
    build: the transformation for given views; it is called with a value that is never
      None (the views given, those recorded, or :data:`INFERRED`).
    views: a constructor's ``views`` argument.
  """
  if views is not None:
    return build(views)

  def init_fn(params):
    recorded = linalg.recorded_views(params)
    if recorded is None:
      return tx.with_views(INFERRED).init(params)
    return RecordedViewsState(inner=tx.with_views(recorded).init(params), views=recorded)

  def update_fn(updates, state, params=None, **extra_args):
    if not isinstance(state, RecordedViewsState):
      inner = optax.with_extra_args_support(tx.with_views(INFERRED))
      return inner.update(updates, state, params, **extra_args)
    inner = optax.with_extra_args_support(tx.with_views(state.views))
    updates, inner_state = inner.update(updates, state.inner, params, **extra_args)
    return updates, RecordedViewsState(inner=inner_state, views=state.views)

  tx = ViewsFromInit(init_fn, update_fn, build)
  tx.with_views(INFERRED)   # built now: the links' argument checks fail here, not at init
  return tx
