"""Riemannian building blocks as Optax gradient transformations.

A Riemannian optimizer on a manifold M is an Optax chain

    project_to_tangent(M)          # Euclidean gradient -> Riemannian gradient
    riemannian_momentum(M) or scale_by_riemannian_adam(M)   # moments transported
    optax.scale_by_learning_rate(lr)
    retract(M)                     # last link: ambient step -> retraction

so that ``optax.apply_updates(w, u)`` lands on ``R_w(-lr * direction)``.
Moments live in the tangent space of the point where they were computed; at
the next step they are moved to the new point by vector transport by
projection (Absil, Mahony & Sepulchre 2008, "Optimization Algorithms on
Matrix Manifolds", §8.1.3; Sokol & Park, ICLR 2020, Appendix A.6.2) *before* being combined
with the new gradient — transporting the first moment only, as Bécigneul &
Ganea (ICLR 2019, "Riemannian adaptive optimization methods") do; the second
moment is a non-negative statistic and is not transported.

All transforms need ``params`` in ``update`` and accept ``views`` (see
``orthojax.linalg.map_views``). They are plain jnp code: jit-able, shardable,
and their states are pytrees Orbax can save.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import optax

from orthojax import linalg
from orthojax.linalg import map_views, unzip
from orthojax.manifolds import Manifold
from orthojax.optim._checks import (check_bucket, check_decay, check_manifold, check_matrices,
                                     check_second_moment, require_params, traced)
from orthojax.optim._clean_up import after_retraction, clean_up
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._scope import scoped


def project_to_tangent(manifold: Manifold, views: Any = None,
                       bucket: str = "pad") -> optax.GradientTransformation:
  """Euclidean gradient -> Riemannian gradient (``manifold.egrad_to_rgrad``).

  For the Stiefel manifold with the Euclidean metric this is
  ``G - W sym(W^T G)``; with the canonical metric ``G - W G^T W``; for the
  oblique manifold ``g - w (w^T g)`` per column.

  Args:
    manifold: an :class:`orthojax.manifolds.Manifold`.
    views: per-leaf matrix views (``orthojax.linalg.map_views``); None (default): those
      the parameters' Variables record, read at ``init`` on the ``nnx.Optimizer`` path
      and kept in the state (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    bucket: how the update runs over many matrices (:data:`orthojax.linalg.BUCKETS`):
      ``"pad"`` (default: zero-padded stacks of a shared small side), ``"shape"``
      (stacks of one shape) or ``"per_leaf"``; the same updates to rounding.

  Returns:
    A stateless ``optax.GradientTransformation``.
  """
  check_manifold("project_to_tangent", manifold)
  check_bucket("project_to_tangent", bucket)
  return views_from_init(lambda v: _project_to_tangent(manifold, v, bucket), views)


def _project_to_tangent(manifold, views, bucket):
  def update_fn(updates, state, params=None):
    require_params("project_to_tangent", params)
    out = map_views(lambda w, g, view: manifold.egrad_to_rgrad(w, g, view=view),
                    params, updates, views=views, bucket=bucket)
    return out, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                      scoped("project_to_tangent", update_fn))


class RiemannianMomentumState(NamedTuple):
  """The momentum, tangent at the params it was computed at."""
  trace: optax.Params


def riemannian_momentum(manifold: Manifold, momentum: float = 0.9, nesterov: bool = False,
                        views: Any = None, accumulator_dtype: Any = None,
                        bucket: str = "pad") -> optax.GradientTransformation:
  """Heavy-ball / Nesterov momentum with the trace transported by projection.

  ``m_t = mu * P_{W_t}(m_{t-1}) + g_t``; the output is ``m_t`` (heavy ball) or
  ``g_t + mu * m_t`` (Nesterov), both tangent at ``W_t`` when ``g_t`` is.
  Like ``optax.trace``, there is no dampening.

  Args:
    manifold: the manifold the params live on.
    momentum: decay ``mu`` in [0, 1).
    nesterov: Nesterov's variant.
    views: per-leaf matrix views; None (default): as :func:`project_to_tangent`.
    accumulator_dtype: dtype of the trace (default: the params').
    bucket: as :func:`project_to_tangent`.

  Returns:
    An ``optax.GradientTransformation``; expects Riemannian gradients (put
    :func:`project_to_tangent` before it).
  """
  check_manifold("riemannian_momentum", manifold)
  check_decay("riemannian_momentum", momentum, "momentum")
  check_bucket("riemannian_momentum", bucket)
  return views_from_init(
      lambda v: _riemannian_momentum(manifold, momentum, nesterov, v, accumulator_dtype,
                                     bucket), views)


def _riemannian_momentum(manifold, momentum, nesterov, views, accumulator_dtype, bucket):
  def init_fn(params):
    check_matrices("riemannian_momentum", params, views)
    return RiemannianMomentumState(
        trace=optax.tree.zeros_like(params, dtype=accumulator_dtype))

  def update_fn(updates, state, params=None):
    require_params("riemannian_momentum", params)

    def leaf(w, g, m, view):
      m = momentum * manifold.transport(w, m.astype(g.dtype), view=view) + g
      out = g + momentum * m if nesterov else m
      return out, m.astype(accumulator_dtype or m.dtype)

    pairs = map_views(leaf, params, updates, state.trace, views=views, bucket=bucket)
    out, trace = unzip(pairs, updates)
    return out, RiemannianMomentumState(trace=trace)

  return optax.GradientTransformation(init_fn, scoped("riemannian_momentum", update_fn))


class ScaleByRiemannianAdamState(NamedTuple):
  """Step count, first moment (tangent) and second moment."""
  count: jnp.ndarray
  mu: optax.Params
  nu: optax.Params


def scale_by_riemannian_adam(
    manifold: Manifold,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    second_moment: str = "elementwise",
    nesterov: bool = False,
    mu_dtype: Any = None,
    views: Any = None,
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Riemannian Adam (Bécigneul & Ganea 2019) with the first moment transported.

  Per leaf, with ``g_t`` the Riemannian gradient at ``W_t``:

      m_t = b1 P_{W_t}(m_{t-1}) + (1 - b1) g_t
      v_t = b2 v_{t-1} + (1 - b2) s(g_t)
      d_t = P_{W_t}( m_hat_t / (sqrt(v_hat_t + eps_root) + eps) )

  with bias corrections ``1 - b^t`` by ``optax.tree.bias_correction``, as in
  ``optax.scale_by_adam``: evaluated in JAX's default float (float64 under
  ``jax_enable_x64``) and applied in the moments' dtype, at least float32, so
  float64 parameters get float64-accurate steps. ``second_moment`` picks
  ``s``:

  * ``"elementwise"``: ``s(g) = g * g``, optax's Adam applied entry by entry to the
    Riemannian gradient. The elementwise division leaves the tangent space, so
    ``d_t`` is projected back — a deliberate difference from codes that retract a
    non-tangent step.
  * ``"matrix"``: one scalar per matrix, the *mean* of ``g * g`` over its ``n·p``
    entries (the product-manifold Adam of Bécigneul & Ganea, §4). The direction
    stays tangent, and a learning rate means what it means for elementwise Adam
    (a step of about ``lr`` per entry).
  * ``"matrix_sum"``: one scalar per matrix, the *sum* ``‖g‖_F²`` — geoopt's
    ``RiemannianAdam`` on its Stiefel manifolds (its ``component_inner`` is the
    matrix inner product) and Li et al.'s Cayley Adam (ICLR 2020, Alg. 2). The same
    direction as ``"matrix"`` with a step ``√(n·p)`` times smaller: ``"matrix"`` at
    rate ``lr`` equals ``"matrix_sum"`` at ``lr·√(n·p)`` (up to ``eps``).

  Args:
    manifold: the manifold the params live on.
    b1, b2, eps, eps_root: as ``optax.scale_by_adam``.
    second_moment: "elementwise", "matrix" or "matrix_sum".
    nesterov: Nesterov-style first moment (as ``optax.scale_by_adam``).
    mu_dtype: dtype of the first moment.
    views: per-leaf matrix views; None (default): as :func:`project_to_tangent`.
    bucket: as :func:`project_to_tangent` (a per-matrix second moment keeps exact-shape
      stacks).

  Returns:
    An ``optax.GradientTransformation``; expects Riemannian gradients.
  """
  who = "scale_by_riemannian_adam"
  check_manifold(who, manifold)
  check_decay(who, b1, "b1")
  check_decay(who, b2, "b2")
  if not traced(eps) and not eps > 0.0:
    raise ValueError(f"{who}: eps must be > 0, got {eps}")
  check_second_moment(who, second_moment)
  check_bucket(who, bucket)
  options = dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, second_moment=second_moment,
                 nesterov=nesterov, mu_dtype=mu_dtype, bucket=bucket)
  return views_from_init(lambda v: _scale_by_riemannian_adam(manifold, v, **options), views)


def _scale_by_riemannian_adam(manifold, views, *, b1, b2, eps, eps_root, second_moment,
                              nesterov, mu_dtype, bucket):
  def init_fn(params):
    check_matrices("scale_by_riemannian_adam", params, views)
    mu = optax.tree.zeros_like(params, dtype=mu_dtype)

    def nu_leaf(w, view):
      if second_moment == "elementwise":
        return jnp.zeros_like(w)
      return jnp.zeros(linalg.layout(w.shape, view).batch_shape, w.dtype)

    nu = map_views(nu_leaf, params, views=views)
    return ScaleByRiemannianAdamState(count=jnp.zeros([], jnp.int32), mu=mu, nu=nu)

  def update_fn(updates, state, params=None):
    require_params("scale_by_riemannian_adam", params)
    count = optax.safe_increment(state.count)

    def leaf(w, g, m, v, view):
      m = b1 * manifold.transport(w, m.astype(g.dtype), view=view) + (1.0 - b1) * g
      if second_moment == "elementwise":
        s = jnp.square(g)
      else:
        reduce = jnp.mean if second_moment == "matrix" else jnp.sum
        s = reduce(jnp.square(linalg.layout(w.shape, view).to_matrix(g)), axis=(-2, -1))
      v = b2 * v + (1.0 - b2) * s
      # Debiased in at least float32 (bfloat16 moments are upcast, float64 kept).
      dtype = linalg.compute_dtype(g.dtype)
      m_c, g_c, v_c = (a.astype(dtype) for a in (m, g, v))
      if nesterov:
        m_hat = (b1 * optax.tree.bias_correction(m_c, b1, optax.safe_increment(count))
                 + (1.0 - b1) * optax.tree.bias_correction(g_c, b1, count))
      else:
        m_hat = optax.tree.bias_correction(m_c, b1, count)
      denom = jnp.sqrt(optax.tree.bias_correction(v_c, b2, count) + eps_root) + eps
      if second_moment == "elementwise":
        d = manifold.project(w, m_hat / denom, view=view)
      else:
        lo = linalg.layout(w.shape, view)
        d = lo.from_matrix(lo.to_matrix(m_hat) / denom[..., None, None])
      return d.astype(g.dtype), (m.astype(mu_dtype or m.dtype), v)

    pairs = map_views(leaf, params, updates, state.mu, state.nu, views=views, bucket=bucket)
    out, mv = unzip(pairs, updates)
    mu, nu = unzip(mv, state.mu)
    return out, ScaleByRiemannianAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, scoped("scale_by_riemannian_adam", update_fn))


