"""Mean-field quadrature, q-map, χ and critical points, against scipy and Monte Carlo."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

from orthojax.nn import initializers as oi

TANH_Q_STARS = (1 / 64, 9e-4, 0.5, 8.0)


# ----------------------------------------------------------------------------
# An independent reference: scipy.integrate.quad on split intervals
# ----------------------------------------------------------------------------


def ref_expectation(f, q, kinks=()):
  """E_h[f(√q h)] with scipy quad, split at ±1, ±3, ... and at the kinks."""
  sq = math.sqrt(q)
  edges = {-40.0, -12.0, -6.0, -3.0, -1.0, 0.0, 1.0, 3.0, 6.0, 12.0, 40.0}
  edges |= {k / sq for k in kinks if abs(k / sq) < 40.0}
  edges = sorted(edges)
  g = lambda h: f(sq * h) * math.exp(-0.5 * h * h) / math.sqrt(2 * math.pi)
  return sum(integrate.quad(g, a, b, epsabs=0.0, epsrel=1e-13, limit=200)[0]
             for a, b in zip(edges[:-1], edges[1:]))


def sech2(x):
  return 1.0 / math.cosh(x) ** 2 if abs(x) < 350 else 0.0


SCALAR = {
    "tanh": (math.tanh, sech2, ()),
    "erf": (math.erf, lambda x: 2 / math.sqrt(math.pi) * math.exp(-x * x), ()),
    "hard_tanh": (lambda x: min(max(x, -1.0), 1.0), lambda x: float(abs(x) < 1), (-1.0, 1.0)),
    "relu": (lambda x: max(x, 0.0), lambda x: float(x > 0), (0.0,)),
}


def ref_q_map(q, sw, sb, name):
  phi, _, kinks = SCALAR[name]
  return sw**2 * ref_expectation(lambda x: phi(x) ** 2, q, kinks) + sb**2


def ref_chi(q, sw, name):
  _, dphi, kinks = SCALAR[name]
  return sw**2 * ref_expectation(lambda x: dphi(x) ** 2, q, kinks)


def rel(a, b):
  return abs(a - b) / abs(b)


# ----------------------------------------------------------------------------
# Quadrature
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tanh", "erf", "hard_tanh", "relu"])
@pytest.mark.parametrize("q", [9e-4, 1 / 64, 0.5, 8.0, 100.0])
def test_adaptive_quadrature_matches_scipy(name, q):
  act = oi.resolve_activation(name)
  phi, dphi, kinks = SCALAR[name]
  for vec, scalar in ((act.phi, phi), (act.dphi, dphi)):
    got = oi.gaussian_expectation(lambda x: vec(x) ** 2, q, breakpoints=act.kinks)
    want = ref_expectation(lambda x: scalar(x) ** 2, q, kinks)
    # Targets of the spec are 1e-5 (q <= 1/2) and 1e-3 (q = 8); adaptive
    # Gauss-Legendre with panel edges at the kinks is at round-off.
    assert rel(got, want) < 1e-11, (name, q, got, want)


@pytest.mark.parametrize("q,tol", [(1 / 64, 1e-5), (0.5, 1e-5), (8.0, 1e-3)])
def test_gauss_hermite_tanh_meets_targets(q, tol):
  for f, g in ((lambda x: np.tanh(x) ** 2, lambda x: math.tanh(x) ** 2),
               (lambda x: oi.resolve_activation("tanh").dphi(x) ** 2, lambda x: sech2(x) ** 2)):
    got = oi.gaussian_expectation(f, q, method="hermite", order=200)
    assert rel(got, ref_expectation(g, q)) < tol


def test_gauss_hermite_is_poor_at_kinks_adaptive_is_not():
  """Why the default is adaptive: hard-tanh's kinks stall Gauss-Hermite."""
  f = lambda x: (np.abs(x) < 1.0).astype(np.float64)
  want = math.erf(1 / math.sqrt(2 * 8.0))  # P(|√8 h| < 1)
  assert rel(oi.gaussian_expectation(f, 8.0, method="hermite"), want) > 1e-3
  assert rel(oi.gaussian_expectation(f, 8.0, breakpoints=(-1.0, 1.0)), want) < 1e-12
  # Without declared breakpoints the adaptive refinement still finds the kinks.
  assert rel(oi.gaussian_expectation(f, 8.0), want) < 1e-9


