"""Mean-field predictions against Monte-Carlo simulations of wide random networks."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import orthojax as oj
from orthojax import analysis as oa

WIDTH, DEPTH, BATCH = 1024, 30, 16


def test_reexports_are_the_initializers_functions():
  init = oj.nn.initializers
  for name in ("q_map", "q_star", "chi", "critical_point", "critical_line"):
    assert getattr(oa, name) is getattr(init, name)
    assert getattr(oa.mean_field, name) is getattr(init, name)
  assert oa.mean_field.q_recursion is oa.q_recursion


def test_q_recursion():
  sw, sb = 1.5, 0.3
  qs = oa.q_recursion(2.0, sw, sb, "tanh", 40)
  assert qs.shape == (41,) and qs[0] == 2.0
  for a, b in zip(qs[:-1], qs[1:]):
    assert b == pytest.approx(oa.q_map(a, sw, sb, "tanh"), rel=1e-12)
  assert qs[-1] == pytest.approx(oa.q_star(sw, sb, "tanh"), rel=1e-6)
  # a linear network: q^l = σ_w^{2l} q0 + σ_b² Σ σ_w^{2j}
  lin = oa.q_recursion(1.0, 0.9, 0.1, "linear", 3)
  np.testing.assert_allclose(lin[-1], 0.81**3 + 0.01 * (1 + 0.81 + 0.81**2), rtol=1e-12)
  np.testing.assert_allclose(oa.q_recursion(0.7, 1.0, 0.0, "tanh", 0), [0.7])
  with pytest.raises(ValueError, match="depth"):
    oa.q_recursion(1.0, 1.0, 0.0, "tanh", -1)
  with pytest.raises(ValueError, match="q0"):
    oa.q_recursion(-1.0, 1.0, 0.0, "tanh", 2)
  with pytest.raises(ValueError, match="unknown activation"):
    oa.q_recursion(1.0, 1.0, 0.0, "swishy", 2)


@jax.jit
def _simulate(key, sigma_w, sigma_b, q0):
  """A wide random tanh network, layer by layer (weights drawn inside the scan).

  Returns per layer ``l``: the empirical variance ``mean(h^{l+1}²)``; the mean
  squared singular value of the layer Jacobian ``D_l W_l``, exactly
  ``(1/N) tr = (1/N) Σ_ij φ'(h_i)² W_ij²`` averaged over the inputs; and the
  growth ``‖δ^{l+1}‖² / ‖δ^l‖²`` of random tangents pushed through the whole
  network (their product is a Hutchinson estimate of the whole Jacobian's
  mean squared singular value, the tangents being isotropic at the input).
  """
  k_h, k_d, k_layers = jax.random.split(key, 3)
  h = jnp.sqrt(q0) * jax.random.normal(k_h, (BATCH, WIDTH))
  delta = jax.random.normal(k_d, (BATCH, WIDTH))

  def layer(carry, k):
    h, delta = carry
    kw, kb = jax.random.split(k)
    w = sigma_w / math.sqrt(WIDTH) * jax.random.normal(kw, (WIDTH, WIDTH))
    b = sigma_b * jax.random.normal(kb, (WIDTH,))
    d2 = (1.0 - jnp.tanh(h) ** 2) ** 2
    layer_chi = jnp.mean(d2 @ jnp.sum(w * w, axis=1)) / WIDTH
    new_delta = (delta * (1.0 - jnp.tanh(h) ** 2)) @ w
    growth = jnp.sum(new_delta**2) / jnp.sum(delta**2)
    h = jnp.tanh(h) @ w + b
    return (h, new_delta), (jnp.mean(h * h), layer_chi, growth)

  _, out = jax.lax.scan(layer, (h, delta), jax.random.split(k_layers, DEPTH))
  return out


@pytest.mark.parametrize("case", ["critical", "chaotic"])
def test_q_and_chi_match_a_wide_random_tanh_network(case):
  if case == "critical":
    q_fixed = 0.5
    sw, sb = oa.critical_point("tanh", q_fixed)
  else:
    sw, sb = 2.0, 0.3
    q_fixed = oa.q_star(sw, sb, "tanh")
  q0 = 2.0   # start away from q*: the transient is predicted too
  q_emp, chi_emp, growth = (np.asarray(v, np.float64)
                            for v in _simulate(jax.random.key(0), sw, sb, q0))
  q_pred = oa.q_recursion(q0, sw, sb, "tanh", DEPTH)             # q^0 ... q^L
  # One network for all inputs: each layer's sample variance over N units
  # fluctuates by ~sqrt(2/N) ≈ 4% (the inputs correlate with depth, so the
  # batch does not average it away); the average over layers is tight.
  np.testing.assert_allclose(q_emp, q_pred[1:], rtol=0.12)
  np.testing.assert_allclose(q_emp[10:].mean(), q_fixed, rtol=0.02)
  # Layer l's Jacobian D_l W_l: mean squared singular value χ(q^l).
  chi_pred = np.array([oa.chi(q, sw, "tanh") for q in q_pred[:-1]])
  np.testing.assert_allclose(chi_emp, chi_pred, rtol=0.08)
  np.testing.assert_allclose(chi_emp[10:].mean(), oa.chi(q_fixed, sw, "tanh"), rtol=0.01)
  # The whole Jacobian: mean squared singular value ∏ χ(q^l) (χ^L at the fixed point).
  np.testing.assert_allclose(np.log(np.prod(growth)), np.log(np.prod(chi_pred)), atol=0.15)
  if case == "critical":
    assert oa.chi(q_fixed, sw, "tanh") == pytest.approx(1.0, rel=1e-9)
    np.testing.assert_allclose(np.prod(growth[5:]), 1.0, rtol=0.15)
  else:
    assert oa.chi(q_fixed, sw, "tanh") > 1.3   # chaotic: gradients explode like χ^L


def _haar(rng, n):
  q, r = np.linalg.qr(rng.standard_normal((n, n)))
  return q * np.sign(np.diag(r))


def _jjt_moments(activation, weights, sigma_w, sigma_b, q, depth, width=256, samples=6):
  """Mean and variance of the eigenvalues of JJᵀ of random networks, in numpy."""
  dphi = {"relu": lambda h: (h > 0) * 1.0, "hard_tanh": lambda h: (np.abs(h) < 1) * 1.0}[activation]
  phi = {"relu": lambda h: np.maximum(h, 0), "hard_tanh": lambda h: np.clip(h, -1, 1)}[activation]
  rng = np.random.default_rng(0)
  out = []
  for _ in range(samples):
    h = math.sqrt(q) * rng.standard_normal(width)
    jac = np.eye(width)
    for _ in range(depth):
      w = (sigma_w * _haar(rng, width) if weights == "orthogonal"
           else sigma_w / math.sqrt(width) * rng.standard_normal((width, width)))
      jac = w @ (dphi(h)[:, None] * jac)
      h = w @ phi(h) + sigma_b * rng.standard_normal(width)
    ev = np.linalg.eigvalsh(jac @ jac.T)
    out.append((ev.mean(), ev.var()))
  return np.mean(out, axis=0)


@pytest.mark.parametrize("activation,weights,rtol", [
    ("relu", "orthogonal", 0.12), ("relu", "gaussian", 0.2),
    ("hard_tanh", "orthogonal", 0.12), ("hard_tanh", "gaussian", 0.2)])
def test_predicted_jacobian_moments_match_simulation(activation, weights, rtol):
  depth, q = 4, 0.5
  if activation == "relu":   # critical at σ_w = √2, σ_b = 0; every q is a fixed point
    pred = oa.jacobian_spectrum_moments("relu", depth, weights=weights, sigma_w=math.sqrt(2),
                                        q_star=q)
  else:
    pred = oa.jacobian_spectrum_moments("hard_tanh", depth, weights=weights, q_star=q)
  m1, var = _jjt_moments(activation, weights, pred.sigma_w, pred.sigma_b, q, depth)
  np.testing.assert_allclose(m1, pred.m1, rtol=0.1)
  np.testing.assert_allclose(var, pred.variance, rtol=rtol)


def test_moment_formulas():
  # Piecewise-linear φ at criticality: σ² = L(1/p − 1) orthogonal, L/p Gaussian.
  for q in (0.1, 1.0, 4.0):
    p = math.erf(1.0 / math.sqrt(2.0 * q))          # P(|√q h| < 1)
    for weights, want in (("orthogonal", 7 * (1 / p - 1)), ("gaussian", 7 / p)):
      m = oa.jacobian_spectrum_moments("hard_tanh", 7, weights=weights, q_star=q)
      assert m.m1 == pytest.approx(1.0, rel=1e-9) and m.chi == pytest.approx(1.0, rel=1e-9)
      assert m.mu1 == pytest.approx(p, rel=1e-9) and m.mu2 == pytest.approx(p, rel=1e-9)
      assert m.variance == pytest.approx(want, rel=1e-8)
      assert m.m2 == pytest.approx(want + 1.0, rel=1e-8)
  relu = oa.jacobian_spectrum_moments("relu", 5, weights="gaussian", sigma_w=math.sqrt(2),
                                      q_star=1.0)
  assert relu.variance == pytest.approx(10.0) and relu.mu1 == pytest.approx(0.5)
  lin = oa.jacobian_spectrum_moments("linear", 9, weights="orthogonal", sigma_w=1.0, q_star=1.0)
  assert lin.variance == pytest.approx(0.0, abs=1e-12) and lin.m1 == pytest.approx(1.0)
  # Off criticality the mean is χ^L and the variance scales with m1².
  off = oa.jacobian_spectrum_moments("linear", 3, weights="gaussian", sigma_w=1.1, q_star=1.0)
  assert off.m1 == pytest.approx(1.21**3) and off.variance == pytest.approx(3 * 1.21**6)
  # Smooth φ (tanh) uses both moments of φ'²: small q* is near-isometric.
  small = oa.jacobian_spectrum_moments("tanh", 200, weights="orthogonal", q_star=1 / 64)
  large = oa.jacobian_spectrum_moments("tanh", 200, weights="orthogonal", q_star=8.0)
  assert small.variance < 1.0 < large.variance
  with pytest.raises(ValueError, match="weights"):
    oa.jacobian_spectrum_moments("tanh", 3, weights="haar", q_star=0.5)
  with pytest.raises(ValueError, match="depth"):
    oa.jacobian_spectrum_moments("tanh", 0, q_star=0.5)
  with pytest.raises(ValueError, match="give q_star"):
    oa.jacobian_spectrum_moments("tanh", 3)
  with pytest.raises(ValueError, match="sigma_b needs sigma_w"):
    oa.jacobian_spectrum_moments("tanh", 3, sigma_b=0.1)
