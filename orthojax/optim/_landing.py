"""The landing algorithm: retraction-free optimization near the Stiefel manifold.

Ablin & Peyré, "Fast and accurate optimization on the orthogonal manifold
without retraction", AISTATS 2022; Stiefel version: Ablin, Vary, Gao & Absil,
"Infeasible deterministic, stochastic, and variance-reduction algorithms for
optimization under orthogonality constraints", 2023.

On the tall matrix X (n x p), with G the Euclidean gradient, the landing field

    Lambda(X) = psi(X) + lam * X (X^T X - I),
    psi(X)    = skew(G X^T) X = (G (X^T X) - X (G^T X)) / 2

needs only p x p products (the n x n skew matrix is never formed). The step
``X <- X - eta Lambda(X)`` uses the safe step size of the Stiefel paper, which
keeps the iterate in the safe region ``d = ||X^T X - I||_F <= eps``:

    a = ||psi(X)||_F,  alpha = 2 lam d - 2 a d - 2 lam d^2,
    beta = a^2 + lam^2 d^3 + 2 lam a d^2 + a^2 d,
    eta* = (sqrt(alpha^2 + 4 beta (eps - d)) + alpha) / (2 beta),
    eta  = min(lr, eta*, 1 / (2 lam))          (per matrix).

The cap ``1 / (2 lam)`` is part of the lemma's hypotheses: its bound on the
normal part, ``||R - 2 eta lam (R + R^2)||_F <= (1 - 2 eta lam) d + 2 eta lam d^2``
(R = X^T X - I), needs ``2 eta lam <= 1``. Without it, a small ``psi`` (e.g. a
vanishing gradient near the manifold) makes ``eta* ~ 2 / (lam d^2)`` huge and
the normal step overshoots far out of the safe region.

Numerics: ``eta*`` is +inf when ``beta = 0`` (on the manifold with a zero
gradient); the square root's argument is clipped at 0, and where ``eta*`` is
not a positive finite number (only outside the safe region, d > eps) the step
falls back to ``min(lr, 1 / (2 lam (1 + d)))``, for which the normal term
alone pulls the iterate back: it maps each eigenvalue r of ``X^T X - I``
(``-1 <= r <= d``) to ``r (1 - 2c (1 + r) + c^2 r (1 + r))``, ``c = eta lam``,
a factor in [0, 1) when ``2 c (1 + d) <= 1`` (the plain ``1 / (2 lam)`` would
amplify every r > 4, i.e. singular values above sqrt(5), and diverge).
Every quantity is per batch matrix, so stacks of matrices never mix their step
sizes and no NaN can arise from a single degenerate one.

Low precision: for parameters stored in bfloat16/float16 the field is
computed in float32, but near the manifold the attraction's change to an
entry (of order ``eta lam d |x_ij|``) is below half an ulp of ``x_ij`` and
rounds away, so the iterate drifts from the manifold (a 16 x 8 bfloat16
matrix reached ``d = 0.25`` within 10^4 steps; with a zero gradient it stalls
at ``d = 0.07``). There the new point ``X - eta Lambda`` is polished by
Newton–Schulz steps (:func:`orthojax.manifolds.polish`: one or two, each two
``n x p x p`` products, matmuls only) before it is rounded, which keeps ``d``
at rounding level. float32 and float64 runs are unchanged.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from orthojax import linalg
from orthojax.linalg import map_views
from orthojax.manifolds import polish
from orthojax.optim._checks import check_bucket, check_rate, require_params, traced
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._scope import scoped


class LandingState(NamedTuple):
  """Step count (for learning-rate schedules)."""
  count: jnp.ndarray


def landing_field(x, g, lam):
  """``(psi, normal, d)`` on tall matrices; ``Lambda = psi + lam * normal``."""
  xtx = x.mT @ x
  psi = 0.5 * (g @ xtx - x @ (g.mT @ x))
  residual = xtx - jnp.eye(x.shape[-1], dtype=x.dtype)
  return psi, x @ residual, jnp.linalg.matrix_norm(residual)


def safe_step_size(a, d, lam, eps):
  """The Stiefel landing paper's ``eta*(a, d)`` (see the module docstring)."""
  alpha = 2.0 * lam * d - 2.0 * a * d - 2.0 * lam * d ** 2
  beta = a ** 2 + lam ** 2 * d ** 3 + 2.0 * lam * a * d ** 2 + a ** 2 * d
  root = jnp.sqrt(jnp.maximum(alpha ** 2 + 4.0 * beta * (eps - d), 0.0))
  safe_beta = jnp.where(beta > 0, beta, 1.0)
  return jnp.where(beta > 0, (root + alpha) / (2.0 * safe_beta), jnp.inf)


