"""Fused Riemannian Adam on the Stiefel manifold (Euclidean metric).

:func:`fused_stiefel_adam` computes, in one pass per leaf, what the composable
chain

    optax.chain(project_to_tangent(M), scale_by_riemannian_adam(M, ...),
                optax.scale_by_learning_rate(lr), retract(M))

computes for ``M = Stiefel(retraction, metric="euclidean")`` — same options,
same state (the chain's tuple of states, so checkpoints and code that reads
``state[1].mu`` keep working), same results up to float rounding — with fewer
matrix products. :func:`orthojax.optim.radam` uses it whenever it applies.

Notation on the tall matrix (n x p, n >= p, ``W^T W = I``): ``G`` the
Euclidean gradient, ``m`` the stored first moment (tangent at the previous
point), ``sym(A) = (A + A^T)/2``, ``skew(A) = (A - A^T)/2``,
``P(X) = X - W sym(W^T X)`` the tangent projection at ``W``. Why each saving
is exact:

* **Projection and transport share ``W^T``.** With ``a = W^T G`` and
  ``b = W^T m`` (two products) the chain's
  ``m_t = b1 P(m) + (1 - b1) P(G)`` is, by linearity of ``P``,
  ``P(X) = X - W sym(b1 b + (1 - b1) a)`` with ``X = b1 m + (1 - b1) G`` (so
  ``W^T X = b1 b + (1 - b1) a``): one more product instead of two projections
  (four products). The
  ``"elementwise"`` second moment needs ``P(G)`` itself (its square), so
  there ``P(G) = G - W sym(a)`` and ``P(m) = m - W sym(b)`` are formed
  (four products, as before, but ``W^T`` of each is shared).
* **Second moment "matrix" without projecting.** For ``W^T W = I``,
  ``||P(G)||^2 = ||G||^2 - ||sym(a)||^2`` (expand the square: the cross term
  is ``-2 <a, sym(a)> = -2 ||sym(a)||^2``). It is evaluated as
  ``||skew(a)||^2 + (||G||^2 - ||a||^2)``: the second term is
  ``||(I - W W^T) G||^2``, zero for square ``W`` (dropped) and clipped at 0
  for tall ones, so no cancellation ever makes the statistic negative. The
  direction ``m_hat / denom`` is tangent, so nothing is re-projected.
* **``W^T d`` is free.** ``W^T P(X) = W^T X - sym(W^T X) = skew(W^T X)``, so
  the step's ``Omega = W^T xi`` (``xi = -lr d``) is known from ``a``, ``b``
  (and, for the elementwise moment, from ``c = W^T u`` of the re-projection
  ``d = P(u)``, which costs two products as in the chain).
* **Cayley in coordinates.** Wen & Yin's generator ``A = vh W^T - W vh^T``,
  ``vh = xi - W Omega / 2``, maps ``W`` to ``W Omega + xi_perp`` and
  ``xi_perp = xi - W Omega`` (zero for square ``W``) to ``-W B``,
  ``B = xi_perp^T xi_perp``, so the exact transform and Li et al.'s fixed point are
  ``Y = W Z + xi_perp K`` with ``p x p`` coefficients
  (:func:`orthojax.linalg.cayley_in_coordinates`, as ``Stiefel``'s own retraction runs
  them). Here ``Omega`` is known, so ``W^T xi`` is not formed again: exact, the
  retraction costs ``B``, the ``p x p`` inverse and two products (a square ``W``: a
  ``p x p`` solve and one product); iterative, ``B``, ``p x p`` products per iteration and
  ``Y = W Z + xi_perp K``. With the ``"elementwise"`` second moment the
  step never needs ``d = P(u)`` itself here, only ``xi_perp = -lr (u - W c)``
  (``W sym(c) + W skew(c) = W c``): one product where ``d`` and then
  ``xi - W Omega`` took two.
* Other retractions (QR, polar, Newton–Schulz) are applied to ``W + xi`` as in the
  chain; for parameters stored in bfloat16/float16 both Cayley forms are followed by
  :func:`orthojax.manifolds.polish`, as in ``Stiefel.retract``.

The identities use ``W^T W = I``; on an iterate with defect ``delta`` the two
paths differ by ``O(delta * ||step||)``, far below float32 resolution for the
retractions here (tested at 1e-5 over several steps).

Like the building blocks, the update is plain jnp (jit-able, sharding
agnostic, no host callbacks); matrix products run at the manifold's ``precision``
and each new point is corrected at float32 where they are reduced, as in
:mod:`orthojax.manifolds`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from orthojax import linalg
from orthojax.manifolds import Stiefel, polish
from orthojax.optim._checks import check_bucket, check_rate, check_second_moment, require_params
from orthojax.optim._clean_up import after_retraction, clean_up
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._riemannian import (RetractState, ScaleByRiemannianAdamState,
                                         project_to_tangent, retract, scale_by_riemannian_adam)
from orthojax.optim._scope import scoped

_TALL = linalg.MatrixView.dense()   # an (..., n, p) tall matrix, n >= p: as it is


def _sq(x):
  return jnp.sum(jnp.square(x), axis=(-2, -1))


def _debias(decay, count, dtype):
  """Adam's bias correction ``1 - decay**count`` as ``optax.tree.bias_correction``.

  Evaluated in JAX's default float (float64 under ``jax_enable_x64``), then
  cast to the leaf's compute ``dtype``.
  """
  return (1.0 - decay ** count).astype(dtype)


def supports_fused(manifold: Any) -> bool:
  """Whether the fused Stiefel paths compute ``radam`` / ``rsgd`` on ``manifold``."""
  return isinstance(manifold, Stiefel) and manifold.metric == "euclidean"


def in_coordinates(manifold: Stiefel) -> bool:
  """Whether :func:`retract_tall` runs ``manifold``'s retraction in coordinates."""
  return manifold.retraction == "cayley"


