"""Tests of the decoupled soft-orthogonality optax transformation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from orthojax import penalties
from orthojax.linalg import MatrixView
from orthojax.optim._penalty import AddOrthogonalityPenaltyState
from orthojax.optim._penalty import add_orthogonality_penalty


def _params(seed=0):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(size=(8, 4)) / np.sqrt(8), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(4,)), jnp.float32),
          "conv": jnp.asarray(rng.normal(size=(2, 2, 3, 5)) * 0.3, jnp.float32)}


def _so_grad(w):
  """4 T (TᵀT − I) for a tall 2-D w, numpy float64."""
  w = np.asarray(w, np.float64)
  return 4 * w @ (w.T @ w - np.eye(w.shape[1]))


def _ones_like(p):
  return jax.tree_util.tree_map(jnp.ones_like, p)


def test_constant_strength_adds_the_gradient_under_jit():
  p = _params()
  tx = add_orthogonality_penalty("so", 0.3)
  state = tx.init(p)
  assert isinstance(state, optax.EmptyState)
  updates, new_state = jax.jit(tx.update)(_ones_like(p), state, p)
  np.testing.assert_allclose(updates["w"], 1 + 0.3 * _so_grad(p["w"]), rtol=1e-5, atol=1e-6)
  conv_t = np.asarray(p["conv"]).reshape(12, 5)
  np.testing.assert_allclose(updates["conv"],
                             (1 + 0.3 * _so_grad(conv_t)).reshape(p["conv"].shape),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(updates["b"], 1.0)  # vectors untouched
  assert isinstance(new_state, optax.EmptyState)


def test_schedule_strength_and_count():
  p = _params()
  schedule = optax.linear_schedule(1.0, 0.0, transition_steps=4)
  tx = add_orthogonality_penalty("so", schedule)
  state = tx.init(p)
  assert isinstance(state, AddOrthogonalityPenaltyState)
  update = jax.jit(tx.update)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, p)
  for step in range(3):
    assert int(state.count) == step
    updates, state = update(zeros, state, p)
    np.testing.assert_allclose(updates["w"], schedule(step) * _so_grad(p["w"]), rtol=1e-5,
                               atol=1e-6)
  assert int(state.count) == 3


def _train(tx, params, steps=200):
  state = tx.init(params)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)

  @jax.jit
  def run(params, state):
    def body(_, carry):
      params, state = carry
      updates, state = tx.update(zeros, state, params)
      return optax.apply_updates(params, updates), state
    return jax.lax.fori_loop(0, steps, body, (params, state))

  return run(params, state)[0]


def test_sgd_chain_drives_the_defect_to_zero():
  p = {"w": _params()["w"]}
  before = float(penalties.so(p["w"]))
  assert before > 0.5
  after = _train(optax.chain(add_orthogonality_penalty("so", 1.0), optax.sgd(0.05)), p)
  assert float(penalties.so(after["w"])) < 1e-4 * before
  np.testing.assert_allclose(np.linalg.svd(after["w"], compute_uv=False), 1.0, atol=1e-3)


def test_gain_adjusted_drives_singular_values_to_gain():
  gain = 1.5
  p = {"w": _params()["w"]}
  tx = optax.chain(add_orthogonality_penalty("gain_adjusted_so", 1.0, gain), optax.sgd(0.1))
  after = _train(tx, p)
  np.testing.assert_allclose(np.linalg.svd(after["w"], compute_uv=False), gain, atol=1e-3)
  # Plain SO would have pulled them to 1 instead.
  plain = _train(optax.chain(add_orthogonality_penalty("so", 1.0), optax.sgd(0.1)), p)
  np.testing.assert_allclose(np.linalg.svd(plain["w"], compute_uv=False), 1.0, atol=1e-3)


def test_injected_strength_and_gain_equal_the_constants():
  """``optax.inject_hyperparams`` hands the constructor every numeric argument traced
  (the checks let them through; the penalty uses them as numbers); a new gain set in
  the state takes effect at the next step. srip's loop count must stay static."""
  p = _params()
  injected = optax.inject_hyperparams(add_orthogonality_penalty)(
      kind="gain_adjusted_so", strength=0.3, gain=1.5)
  state = injected.init(p)
  update = jax.jit(injected.update)
  for gain in (1.5, 0.5):
    state.hyperparams["gain"] = jnp.asarray(gain)
    updates, state = update(_ones_like(p), state, p)
    constant = add_orthogonality_penalty("gain_adjusted_so", 0.3, gain)
    want, _ = constant.update(_ones_like(p), constant.init(p), p)
    for key in p:
      np.testing.assert_allclose(updates[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)
  assert not np.allclose(updates["w"], 1.0)
  plain = optax.inject_hyperparams(add_orthogonality_penalty)(kind="so", strength=0.3)
  updates, _ = jax.jit(plain.update)(_ones_like(p), plain.init(p), p)   # gain, iterations traced
  np.testing.assert_allclose(updates["w"], 1 + 0.3 * _so_grad(p["w"]), rtol=1e-5, atol=1e-6)
  srip = optax.inject_hyperparams(add_orthogonality_penalty)(kind="srip", strength=0.3)
  with pytest.raises(ValueError, match=r"^add_orthogonality_penalty: iterations sets the "
                     r"program's structure .* static_args=\('iterations',\)\)$"):
    srip.init(p)


def test_mask_views_and_reduction_are_forwarded():
  p = _params()
  p["stack"] = jnp.asarray(np.random.default_rng(3).normal(size=(2, 5, 3)), jnp.float32)
  views = {"w": False, "b": False, "conv": False, "stack": MatrixView.stacked()}
  tx = add_orthogonality_penalty("so", 2.0, views=views, reduction="mean")
  updates, _ = jax.jit(tx.update)(_ones_like(p), tx.init(p), p)
  for k in ("w", "b", "conv"):
    np.testing.assert_array_equal(updates[k], 1.0)
  expected = 1 + 2.0 * jax.jit(jax.grad(
      lambda s: penalties.so(s, view=MatrixView.stacked(), reduction="mean")))(p["stack"])
  np.testing.assert_allclose(updates["stack"], expected, rtol=1e-5)
  mask = {"w": False, "b": False, "conv": True, "stack": False}
  tx = add_orthogonality_penalty("so", 1.0, mask=mask)
  updates, _ = jax.jit(tx.update)(_ones_like(p), tx.init(p), p)
  np.testing.assert_array_equal(updates["w"], 1.0)
  assert float(jnp.abs(updates["conv"] - 1).max()) > 1e-3


def test_bfloat16_params_keep_update_dtype():
  p = {"w": _params()["w"].astype(jnp.bfloat16)}
  tx = add_orthogonality_penalty("srip", optax.constant_schedule(0.5))
  updates, _ = jax.jit(tx.update)({"w": jnp.zeros((8, 4), jnp.bfloat16)}, tx.init(p), p)
  assert updates["w"].dtype == jnp.bfloat16
  assert float(jnp.abs(updates["w"].astype(jnp.float32)).max()) > 1e-3


def test_errors():
  p = _params()
  tx = add_orthogonality_penalty("so", 1.0)
  with pytest.raises(ValueError, match="params"):
    tx.update(p, tx.init(p), None)
  with pytest.raises(ValueError, match="gain"):
    add_orthogonality_penalty("so", 1.0, gain=1.5)
  with pytest.raises(ValueError, match="gain"):
    add_orthogonality_penalty("gain_adjusted_so", 1.0, gain=0.0)
  with pytest.raises(ValueError, match="unknown penalty"):
    add_orthogonality_penalty("orth", 1.0)
  with pytest.raises(ValueError, match="reduction"):
    add_orthogonality_penalty("so", 1.0, reduction="avg")
  with pytest.raises(ValueError, match="reduction"):
    add_orthogonality_penalty(lambda w, view=None: jnp.sum(w), 1.0, reduction="mean")