@pytest.mark.parametrize("q", [1e-3, 0.1, 0.5, 3.0, 50.0])
def test_erf_closed_forms(q):
  # E[erf(√q h)²] = (2/π) arcsin(2q/(1+2q));  E[erf'(√q h)²] = 4/(π √(1+4q)).
  act = oi.resolve_activation("erf")
  e_phi2 = oi.gaussian_expectation(lambda x: act.phi(x) ** 2, q)
  e_dphi2 = oi.gaussian_expectation(lambda x: act.dphi(x) ** 2, q)
  assert rel(e_phi2, 2 / math.pi * math.asin(2 * q / (1 + 2 * q))) < 1e-12
  assert rel(e_dphi2, 4 / (math.pi * math.sqrt(1 + 4 * q))) < 1e-12
  assert rel(oi.chi(q, 1.3, "erf"), 1.69 * 4 / (math.pi * math.sqrt(1 + 4 * q))) < 1e-12


def test_gaussian_expectation_edge_cases():
  assert oi.gaussian_expectation(lambda x: np.cos(x), 0.0) == 1.0  # degenerate Gaussian
  assert rel(oi.gaussian_expectation(lambda x: np.cos(x), 2.0), math.exp(-1.0)) < 1e-13
  assert rel(oi.gaussian_expectation(lambda x: x**4, 3.0), 27.0) < 1e-13
  with pytest.raises(ValueError, match="q must be"):
    oi.gaussian_expectation(np.cos, -1.0)
  with pytest.raises(ValueError, match="method"):
    oi.gaussian_expectation(np.cos, 1.0, method="simpson")
  # A float32 integrand: the refinement stops at float32 noise instead of looping.
  got = oi.gaussian_expectation(lambda x: np.tanh(x.astype(np.float32)) ** 2, 0.5)
  assert rel(got, ref_expectation(lambda x: math.tanh(x) ** 2, 0.5)) < 1e-6


# ----------------------------------------------------------------------------
# q-map, χ, q*
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tanh", "hard_tanh", "relu"])
def test_q_map_and_chi_match_scipy(name):
  for q in (0.05, 1.0, 4.0):
    assert rel(oi.q_map(q, 1.4, 0.3, name), ref_q_map(q, 1.4, 0.3, name)) < 1e-11
    assert rel(oi.chi(q, 1.4, name), ref_chi(q, 1.4, name)) < 1e-11
  qs = np.array([[0.05, 1.0], [4.0, 9.0]])
  np.testing.assert_allclose(
      oi.q_map(qs, 1.4, 0.3, name), [[ref_q_map(q, 1.4, 0.3, name) for q in row] for row in qs],
      rtol=1e-11)


def test_linear_and_relu_closed_forms():
  for q in (0.1, 2.0):
    assert rel(oi.chi(q, 0.7, "linear"), 0.49) < 1e-13  # χ = σ_w², any q
    assert rel(oi.chi(q, 1.2, "relu"), 0.72) < 1e-13  # χ = σ_w²/2
    assert rel(oi.q_map(q, 0.7, 0.2, "linear"), 0.49 * q + 0.04) < 1e-13
  # q* = σ_b²/(1 − σ_w²) (linear), σ_b²/(1 − σ_w²/2) (ReLU).
  assert rel(oi.q_star(0.5, 0.1, "linear"), 0.01 / 0.75) < 1e-10
  assert rel(oi.q_star(1.0, 0.5, "relu"), 0.5) < 1e-10


@pytest.mark.parametrize("q_star", TANH_Q_STARS)
def test_tanh_critical_point_against_scipy(q_star):
  sw, sb = oi.critical_point("tanh", q_star)
  assert sb > 0.0 and sw > 1.0
  assert abs(ref_q_map(q_star, sw, sb, "tanh") - q_star) / q_star < 1e-8
  assert abs(ref_chi(q_star, sw, "tanh") - 1.0) < 1e-8
  assert oi.critical("tanh", q_star) == (sw, sb)