def retract_tall(manifold: Stiefel, x, xi, omega, stored_dtype, count,
                 reorthonormalize_every: int | None, xi_perp=None):
  """The chain's ``retract`` link on a tall ``x`` given the step ``xi`` and ``omega = x^T xi``.

  Cayley (exact or iterative) runs in coordinates
  (:meth:`orthojax.manifolds.Stiefel.cayley_in_coordinates`, from ``omega`` and the normal part
  ``xi_perp = xi - x omega``, which the caller may pass where it knows it); every other
  retraction is ``manifold.retract`` of ``xi`` at ``x``. ``stored_dtype`` is the
  parameter's (bfloat16/float16 Cayley results are polished, as in
  ``Stiefel.retract``); ``count`` is the retraction step for ``reorthonormalize_every``.
  """
  with jax.named_scope("retraction"):
    if in_coordinates(manifold):
      if x.shape[-2] == x.shape[-1]:   # a square x: xi = x omega, no normal part
        xi_perp = None
      elif xi_perp is None:
        xi_perp = xi - x @ omega
      y = manifold.cayley_in_coordinates(x, omega, xi_perp)
      y = polish(y, stored_dtype)  # as Stiefel's Cayley retraction
      y = manifold.correct(y, view=_TALL)  # as Stiefel's retract: float32 where reduced
    else:
      y = manifold.retract(x, xi, view=_TALL, stored_dtype=stored_dtype)
    y = clean_up(y, count, reorthonormalize_every,
                 lambda y: manifold.reorthonormalize(y, view=_TALL),
                 after_retraction(manifold, _TALL))
  return y


