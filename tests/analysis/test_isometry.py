"""isometry_diagnostics: the composition of the estimators it names, bit for bit, and dense
references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.flatten_util import ravel_pytree

import orthojax.analysis as oa
from orthojax.models import DeepMLP
from orthojax.train.model_zoo import Flatten   # the trainer's wrapper (tests only)

KEYS = {"fisher_lambda_max", "fisher_converged", "jacobian_sigma_max", "jacobian_sigma_max_sq"}


def _network(weights="euclidean", *, in_features=12, depth=3, width=10, classes=5, seed=0,
             q_star=0.5, scale=1.7):
  mlp = DeepMLP(in_features, depth, width, classes, q_star=q_star, init="orthogonal",
                weights=weights, rngs=nnx.Rngs(seed))
  return Flatten(mlp, scale)


def _train_a_little(model, seed):
  """Move every parameter off its init, as training would (not along the manifold: the
  diagnostics do not care)."""
  rng = np.random.default_rng(seed)
  state = nnx.state(model, nnx.Param)
  pure = jax.tree.map(lambda v: (np.asarray(v) + 0.05 * rng.normal(size=np.shape(v))
                                 ).astype(np.float32), nnx.to_pure_dict(state))
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)


def _batch(n=16, shape=(3, 2, 2), classes=5, seed=1):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(n, *shape)).astype(np.float32),
          rng.integers(0, classes, size=n).astype(np.int32))


def _composed(fresh_model, params, x, y, *, jacobian_examples, lanczos_iters, mse):
  """What the docstring of :func:`orthojax.analysis.isometry_diagnostics` says it computes,
  spelled out with the estimators it names: a model built alike (eval mode) merged with a
  pure-dict of parameters (the trainer's ``state.params``); Lanczos λ_max of the empirical
  Fisher (and of the MSE Gauss–Newton matrix), Lanczos σ_max of ``features``' Jacobian at
  the scaled input of the first ``jacobian_examples`` examples, averaged."""
  model = fresh_model
  model.eval()
  graphdef, _, rest = nnx.split(model, nnx.Param, ...)
  x = jnp.asarray(np.asarray(x).reshape(x.shape[0], -1))
  y = jnp.asarray(y)

  def apply(p, inputs):
    return nnx.merge(graphdef, p, rest)(inputs)

  fisher = oa.fisher_max_eigenvalue(apply, params, x, y, loss="cross_entropy",
                                    kind="empirical", max_iters=lanczos_iters)
  mlp = nnx.merge(graphdef, params, rest).model
  x0 = model.scale * x[:jacobian_examples]
  jac = oa.jacobian_singular_values(mlp.features, x0, method="lanczos", k=1, batched=True)
  sigma = np.asarray(jac.largest)[:, 0]
  out = {"fisher_lambda_max": float(fisher.eigenvalue),
         "fisher_converged": float(fisher.converged),
         "jacobian_sigma_max": float(np.mean(sigma)),
         "jacobian_sigma_max_sq": float(np.mean(sigma ** 2))}
  if mse:
    gn = oa.fisher_max_eigenvalue(apply, params, x, loss="mse", kind="gauss_newton",
                                  max_iters=lanczos_iters)
    out["fisher_mse_lambda_max"] = float(gn.eigenvalue)
  return out


@pytest.mark.parametrize("weights", ["euclidean", "stiefel", "oblique"])
def test_bit_identical_to_the_estimators_it_composes(weights):
  """On a network moved off its init (at init the programs are the same, only the numbers
  differ), for each kind of weights."""
  model = _network(weights)
  _train_a_little(model, seed=3)
  x, y = _batch()
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))     # the trainer's state.params
  composed = _composed(_network(weights), params, x, y, jacobian_examples=3,
                       lanczos_iters=20, mse=True)
  new = oa.isometry_diagnostics(model, x, y, jacobian_examples=3, lanczos_iters=20, mse=True)
  assert new == composed       # every float, bit for bit
  assert set(new) == KEYS | {"fisher_mse_lambda_max"}


def test_flat_inputs_and_mse_off_give_the_same_numbers():
  """Each diagnostic compiles its own programs, so these two checks, which do not depend on
  the parametrisation, run once (on a trained Stiefel network) rather than per case above."""
  model = _network("stiefel")
  _train_a_little(model, seed=3)
  x, y = _batch()
  full = oa.isometry_diagnostics(model, x, y, jacobian_examples=3, lanczos_iters=20, mse=True)
  assert full == oa.isometry_diagnostics(model, x.reshape(len(x), -1), y, jacobian_examples=3,
                                         lanczos_iters=20, mse=True)   # flat x alike
  new = oa.isometry_diagnostics(model, x, y, jacobian_examples=3, lanczos_iters=20)
  assert set(new) == KEYS
  assert new == {k: v for k, v in full.items() if k in KEYS}


def test_against_dense_references():
  """A small network (515 parameters): λ_max of the explicit empirical Fisher GᵀG/B and of
  the MSE Gauss–Newton JᵀJ/B (float64 eigvalsh), σ_max of the explicit Jacobian (SVD)."""
  model = _network(seed=2)         # the shapes above: the compiled programs are reused
  _train_a_little(model, seed=4)
  x, y = _batch(seed=5)
  got = oa.isometry_diagnostics(model, x, y, jacobian_examples=3, lanczos_iters=20, mse=True)

  graphdef, state, rest = nnx.split(model, nnx.Param, ...)
  flat, unravel = ravel_pytree(nnx.to_pure_dict(state))
  apply = lambda theta: nnx.merge(graphdef, unravel(theta), rest)(jnp.asarray(x))  # (B, C)
  losses = lambda theta: -jax.nn.log_softmax(apply(theta))[jnp.arange(len(y)), y]
  g = np.asarray(jax.jacobian(losses)(flat), np.float64)                    # (B, P)
  fisher = g.T @ g / len(y)
  assert got["fisher_lambda_max"] == pytest.approx(np.linalg.eigvalsh(fisher)[-1], rel=1e-4)
  assert got["fisher_converged"] == 1.0
  j = np.asarray(jax.jacobian(apply)(flat), np.float64)                     # (B, C, P)
  gn = np.einsum("bcp,bcq->pq", j, j) / len(y)
  assert got["fisher_mse_lambda_max"] == pytest.approx(np.linalg.eigvalsh(gn)[-1], rel=1e-4)

  x0 = model.scale * jnp.asarray(x[:3].reshape(3, -1))     # J at the scaled input x⁰
  jac = jax.vmap(jax.jacobian(model.model.features))(x0)                   # (3, width, in)
  sigma = np.asarray(jnp.linalg.svd(jac, compute_uv=False), np.float64)[:, 0]
  assert got["jacobian_sigma_max"] == pytest.approx(np.mean(sigma), rel=1e-5)
  assert got["jacobian_sigma_max_sq"] == pytest.approx(np.mean(sigma ** 2), rel=1e-5)
  # The scale matters: J at the unscaled input differs for tanh.
  plain = np.asarray(jnp.linalg.svd(jax.vmap(jax.jacobian(model.model.features))(
      jnp.asarray(x[:3].reshape(3, -1))), compute_uv=False))[:, 0]
  assert abs(np.mean(plain) - np.mean(sigma)) > 1e-3


def test_a_bare_deep_mlp_is_the_wrapper_with_scale_one():
  model = _network(scale=1.0)
  _train_a_little(model, seed=6)
  x, y = _batch(shape=(12,))
  wrapped = oa.isometry_diagnostics(model, x, y, jacobian_examples=3, lanczos_iters=20)
  bare = oa.isometry_diagnostics(model.model, x, y, jacobian_examples=3, lanczos_iters=20)
  for key in KEYS:
    assert bare[key] == pytest.approx(wrapped[key], rel=1e-6)


def test_the_callers_model_is_left_alone():
  model = _network()
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))
  x, y = _batch()
  oa.isometry_diagnostics(model, x, y, jacobian_examples=3, lanczos_iters=20)
  after = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model)))
  jax.tree.map(np.testing.assert_array_equal, before, after)


def test_errors():
  x, y = _batch()
  with pytest.raises(TypeError, match="features"):
    oa.isometry_diagnostics(nnx.Linear(12, 5, rngs=nnx.Rngs(0)), x.reshape(16, -1), y)
  with pytest.raises(TypeError, match="nnx.Module"):
    oa.isometry_diagnostics(lambda v: v, x, y)
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match="jacobian_examples"):
      oa.isometry_diagnostics(_network(), x, y, jacobian_examples=bad)
    with pytest.raises(ValueError, match="lanczos_iters"):
      oa.isometry_diagnostics(_network(), x, y, lanczos_iters=bad)
  with pytest.raises(ValueError, match="labels"):
    oa.isometry_diagnostics(_network(), x, y[:, None].astype(np.float32))