@pytest.mark.parametrize("q_star", TANH_Q_STARS)
def test_q_star_recovers_the_fixed_point(q_star):
  # Near q* -> 0 the q-map's slope at q* tends to 1, so this also exercises
  # the root-finding fallback after the plain iteration stalls.
  sw, sb = oi.critical_point("tanh", q_star)
  for q0 in (1.0, 0.3 * q_star):
    assert rel(oi.q_star(sw, sb, "tanh", q0=q0), q_star) < 1e-8


def test_q_star_without_bias():
  assert oi.q_star(0.5, 0.0, "tanh") == 0.0  # ordered phase: signals die out
  assert oi.q_star(1.0, 0.0, "tanh") < 1e-12  # critical: q -> 0 algebraically
  q = oi.q_star(1.5, 0.0, "tanh")  # chaotic phase: a non-zero stable fixed point
  assert q > 0.5
  assert abs(ref_q_map(q, 1.5, 0.0, "tanh") - q) / q < 1e-10


def test_small_q_tanh_is_near_linear():
  # σ_w² = 1/E[sech⁴] ≈ 1 + 2q − 3q², σ_b² = O(q³) as q* -> 0.
  q = 1e-3
  sw, sb = oi.critical_point("tanh", q)
  assert abs(sw**2 - (1 + 2 * q - 3 * q**2)) < 1e-7
  assert 0 < sb**2 < 10 * q**3


def test_other_named_critical_points():
  for name in ("hard_tanh", "erf"):
    for q in (0.1, 2.0):
      sw, sb = oi.critical_point(name, q)
      assert abs(ref_q_map(q, sw, sb, name) - q) / q < 1e-8
      assert abs(ref_chi(q, sw, name) - 1.0) < 1e-8


def test_relu_and_linear_are_critical_only_without_bias():
  for q in (1e-3, 1.0, 50.0):
    assert oi.critical_point("relu", q) == (math.sqrt(2.0), 0.0)
    assert oi.critical_point("linear", q) == (1.0, 0.0)
  assert oi.critical_line("relu", 0.0) == pytest.approx(math.sqrt(2.0), rel=1e-12)
  # σ_b > 0 at σ_w = √2: q grows by σ_b² every layer, no fixed point.
  with pytest.raises(ValueError, match="no finite fixed point"):
    oi.q_star(math.sqrt(2.0), 0.1, "relu")
  with pytest.raises(ValueError, match="critical only at sigma_b = 0"):
    oi.critical_line("relu", [0.0, 0.1])
  with pytest.raises(ValueError, match="no finite fixed point"):
    oi.q_star(1.0, 0.1, "linear")


def test_no_critical_point_when_sigma_b_squared_negative():
  # φ(0) ≠ 0: χ = 1 needs a large σ_w that overshoots q* by itself.
  with pytest.raises(ValueError, match="no critical point with q"):
    oi.critical_point(jax.nn.sigmoid, 0.5)
  with pytest.raises(ValueError, match="sigma_b\\^2 would be"):
    oi.critical_point((lambda x: x + 1.0, np.ones_like), 1.0)
  with pytest.raises(ValueError, match="q_star must be"):
    oi.critical_point("tanh", 0.0)


def test_callable_activations():
  # sin: E[sin²] = (1 − e^{−2q})/2, E[cos²] = (1 + e^{−2q})/2, so
  # σ_w² = 2/(1 + e^{−2q}) and σ_b² = q − tanh(q).
  q = 0.7
  want = (math.sqrt(2 / (1 + math.exp(-2 * q))), math.sqrt(q - math.tanh(q)))
  by_grad = oi.critical_point(lambda x: jnp.sin(x), q)
  by_pair = oi.critical_point((np.sin, np.cos), q)
  np.testing.assert_allclose(by_grad, want, rtol=1e-10)
  np.testing.assert_allclose(by_pair, want, rtol=1e-10)
  # A jax callable agrees with the named activation (float64 under enable_x64).
  np.testing.assert_allclose(oi.critical_point(jnp.tanh, 0.5), oi.critical_point("tanh", 0.5),
                             rtol=1e-10)
  np.testing.assert_allclose(oi.chi(2.0, 1.5, lambda x: jnp.maximum(x, 0.0)), 1.125, rtol=1e-9)


