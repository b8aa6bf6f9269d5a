"""Fused Riemannian momentum SGD on the Stiefel manifold (Euclidean metric).

:func:`fused_stiefel_momentum` computes, in one pass per leaf, what the chain

    optax.chain(project_to_tangent(M), riemannian_momentum(M, mu, nesterov),
                optax.scale_by_learning_rate(lr), retract(M))

computes for ``M = Stiefel(retraction, metric="euclidean")`` — same state (the
chain's tuple of states), same results up to float rounding — with fewer matrix
products. :func:`orthojax.optim.rsgd` uses it whenever it applies and
``momentum > 0``.

Notation as in :func:`orthojax.optim.fused_stiefel_adam`: ``W`` tall with ``W^T W = I``,
``G`` the Euclidean gradient, ``m`` the stored trace (tangent at the previous
point), ``P(X) = X - W sym(W^T X)``. The chain forms ``P(G)`` and transports
``m`` by projection, ``P(m)``: four products. Since ``P`` is linear,

* heavy ball: ``m_t = mu P(m) + P(G) = P(X)`` with ``X = mu m + G``: with
  ``c = W^T X`` it is ``X - W sym(c)``, **two** products;
* Nesterov: the output ``P(G) + mu m_t = P(G + mu X)``, and with ``a = W^T G``
  it is ``G + mu X - W sym(a + mu c)``: four products, as the chain;
* ``W^T P(Y) = skew(W^T Y)``, so the step's ``Omega = W^T xi`` is ``skew(c)``
  (or ``skew(a + mu c)``) for free, which the iterative Cayley retraction in
  coordinates uses (as :func:`orthojax.optim.fused_stiefel_adam` does).

For a stack of 32 square 400 x 400 matrices with the QR retraction that is 64
instead of 128 products of 400^3 per heavy-ball step. The identities use
``W^T W = I``; on an iterate with defect ``delta`` the two paths differ by
``O(delta * ||step||)`` (tested against the chain to 1e-5).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from orthojax import linalg
from orthojax.manifolds import Stiefel
from orthojax.optim._checks import check_bucket, check_rate, require_params
from orthojax.optim._fused import retract_tall, supports_fused
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._riemannian import (RetractState, RiemannianMomentumState,
                                         project_to_tangent, retract, riemannian_momentum)
from orthojax.optim._scope import scoped


def fused_stiefel_momentum(
    learning_rate: optax.ScalarOrSchedule,
    manifold: Stiefel | None = None,
    momentum: float = 0.9,
    nesterov: bool = False,
    views: Any = None,
    reorthonormalize_every: int | None = None,
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Riemannian SGD with momentum on ``Stiefel(metric="euclidean")``, fused.

  The step of :func:`orthojax.optim.rsgd` with ``momentum > 0``:
  ``m_t = mu P_{W_t}(m_{t-1}) + P_{W_t}(G_t)``, ``d = m_t`` (heavy ball) or
  ``P_{W_t}(G_t) + mu m_t`` (Nesterov), ``W_{t+1} = R_{W_t}(-lr d)``, with the
  chain's state and fewer matrix products (module docstring).

  Args:
    learning_rate: a float or an Optax schedule.
    manifold: a :class:`orthojax.manifolds.Stiefel` with the Euclidean metric (default
      ``Stiefel()``).
    momentum: decay ``mu`` in [0, 1).
    nesterov: Nesterov's variant.
    views: per-leaf matrix views; None (default): those the parameters' Variables
      record, read at ``init`` on the ``nnx.Optimizer`` path and kept in the state
      (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    reorthonormalize_every: see :func:`orthojax.optim.retract`.
    bucket: see :func:`orthojax.optim.project_to_tangent`.

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation` taking Euclidean gradients; its
    state is the chain's ``(EmptyState, RiemannianMomentumState, <learning-rate state>,
    RetractState)``.
  """
  check_rate("fused_stiefel_momentum", learning_rate)
  manifold = Stiefel() if manifold is None else manifold
  if not supports_fused(manifold):
    raise ValueError(f"fused_stiefel_momentum: needs Stiefel(metric='euclidean'), "
                     f"got {manifold!r}")
  check_bucket("fused_stiefel_momentum", bucket)
  return views_from_init(
      lambda v: keeping(_fused_stiefel_momentum(learning_rate, manifold, momentum, nesterov,
                                                v, reorthonormalize_every, bucket)), views)


def _fused_stiefel_momentum(learning_rate, manifold, mu, nesterov, views,
                            reorthonormalize_every, bucket):
  # The chain supplies init, validation and the learning-rate link's state.
  lr_link = optax.scale_by_learning_rate(learning_rate)
  chain = optax.chain(project_to_tangent(manifold, views, bucket),
                      riemannian_momentum(manifold, mu, nesterov, views, bucket=bucket),
                      lr_link, retract(manifold, views, reorthonormalize_every, bucket))

  def update_fn(updates, state, params=None):
    require_params("rsgd", params)
    empty, momentum_state, lr_state, retract_state = state
    neg_lr, lr_state = lr_link.update(jnp.ones([], jnp.result_type(float)), lr_state)
    retract_count = optax.safe_increment(retract_state.count)

    def leaf(w, g, m, view):
      lo = linalg.layout(w.shape, view)
      dtype = linalg.compute_dtype(jnp.result_type(w, g))
      x, gt, mt = (lo.to_tall(jnp.asarray(a, dtype)) for a in (w, g, m.astype(g.dtype)))
      big_x = mu * mt + gt
      c = x.mT @ big_x                                  # W^T X
      m_new = big_x - x @ linalg.sym(c)                 # P(X) = m_t
      if nesterov:
        a = x.mT @ gt                                   # W^T G
        w_tx = a + mu * c
        d = gt + mu * big_x - x @ linalg.sym(w_tx)      # P(G + mu X)
      else:
        w_tx, d = c, m_new
      # The chain's links cast d to the gradient dtype and scale it by -lr.
      d = d.astype(g.dtype).astype(dtype)
      scale = neg_lr.astype(dtype)
      y = retract_tall(manifold, x, scale * d, scale * linalg.skew(w_tx), w.dtype,
                       retract_count, reorthonormalize_every)
      y = lo.from_tall(y).astype(jnp.result_type(w, g))
      return (y - w).astype(g.dtype), lo.from_tall(m_new).astype(m.dtype)

    # Products at the manifold's precision, as its own methods run them.
    pairs = linalg.at_precision(
        lambda *trees: linalg.map_views(leaf, *trees, views=views, bucket=bucket),
        manifold.precision)(params, updates, momentum_state.trace)
    out, trace = linalg.unzip(pairs, updates)
    new_state = (empty, RiemannianMomentumState(trace=trace), lr_state,
                 RetractState(count=retract_count))
    return out, new_state

  return optax.GradientTransformation(chain.init, scoped("fused_stiefel_momentum", update_fn))
