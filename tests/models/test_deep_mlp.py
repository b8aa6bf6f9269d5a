"""DeepMLP: scanned = unrolled, critical mean-field statistics, manifold weights.

Small models share one shape (6 → 5 × 12 → 3, a wide input layer) and test
data comes from numpy, so jax compiles few distinct random draws.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import orthojax as oj
from orthojax.models import DeepMLP

SMALL = (6, 5, 12, 3)   # in_features, depth, width, out_features


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _randomise_biases(model, seed):
  """Non-zero biases everywhere, so the comparisons see them."""
  model.in_bias[...] = _normal(seed, model.in_bias.shape, 0.1)
  model.biases[...] = _normal(seed + 1, model.biases.shape, 0.1)
  model.readout.bias[...] = _normal(seed + 2, model.readout.bias.shape, 0.1)


def _unrolled(model, x):
  """Pre-activations and logits by a float64 numpy loop over the raw parameters."""
  f64 = lambda v: np.asarray(v[...], np.float64)
  s_in = 1.0 if model.in_scale is None else float(model.in_scale[...])
  scales = np.ones(model.depth) if model.scales is None else f64(model.scales)
  kernels, biases = f64(model.kernels), f64(model.biases)
  h = np.asarray(x, np.float64) @ (s_in * f64(model.in_kernel)) + f64(model.in_bias)
  hs = [h]
  for layer in range(model.depth):
    h = np.tanh(h) @ (scales[layer] * kernels[layer]) + biases[layer]
    hs.append(h)
  logits = np.tanh(h) @ f64(model.readout.kernel) + f64(model.readout.bias)
  return np.stack(hs), logits


@pytest.mark.parametrize("weights", ["euclidean", "stiefel", "oblique"])
def test_scan_equals_unrolled_loop(weights):
  model = DeepMLP(*SMALL, q_star=0.5, init="orthogonal", weights=weights, rngs=nnx.Rngs(0))
  _randomise_biases(model, 1)
  x = _normal(2, (4, SMALL[0]))
  hs, logits = _unrolled(model, x)
  np.testing.assert_allclose(model(x), logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(model.preactivations(x), hs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(model.features(x), np.tanh(hs[-1]), rtol=1e-5, atol=1e-5)
  assert model.kernels.shape == (5, 12, 12)
  # jit'd and single-example inputs go through the same scan
  np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(model, x), logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(model(x[0]), logits[0], rtol=1e-5, atol=1e-5)


# (orthogonal, stiefel) draws the same matrices as (orthogonal, euclidean): left out.
@pytest.mark.parametrize("init,weights", [("gaussian", "euclidean"), ("orthogonal", "euclidean"),
                                          ("gaussian", "oblique")])
def test_critical_init_statistics(init, weights):
  """Wide tanh net at q* = 1/2: E[h²] ≈ q* in every layer and χ ≈ 1.

  At width N a layer's mean square fluctuates by O(√(2/N)) for Gaussian and
  oblique weights (the norm of ``xW`` per input direction) and less for
  orthogonal ones, and the q-map contracts only slowly, so single layers get
  10 % and the average over layers 3 %. The input layer is wide (256 → 512):
  that checks the √(fan_out/fan_in) gain of orthogonal and manifold weights.
  """
  q_star, width, depth = 0.5, 512, 16
  model = DeepMLP(width // 2, depth, width, 10, q_star=q_star, init=init, weights=weights,
                  rngs=nnx.Rngs(3))
  sw, sb = model.sigma_w, model.sigma_b
  q_in = (q_star - sb ** 2) / sw ** 2                 # input mean square giving q¹ = q*
  x = _normal(4, (64, width // 2), np.sqrt(q_in))
  u = _normal(5, x.shape)                             # a tangent at the input
  hs, dhs = jax.jvp(model.preactivations, (x,), (u,))
  hs = np.asarray(hs, np.float64)
  assert hs.shape == (depth + 1, 64, width)

  q = np.mean(np.square(hs), axis=(1, 2))
  np.testing.assert_allclose(q, q_star, rtol=0.10)
  np.testing.assert_allclose(np.mean(q), q_star, rtol=0.03)
  # χ = σ_w² E[φ'(h)²] per layer, from the measured pre-activations
  chi = sw ** 2 * np.mean(np.square(1.0 - np.square(np.tanh(hs))), axis=(1, 2))
  np.testing.assert_allclose(chi, 1.0, atol=0.06)
  np.testing.assert_allclose(np.mean(chi), 1.0, atol=0.02)
  # χ on the Jacobian itself: per-layer growth of the mean square of J u
  norms = np.mean(np.square(np.asarray(dhs, np.float64)), axis=(1, 2))
  np.testing.assert_allclose((norms[-1] / norms[0]) ** (1.0 / depth), 1.0, atol=0.015)


@pytest.mark.parametrize("weights,init", [("stiefel", "gaussian"), ("oblique", "gaussian"),
                                          ("oblique", "orthogonal")])
def test_manifold_kernels_on_manifold_at_init(weights, init):
  with jax.enable_x64(True):
    model = DeepMLP(*SMALL, q_star=1 / 64, init=init, weights=weights,
                    param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    stack = np.asarray(model.kernels[...])
    v_in = np.asarray(model.in_kernel[...])        # wide (6, 12): the rows are the tall side
  assert stack.dtype == v_in.dtype == np.float64
  gram = np.einsum("lij,lik->ljk", stack, stack)
  gram_in = v_in @ v_in.T
  if weights == "stiefel" or init == "orthogonal":   # a Stiefel point is an oblique point too
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(12), gram.shape), atol=1e-12)
    np.testing.assert_allclose(gram_in, np.eye(6), atol=1e-12)
  else:
    np.testing.assert_allclose(np.diagonal(gram, axis1=1, axis2=2), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.diag(gram_in), 1.0, atol=1e-12)
    assert np.max(np.abs(gram - np.eye(12))) > 0.1   # columns not orthogonal
  np.testing.assert_allclose(model.scales[...], model.sigma_w)
  np.testing.assert_allclose(model.in_scale[...], model.sigma_w * np.sqrt(12 / 6))
  labels = oj.nn.manifold_labels(model)
  assert labels["kernels"] == weights and labels["in_kernel"] == weights
  assert labels["scales"] == labels["in_scale"] == labels["biases"] == "euclidean"
  assert labels["readout"]["kernel"] == "euclidean"
  assert oj.nn.matrix_views(model)["kernels"] == oj.linalg.MatrixView.stacked()


def _classify_loss(model, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


@pytest.mark.parametrize("weights,learn_scale", [("stiefel", True), ("oblique", False)])
def test_riemannian_training_keeps_kernels_on_manifold(weights, learn_scale):
  model = DeepMLP(*SMALL, q_star=0.5, weights=weights, learn_scale=learn_scale,
                  rngs=nnx.Rngs(0))
  manifold = oj.manifolds.Stiefel() if weights == "stiefel" else oj.manifolds.Oblique()
  tx = oj.optim.partition(
      model, **{weights: oj.optim.radam(0.02, manifold=manifold,
                                        views=oj.nn.matrix_views(model))},
      euclidean=optax.adam(0.02))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x = _normal(1, (64, SMALL[0]))
  y = jnp.argmax(x[:, :3], axis=-1)
  scales_before = np.asarray(model.scales[...])

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(_classify_loss)(model, x, y)
    optimizer.update(model, grads)
    return loss

  first = float(step(model, optimizer))
  for _ in range(25):
    last = float(step(model, optimizer))
  assert last < 0.5 * first, (first, last)
  stack = np.asarray(model.kernels[...], np.float64)
  gram = np.einsum("lij,lik->ljk", stack, stack)
  if weights == "stiefel":
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(12), gram.shape), atol=1e-5)
  else:
    np.testing.assert_allclose(np.diagonal(gram, axis1=1, axis2=2), 1.0, atol=1e-5)
  v_in = np.asarray(model.in_kernel[...], np.float64)   # wide: unit (orthonormal) rows
  np.testing.assert_allclose(np.linalg.norm(v_in, axis=1), 1.0, atol=1e-5)
  assert ("scales" in nnx.state(model, nnx.Param)) == learn_scale
  moved = np.max(np.abs(np.asarray(model.scales[...]) - scales_before))
  assert (moved > 1e-4) == learn_scale


def test_bad_names_and_missing_critical_points():
  rngs = nnx.Rngs(0)
  with pytest.raises(ValueError, match="activation='swishy'.*'tanh'"):
    DeepMLP(*SMALL, activation="swishy", rngs=rngs)
  with pytest.raises(ValueError, match=r"init='xavier'; valid: \['gaussian', 'orthogonal'\]"):
    DeepMLP(*SMALL, init="xavier", rngs=rngs)
  with pytest.raises(ValueError, match=r"weights='sphere'.*'euclidean', 'stiefel', 'oblique'"):
    DeepMLP(*SMALL, weights="sphere", rngs=rngs)
  with pytest.raises(ValueError, match="not both"):
    DeepMLP(*SMALL, q_star=0.5, sigma_w=1.0, rngs=rngs)
  with pytest.raises(ValueError, match="depth"):
    DeepMLP(6, 0, 12, 3, rngs=rngs)
  with pytest.raises(ValueError, match="critical only at sigma_b = 0"):
    DeepMLP(*SMALL, activation="relu", sigma_b=0.1, rngs=rngs)
  with pytest.raises(ValueError, match="no critical point"):
    DeepMLP(*SMALL, activation=jax.nn.sigmoid, q_star=1 / 64, rngs=rngs)
  relu = DeepMLP(*SMALL, activation="relu", q_star=1.0, rngs=rngs)
  assert relu.sigma_w == pytest.approx(np.sqrt(2)) and relu.sigma_b == 0.0
  plain = DeepMLP(*SMALL, sigma_w=1.5, rngs=rngs)
  assert (plain.sigma_w, plain.sigma_b) == (1.5, 0.0)
