"""OrthogonalDense / OrthogonalConv (orthojax.nn._orthogonal)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.linalg
from flax import nnx
from jax.test_util import check_grads
from scipy import stats

from orthojax.nn import OrthogonalConv
from orthojax.nn import OrthogonalDense
from orthojax.nn import _orthogonal as orth

PARAMS = orth.PARAMETRIZATIONS
SHAPES = {"tall": (8, 5), "wide": (5, 8), "square": (6, 6)}
CONVS = {"conv3x3": ((3, 3), 4, 6), "wide1x1": ((1, 1), 3, 8)}  # (kernel_size, cin, cout)


_columns = jax.jit(orth.orthogonal_columns, static_argnums=(0, 3))  # (name, generator, signs, p)


def _rand(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape)


def _randomize(layer, seed):
  """A random generator and sign pattern (the init itself is tested on Dense layers)."""
  shape = layer.generator.shape
  scale = 0.5 if layer.parametrization in ("cayley", "expm") else 1.0
  layer.generator[...] = jnp.asarray(scale * _rand(seed, *shape), jnp.float32)
  layer.signs[...] = jnp.asarray(np.sign(_rand(seed + 1, *layer.signs.shape)), jnp.float32)
  return layer


def _assert_orthogonal_tall_side(w, atol):
  """Orthonormal columns (fan_in ≥ fan_out) or rows, checked in float64."""
  w = np.asarray(w, np.float64)
  gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
  np.testing.assert_allclose(gram, np.eye(min(w.shape)), atol=atol)


def _householder_reference(vectors, signs, p):
  n = len(signs)
  q = np.eye(n)
  for v in vectors:
    q = q @ (np.eye(n) - 2 * np.outer(v, v) / (v @ v))
  return (q @ np.diag(signs))[:, :p]


def _givens_reference(angles, signs, p):
  """``R_m ⋯ R_1 D`` from explicit rotation matrices in the documented order."""
  n = len(signs)
  index = {pair: k for k, pair in enumerate(zip(*np.triu_indices(n, 1)))}
  q = np.eye(n)
  for pairs in orth.givens_rounds(n):
    for i, j in pairs:
      t = angles[index[(i, j)]]
      g = np.eye(n)
      g[i, i] = g[j, j] = np.cos(t)
      g[j, i], g[i, j] = np.sin(t), -np.sin(t)
      q = g @ q
  return (q @ np.diag(signs))[:, :p]


# ---------------------------------------------------------------- layers


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("parametrization", PARAMS)
def test_dense_kernel_is_scaled_orthogonal_and_forward_matches(parametrization, shape):
  fan_in, fan_out = shape
  gain = 1.7
  layer = OrthogonalDense(fan_in, fan_out, parametrization=parametrization, gain=gain,
                          rngs=nnx.Rngs(0))
  w = np.asarray(layer.kernel(), np.float64)
  assert w.shape == shape
  _assert_orthogonal_tall_side(w / gain, atol=2e-6)
  np.testing.assert_allclose(np.linalg.norm(w), gain * np.sqrt(min(shape)), rtol=1e-5)
  assert np.linalg.norm(w / gain - np.eye(*shape)) > 1.0  # random, not the identity
  layer.bias[...] = jnp.asarray(_rand(1, fan_out), jnp.float32)
  x = _rand(2, 3, 4, fan_in).astype(np.float32)
  np.testing.assert_allclose(layer(x), x @ w + np.asarray(layer.bias[...]), atol=1e-5)


def _nnx_conv(cin, cout, kernel_size, *args, **kwargs):
  # zeros init: the reference only needs our kernel copied in (and compiles fast)
  return nnx.Conv(cin, cout, kernel_size, *args, kernel_init=nnx.initializers.zeros,
                  rngs=nnx.Rngs(0), **kwargs)


@pytest.mark.parametrize("conv", CONVS.values(), ids=CONVS.keys())
@pytest.mark.parametrize("parametrization", PARAMS)
def test_conv_kernel_is_orthogonal_and_forward_matches_nnx_conv(parametrization, conv):
  kernel_size, cin, cout = conv
  layer = OrthogonalConv(cin, cout, kernel_size, parametrization=parametrization, gain=0.5,
                         init="identity", rngs=nnx.Rngs(1))
  w = _randomize(layer, 0).kernel()
  assert w.shape == kernel_size + (cin, cout)
  _assert_orthogonal_tall_side(np.reshape(w, (-1, cout)) / 0.5, atol=2e-6)
  layer.bias[...] = jnp.asarray(_rand(3, cout), jnp.float32)
  reference = _nnx_conv(cin, cout, kernel_size)
  reference.kernel[...] = w
  reference.bias[...] = layer.bias[...]
  x = _rand(4, 2, 7, 6, cin).astype(np.float32)
  np.testing.assert_allclose(layer(x), reference(x), atol=1e-5)
  # Every Variable carries logical axes of its rank (replicated generators).
  for path, var in nnx.to_flat_state(nnx.state(layer)):
    names = var.get_metadata().get("out_sharding")
    assert names is not None and len(names) == jnp.ndim(var.get_value()), (path, names)
  assert layer.bias.get_metadata()["out_sharding"] == ("fan_out",)


@pytest.mark.parametrize("kernel_size,strides,padding,feature_group_count", [
    ((3,), 2, "VALID", 1), ((2, 2, 2), (1, 2, 1), ((1, 0), (0, 1), (1, 1)), 2)])
def test_conv_1d_2d_3d_strides_padding_groups(kernel_size, strides, padding, feature_group_count):
  cin, cout = 4, 6
  layer = OrthogonalConv(cin, cout, kernel_size, strides, padding=padding,
                         feature_group_count=feature_group_count, parametrization="givens",
                         init="identity", rngs=nnx.Rngs(2))
  _randomize(layer, 1)
  reference = _nnx_conv(cin, cout, kernel_size, strides, padding=padding,
                        feature_group_count=feature_group_count)
  reference.kernel[...] = layer.kernel()
  x = _rand(5, 2, 3, *(5,) * len(kernel_size), cin).astype(np.float32)  # two batch axes
  np.testing.assert_allclose(layer(x), reference(x), atol=1e-5)
  np.testing.assert_allclose(layer(x[0, 0]), reference(x[0, 0]), atol=1e-5)  # no batch axis


@pytest.mark.parametrize("parametrization", PARAMS)
def test_identity_init(parametrization):
  layer = OrthogonalDense(8, 5, parametrization=parametrization, init="identity", gain=2.0,
                          use_bias=False, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(layer.kernel(), 2.0 * np.eye(8, 5), atol=1e-6)
  assert layer.bias is None
  x = _rand(0, 3, 8).astype(np.float32)
  np.testing.assert_allclose(layer(x), 2.0 * x[:, :5], atol=1e-6)


@pytest.mark.parametrize("parametrization", ["cayley", "expm", "householder"])
def test_random_init_is_haar(parametrization):
  """Entry law (Q_ij + 1)/2 ~ Beta((n−1)/2, (n−1)/2), fair determinant, Var tr Q = 1."""
  n, samples = 6, 300
  k = n if parametrization == "householder" else 0
  q, largest = [], 0.0
  for seed in range(samples):  # the jitted init and map of the (6, 6) layer, compiled once
    generator, signs = orth.initial_generator(jax.random.key(seed), parametrization, "random",
                                              n, n, k)
    q.append(np.asarray(_columns(parametrization, generator, signs, n), np.float64))
    largest = max(largest, float(jnp.abs(generator).max()))
  q = np.stack(q)
  if parametrization == "cayley":
    # Kahan's sign rule keeps the inverse-Cayley generator small; with D = I it
    # is Cauchy-tailed (max over these samples ~1e9).
    assert largest < 5.0
  beta = stats.beta((n - 1) / 2, (n - 1) / 2)
  for i, j in [(0, 0), (0, 1), (n - 1, n - 1)]:
    assert stats.kstest((q[:, i, j] + 1) / 2, beta.cdf).pvalue > 1e-3, (i, j)
  assert abs(np.linalg.det(q).mean()) < 0.25  # 4 standard errors
  assert abs(np.trace(q, axis1=1, axis2=2).var() - 1.0) < 0.35


# ---------------------------------------------------------- the maps, by hand


def test_packed_skew_layout_is_row_major_upper_triangle():
  a = orth.skew_from_packed(jnp.arange(1.0, 7.0), 4)
  expected = np.array([[0, 1, 2, 3], [-1, 0, 4, 5], [-2, -4, 0, 6], [-3, -5, -6, 0]])
  np.testing.assert_array_equal(a, expected)
  np.testing.assert_array_equal(orth.packed_from_skew(a), np.arange(1.0, 7.0))


def test_cayley_and_expm_match_scipy():
  n, p = 6, 4
  theta = 0.7 * _rand(0, n * (n - 1) // 2)
  signs = np.array([1.0, -1, 1, 1, -1, -1])
  rows, cols = np.triu_indices(n, 1)
  a = np.zeros((n, n))
  a[rows, cols] = theta
  a = a - a.T
  with jax.enable_x64(True):
    cayley = _columns("cayley", jnp.asarray(theta), jnp.asarray(signs), p)
    expm = _columns("expm", jnp.asarray(theta), jnp.asarray(signs), p)
  eye = np.eye(n)
  np.testing.assert_allclose(cayley, (np.linalg.solve(eye + a, eye - a) @ np.diag(signs))[:, :p],
                             atol=1e-12)
  np.testing.assert_allclose(expm, (scipy.linalg.expm(a) @ np.diag(signs))[:, :p], atol=1e-12)


@pytest.mark.parametrize("k,p", [(3, 4), (9, 2)])  # fewer / more reflections than columns
def test_householder_matches_explicit_product(k, p):
  n = max(k, 6)
  vectors, signs = _rand(0, k, n), np.sign(_rand(1, n))
  with jax.enable_x64(True):
    q = _columns("householder", jnp.asarray(vectors), jnp.asarray(signs), p)
  np.testing.assert_allclose(q, _householder_reference(vectors, signs, p), atol=1e-12)


def test_householder_zero_vector_is_identity_without_nans():
  vectors = np.zeros((2, 3))
  vectors[1] = [0.0, 1.0, 0.0]
  f = lambda v: orth.householder_columns(v, jnp.ones(3), 3)
  np.testing.assert_allclose(jax.jit(f)(jnp.asarray(vectors, jnp.float32)),
                             np.diag([1.0, -1.0, 1.0]))
  grad = jax.jit(jax.grad(lambda v: jnp.sum(f(v) * jnp.arange(9.0).reshape(3, 3))))
  assert np.all(np.isfinite(grad(jnp.zeros((2, 3)))))


def test_givens_rounds_are_the_documented_round_robin():
  assert orth.givens_rounds(4) == (((0, 3), (1, 2)), ((0, 2), (1, 3)), ((0, 1), (2, 3)))
  assert orth.givens_rounds(3) == (((1, 2),), ((0, 2),), ((0, 1),))
  for n in (2, 5, 8, 9):
    rounds = orth.givens_rounds(n)
    assert len(rounds) == n - 1 + n % 2
    pairs = [pair for r in rounds for pair in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))  # each pair once
    for r in rounds:  # disjoint within a round
      members = [i for pair in r for i in pair]
      assert len(members) == len(set(members))


def test_givens_matches_explicit_product():
  n, p = 7, 3  # odd n: one row rests each round
  angles, signs = _rand(0, n * (n - 1) // 2), np.sign(_rand(1, n))
  with jax.enable_x64(True):
    q = _columns("givens", jnp.asarray(angles), jnp.asarray(signs), p)
  np.testing.assert_allclose(q, _givens_reference(angles, signs, p), atol=1e-12)


def test_givens_jacobian_has_full_rank():
  n = 5
  angles = jnp.asarray(_rand(0, n * (n - 1) // 2), jnp.float32)
  jac = jax.jit(jax.jacfwd(lambda t: orth.givens_columns(t, jnp.ones(n), n)))(angles)
  assert np.linalg.matrix_rank(np.reshape(jac, (n * n, -1)), tol=1e-4) == n * (n - 1) // 2


@pytest.mark.parametrize("parametrization,n,p,k,modes", [  # the shapes of the checks above
    ("cayley", 6, 4, 0, ("rev",)), ("expm", 6, 4, 0, ("rev",)),  # jax's own jvp rules
    ("householder", 9, 2, 9, ("fwd", "rev")), ("givens", 7, 3, 0, ("fwd", "rev"))])
def test_gradients_match_finite_differences(parametrization, n, p, k, modes):
  with jax.enable_x64(True):
    generator = jnp.asarray(0.5 * _rand(0, *orth.num_generators(parametrization, n, k)))
    signs = jnp.asarray(np.sign(_rand(1, n)))
    weights = jnp.asarray(_rand(2, n, p))

    def loss(g):
      return jnp.sum(weights * _columns(parametrization, g, signs, p))

    check_grads(loss, (generator,), order=1, modes=modes, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------ training, gain


def test_learn_gain_makes_the_gain_a_param():
  learned = OrthogonalDense(6, 4, gain=1.5, learn_gain=True, rngs=nnx.Rngs(0))
  fixed = OrthogonalDense(6, 4, gain=1.5, rngs=nnx.Rngs(0))
  assert "gain" in nnx.state(learned, nnx.Param)
  assert "gain" not in nnx.state(fixed, nnx.Param)
  assert "signs" not in nnx.state(fixed, nnx.Param)
  assert set(nnx.state(fixed, nnx.Param)) == {"generator", "bias"}
  np.testing.assert_allclose(fixed.gain[...], 1.5)


@pytest.mark.parametrize("parametrization", PARAMS)
def test_adam_keeps_kernel_orthogonal_and_fits(parametrization):
  fan_in, fan_out = 8, 5
  layer = OrthogonalDense(fan_in, fan_out, parametrization=parametrization, learn_gain=True,
                          rngs=nnx.Rngs(0))
  target = 2.0 * np.linalg.qr(_rand(9, fan_in, fan_out))[0]
  x = jnp.asarray(_rand(0, 64, fan_in), jnp.float32)
  y = jnp.asarray(x @ target + 0.3, jnp.float32)
  optimizer = nnx.Optimizer(layer, optax.adam(0.05), wrt=nnx.Param)

  def loss_fn(model):
    return jnp.mean((model(x) - y) ** 2)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  initial = float(loss_fn(layer))
  for _ in range(25):
    step(layer, optimizer)
  final = float(loss_fn(layer))
  assert final < 0.5 * initial, (initial, final)
  gain = float(layer.gain[...])
  assert abs(gain - 1.0) > 1e-3  # the learned gain is trained
  _assert_orthogonal_tall_side(layer.kernel() / gain, atol=1e-5)


# ---------------------------------------------------------- dtypes, sharding


def test_dtypes_follow_nnx_linear():
  layer = OrthogonalDense(8, 5, parametrization="givens", param_dtype=jnp.bfloat16,
                          rngs=nnx.Rngs(0))
  assert layer.generator.dtype == jnp.bfloat16 and layer.kernel().dtype == jnp.bfloat16
  _assert_orthogonal_tall_side(layer.kernel(), atol=2e-2)
  x = jnp.ones((2, 8), jnp.float32)
  assert layer(x).dtype == jnp.float32
  layer.dtype = jnp.bfloat16
  assert layer(x).dtype == jnp.bfloat16


def test_abstract_init_has_the_shapes_and_logical_axes():
  abstract = jax.eval_shape(lambda: nnx.state(OrthogonalConv(
      3, 8, (3, 3), parametrization="householder", learn_gain=True, rngs=nnx.Rngs(0))))
  assert abstract["generator"].shape == (8, 27)  # k = p = 8 reflections in R^27
  assert abstract["signs"].shape == (27,)
  assert abstract["gain"].get_metadata()["out_sharding"] == ()


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs,match", [
    ({"parametrization": "qr"}, r"unknown parametrization='qr'; valid: \['cayley', 'expm'"),
    ({"init": "haar"}, r"unknown init='haar'; valid: \['random', 'identity'\]"),
    ({"num_reflections": 3}, "householder"),
    ({"parametrization": "householder", "num_reflections": 9}, "exceeds n"),
    ({"parametrization": "householder", "num_reflections": 0}, "positive integer"),
])
def test_bad_options_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    OrthogonalDense(6, 4, rngs=nnx.Rngs(0), **kwargs)


@pytest.mark.parametrize("make,match", [
    (lambda r: OrthogonalDense(0, 4, rngs=r), "in_features must be a positive integer, got 0"),
    (lambda r: OrthogonalDense(4, -2, rngs=r), "out_features must be a positive integer"),
    (lambda r: OrthogonalConv(4, 6, (3, 0), rngs=r), "kernel_size must be a positive integer"),
    (lambda r: OrthogonalConv(4, 6, (1, 1, 1, 1), rngs=r), "1, 2 or 3 spatial"),
    (lambda r: OrthogonalConv(4, 6, (3, 3), strides=(1, 2, 3), rngs=r), "strides"),
    (lambda r: OrthogonalConv(4, 6, (3, 3), padding="FULL", rngs=r), "padding"),
    (lambda r: OrthogonalConv(4, 6, (3, 3), feature_group_count=3, rngs=r), "divisible"),
])
def test_bad_sizes_raise(make, match):
  with pytest.raises(ValueError, match=match):
    make(nnx.Rngs(0))
