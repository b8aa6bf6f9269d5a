"""Cayley SGD and Cayley Adam (Li, Fuxin & Todorovic, ICLR 2020).

"Efficient Riemannian optimization on the Stiefel manifold via the Cayley
transform", Algorithms 1 and 2, on the tall matrix X (n x p, X^T X = I):

Cayley SGD with momentum::

    M <- beta M - G
    A = Mh X^T - X Mh^T,   Mh = M - X (X^T M) / 2      (their W = W_hat - W_hat^T)
    M <- A X                                             (= P_X(M), tangent)
    alpha = min(lr, 2 q / (||A||_F + eps))
    Y_0 = X + alpha M;   Y_i = X + alpha/2 A (X + Y_{i-1}),  i = 1..s;   X <- Y_s

Cayley Adam::

    m <- b1 m + (1 - b1) G;   v <- b2 v + (1 - b2) ||G||_F^2   (one scalar per matrix)
    r = (1 - b1^k) sqrt(v / (1 - b2^k) + eps)
    A = (mh X^T - X mh^T) / r,   mh = m - X (X^T m) / 2;   m <- r A X
    alpha = min(lr, 2 q / (||A||_F + eps))
    Y_0 = X - alpha A X;   Y_i = X - alpha/2 A (X + Y_{i-1});   X <- Y_s

Differences from the paper, deliberately: ``A`` is never formed as an n x n
matrix when n >= 2p (its factors are applied instead, see
:func:`orthojax.manifolds.cayley_generator`), and the iterate is replaced by its
closest orthonormal matrix every ``reorthonormalize_every`` steps (default
100): a fixed number of fixed-point iterations is only approximately
orthogonal, and the error would otherwise accumulate over long runs.
Parameters stored in bfloat16/float16 are also polished at every step
(Newton–Schulz steps, usually one: :func:`orthojax.manifolds.polish`), which
keeps them at rounding level; float32 and float64 runs are as in the paper.

Feasibility between re-orthonormalizations: at the step cap
(``alpha ||A||_F = 2q = 1``) two iterations leave a defect
``||X^T X - I||_F`` of about 1e-2 per step (5 iterations: ~6e-5), and it
accumulates until the next re-orthonormalization. That is the paper's
trade-off; for iterates that are feasible at every step use
``reorthonormalize_every=1``, more ``iterations``, a smaller ``q``, or
``rsgd``/``radam`` with the exact Cayley retraction.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from orthojax import linalg
from orthojax.linalg import map_views, unzip
from orthojax.manifolds import (cayley_generator, newton_schulz_step, polish,
                                reorthonormalize_newton_schulz)
from orthojax.optim._checks import (check_bucket, check_decay, check_matrices, check_rate,
                                     check_static, require_params, traced)
from orthojax.optim._clean_up import clean_up
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._scope import scoped


class CayleyState(NamedTuple):
  """Step count, (tangent) momentum, and Adam's per-matrix second moment."""
  count: jnp.ndarray
  mu: optax.Params
  nu: optax.Params


def _cayley_optimizer(learning_rate, adam, momentum, b1, b2, q, iterations, eps,
                      reorthonormalize_every, views, bucket, who):
  """Checks the arguments; the transformation (:func:`_cayley`), its views read at
  ``init`` where ``views`` is None."""
  check_rate(who, learning_rate)
  check_bucket(who, bucket)
  check_static(who, iterations, "iterations")
  for name, value in (("b1", b1), ("b2", b2)) if adam else (("momentum", momentum),):
    check_decay(who, value, name)
  if int(iterations) < 1:
    raise ValueError(f"{who}: iterations must be >= 1, got {iterations}")
  if not traced(q) and not 0.0 < q < 1.0:
    raise ValueError(f"{who}: q must be in (0, 1) for the fixed point to contract, got {q}")
  if (reorthonormalize_every is not None and not traced(reorthonormalize_every)
      and int(reorthonormalize_every) < 1):
    raise ValueError(f"{who}: reorthonormalize_every must be None or >= 1")
  options = dict(adam=adam, momentum=momentum, b1=b1, b2=b2, q=q, iterations=int(iterations),
                 eps=eps, reorthonormalize_every=reorthonormalize_every, bucket=bucket, who=who)
  return views_from_init(lambda v: keeping(_cayley(learning_rate, v, **options)), views)


