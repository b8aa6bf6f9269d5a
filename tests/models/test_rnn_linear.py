"""SequenceRNN (E6) and DeepLinear (E7) against loop references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import orthojax as oj
from orthojax.models import DeepLinear
from orthojax.models import SequenceRNN

# One small shape per model, and numpy test data, so jax compiles few random draws.
RNN = dict(input_size=3, hidden=6, num_classes=4)


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


# ------------------------------------------------------------------------------
# SequenceRNN
# ------------------------------------------------------------------------------


def _rnn_reference(model, x):
  """States and logits by a float64 Python loop over time."""
  f64 = lambda v: np.asarray(v[...], np.float64)
  w_rec = f64(model.recurrent_kernel)
  if model.recurrent_gain is not None:
    w_rec = float(model.recurrent_gain[...]) * w_rec
  x = np.asarray(x, np.float64)
  h = np.zeros((x.shape[0], w_rec.shape[0]))
  states = []
  for t in range(x.shape[1]):
    h = np.tanh(x[:, t] @ f64(model.input_kernel) + h @ w_rec + f64(model.bias))
    states.append(h)
  logits = h @ f64(model.classifier.kernel) + f64(model.classifier.bias)
  return np.stack(states, axis=1), logits


@pytest.mark.parametrize("recurrent_init,recurrent,gain", [
    ("glorot", "euclidean", 1.0), ("orthogonal", "euclidean", 1.3), ("orthogonal", "stiefel", 1.3)])
def test_rnn_equals_python_loop(recurrent_init, recurrent, gain):
  model = SequenceRNN(**RNN, recurrent_init=recurrent_init, gain=gain, recurrent=recurrent,
                      rngs=nnx.Rngs(0))
  model.bias[...] = _normal(7, (6,), 0.1)
  x = _normal(1, (5, 9, 3))
  states, logits = _rnn_reference(model, x)
  np.testing.assert_allclose(model.states(x, return_sequence=True), states, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(model.states(x), states[:, -1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(model(x), logits, rtol=1e-5, atol=1e-5)
  stiefel_gain = gain if recurrent == "stiefel" else 1.0
  np.testing.assert_allclose(model.recurrent_matrix(),
                             stiefel_gain * np.asarray(model.recurrent_kernel[...]))


@pytest.mark.parametrize("gain", [0.8, 1.25])
def test_rnn_orthogonal_init_singular_values_equal_gain(gain):
  model = SequenceRNN(**RNN, recurrent_init="orthogonal", gain=gain, rngs=nnx.Rngs(2))
  s = np.linalg.svd(np.asarray(model.recurrent_kernel[...], np.float64), compute_uv=False)
  np.testing.assert_allclose(s, gain, rtol=1e-5)
  glorot = SequenceRNN(**RNN, gain=gain, rngs=nnx.Rngs(2))
  w = np.asarray(glorot.recurrent_kernel[...])
  limit = gain * np.sqrt(6.0 / 12)                     # U(±gain·√(6/(fan_in + fan_out)))
  assert np.max(np.abs(w)) <= limit and np.max(np.abs(w)) > 0.8 * limit
  s = np.linalg.svd(w.astype(np.float64), compute_uv=False)
  assert s[0] / s[-1] > 3                              # Glorot is far from orthogonal


def test_rnn_stiefel_kernel_routes_through_partition_and_trains():
  model = SequenceRNN(**RNN, recurrent_init="orthogonal", gain=0.9, recurrent="stiefel",
                      rngs=nnx.Rngs(0))
  labels = oj.nn.manifold_labels(model)
  assert labels["recurrent_kernel"] == "stiefel"
  assert labels["input_kernel"] == labels["bias"] == labels["classifier"]["kernel"] == "euclidean"
  assert "recurrent_gain" not in nnx.state(model, nnx.Param)   # a fixed gain
  tx = oj.optim.partition(model, stiefel=oj.optim.radam(0.03), euclidean=optax.adam(0.03))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x = _normal(1, (64, 12, 3))
  y = (jnp.sum(x[:, :, 0], axis=1) > 0).astype(jnp.int32)   # sign of a running sum

  def loss_fn(model):
    return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  kernel_before = np.asarray(model.recurrent_kernel[...])
  first = float(step(model, optimizer))
  for _ in range(30):
    last = float(step(model, optimizer))
  assert last < 0.7 * first, (first, last)
  w = np.asarray(model.recurrent_kernel[...], np.float64)
  assert np.max(np.abs(w - kernel_before)) > 1e-2      # it did train
  np.testing.assert_allclose(w.T @ w, np.eye(6), atol=1e-5)
  np.testing.assert_allclose(float(model.recurrent_gain[...]), 0.9)


def test_rnn_pixelwise_784_steps():
  model = SequenceRNN(1, hidden=6, num_classes=4, recurrent_init="orthogonal", rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(0).uniform(size=(4, 784, 1)), jnp.float32)
  y = jnp.arange(4)
  loss = lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean()
  value, grads = nnx.jit(nnx.value_and_grad(loss))(model)
  assert np.isfinite(float(value))
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert np.any(np.asarray(grads["recurrent_kernel"][...]) != 0)
  assert model.states(x, return_sequence=True).shape == (4, 784, 6)


def test_rnn_bad_arguments():
  rngs = nnx.Rngs(0)
  with pytest.raises(ValueError, match=r"recurrent_init='identity'.*\['glorot', 'orthogonal'\]"):
    SequenceRNN(1, recurrent_init="identity", rngs=rngs)
  with pytest.raises(ValueError, match=r"recurrent='oblique'.*\['euclidean', 'stiefel'\]"):
    SequenceRNN(1, recurrent="oblique", rngs=rngs)
  with pytest.raises(ValueError, match="orthogonal"):
    SequenceRNN(1, recurrent="stiefel", rngs=rngs)       # glorot is not on the manifold
  with pytest.raises(ValueError, match="activation"):
    SequenceRNN(1, activation="sigmoidal", rngs=rngs)
  with pytest.raises(ValueError, match="batch, time, input_size"):
    SequenceRNN(**RNN, rngs=rngs)(jnp.ones((784, 3)))


# ------------------------------------------------------------------------------
# DeepLinear
# ------------------------------------------------------------------------------


def _matrices(model):
  f64 = lambda v: np.asarray(v[...], np.float64)
  mats = [] if model.in_kernel is None else [f64(model.in_kernel)]
  mats += [] if model.kernels is None else list(f64(model.kernels))
  return mats + ([] if model.out_kernel is None else [f64(model.out_kernel)])


@pytest.mark.parametrize("init,depth,in_features,out_features", [
    ("gaussian", 5, None, None), ("orthogonal", 5, 7, 3), ("gaussian", 5, 8, None),
    ("orthogonal", 2, 7, 3)])   # depth 2, both ends rectangular: no square stack
def test_deep_linear_is_the_product_of_its_matrices(init, depth, in_features, out_features):
  model = DeepLinear(depth, 8, in_features, out_features, init=init, scale=1.1,
                     rngs=nnx.Rngs(0))
  assert (model.kernels is None) == (depth == 2)
  mats = _matrices(model)
  assert len(mats) == depth
  product = mats[0]
  for m in mats[1:]:
    product = product @ m
  np.testing.assert_allclose(model.end_to_end(), product, rtol=1e-5, atol=1e-6)
  x = _normal(1, (4, product.shape[0]))
  np.testing.assert_allclose(model(x), np.asarray(x, np.float64) @ product, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("depth,scale", [(1, 1.0), (10, 0.9), (10, 1.1)])
def test_deep_linear_orthogonal_product_is_scaled_isometry(depth, scale):
  with jax.enable_x64(True):
    model = DeepLinear(depth, 8, init="orthogonal", scale=scale, param_dtype=jnp.float64,
                       rngs=nnx.Rngs(depth))
    s = np.linalg.svd(np.asarray(model.end_to_end()), compute_uv=False)
  np.testing.assert_allclose(s, scale ** depth, rtol=1e-10)
  gaussian = DeepLinear(depth, 8, init="gaussian", scale=scale, rngs=nnx.Rngs(depth))
  s = np.linalg.svd(np.asarray(gaussian.end_to_end(), np.float64), compute_uv=False)
  assert s[0] / s[-1] > 2                              # Gaussian factors spread the spectrum


def test_deep_linear_bad_arguments():
  with pytest.raises(ValueError, match=r"init='identity'.*\['gaussian', 'orthogonal'\]"):
    DeepLinear(3, 8, init="identity", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="depth"):
    DeepLinear(1, 8, 4, 2, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="depth"):
    DeepLinear(0, 8, rngs=nnx.Rngs(0))
