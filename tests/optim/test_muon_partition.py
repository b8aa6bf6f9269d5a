"""Tests of Muon with matrix-view dimension numbers, stiefel_muon, and partition."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from optax.contrib import MuonDimensionNumbers

import orthojax as oj

try:  # public in later optax releases, private in 0.2.8
  from optax.contrib import orthogonalize_via_newton_schulz as optax_ns
except ImportError:
  from optax.contrib._muon import orthogonalize_via_newton_schulz as optax_ns
from orthojax.linalg import MatrixView
from orthojax.manifolds import Stiefel


def _axes(axes, ndim):
  axes = (axes,) if isinstance(axes, int) else tuple(axes)
  return tuple(sorted(a % ndim for a in axes))


# Compiling scanned optimisations dominates these tests' run time; XLA's
# backend optimisations buy nothing for a few tiny matmuls per step.
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def _f32(tree):
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def _haar(rng, n, p):
  q, r = np.linalg.qr(rng.standard_normal((n, p)))
  return q * np.sign(np.diag(r))


def _defect(x):
  """‖TᵀT − I‖_F of the tall side T of (…, m, n) matrices, float64."""
  t = np.asarray(x, np.float64)
  t = np.swapaxes(t, -1, -2) if t.shape[-2] < t.shape[-1] else t
  return np.linalg.norm(np.swapaxes(t, -1, -2) @ t - np.eye(t.shape[-1]), axis=(-2, -1))


# ------------------------------------------------- muon_dimension_numbers ---

def test_muon_dimension_numbers_from_the_matrix_view():
  params = {"dense": jnp.zeros((6, 4)), "conv": jnp.zeros((3, 3, 2, 8)),
            "bias": jnp.zeros((4,)), "scale": jnp.zeros(()),
            "stack": jnp.zeros((3, 5, 5))}
  views = {"dense": None, "conv": None, "bias": None, "scale": None,
           "stack": MatrixView.stacked()}
  dims = oj.optim.muon_dimension_numbers(params, views)
  expected = {"dense": ((0,), (1,)), "conv": ((0, 1, 2), (3,)), "stack": ((1,), (2,))}
  for k, (red, out) in expected.items():
    assert isinstance(dims[k], MuonDimensionNumbers), k
    ndim = params[k].ndim
    assert _axes(dims[k].reduction_axis, ndim) == red, k
    assert _axes(dims[k].output_axis, ndim) == out, k
  assert dims["bias"] is None and dims["scale"] is None
  # Without views Dense and conv are inferred the same way.
  inferred = oj.optim.muon_dimension_numbers({k: params[k] for k in ("dense", "conv", "bias")})
  assert _axes(inferred["conv"].reduction_axis, 4) == (0, 1, 2)
  assert inferred["bias"] is None


def test_muon_dimension_numbers_refuses_to_guess_a_3d_leaf():
  params = {"dense": jnp.zeros((6, 4)), "layers": {"kernel": jnp.zeros((3, 5, 5))}}
  with pytest.raises(ValueError, match=r"\['layers'\]\['kernel'\]"):
    oj.optim.muon_dimension_numbers(params)


# ------------------------------------------------------------------- muon ---

def _conv_gradient(seed=0):
  """A conv-kernel gradient whose matrix view (36, 8) has spread-out singular values."""
  rng = np.random.default_rng(seed)
  s = np.geomspace(30.0, 0.3, 8)
  m = (_haar(rng, 36, 8) * s) @ _haar(rng, 8, 8).T
  return m.reshape(3, 3, 4, 8)


def _singular_values(update):
  return np.linalg.svd(np.asarray(update, np.float64).reshape(36, 8), compute_uv=False)


def test_muon_orthogonalizes_conv_kernels_that_optax_sends_to_adam():
  g = {"conv": jnp.asarray(_conv_gradient(), jnp.float32)}
  params = {"conv": jnp.zeros((3, 3, 4, 8), jnp.float32)}

  ours = oj.optim.muon(1.0, beta=0.0, nesterov=False)
  u_ours, _ = jax.jit(ours.update)(g, ours.init(params), params)
  s_ours = _singular_values(u_ours["conv"])
  # Newton–Schulz (quintic) puts every singular value in ~[0.7, 1.2] while
  # the gradient's span a factor 100: the update is nearly orthogonal.
  assert s_ours.max() / s_ours.min() < 1.8, s_ours
  assert 0.6 < s_ours.min() and s_ours.max() < 1.25, s_ours
  # ... and points along the polar factor of the gradient (descent).
  u, _, vh = np.linalg.svd(np.asarray(g["conv"], np.float64).reshape(36, 8),
                           full_matrices=False)
  cos = -np.sum(np.asarray(u_ours["conv"]).reshape(36, 8) * (u @ vh)) / (
      np.linalg.norm(u_ours["conv"]) * np.sqrt(8))
  assert cos > 0.95, cos

  # optax.contrib.muon's default orthogonalizes 2-D leaves only: the conv
  # kernel silently gets Adam's update, the same as optax.adam's.
  plain = optax.contrib.muon(1.0, beta=0.0, nesterov=False)
  u_plain, _ = jax.jit(plain.update)(g, plain.init(params), params)
  adam = optax.adam(1.0, b1=0.0, nesterov=False)
  u_adam, _ = jax.jit(adam.update)(g, adam.init(params), params)
  np.testing.assert_allclose(u_plain["conv"], u_adam["conv"], rtol=1e-6)
  s_plain = _singular_values(u_plain["conv"])
  assert s_plain.max() / s_plain.min() > 4.0, s_plain


def test_muon_routes_biases_to_adam_and_stacks_by_view():
  rng = np.random.default_rng(1)
  params = _f32({"w": np.zeros((10, 6)), "b": np.zeros((6,)), "stack": np.zeros((2, 7, 5))})
  g = _f32({k: rng.standard_normal(v.shape) for k, v in params.items()})
  tx = oj.optim.muon(1.0, beta=0.0, nesterov=False,
                     views={"w": None, "b": None, "stack": MatrixView.stacked()})
  out, _ = jax.jit(tx.update)(g, tx.init(params), params)
  # Adam's first step with b1 = 0 is -lr * g / (|g| + eps) = -sign(g).
  np.testing.assert_allclose(out["b"], -np.sign(g["b"]), rtol=1e-5)
  for k in range(2):  # each stack element orthogonalized on its own
    s = np.linalg.svd(np.asarray(out["stack"][k], np.float64), compute_uv=False)
    assert s.max() / s.min() < 2.0, s
  with pytest.raises(ValueError, match="views"):
    oj.optim.muon(1.0, muon_weight_dimension_numbers={})


def test_muon_takes_the_polar_express_preset_by_name():
  """One step with beta = 0 and no Nesterov orthogonalizes the gradient itself: the update
  is -lr * scale * NS_pe(G), NS_pe orthojax's Polar Express (an independent code path)."""
  rng = np.random.default_rng(3)
  g = {"w": jnp.asarray(rng.standard_normal((12, 20)), jnp.float32)}
  params = {"w": jnp.zeros((12, 20), jnp.float32)}
  tx = oj.optim.muon(1.0, beta=0.0, nesterov=False, ns_coeffs="polar_express", ns_steps=6)
  u, _ = jax.jit(tx.update)(g, tx.init(params), params)
  expected = -np.sqrt(20 / 12) * oj.linalg.newton_schulz(g["w"], steps=6,
                                                        coeffs="polar_express")
  np.testing.assert_allclose(u["w"], expected, rtol=2e-5, atol=2e-6)
  # six steps from the schedule converge far beyond the quintic's [0.7, 1.2]
  s = np.linalg.svd(np.asarray(u["w"], np.float64) / np.sqrt(20 / 12), compute_uv=False)
  assert np.abs(s - 1).max() < 0.05, s
  with pytest.raises(ValueError, match="ns_coeffs='polar'.*polar_express"):
    oj.optim.muon(1.0, ns_coeffs="polar")


