"""Jacobian singular values: exact and Lanczos against numpy products of layer Jacobians."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import orthojax as oj
from orthojax import analysis as oa

SIZES = (7, 10, 12, 9)   # a tanh MLP 7 -> 10 -> 12 -> 9


def _tanh_mlp(seed: int, sizes=SIZES):
  rng = np.random.default_rng(seed)
  ws = [rng.standard_normal((a, b)) * 1.2 / np.sqrt(a) for a, b in zip(sizes[:-1], sizes[1:])]
  bs = [0.2 * rng.standard_normal(b) for b in sizes[1:]]
  return ws, bs


def _jax_mlp(ws, bs):
  wj = [jnp.asarray(w, jnp.float32) for w in ws]
  bj = [jnp.asarray(b, jnp.float32) for b in bs]

  def f(x):   # one example (row vector)
    for w, b in zip(wj, bj):
      x = jnp.tanh(x @ w + b)
    return x

  return f


def _numpy_jacobian(ws, bs, x):
  """∂y/∂x = (∏_l W_l D_l)ᵀ in float64: the explicit product of layer Jacobians."""
  prod = np.eye(len(x))
  for w, b in zip(ws, bs):
    z = x @ w + b
    prod = prod @ w @ np.diag(1.0 - np.tanh(z) ** 2)   # row form: x ↦ tanh(x W + b)
    x = np.tanh(z)
  return prod.T


@functools.partial(jax.jit, static_argnames=("f", "k", "which"))
def _lanczos_svals(f, x, k, which):
  dim = min(x.shape[-1], jax.eval_shape(f, x[0]).shape[-1])
  return oa.jacobian_singular_values(f, x, method="lanczos", k=k, which=which, max_iters=dim)


def test_exact_and_lanczos_equal_numpy_svd_of_the_layer_product():
  ws, bs = _tanh_mlp(0)
  f = _jax_mlp(ws, bs)
  x = np.random.default_rng(1).standard_normal((3, SIZES[0]))
  want = np.stack([np.linalg.svd(_numpy_jacobian(ws, bs, xi), compute_uv=False) for xi in x])
  exact = oa.jacobian_singular_values(f, jnp.asarray(x, jnp.float32))
  assert exact.largest.shape == (3, min(SIZES[0], SIZES[-1])) and exact.smallest is None
  np.testing.assert_allclose(exact.largest, want, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(exact.largest_mean, want.mean(axis=0), rtol=2e-5, atol=1e-6)
  assert bool(jnp.all(exact.converged)) and int(jnp.sum(exact.num_iters)) == 0

  # Lanczos on JᵀJ (7 <= 9): the 2 largest and the 2 smallest, jvp/vjp only.
  lz = _lanczos_svals(f, jnp.asarray(x, jnp.float32), 2, "both")
  np.testing.assert_allclose(lz.largest, want[:, :2], rtol=1e-4)
  np.testing.assert_allclose(lz.smallest, want[:, ::-1][:, :2], rtol=2e-3)
  np.testing.assert_allclose(lz.smallest_mean, want[:, ::-1][:, :2].mean(0), rtol=2e-3)
  assert bool(jnp.all(lz.converged))

  # The reverse shape (9 -> 7): Lanczos on JJᵀ, the smaller Gram (the larger one,
  # JᵀJ, would put two zero eigenvalues at the bottom instead of σ_6², σ_7²).
  ws_t, bs_t = _tanh_mlp(2, SIZES[::-1])
  g = _jax_mlp(ws_t, bs_t)
  xt = np.random.default_rng(3).standard_normal((2, SIZES[-1]))
  want_t = np.stack([np.linalg.svd(_numpy_jacobian(ws_t, bs_t, xi), compute_uv=False)
                     for xi in xt])
  lz = _lanczos_svals(g, jnp.asarray(xt, jnp.float32), 2, "both")
  np.testing.assert_allclose(lz.largest, want_t[:, :2], rtol=1e-4)
  np.testing.assert_allclose(lz.smallest, want_t[:, ::-1][:, :2], rtol=2e-3)
  # per_example=False: one example, no batch axis.
  one = oa.jacobian_singular_values(g, jnp.asarray(xt[1], jnp.float32), k=2, which="smallest",
                                    per_example=False)
  np.testing.assert_allclose(one.smallest, want_t[1, ::-1][:2], rtol=1e-4)


def test_deep_mlp_hidden_map_is_the_product_of_layer_jacobians():
  model = oj.models.DeepMLP(5, 4, 16, 3, q_star=0.5, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(4).standard_normal((2, 5)), jnp.float32)
  hs = np.asarray(model.preactivations(x), np.float64)          # (L + 1, B, width)
  w_in, w = (np.asarray(a, np.float64) for a in model.effective_kernels())

  def product(a, b, i):
    """∂h^b/∂h^a of example i: (D_a W^a ⋯ D_{b−1} W^{b−1})ᵀ, W⁰ first from the input."""
    prod = w_in if a == 0 else np.eye(16)
    for layer in range(max(a, 1), b):
      prod = prod @ np.diag(1.0 - np.tanh(hs[layer - 1, i]) ** 2) @ w[layer - 1]
    return prod.T

  f = oa.deep_mlp_hidden_map(model, 2, 5)            # h² -> h⁵ = h^{L+1}
  np.testing.assert_allclose(f(hs[1]), hs[4], rtol=1e-5, atol=1e-5)
  got = oa.jacobian_singular_values(f, jnp.asarray(hs[1], jnp.float32)).largest
  want = [np.linalg.svd(product(2, 5, i), compute_uv=False) for i in range(2)]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  # from the input (a = 0) to h³; and the default to_layer is L + 1
  f0 = oa.deep_mlp_hidden_map(model, 0, 3)
  np.testing.assert_allclose(f0(x), hs[2], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(oa.deep_mlp_hidden_map(model, 0)(x), hs[-1], rtol=1e-5, atol=1e-5)
  got = oa.jacobian_singular_values(f0, x).largest
  want = [np.linalg.svd(product(0, 3, i), compute_uv=False) for i in range(2)]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


class _TanhNet(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(5, 8, rngs=rngs)
    self.l2 = nnx.Linear(8, 4, rngs=rngs)

  def __call__(self, x):
    return self.l2(jnp.tanh(self.l1(x)))


def test_nnx_module_is_called_in_eval_mode_on_batches_of_one():
  model = _TanhNet(nnx.Rngs(0))
  x = np.random.default_rng(5).standard_normal((3, 5))
  got = oa.jacobian_singular_values(model, jnp.asarray(x, jnp.float32), k=2)
  w1, b1 = np.asarray(model.l1.kernel[...], np.float64), np.asarray(model.l1.bias[...])
  w2 = np.asarray(model.l2.kernel[...], np.float64)
  for i in range(3):
    jac = (w1 @ np.diag(1.0 - np.tanh(x[i] @ w1 + b1) ** 2) @ w2).T
    np.testing.assert_allclose(got.largest[i], np.linalg.svd(jac, compute_uv=False)[:2],
                               rtol=1e-5)
  # Eval mode, without touching the caller's model: dropout is off in the analysis.
  drop = nnx.Sequential(nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.Dropout(0.5, rngs=nnx.Rngs(1)))
  s = oa.jacobian_singular_values(drop, jnp.ones((2, 4)))
  np.testing.assert_allclose(s.largest[0], s.largest[1], rtol=1e-6)
  np.testing.assert_allclose(s.largest[0], np.linalg.svd(np.asarray(drop.layers[0].kernel[...]),
                                                         compute_uv=False), rtol=1e-5)
  assert not drop.layers[1].deterministic


def test_orthogonal_deep_linear_network_is_an_exact_isometry():
  model = oj.models.DeepLinear(12, 32, init="orthogonal", rngs=nnx.Rngs(0))
  x = jnp.ones((1, 32))
  s = oa.jacobian_singular_values(model, x)
  np.testing.assert_allclose(s.largest, 1.0, atol=1e-5)
  s = oa.jacobian_singular_values(model, x, method="lanczos", k=2, which="both", max_iters=32)
  np.testing.assert_allclose(jnp.stack([s.largest, s.smallest]), 1.0, atol=1e-5)


def test_gaussian_deep_linear_spectrum_spreads_linearly_in_depth():
  """Var of the eigenvalues of JJᵀ for L Gaussian layers ≈ L (free probability)."""
  depths, width, seeds = (1, 2, 4, 8), 128, 4
  variances = []
  x = jnp.ones((1, width))
  for depth in depths:
    per_seed = []
    for seed in range(seeds):
      model = oj.models.DeepLinear(depth, width, init="gaussian", rngs=nnx.Rngs(seed))
      s2 = np.asarray(oa.jacobian_singular_values(model, x).largest[0], np.float64) ** 2
      per_seed.append(s2.var())
      np.testing.assert_allclose(s2.mean(), 1.0, atol=0.25)   # m1 = χ^L = 1
    variances.append(np.mean(per_seed))
  slope, intercept = np.polyfit(depths, variances, 1)
  assert 0.85 < slope < 1.15, (variances, slope)
  assert abs(intercept) < 0.5, (variances, intercept)
  moments = [oa.jacobian_spectrum_moments("linear", d, weights="gaussian", sigma_w=1.0,
                                          q_star=1.0) for d in depths]
  np.testing.assert_allclose([m.variance for m in moments], depths)
  np.testing.assert_allclose(variances, depths, rtol=0.2)


def test_bad_input():
  f = _jax_mlp(*_tanh_mlp(0))
  x = jnp.ones((2, SIZES[0]))
  with pytest.raises(ValueError, match="method"):
    oa.jacobian_singular_values(f, x, method="svd")
  with pytest.raises(ValueError, match="k=8"):
    oa.jacobian_singular_values(f, x, k=8)
  with pytest.raises(ValueError, match="which"):
    oa.jacobian_singular_values(f, x, which="all")
  with pytest.raises(TypeError, match="callable"):
    oa.jacobian_singular_values(np.eye(3), x)
  with pytest.raises(ValueError, match="batch axis"):
    oa.jacobian_singular_values(f, jnp.float32(1.0))
  model = oj.models.DeepMLP(5, 4, 16, 3, sigma_w=1.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="from_layer < to_layer"):
    oa.deep_mlp_hidden_map(model, 3, 3)
  with pytest.raises(ValueError, match="depth \\+ 1 = 5"):
    oa.deep_mlp_hidden_map(model, 1, 6)
  with pytest.raises(TypeError, match="DeepMLP"):
    oa.deep_mlp_hidden_map(nnx.Linear(2, 2, rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="no method"):
    oa.model_function(model, "nope")