def fused_stiefel_adam(
    learning_rate: optax.ScalarOrSchedule,
    manifold: Stiefel | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    second_moment: str = "elementwise",
    nesterov: bool = False,
    views: Any = None,
    reorthonormalize_every: int | None = None,
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Riemannian Adam on ``Stiefel(metric="euclidean")`` in one fused transform.

  Computes the same step as :func:`orthojax.optim.radam`'s chain
  (``project_to_tangent``, ``scale_by_riemannian_adam``,
  ``scale_by_learning_rate``, ``retract``) with the same options and the same
  state structure, using fewer matrix products (module docstring: the
  formulas and why they agree with the chain).

  Args:
    learning_rate: a float or an Optax schedule.
    manifold: a :class:`orthojax.manifolds.Stiefel` with the Euclidean metric (default
      ``Stiefel()``).
    b1, b2, eps: as ``optax.scale_by_adam``.
    second_moment: "elementwise", "matrix" or "matrix_sum" (see
      :func:`orthojax.optim.scale_by_riemannian_adam`).
    nesterov: Nesterov-style first moment.
    views: per-leaf matrix views; None (default): those the parameters' Variables
      record, read at ``init`` on the ``nnx.Optimizer`` path and kept in the state
      (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    reorthonormalize_every: see :func:`orthojax.optim.retract`.
    bucket: see :func:`orthojax.optim.project_to_tangent`.

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation` taking Euclidean gradients; its
    state is the chain's ``(EmptyState, ScaleByRiemannianAdamState, <learning-rate
    state>, RetractState)``.
  """
  check_rate("fused_stiefel_adam", learning_rate)
  manifold = Stiefel() if manifold is None else manifold
  if not supports_fused(manifold):
    raise ValueError(f"fused_stiefel_adam: needs Stiefel(metric='euclidean'), got {manifold!r}")
  check_second_moment("fused_stiefel_adam", second_moment)
  check_bucket("fused_stiefel_adam", bucket)
  options = dict(b1=b1, b2=b2, eps=eps, second_moment=second_moment, nesterov=nesterov)
  return views_from_init(
      lambda v: keeping(_fused_stiefel_adam(learning_rate, manifold, v, options,
                                            reorthonormalize_every, bucket)), views)


def _fused_stiefel_adam(learning_rate, manifold, views, options, reorthonormalize_every,
                        bucket):
  # The chain supplies init, validation and the learning-rate link's state.
  lr_link = optax.scale_by_learning_rate(learning_rate)
  chain = optax.chain(
      project_to_tangent(manifold, views, bucket),
      scale_by_riemannian_adam(manifold, **options, views=views, bucket=bucket),
      lr_link,
      retract(manifold, views, reorthonormalize_every, bucket))

  def update_fn(updates, state, params=None):
    require_params("radam", params)
    empty, adam_state, lr_state, retract_state = state
    count = optax.safe_increment(adam_state.count)
    # -lr as the chain's learning-rate link computes it (schedules included),
    # in JAX's default float (float64 under jax_enable_x64), cast per leaf.
    neg_lr, lr_state = lr_link.update(jnp.ones([], jnp.result_type(float)), lr_state)
    retract_count = optax.safe_increment(retract_state.count)
    leaf = functools.partial(_adam_leaf, manifold=manifold, count=count, neg_lr=neg_lr,
                             retract_count=retract_count,
                             reorthonormalize_every=reorthonormalize_every, **options)
    # Products at the manifold's precision, as its own methods run them.
    triples = linalg.at_precision(
        lambda *trees: linalg.map_views(leaf, *trees, views=views, bucket=bucket),
        manifold.precision)(params, updates, adam_state.mu, adam_state.nu)
    treedef = jax.tree_util.tree_structure(updates)
    flat = treedef.flatten_up_to(triples)
    out, mu, nu = (treedef.unflatten([t[k] for t in flat]) for k in range(3))
    new_state = (empty, ScaleByRiemannianAdamState(count=count, mu=mu, nu=nu), lr_state,
                 RetractState(count=retract_count))
    return out, new_state

  return optax.GradientTransformation(chain.init, scoped("fused_stiefel_adam", update_fn))


def _adam_leaf(w, g, m, v, view, *, manifold, count, neg_lr, retract_count,
               reorthonormalize_every, b1, b2, eps, second_moment, nesterov):
  """One leaf's fused step: ``(update, new first moment, new second moment)``."""
  elementwise = second_moment == "elementwise"
  lo = linalg.layout(w.shape, view)
  dtype = linalg.compute_dtype(jnp.result_type(w, g))
  x, gt, mt = (lo.to_tall(jnp.asarray(a, dtype)) for a in (w, g, m.astype(g.dtype)))
  n, p = x.shape[-2], x.shape[-1]
  c1, c2 = _debias(b1, count, dtype), _debias(b2, count, dtype)
  a = x.mT @ gt                                     # W^T G
  b = x.mT @ mt                                     # W^T m
  if elementwise or nesterov:
    g_r = gt - x @ linalg.sym(a)                    # P(G)
  if elementwise:
    m_new = b1 * (mt - x @ linalg.sym(b)) + (1.0 - b1) * g_r
    g_q = g_r.astype(g.dtype).astype(dtype) if g.dtype != dtype else g_r
    v_new = b2 * lo.to_tall(v.astype(dtype)) + (1.0 - b2) * jnp.square(g_q)
  else:
    xm = b1 * mt + (1.0 - b1) * gt
    m_new = xm - x @ linalg.sym(b1 * b + (1.0 - b1) * a)   # W^T xm, symmetrised
    normal = jnp.maximum(_sq(gt) - _sq(a), 0.0) if n > p else 0.0
    s = _sq(linalg.skew(a)) + normal               # sum of P(G)^2
    if second_moment == "matrix":
      s = s / (n * p)                              # its mean
    v_new = b2 * v.astype(dtype) + (1.0 - b2) * s
  # The chain stores m in its state dtype and uses that value.
  m_new = m_new.astype(m.dtype).astype(dtype) if m.dtype != dtype else m_new
  if nesterov:
    c1_next = _debias(b1, optax.safe_increment(count), dtype)
    m_hat = b1 * m_new / c1_next + (1.0 - b1) * g_r / c1
    omega_m = ((b1 / c1_next) * linalg.skew(b1 * b + (1.0 - b1) * a)
               + ((1.0 - b1) / c1) * linalg.skew(a))
  else:
    m_hat = m_new / c1
    omega_m = linalg.skew(b1 * b + (1.0 - b1) * a) / c1
  normal = None
  if elementwise:
    u = m_hat / (jnp.sqrt(v_new / c2) + eps)
    c = x.mT @ u
    d = u - x @ linalg.sym(c)
    omega = linalg.skew(c)
    if in_coordinates(manifold) and n > p and g.dtype == dtype:
      # Cayley in coordinates needs xi's normal part, not d: (I - W W^T) u = u - W c
      # (W sym(c) + W skew(c) = W c), one product where d and then xi - W Omega took two.
      normal = u - x @ c
  else:
    denom = (jnp.sqrt(v_new / c2) + eps)[..., None, None]
    d = m_hat / denom
    omega = omega_m / denom
  # The chain's links cast d to the gradient dtype and scale it by -lr.
  d = d.astype(g.dtype).astype(dtype)
  scale = neg_lr.astype(dtype)
  y = retract_tall(manifold, x, scale * d, scale * omega, w.dtype, retract_count,
                   reorthonormalize_every, None if normal is None else scale * normal)
  y = lo.from_tall(y).astype(jnp.result_type(w, g))
  v_new = lo.from_tall(v_new) if elementwise else v_new
  return (y - w).astype(g.dtype), lo.from_tall(m_new).astype(m.dtype), v_new.astype(v.dtype)
