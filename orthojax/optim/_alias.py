"""Ready-made Riemannian optimizers built from the blocks in ``_riemannian``.

Each returns a :class:`orthojax.optim.ManifoldTransformation` (it keeps its leaves on
their manifold); built without ``views=``, its views are read at ``init``
(:class:`orthojax.optim.ViewsFromInit`).
"""

from __future__ import annotations

from typing import Any

import optax

from orthojax.manifolds import Manifold, Stiefel
from orthojax.optim._checks import check_bucket, check_rate, injected
from orthojax.optim._fused import fused_stiefel_adam, supports_fused
from orthojax.optim._fused_momentum import fused_stiefel_momentum
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._riemannian import (project_to_tangent, retract, riemannian_momentum,
                                         scale_by_riemannian_adam)


def _default(manifold):
  return Stiefel() if manifold is None else manifold


def rsgd(
    learning_rate: optax.ScalarOrSchedule,
    manifold: Manifold | None = None,
    momentum: float = 0.0,
    nesterov: bool = False,
    views: Any = None,
    reorthonormalize_every: int | None = None,
    bucket: str = "pad",
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
      the parameters' Variables record, read at ``init`` on the ``nnx.Optimizer`` path
      and kept in the state (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    reorthonormalize_every: see :func:`orthojax.optim.retract`.
    bucket: see :func:`orthojax.optim.project_to_tangent`.

  Which program computes the step: the chain ``project_to_tangent``,
  ``riemannian_momentum`` (when ``momentum > 0``), ``optax.scale_by_learning_rate``,
  ``retract`` — except **with momentum on** ``Stiefel(metric="euclidean")``, where
  the same step, with the same state structure, is computed by
  :func:`orthojax.optim.fused_stiefel_momentum`, which needs half the matrix products
  for heavy ball.
  """
  check_rate("rsgd", learning_rate)
  check_bucket("rsgd", bucket)
  manifold = _default(manifold)
  # An injected momentum (optax.inject_hyperparams) keeps the trace, at 0 too.
  with_momentum = injected(momentum) or bool(momentum)
  if with_momentum and supports_fused(manifold):
    return fused_stiefel_momentum(learning_rate, manifold, momentum, nesterov, views=views,
                                  reorthonormalize_every=reorthonormalize_every,
                                  bucket=bucket)

  def build(views):
    links = [project_to_tangent(manifold, views, bucket)]
    if with_momentum:
      links.append(riemannian_momentum(manifold, momentum, nesterov, views, bucket=bucket))
    links += [optax.scale_by_learning_rate(learning_rate),
              retract(manifold, views, reorthonormalize_every, bucket)]
    return keeping(optax.chain(*links))

  return views_from_init(build, views)


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
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Riemannian Adam (Bécigneul & Ganea, ICLR 2019), first moment transported.

  See :func:`orthojax.optim.scale_by_riemannian_adam` for the moments and the
  ``second_moment`` choice. Sokol & Park (ICLR 2020, "Information geometry of
  orthogonal initializations and training", §4) train Stiefel and oblique
  networks with it.

  ``views``, ``reorthonormalize_every`` and ``bucket`` are as in :func:`rsgd`.

  Which program computes the step: the chain ``project_to_tangent``,
  ``scale_by_riemannian_adam``, ``optax.scale_by_learning_rate``, ``retract`` —
  except on ``Stiefel(metric="euclidean")`` (the default manifold), where the same
  step, with the same state structure, is computed by
  :func:`orthojax.optim.fused_stiefel_adam`, which needs fewer matrix products.
  """
  check_rate("radam", learning_rate)
  check_bucket("radam", bucket)
  manifold = _default(manifold)
  options = dict(b1=b1, b2=b2, eps=eps, second_moment=second_moment, nesterov=nesterov)
  if supports_fused(manifold):
    return fused_stiefel_adam(learning_rate, manifold, **options, views=views,
                              reorthonormalize_every=reorthonormalize_every, bucket=bucket)

  def build(views):
    return keeping(optax.chain(
        project_to_tangent(manifold, views, bucket),
        scale_by_riemannian_adam(manifold, **options, views=views, bucket=bucket),
        optax.scale_by_learning_rate(learning_rate),
        retract(manifold, views, reorthonormalize_every, bucket)))

  return views_from_init(build, views)


def projected_gradient(
    optimizer: optax.GradientTransformation | optax.ScalarOrSchedule,
    manifold: Manifold | None = None,
    views: Any = None,
    bucket: str = "pad",
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
    views, bucket: as :func:`rsgd` (the retraction's).
  """
  if not isinstance(optimizer, optax.GradientTransformation):
    check_rate("projected_gradient", optimizer, "optimizer")
    optimizer = optax.sgd(optimizer)
  check_bucket("projected_gradient", bucket)
  manifold = Stiefel("polar") if manifold is None else manifold
  return views_from_init(
      lambda v: keeping(optax.chain(optimizer, retract(manifold, v, bucket=bucket))), views)
