"""Decoupled soft-orthogonality regularisation as an optax transformation."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from orthojax import linalg
from orthojax import penalties
from orthojax.optim._checks import check_rate, check_static, traced
from orthojax.optim._recorded import views_from_init
from orthojax.optim._scope import scoped


class AddOrthogonalityPenaltyState(NamedTuple):
  """State of :func:`add_orthogonality_penalty` with a scheduled strength.

  Attributes:
    count: number of updates applied so far (the schedule's step).
  """

  count: jnp.ndarray


def add_orthogonality_penalty(
    kind: Any,
    strength: optax.ScalarOrSchedule,
    gain: float = 1.0,
    *,
    mask: Any = None,
    views: Any = None,
    reduction: str = "sum",
    iterations: int = 2,
) -> optax.GradientTransformation:
  r"""Add the gradient of a soft-orthogonality penalty to the updates.

  Decoupled, like ``optax.add_decayed_weights``: the penalty never enters the
  loss; instead, at step ``t`` with parameters ``θ``,

  .. math:: u \leftarrow u + \lambda_t\, \nabla_\theta \sum_{\text{leaves}} P(\theta),

  where ``P`` is the penalty ``kind`` on each constrained leaf (see
  :func:`orthojax.penalties.tree_penalty` for ``mask`` and ``views``). Put
  it before the optimizer's scaling, e.g.
  ``optax.chain(add_orthogonality_penalty("so", 1e-4), optax.sgd(0.1))``,
  for the same effect as adding ``λ P`` to the loss under SGD; after an
  adaptive scaling (Adam), it acts like AdamW's decoupled weight decay.

  Each leaf's gradient is computed on its own (``jax.grad`` of the penalty of
  that leaf), in the leaf's dtype; unconstrained leaves are left untouched.
  ``"srip"`` is stateless here: each step runs ``iterations`` power
  iterations from the fixed start vector.

  Bansal, Chen & Wang (NeurIPS 2018) *decay* the regularisation strength
  during training (e.g. 1e-1 → 1e-3 → 1e-4 → 1e-6 at fixed epochs), because
  a strong orthogonality pull late in training limits what the network can
  fit: pass an optax schedule as ``strength``
  (``optax.piecewise_constant_schedule``, ``optax.linear_schedule``, ...).

  Args:
    kind: a penalty name (``"so"``, ``"half_so"``, ``"dso"``, ``"mc"``,
      ``"srip"``, ``"gain_adjusted_so"``) or a callable
      ``(w, view=...) -> scalar``.
    strength: λ, a float or an optax schedule ``step -> λ_t``.
    gain: ``g`` of ``"gain_adjusted_so"`` (singular values are pulled to
      ``g``; ``optax.inject_hyperparams`` may make it a hyperparameter, as
      ``strength``); must stay 1 for every other kind.
    mask: which leaves to penalise (None: every leaf with >= 2 axes), as in
      :func:`orthojax.penalties.tree_penalty`.
    views: matrix views of the leaves, as in
      :func:`orthojax.penalties.tree_penalty`. None (default): the views the
      parameters' Variables record, read at ``init`` where
      ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` hands it the Variables
      themselves (kept in a :class:`orthojax.optim.RecordedViewsState`): for an
      ``oj.nn`` / ``oj.models`` network the leaves that are not matrices (GmP's
      angles ``theta``, stacked biases and scales: ``matrix_view=False``) are left
      alone, as with ``views=oj.nn.matrix_views(model)``. Initialised on bare
      arrays (a plain parameter dict), it infers: a 2-D array of GmP angles is
      then penalised as a matrix — pass ``oj.nn.matrix_views(model)`` there. (The
      trainer passes the model's own mask, ``orthojax.train.model_zoo.penalty_mask``.)
    reduction: ``"sum"`` or ``"mean"``, passed to a named penalty. A callable
      ``kind`` takes no reduction, so it must be left at ``"sum"``.
    iterations: power iterations of ``"srip"``'s spectral-norm estimate
      (Bansal et al. 2018 use 2); must stay 2 for every other kind.

  Returns:
    An ``optax.GradientTransformation``. Its state is ``optax.EmptyState()``
    for a constant strength and :class:`AddOrthogonalityPenaltyState` (the
    step count) for a schedule — inside a :class:`RecordedViewsState` where
    ``views`` is None and the Variables it is initialised on record views.
    ``update`` requires ``params``.

  Raises:
    ValueError: unknown ``kind`` or ``reduction``; ``gain != 1`` with a kind
      other than ``"gain_adjusted_so"``; ``reduction != "sum"`` with a
      callable kind; non-positive ``gain``; ``iterations != 2`` with a kind
      other than ``"srip"``, or ``iterations < 1``.
  """
  fn = penalties.get_penalty(kind)
  kwargs = _penalty_options(kind, gain, reduction, iterations)
  check_rate("add_orthogonality_penalty", strength, "strength", allow_zero=True)
  return views_from_init(lambda v: _add_penalty(fn, kwargs, strength, mask, v), views)


def _penalty_options(kind: Any, gain: Any, reduction: str, iterations: Any) -> dict[str, Any]:
  """The keyword arguments of the penalty ``kind`` (checked: the docstring's Raises)."""
  kwargs: dict[str, Any] = {}
  if callable(kind):
    if reduction != "sum":
      raise ValueError(f"reduction={reduction!r} only applies to named penalties; "
                       "a callable kind must apply its own reduction")
  else:
    if reduction not in penalties.REDUCTIONS:
      raise ValueError(f"reduction must be one of {penalties.REDUCTIONS}, "
                       f"got reduction={reduction!r}")
    kwargs["reduction"] = reduction
  if kind == "gain_adjusted_so":
    if not traced(gain) and not gain > 0:
      raise ValueError(f"gain must be positive, got gain={gain!r}")
    kwargs["gain"] = gain
  elif not traced(gain) and gain != 1.0:
    raise ValueError(f"gain={gain!r} only applies to kind='gain_adjusted_so', got kind={kind!r}")
  if kind == "srip":
    check_static("add_orthogonality_penalty", iterations, "iterations")
    if int(iterations) < 1:
      raise ValueError(f"iterations must be >= 1, got iterations={iterations!r}")
    kwargs["iterations"] = int(iterations)
  elif not traced(iterations) and iterations != 2:
    raise ValueError(f"iterations={iterations!r} only applies to kind='srip', got kind={kind!r}")
  return kwargs


def _add_penalty(fn, kwargs, strength, mask, views):
  scheduled = callable(strength)

  def init_fn(params):
    del params
    if scheduled:
      return AddOrthogonalityPenaltyState(count=jnp.zeros([], jnp.int32))
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("add_orthogonality_penalty needs the current parameters: pass "
                       "params to update(updates, state, params)")
    if scheduled:
      lam = strength(state.count)
      state = AddOrthogonalityPenaltyState(count=optax.safe_increment(state.count))
    else:
      lam = strength

    grads = linalg.map_views(lambda w, view: jax.grad(lambda x: fn(x, view=view, **kwargs))(w),
                             params, mask=True if mask is None else mask, views=views,
                             default=lambda leaf: None)

    def add(u, g):
      if u is None or g is None:
        return u
      return (u + lam * g).astype(u.dtype)

    updates = jax.tree_util.tree_map(add, updates, grads, is_leaf=lambda x: x is None)
    return updates, state

  return optax.GradientTransformation(init_fn,
                                      scoped("add_orthogonality_penalty", update_fn))