def test_muon_3d_leaf_without_view_raises():
  params = {"stack": jnp.zeros((2, 7, 5), jnp.float32)}
  tx = oj.optim.muon(0.1)
  with pytest.raises(ValueError, match=r"\['stack'\]"):
    tx.init(params)


# ----------------------------------------------------------- stiefel_muon ---

def _defect_by_layout(x, shape):
  """Defects of a path of parameters of ``shape`` (leading axis: steps)."""
  x = np.asarray(x, np.float64)
  if len(shape) == 4:  # conv kernels: (kh·kw·cin, cout)
    x = x.reshape(x.shape[0], -1, shape[-1])
  return _defect(x)


def test_stiefel_muon_keeps_weights_on_the_manifold():
  rng = np.random.default_rng(2)
  shapes = {"wide": (3, 10), "conv": (3, 3, 2, 5), "stack": (2, 9, 3)}
  views = {"wide": None, "conv": None, "stack": MatrixView.stacked()}
  w0 = {"wide": _haar(rng, 10, 3).T, "conv": _haar(rng, 18, 5).reshape(3, 3, 2, 5),
        "stack": np.stack([_haar(rng, 9, 3), _haar(rng, 9, 3)])}
  w0 = _f32(w0)
  grads = _f32({k: rng.standard_normal((30,) + s) for k, s in shapes.items()})
  tx = oj.optim.stiefel_muon(0.2, views=views)

  @_jit
  def run(w):
    def step(carry, g):
      w, s = carry
      u, s = tx.update(g, s, w)
      w = optax.apply_updates(w, u)
      return (w, s), w
    return jax.lax.scan(step, (w, tx.init(w)), grads)[1]

  path = jax.device_get(run(w0))
  for k, s in shapes.items():
    assert np.max(_defect_by_layout(path[k], s)) < 1e-5, k
    # It moves (random gradients, lr 0.2).
    assert np.abs(path[k][-1] - w0[k]).max() > 0.1, k