class RetractState(NamedTuple):
  """Step count (used by occasional re-orthonormalization)."""
  count: jnp.ndarray


def retract(manifold: Manifold, views: Any = None, reorthonormalize_every: int | None = None,
            bucket: str = "pad") -> optax.GradientTransformation:
  """Last link of a Riemannian chain: turns a step ``u`` into ``R_W(u) - W``.

  ``optax.apply_updates(W, retract(...)(u))`` then returns the retraction
  ``R_W(u)``. Retractions of non-tangent steps (QR, polar, Newton–Schulz) act
  as projections back onto the manifold, which is how
  :func:`orthojax.optim.projected_gradient` uses this transform.

  Args:
    manifold: the manifold (its ``retraction`` option picks the map).
    views: per-leaf matrix views; None (default): as :func:`project_to_tangent`.
    reorthonormalize_every: if set, every this many steps the new point is
      replaced by the closest point of the manifold
      (``manifold.reorthonormalize``: Newton–Schulz steps for Stiefel), removing the
      drift that retractions that do not re-project (Cayley, especially the iterative
      form) accumulate from rounding; Li et al. (2020) re-orthonormalize occasionally,
      too. ``1``: one Newton–Schulz step after every step instead, with no branch
      (``manifold.reorthonormalize_step``; the choice between the two:
      ``orthojax.optim._clean_up``).
      Not needed for parameters stored in bfloat16/float16: there the Cayley
      retraction is followed at every step by Newton–Schulz steps (usually
      one; :func:`orthojax.manifolds.polish`), which keep them at rounding
      level.
    bucket: as :func:`project_to_tangent`.

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation`: it keeps its leaves on the
    manifold.
  """
  check_manifold("retract", manifold)
  check_bucket("retract", bucket)
  if (reorthonormalize_every is not None and not traced(reorthonormalize_every)
      and int(reorthonormalize_every) < 1):
    raise ValueError(f"retract: reorthonormalize_every must be None or >= 1, "
                     f"got {reorthonormalize_every}")
  return views_from_init(
      lambda v: keeping(_retract(manifold, v, reorthonormalize_every, bucket)), views)


def _retract(manifold, views, reorthonormalize_every, bucket):
  def update_fn(updates, state, params=None):
    require_params("retract", params)
    count = optax.safe_increment(state.count)

    def leaf(w, u, view):
      y = manifold.retract(w, u, view=view)
      y = clean_up(y, count, reorthonormalize_every,
                   lambda y: manifold.reorthonormalize(y, view=view),
                   after_retraction(manifold, view))
      return (y - w).astype(u.dtype)

    return map_views(leaf, params, updates, views=views, bucket=bucket), RetractState(count=count)

  return optax.GradientTransformation(
      lambda params: RetractState(count=jnp.zeros([], jnp.int32)),
      scoped("retract", update_fn))
