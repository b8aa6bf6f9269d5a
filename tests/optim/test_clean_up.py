"""``reorthonormalize_every=1``: one Newton–Schulz step after every step, with no branch —
it holds an iterative-Cayley iterate at float32 rounding where the clean-up every 100
steps lets the defect grow between clean-ups; ``k > 1`` keeps its guarded branch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import orthojax as oj
from tests.jaxpr_counts import update_primitives

CAYLEY = oj.manifolds.Stiefel("cayley", cayley_iterations=2)
STACK = oj.linalg.MatrixView.stacked()
SHAPES = {"stack": (4, 64, 64), "conv": (3, 3, 16, 16), "tall": (96, 24)}
VIEWS = {"stack": STACK}

OPTIMIZERS = {
    "radam (fused)": lambda every: oj.optim.radam(1e-3, CAYLEY, views=VIEWS,
                                                  reorthonormalize_every=every),
    "rsgd (chain)": lambda every: oj.optim.rsgd(
        1e-3, oj.manifolds.Stiefel("cayley", cayley_iterations=2, metric="canonical"),
        views=VIEWS, reorthonormalize_every=every),
    "cayley_adam": lambda every: oj.optim.cayley_adam(1e-3, views=VIEWS,
                                                      reorthonormalize_every=every),
}


def _params():
  keys = jax.random.split(jax.random.key(0), len(SHAPES))
  return {name: oj.manifolds.Stiefel().random(key, shape, view=VIEWS.get(name))
          for key, (name, shape) in zip(keys, SHAPES.items())}


def _largest_defect(tx, steps):
  """The largest defect of any matrix over ``steps`` updates on random gradients."""
  params = _params()

  def body(carry, key):
    p, s = carry
    g = {k: jax.random.normal(kk, x.shape) for (k, x), kk in
         zip(p.items(), jax.random.split(key, len(p)))}
    u, s = tx.update(g, s, p)
    p = optax.apply_updates(p, u)
    defect = jnp.max(jnp.stack([jnp.max(oj.manifolds.Stiefel().defect(x, view=VIEWS.get(k)))
                                for k, x in p.items()]))
    return (p, s), defect

  _, defects = jax.jit(lambda p: jax.lax.scan(body, (p, tx.init(p)),
                                              jax.random.split(jax.random.key(1), steps)))(
      params)
  return float(jnp.max(defects))


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_a_newton_schulz_step_every_step_holds_the_defect_at_rounding(name):
  every_step = _largest_defect(OPTIMIZERS[name](1), 300)
  every_100 = _largest_defect(OPTIMIZERS[name](100), 300)
  assert every_step <= 1e-5, every_step
  assert every_100 > 2 * every_step, (every_100, every_step)   # the drift it removes


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_every_step_has_no_branch_and_every_k_keeps_its_guard(name):
  params = _params()
  grads = jax.tree.map(jnp.ones_like, params)
  assert "cond" not in update_primitives(OPTIMIZERS[name](1), params, grads)
  assert "cond" in update_primitives(OPTIMIZERS[name](100), params, grads)


def test_the_step_is_one_cubic_newton_schulz_step():
  w = oj.manifolds.Stiefel().random(jax.random.key(2), (40, 8)) * 1.001
  want = w @ (1.5 * np.eye(8) - 0.5 * w.T @ w)
  np.testing.assert_allclose(oj.manifolds.Stiefel().reorthonormalize_step(w), want,
                             rtol=1e-6, atol=1e-7)
  before = oj.manifolds.Stiefel().defect(w)
  after = oj.manifolds.Stiefel().defect(oj.manifolds.newton_schulz_step(w))
  assert after < 0.76 * before ** 2 + 1e-6   # δ -> ~3/4 δ²


QR_OPTIMIZERS = {
    "radam (fused)": lambda qr: oj.optim.radam(1e-3, qr, views=VIEWS),
    "rsgd (fused momentum)": lambda qr: oj.optim.rsgd(1e-3, qr, momentum=0.9, views=VIEWS),
    "rsgd (chain, canonical)": lambda qr: oj.optim.rsgd(
        1e-3, oj.manifolds.Stiefel("qr", metric="canonical", qr_algorithm=qr.qr_algorithm),
        views=VIEWS),
}


@pytest.mark.parametrize("platform", ["cpu", "cuda", "tpu"])
@pytest.mark.parametrize("name", sorted(QR_OPTIMIZERS))
def test_the_qr_retraction_has_no_branch_unless_cholesky_qr2_is_asked_for(name, platform):
  """The default QR retraction is one CholeskyQR pass (a retraction point's singular
  values are all at least 1): no ``cond`` on any backend; ``qr_algorithm="cholesky_qr2"``
  keeps its two guards."""
  params = _params()
  grads = jax.tree.map(jnp.ones_like, params)
  make = QR_OPTIMIZERS[name]
  assert "cond" not in update_primitives(make(oj.manifolds.Stiefel("qr")), params, grads,
                                         platform)
  guarded = make(oj.manifolds.Stiefel("qr", qr_algorithm="cholesky_qr2"))
  assert update_primitives(guarded, params, grads, platform).get("cond", 0) >= 2
