"""Ready-made Riemannian optimizers built from the blocks in ``_riemannian``."""

from __future__ import annotations

from typing import Any

import optax

from orthojax.manifolds import Manifold, Stiefel
from orthojax.optim._checks import check_rate, injected
from orthojax.optim._fused import fused_stiefel_adam, supports_fused
from orthojax.optim._fused_momentum import fused_stiefel_momentum
from orthojax.optim._riemannian import (project_to_tangent, retract, riemannian_momentum,
                                         scale_by_riemannian_adam)
from orthojax.optim.execution.recorded import reads_recorded_views


def _default(manifold):
  return Stiefel() if manifold is None else manifold


@reads_recorded_views
def rsgd(
    learning_rate: optax.ScalarOrSchedule,
    manifold: Manifold | None = None,
    momentum: float = 0.0,
    nesterov: bool = False,
    views: Any = None,
    reorthonormalize_every: int | None = None,
) -> optax.GradientTransformation:
  """Riemannian SGD (Bonnabel 2013), optionally with transported momentum.

  ``W <- R_W(-lr * d)``, ``d`` the Riemannian gradient or its momentum trace.

  Args:
    learning_rate: a float or an Optax schedule.
    manifold: default ``Stiefel()`` (QR retraction, Euclidean metric).
    momentum: heavy-ball decay; 0 disables the trace (an array, as
      ``optax.inject_hyperparams`` passes it, keeps the trace at any value).
    nesterov: Nesterov momentum.
    views: per-leaf matrix views (``orthojax.linalg.map_views``); None (default): those
      the parameters' Variables record, on the ``nnx.Optimizer`` path
      (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    reorthonormalize_every: see :func:`orthojax.optim.retract`.

  The result is the chain ``project_to_tangent``, ``riemannian_momentum`` (when
  ``momentum > 0``), ``optax.scale_by_learning_rate``, ``retract``. With momentum on
  ``Stiefel`` with the Euclidean metric the same step (and the same state
  structure) is computed by :func:`orthojax.optim.fused_stiefel_momentum`, which
  needs half the matrix products for heavy ball.
  """
  check_rate("rsgd", learning_rate)
  manifold = _default(manifold)
  # An injected momentum (optax.inject_hyperparams) keeps the trace, at 0 too.
  with_momentum = injected(momentum) or bool(momentum)
  if with_momentum and supports_fused(manifold):
    return fused_stiefel_momentum(learning_rate, manifold, momentum, nesterov, views=views,
                                  reorthonormalize_every=reorthonormalize_every)
  links = [project_to_tangent(manifold, views)]
  if with_momentum:
    links.append(riemannian_momentum(manifold, momentum, nesterov, views))
  links += [optax.scale_by_learning_rate(learning_rate),
            retract(manifold, views, reorthonormalize_every)]
  return optax.chain(*links)


@reads_recorded_views
def radam(
    learning_rate: optax.ScalarOrSchedule,
    manifold: Manifold | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    second_moment: str = "elementwise",
    nesterov: bool = False,
    views: Any = None,
    reorthonormalize_every: int | None = None,
) -> optax.GradientTransformation:
  """Riemannian Adam (Bécigneul & Ganea, ICLR 2019), first moment transported.

  See :func:`orthojax.optim.scale_by_riemannian_adam` for the moments and the
  ``second_moment`` choice. Sokol & Park (ICLR 2020, "Information geometry of
  orthogonal initializations and training", §4) train Stiefel and oblique
  networks with it.

  The result is the chain ``project_to_tangent``, ``scale_by_riemannian_adam``,
  ``optax.scale_by_learning_rate``, ``retract``. On ``Stiefel`` with the
  Euclidean metric the same step (and the same state structure) is computed
  by :func:`orthojax.optim.fused_stiefel_adam`, which needs fewer matrix
  products; the chain is used for every other manifold.
  """
  check_rate("radam", learning_rate)
  manifold = _default(manifold)
  if supports_fused(manifold, nesterov):
    return fused_stiefel_adam(learning_rate, manifold, b1=b1, b2=b2, eps=eps,
                              second_moment=second_moment, nesterov=nesterov, views=views,
                              reorthonormalize_every=reorthonormalize_every)
  return optax.chain(
      project_to_tangent(manifold, views),
      scale_by_riemannian_adam(manifold, b1=b1, b2=b2, eps=eps, second_moment=second_moment,
                               nesterov=nesterov, views=views),
      optax.scale_by_learning_rate(learning_rate),
      retract(manifold, views, reorthonormalize_every),
  )


@reads_recorded_views
def projected_gradient(
    optimizer: optax.GradientTransformation | optax.ScalarOrSchedule,
    manifold: Manifold | None = None,
    views: Any = None,
) -> optax.GradientTransformation:
  """Projected gradient: any Euclidean Optax step, then back onto the manifold.

  ``W <- R_W(u)`` with ``u`` the ambient update of ``optimizer`` (for Stiefel
  with the "polar" retraction this is the metric projection of ``W + u``,
  for "qr" its Q factor). Not a Riemannian method — the step is not made
  tangent first — but a common, cheap baseline. Prefer "polar" (the default):
  QR of a non-tangent step also rotates W by the normal component's lower
  triangle, so with adaptive steps it can stall short of the optimum.

  Args:
    optimizer: an Optax transformation producing ambient updates, or a learning
      rate (then plain SGD).
    manifold: default ``Stiefel("polar")``.
    views: per-leaf matrix views; None (default): those the parameters' Variables
      record, on the ``nnx.Optimizer`` path (:class:`orthojax.optim.RecordedViewsState`),
      else inferred.
  """
  if not isinstance(optimizer, optax.GradientTransformation):
    check_rate("projected_gradient", optimizer, "optimizer")
    optimizer = optax.sgd(optimizer)
  manifold = Stiefel("polar") if manifold is None else manifold
  return optax.chain(optimizer, retract(manifold, views))
