"""Fisher λ_max against the dense Fisher; NTK spectrum = MSE Gauss–Newton spectrum × B."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

from orthojax import analysis as oa

B, D_IN, HIDDEN, C = 6, 4, 5, 3


class _Net(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(D_IN, HIDDEN, rngs=rngs)
    self.l2 = nnx.Linear(HIDDEN, C, rngs=rngs)

  def __call__(self, x):
    return self.l2(jnp.tanh(self.l1(x)))


@pytest.fixture(scope="module")
def setup():
  apply_fn, params = oa.model_apply(_Net(nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((B, D_IN)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, C, B))
  targets = jnp.asarray(rng.standard_normal((B, C)), jnp.float32)
  return apply_fn, params, x, labels, targets


@pytest.fixture(scope="module")
def dense(setup):
  """The Fisher matrices built explicitly (float64 numpy): Jᵀ H J / B and Σ g gᵀ / B.

  ``jax.jacobian`` of the outputs and of the per-example losses (written out by
  hand, not with orthojax) with respect to the flattened parameters.
  """
  apply_fn, params, x, labels, targets = setup
  flat, unravel = ravel_pytree(params)

  @jax.jit
  def jacobians(flat):
    out = lambda t: apply_fn(unravel(t), x)
    ce = lambda t: -jnp.take_along_axis(jax.nn.log_softmax(out(t)), labels[:, None], 1)[:, 0]
    mse = lambda t: 0.5 * jnp.sum((out(t) - targets) ** 2, axis=1)
    return out(flat), jax.jacobian(out)(flat), jax.jacobian(ce)(flat), jax.jacobian(mse)(flat)

  z, jac, g_ce, g_mse = (np.asarray(a, np.float64) for a in jacobians(flat))
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  h_ce = [np.diag(pi) - np.outer(pi, pi) for pi in p]
  return {("cross_entropy", "gauss_newton"): sum(j.T @ h @ j for j, h in zip(jac, h_ce)) / B,
          ("mse", "gauss_newton"): sum(j.T @ j for j in jac) / B,
          ("cross_entropy", "empirical"): g_ce.T @ g_ce / B,
          ("mse", "empirical"): g_mse.T @ g_mse / B,
          "jacobian": jac.reshape(B * C, -1)}


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("kind", ["gauss_newton", "empirical"])
def test_max_eigenvalue_equals_the_dense_fisher(setup, dense, loss, kind):
  apply_fn, params, x, labels, targets = setup
  y = labels if loss == "cross_entropy" else targets
  want = np.linalg.eigvalsh(dense[loss, kind])[-1]
  lz = oa.fisher_max_eigenvalue(apply_fn, params, x, y, loss=loss, kind=kind, tol=1e-5)
  assert bool(lz.converged) and int(lz.num_iters) <= 30
  np.testing.assert_allclose(lz.eigenvalue, want, rtol=1e-4)
  # the eigenvector comes back as a params-shaped tree, unit norm
  assert jax.tree.structure(lz.vector) == jax.tree.structure(params)
  np.testing.assert_allclose(jnp.linalg.norm(ravel_pytree(lz.vector)[0]), 1.0, rtol=1e-5)
  if (loss, kind) in (("cross_entropy", "gauss_newton"), ("mse", "empirical")):
    pw = oa.fisher_max_eigenvalue(apply_fn, params, x, y, loss=loss, kind=kind, method="power",
                                  tol=1e-7, max_iters=500)
    assert bool(pw.converged)
    np.testing.assert_allclose(pw.eigenvalue, want, rtol=1e-3)


def test_one_hot_labels_and_jit(setup, dense):
  apply_fn, params, x, labels, _ = setup
  run = jax.jit(lambda p, x, y: oa.fisher_max_eigenvalue(
      apply_fn, p, x, y, kind="empirical", tol=1e-5).eigenvalue)
  want = np.linalg.eigvalsh(dense["cross_entropy", "empirical"])[-1]
  np.testing.assert_allclose(run(params, x, jax.nn.one_hot(labels, C)), want, rtol=1e-4)

  # the matvec itself: symmetric positive semi-definite, G u = dense G u
  @jax.jit
  def products(p, u, v):
    mv, _, _ = oa.fisher_matvec(apply_fn, p, x, loss="cross_entropy")
    return u @ mv(v), v @ mv(u), v @ mv(v), mv(u)

  dim = dense["cross_entropy", "gauss_newton"].shape[0]
  u, v = (jax.random.normal(k, (dim,)) for k in jax.random.split(jax.random.key(0)))
  uv, vu, vv, gu = products(params, u, v)
  np.testing.assert_allclose(uv, vu, rtol=1e-4)
  assert float(vv) >= 0.0
  np.testing.assert_allclose(gu, dense["cross_entropy", "gauss_newton"] @ np.asarray(u),
                             rtol=1e-4, atol=1e-6)


def test_ntk_and_mse_gauss_newton_share_their_nonzero_spectrum(setup, dense):
  apply_fn, params, x, _, _ = setup
  ntk = np.asarray(oa.empirical_ntk(apply_fn, params, x), np.float64)
  assert ntk.shape == (B * C, B * C)
  np.testing.assert_allclose(ntk, ntk.T, atol=1e-5)
  jac = dense["jacobian"]   # Θ = J Jᵀ entry by entry, example-major rows
  np.testing.assert_allclose(ntk, jac @ jac.T, rtol=1e-4, atol=1e-5)
  blocks = np.asarray(oa.empirical_ntk(apply_fn, params, x, flat=False))
  np.testing.assert_allclose(blocks[2, 4], ntk[2 * C:3 * C, 4 * C:5 * C], rtol=1e-6)

  theta = np.asarray(oa.ntk_eigenvalues(apply_fn, params, x), np.float64)
  gn = np.linalg.eigvalsh(dense["mse", "gauss_newton"])[::-1]
  rank = int(np.sum(theta > 1e-4 * theta[0]))
  assert rank == B * C   # P = 43 parameters > B·C = 18 outputs: Θ has full rank here
  # non-zero eigenvalues: λ(G) = λ(Θ) / B; G has P − rank further zeros
  np.testing.assert_allclose(gn[:rank], theta[:rank] / B, rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(gn[rank:], 0.0, atol=1e-5)
  lz = oa.fisher_max_eigenvalue(apply_fn, params, x, loss="mse", tol=1e-6)
  np.testing.assert_allclose(lz.eigenvalue, theta[0] / B, rtol=1e-4)


def test_bad_input(setup):
  apply_fn, params, x, labels, targets = setup
  with pytest.raises(ValueError, match="loss"):
    oa.fisher_max_eigenvalue(apply_fn, params, x, loss="hinge")
  with pytest.raises(ValueError, match="kind"):
    oa.fisher_max_eigenvalue(apply_fn, params, x, kind="true")
  with pytest.raises(ValueError, match="method"):
    oa.fisher_max_eigenvalue(apply_fn, params, x, method="arnoldi")
  with pytest.raises(ValueError, match="needs the labels"):
    oa.fisher_max_eigenvalue(apply_fn, params, x, kind="empirical")
  with pytest.raises(ValueError, match="integer labels must have shape"):
    oa.fisher_max_eigenvalue(apply_fn, params, x, labels[:2], kind="empirical")
  with pytest.raises(ValueError, match="mse targets"):
    oa.fisher_max_eigenvalue(apply_fn, params, x, targets[:, :2], loss="mse", kind="empirical")
  with pytest.raises(ValueError, match="batch axis"):
    oa.fisher_matvec(apply_fn, params, jnp.float32(1.0))
  with pytest.raises(ValueError, match="no entries"):
    oa.fisher_matvec(apply_fn, {}, x)