def _cayley(learning_rate, views, *, adam, momentum, b1, b2, q, iterations, eps,
            reorthonormalize_every, bucket, who):
  def init_fn(params):
    check_matrices(who, params, views)

    def nu_leaf(w, view):
      return jnp.zeros(linalg.layout(w.shape, view).batch_shape, linalg.compute_dtype(w.dtype))
    return CayleyState(count=jnp.zeros([], jnp.int32),
                       mu=optax.tree.zeros_like(params),
                       nu=map_views(nu_leaf, params, views=views))

  def update_fn(updates, state, params=None):
    require_params(who, params)
    count = optax.safe_increment(state.count)
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    k = count.astype(jnp.float32)

    def leaf(w, g, m, v, view):
      lo = linalg.layout(w.shape, view)
      dtype = linalg.compute_dtype(w.dtype)
      x, g_t, m_t = (lo.to_tall(jnp.asarray(a, dtype)) for a in (w, g, m))
      if adam:
        m_t = b1 * m_t + (1.0 - b1) * g_t
        v = b2 * v + (1.0 - b2) * jnp.sum(jnp.square(g_t), axis=(-2, -1))
        r = (1.0 - b1 ** k) * jnp.sqrt(v / (1.0 - b2 ** k) + eps)
        a = cayley_generator(x, m_t / r[..., None, None])
        m_t = r[..., None, None] * linalg.generator_matmul(a, x)
        sign = -1.0
      else:
        m_t = momentum * m_t - g_t
        a = cayley_generator(x, m_t)
        m_t = linalg.generator_matmul(a, x)
        sign = 1.0
      alpha = linalg.cayley_safe_step(a, lr, q=q, eps=eps)
      y = linalg.cayley_transform(a, x, tau=sign * alpha, method="iterative",
                                  iterations=iterations)
      y = polish(y, w.dtype)  # bfloat16/float16 points: remove the carried defect
      y = clean_up(y, count, reorthonormalize_every, reorthonormalize_newton_schulz,
                   newton_schulz_step)
      return (lo.from_tall(y).astype(w.dtype) - w, (lo.from_tall(m_t).astype(m.dtype), v))

    with jax.default_matmul_precision("highest"):  # as orthojax.manifolds: no TF32/bf16 passes
      pairs = map_views(leaf, params, updates, state.mu, state.nu, views=views, bucket=bucket)
    out, mv = unzip(pairs, updates)
    mu, nu = unzip(mv, state.mu)
    return out, CayleyState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, scoped("cayley", update_fn))


def cayley_sgd(
    learning_rate: optax.ScalarOrSchedule,
    momentum: float = 0.9,
    q: float = 0.5,
    iterations: int = 2,
    eps: float = 1e-8,
    reorthonormalize_every: int | None = 100,
    views: Any = None,
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Li et al.'s Cayley SGD with momentum on the Stiefel manifold (Algorithm 1).

  Args:
    learning_rate: ``l`` (a float or an Optax schedule); the step is
      ``min(l, 2q / ||A||_F)``.
    momentum: ``beta``.
    q: contraction factor of the step rule (paper: 0.5).
    iterations: fixed-point iterations ``s`` (paper: 2).
    eps: the paper's epsilon.
    reorthonormalize_every: replace the iterate by its polar factor every this
      many steps (None: never), by Newton–Schulz steps
      (:func:`orthojax.manifolds.reorthonormalize_newton_schulz`); ``1``: one
      Newton–Schulz step after every step, with no branch
      (:func:`orthojax.manifolds.newton_schulz_step`).
    views: per-leaf matrix views; None (default): those the parameters' Variables
      record, read at ``init`` on the ``nnx.Optimizer`` path and kept in the state
      (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    bucket: see :func:`orthojax.optim.project_to_tangent` (the per-matrix second moment
      keeps exact-shape stacks).

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation` taking Euclidean gradients.
  """
  return _cayley_optimizer(learning_rate, False, momentum, 0.0, 0.0, q, iterations, eps,
                           reorthonormalize_every, views, bucket, "cayley_sgd")


def cayley_adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    q: float = 0.5,
    iterations: int = 2,
    eps: float = 1e-8,
    reorthonormalize_every: int | None = 100,
    views: Any = None,
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Li et al.'s Cayley Adam on the Stiefel manifold (Algorithm 2).

  The second moment is one scalar per matrix, the paper's ``||G||_F^2``.

  Args:
    learning_rate: ``l`` (a float or an Optax schedule).
    b1, b2: moment decays (paper: 0.9, 0.99).
    q, iterations, eps, reorthonormalize_every, views, bucket: as :func:`cayley_sgd`.

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation` taking Euclidean gradients.
  """
  return _cayley_optimizer(learning_rate, True, 0.0, b1, b2, q, iterations, eps,
                           reorthonormalize_every, views, bucket, "cayley_adam")