def test_activation_errors():
  with pytest.raises(ValueError, match=r"activation='swishy'; valid: \['tanh', 'hard_tanh'"):
    oi.critical_point("swishy", 1.0)
  with pytest.raises(TypeError, match="activation must be"):
    oi.chi(1.0, 1.0, 3.0)

  def numpy_only(x):
    return np.tanh(np.asarray(x))  # not traceable by jax.grad

  with pytest.raises(ValueError, match="pair"):
    oi.chi(1.0, 1.0, numpy_only)
  with pytest.raises(ValueError, match="elementwise"):
    oi.q_map(1.0, 1.0, 0.0, lambda x: jnp.sum(x))


def test_critical_line_tanh():
  sigma_b = np.array([0.0, 0.05, 0.3, 1.0])
  sw, qs = oi.critical_line("tanh", sigma_b, return_q_star=True)
  assert sw.shape == qs.shape == sigma_b.shape
  assert sw[0] == pytest.approx(1.0, abs=1e-8) and qs[0] == 0.0  # σ_b -> 0 limit
  assert np.all(np.diff(sw) > 0) and np.all(np.diff(qs) > 0)
  for s, w, q in zip(sigma_b[1:], sw[1:], qs[1:]):
    # On the line: χ(q*) = 1 at the fixed point of (σ_w, σ_b).
    assert abs(ref_chi(q, w, "tanh") - 1.0) < 1e-8
    assert abs(ref_q_map(q, w, s, "tanh") - q) / q < 1e-8
  assert oi.critical_line("tanh", 0.3) == pytest.approx(sw[2], rel=1e-12)


# ----------------------------------------------------------------------------
# Monte Carlo: a wide random network at the critical point
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name,q_star", [("tanh", 1 / 64), ("tanh", 0.5), ("tanh", 8.0),
                                         ("hard_tanh", 2.0)])
def test_monte_carlo_wide_network_stays_at_q_star(name, q_star):
  """Width 2000, depth 10, W ~ N(0, σ_w²/N), b ~ N(0, σ_b²) at the critical point.

  Finite width adds O(√(2/N)) ≈ 3 % relative noise per layer, so single
  layers are checked to 10 % and the depth average to 4 %.
  """
  width, depth, batch = 2000, 10, 8
  act = oi.resolve_activation(name)
  sw, sb = oi.critical_point(name, q_star)
  rng = np.random.default_rng(0)
  h = (math.sqrt(q_star) * rng.standard_normal((batch, width))).astype(np.float32)
  q_emp, chi_emp = [], []
  for _ in range(depth):
    w = rng.standard_normal((width, width), dtype=np.float32) * np.float32(sw / math.sqrt(width))
    b = rng.standard_normal(width, dtype=np.float32) * np.float32(sb)
    h = act.phi(h).astype(np.float32) @ w + b
    q_emp.append(float(np.mean(h.astype(np.float64) ** 2)) / q_star)
    chi_emp.append(sw**2 * float(np.mean(act.dphi(h.astype(np.float64)) ** 2)))
  q_emp, chi_emp = np.array(q_emp), np.array(chi_emp)
  assert np.max(np.abs(q_emp - 1.0)) < 0.1, q_emp
  assert abs(np.mean(q_emp) - 1.0) < 0.04, q_emp
  assert np.max(np.abs(chi_emp - 1.0)) < 0.1, chi_emp
  assert abs(np.mean(chi_emp) - 1.0) < 0.04, chi_emp


def test_monte_carlo_off_critical_drifts():
  """The Monte Carlo check can fail: σ_b = 0 at σ_w(q* = 8) drifts away from q*."""
  sw, _ = oi.critical_point("tanh", 8.0)
  rng = np.random.default_rng(1)
  width = 1000
  h = (math.sqrt(8.0) * rng.standard_normal((2, width))).astype(np.float32)
  for _ in range(8):
    w = rng.standard_normal((width, width), dtype=np.float32) * np.float32(sw / math.sqrt(width))
    h = np.tanh(h) @ w
  assert float(np.mean(h**2)) < 0.8 * 8.0
  assert rel(float(np.mean(h**2)), oi.q_star(sw, 0.0, "tanh")) < 0.05