def test_stiefel_muon_rejects_non_matrix_leaves():
  params = {"w": jnp.asarray(_haar(np.random.default_rng(3), 6, 3), jnp.float32),
            "b": jnp.zeros((3,), jnp.float32)}
  tx = oj.optim.stiefel_muon(0.1)
  with pytest.raises(ValueError, match=r"\['b'\]"):
    jax.jit(tx.update)(params, tx.init(params), params)


# -------------------------------------------------------------- partition ---

def _model(seed=4):
  rng = np.random.default_rng(seed)
  return _f32({
      "conv": _haar(rng, 18, 6).reshape(3, 3, 2, 6),
      "dense": {"kernel": _haar(rng, 6, 4), "bias": rng.standard_normal(4)},
      "head": {"kernel": rng.standard_normal((4, 3)), "bias": rng.standard_normal(3)},
  })


def _labels_fn(params):
  return jax.tree_util.tree_map_with_path(
      lambda path, p: "stiefel" if p.ndim >= 2 and "head" not in jax.tree_util.keystr(path)
      else "euclidean", params)


LABEL_TREE = {"conv": "stiefel",
              "dense": {"kernel": "stiefel", "bias": "euclidean"},
              "head": {"kernel": "euclidean", "bias": "euclidean"}}
STIEFEL_KEYS = [("conv",), ("dense", "kernel")]
EUCLIDEAN_KEYS = [("dense", "bias"), ("head", "kernel"), ("head", "bias")]
STEPS = 10


def _get(tree, path):
  for k in path:
    tree = tree[k]
  return tree


def _gradients(params, seed=5):
  """A fixed sequence of STEPS random gradients shaped like ``params``."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda p: jnp.asarray(rng.standard_normal((STEPS,) + p.shape),
                                            jnp.float32), params)


def _run(tx, params, grads):
  @_jit
  def run(params):
    def step(carry, g):
      p, s = carry
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None
    return jax.lax.scan(step, (params, tx.init(params)), grads)[0][0]

  return jax.device_get(run(params))


@pytest.mark.parametrize("labels", [_labels_fn, LABEL_TREE], ids=["callable", "tree"])
def test_partition_routes_stiefel_and_euclidean_leaves(labels):
  assert _labels_fn(_model()) == LABEL_TREE
  params, lr, mu = _model(), 0.1, 0.9
  grads = _gradients(params)
  tx = oj.optim.partition(labels, stiefel=oj.optim.rsgd(lr, momentum=mu),
                          euclidean=optax.sgd(lr, momentum=mu))
  out = _run(tx, params, grads)
  # Euclidean leaves: plain heavy-ball SGD, written out in numpy.
  for path in EUCLIDEAN_KEYS:
    p = np.asarray(_get(params, path), np.float64)
    trace = np.zeros_like(p)
    for g in np.asarray(_get(grads, path), np.float64):
      trace = mu * trace + g
      p = p - lr * trace
    np.testing.assert_allclose(_get(out, path), p, rtol=1e-5, atol=1e-5, err_msg=str(path))
  # Stiefel leaves: on the manifold, moved, and exactly what rsgd does alone.
  sub = lambda t: {"conv": t["conv"], "kernel": t["dense"]["kernel"]}
  alone = _run(oj.optim.rsgd(lr, momentum=mu), sub(params), sub(grads))
  for path, key in zip(STIEFEL_KEYS, ("conv", "kernel")):
    x = np.asarray(_get(out, path))
    assert np.all(_defect(x.reshape(-1, x.shape[-1])) < 1e-5), path
    assert np.abs(x - _get(params, path)).max() > 1e-2, path
    np.testing.assert_allclose(x, alone[key], atol=1e-6, err_msg=str(path))
  # The Euclidean head kernel is not orthonormal: it was really left alone.
  assert np.all(_defect(out["head"]["kernel"]) > 1e-2)


@pytest.mark.parametrize("make", [lambda: oj.optim.stiefel_muon(0.05),
                                  lambda: oj.optim.rsgd(0.1, Stiefel("cayley"), momentum=0.9)],
                         ids=["stiefel_muon", "rsgd-cayley"])
def test_partition_composes_with_chain_and_jit(make):
  params, clip = _model(), 1.0
  grads = _gradients(params)
  tx = optax.chain(optax.clip_by_global_norm(clip),
                   oj.optim.partition(_labels_fn, stiefel=make(), euclidean=optax.sgd(0.1)))
  out = _run(tx, params, grads)
  for path in STIEFEL_KEYS:
    x = np.asarray(_get(out, path))
    assert np.all(_defect(x.reshape(-1, x.shape[-1])) < 1e-5), path
    assert np.abs(x - _get(params, path)).max() > 1e-3, path
  # The clip sees the whole gradient; Euclidean leaves follow clipped SGD.
  norms = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)), axis=tuple(range(1, g.ndim)))
                      for g in jax.tree.leaves(grads)))
  scale = np.minimum(1.0, clip / norms)
  for path in EUCLIDEAN_KEYS:
    g = np.asarray(_get(grads, path), np.float64)
    ref = _get(params, path) - 0.1 * np.tensordot(scale, g, axes=1)
    np.testing.assert_allclose(_get(out, path), ref, rtol=1e-5, atol=1e-5, err_msg=str(path))


def test_partition_errors():
  params = _model()
  tx = oj.optim.partition({"conv": "stiefel", "dense": "stiefel", "head": "classifier"},
                          stiefel=oj.optim.rsgd(0.1), euclidean=optax.sgd(0.1))
  with pytest.raises(ValueError, match="classifier") as err:
    tx.init(params)
  assert "euclidean" in str(err.value) and "stiefel" in str(err.value)
  with pytest.raises(ValueError, match="transform"):
    oj.optim.partition(_labels_fn)
  with pytest.raises(TypeError, match="stiefel"):
    oj.optim.partition(_labels_fn, stiefel="rsgd")


def test_muon_takes_injected_hyperparameters():
  """``optax.inject_hyperparams`` reads the constructor's named arguments: the rate
  becomes state a schedule-free loop can change, and the step is the plain one's."""
  params = {"w": jnp.ones((4, 3)), "b": jnp.ones(3)}
  grads = {"w": jnp.arange(12.0).reshape(4, 3) / 10, "b": jnp.ones(3)}
  injected = optax.inject_hyperparams(oj.optim.muon)(learning_rate=0.01)
  state = injected.init(params)
  assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.01)
  ours, _ = injected.update(grads, state, params)
  plain, _ = oj.optim.muon(0.01).update(grads, oj.optim.muon(0.01).init(params), params)
  # (float32 hyperparameters in the state, not Python floats folded in: rounding apart)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=0, atol=2e-5 * np.abs(b).max()), ours, plain)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rank", [None, 3], ids=["full rank", "rank 3"])