def landing(
    learning_rate: optax.ScalarOrSchedule,
    lam: float = 1.0,
    eps: float = 0.5,
    safe_step: bool = True,
    views: Any = None,
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Landing on the Stiefel manifold (matmuls only, no retraction).

  Args:
    learning_rate: a float or an Optax schedule (the step before the safe cap).
    lam: weight ``lambda`` of the attraction to the manifold (paper: 1).
    eps: radius of the safe region (paper: 0.5); must be in (0, 1).
    safe_step: cap the step at ``eta*`` (recommended; without it a large step
      can leave the safe region and diverge).
    views: per-leaf matrix views; None (default): those the parameters' Variables
      record, read at ``init`` on the ``nnx.Optimizer`` path and kept in the state
      (:class:`orthojax.optim.RecordedViewsState`), else inferred.
    bucket: see :func:`orthojax.optim.project_to_tangent` (the field and the safe step
      map zero rows to zero rows and are per matrix, so padded stacks are exact).

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation` taking Euclidean gradients and
    returning ``-eta * Lambda(X)`` (it pulls its leaves back to the manifold at every
    step).
  """
  check_rate("landing", learning_rate)
  check_bucket("landing", bucket)
  if not traced(eps) and not 0.0 < eps < 1.0:
    raise ValueError(f"landing: eps must be in (0, 1), got {eps}")
  if not traced(lam) and lam <= 0:
    raise ValueError(f"landing: lam must be > 0, got {lam}")
  return views_from_init(
      lambda v: keeping(_landing(learning_rate, lam, eps, safe_step, v, bucket)), views)


def _landing(learning_rate, lam, eps, safe_step, views, bucket):
  def update_fn(updates, state, params=None):
    require_params("landing", params)
    lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
    lr = jnp.asarray(lr, jnp.float32)

    def leaf(w, g, view):
      lo = linalg.layout(w.shape, view)
      dtype = linalg.compute_dtype(w.dtype)
      x, g_t = lo.to_tall(jnp.asarray(w, dtype)), lo.to_tall(jnp.asarray(g, dtype))
      psi, normal, d = landing_field(x, g_t, lam)
      if safe_step:
        eta = safe_step_size(jnp.linalg.matrix_norm(psi), d, lam, eps)
        eta = jnp.where(jnp.isfinite(eta) & (eta > 0), eta,
                        jnp.minimum(lr, 0.5 / (lam * (1.0 + d))))
        eta = jnp.minimum(jnp.minimum(lr, eta), 0.5 / lam)
      else:
        eta = jnp.broadcast_to(lr, d.shape)
      step = -eta[..., None, None] * (psi + lam * normal)
      if dtype != w.dtype:  # stored in bfloat16/float16: see the module docstring
        step = polish(x + step, w.dtype) - x
      return lo.from_tall(step).astype(g.dtype)

    with jax.default_matmul_precision("highest"):  # as orthojax.manifolds: no TF32/bf16 passes
      out = map_views(leaf, params, updates, views=views, bucket=bucket)
    return out, LandingState(count=optax.safe_increment(state.count))

  return optax.GradientTransformation(
      lambda params: LandingState(count=jnp.zeros([], jnp.int32)),
      scoped("landing", update_fn))