def test_muons_direction_is_optaxs_on_the_gram_matrix_too(dtype, rank):
  """A 3 x 3 x 16 x 32 conv kernel (144 x 32: on the Gram matrix) and a 40 x 32 Dense one
  (the standard iteration), for a full-rank and a rank-3 gradient (singular values near
  0, which the Gram iteration's restarts are for). In float32 orthojax's orthogonalized
  direction is optax's ``orthogonalize_via_newton_schulz`` of the same momentum to 1e-5.
  In bfloat16 both are far from the float32 direction on a low-rank input (0.17 in the
  largest entry, of ~0.1: bfloat16's own Newton–Schulz); orthojax's may be at most 1.25x
  as far as optax's in Frobenius norm (without restarts the Gram iteration's largest
  error was 28)."""
  shapes = {"conv": (3, 3, 16, 32), "dense": (40, 32)}
  keys = jax.random.split(jax.random.key(0), 4)
  grads = {}
  for (name, shape), k1, k2 in zip(shapes.items(), keys[:2], keys[2:]):
    if rank is None:
      grads[name] = jax.random.normal(k1, shape)
    else:
      n = int(np.prod(shape[:-1]))
      low = jax.random.normal(k1, (n, rank)) @ jax.random.normal(k2, (rank, shape[-1]))
      grads[name] = low.reshape(shape)
  dims = oj.optim.muon_dimension_numbers(grads)
  coeffs = jnp.asarray((3.4445, -4.7750, 2.0315))
  optax_direction = lambda g, name: np.asarray(
      optax_ns(g, coeffs.astype(g.dtype), 5, dimension_numbers=dims[name]), np.float32)
  grads_in = jax.tree.map(lambda g: g.astype(dtype), grads)
  tx = oj.optim.scale_by_muon(nesterov=False, beta=0.0)   # the direction of the gradient
  ours, _ = tx.update(grads_in, tx.init(grads_in))
  for name in shapes:
    mine, theirs = np.asarray(ours[name], np.float32), optax_direction(grads_in[name], name)
    if dtype == "float32":
      np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5, err_msg=name)
    else:
      exact = optax_direction(grads[name], name)
      error = lambda d: np.linalg.norm(d - exact)
      assert error(mine) <= 1.25 * error(theirs), (name, error(mine), error(theirs))
