"""Tests for orthojax.manifolds.Stiefel over parameters in their own layouts.

Every reference is computed in numpy/scipy float64 on a tall matrix obtained
by an explicit per-case reshape (independent of orthojax's layout code), then
compared with the library's float32 result.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from orthojax.linalg import MatrixView
from tests.manifolds._cases import CASES, NAMES, f64, param, tall, view
from orthojax.manifolds import Oblique, Stiefel, cayley_generator, polish


RETRACTIONS = {
    "qr": Stiefel("qr"),
    "qr_cholesky2": Stiefel("qr", qr_algorithm="cholesky_qr2"),
    "qr_householder": Stiefel("qr", qr_algorithm="householder"),
    "polar": Stiefel("polar"),
    "newton_schulz": Stiefel("newton_schulz"),
    "cayley": Stiefel("cayley"),
    "cayley_iter2": Stiefel("cayley", cayley_iterations=2),
}
EXACT = ["qr", "qr_cholesky2", "qr_householder", "polar", "newton_schulz", "cayley"]


def _t(x):
  return np.swapaxes(x, -1, -2)





def sign_fixed_qr(x):
  q, r = np.linalg.qr(x)
  d = np.sign(np.diagonal(r, axis1=-2, axis2=-1))
  d = np.where(d == 0, 1.0, d)
  return q * d[..., None, :]


def scipy_polar(x):
  out = np.empty_like(x)
  for idx in np.ndindex(*x.shape[:-2]):
    out[idx] = scipy.linalg.polar(x[idx])[0]
  return out


def proj_ref(w, g):
  """``(I - W W^T) G + W skew(W^T G)`` (information-geometry seed A.6.2)."""
  n = w.shape[-2]
  wtg = _t(w) @ g
  return (np.eye(n) - w @ _t(w)) @ g + w @ (0.5 * (wtg - _t(wtg)))


def gram_err(t):
  p = t.shape[-1]
  return float(np.abs(_t(t) @ t - np.eye(p)).max())


def point(case, seed):
  """A point on St (numpy float64 tall, and the float32 parameter)."""
  shape = CASES[case][0]
  rng = np.random.default_rng(seed)
  t = tall(case, rng.standard_normal(shape))
  w = sign_fixed_qr(t)
  wp = param(case, w)
  return f64(tall(case, wp)), wp


def tangent(case, w_tall, seed, norm=1.0):
  """A tangent vector at w with Frobenius norm ``norm`` per matrix (tall, param)."""
  rng = np.random.default_rng(seed)
  g = rng.standard_normal(w_tall.shape)
  v = proj_ref(w_tall, g)
  v = norm * v / np.linalg.norm(v, axis=(-2, -1), keepdims=True)
  vp = param(case, v)
  return tall(case, vp), vp



# -- random points --------------------------------------------------------------


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_random_on_manifold(case, dtype):
  shape, v, *_ = CASES[case]
  m = Stiefel()
  w = m.random(jax.random.key(0), shape, dtype, view=v)
  assert w.shape == shape and w.dtype == dtype
  x = np.asarray(w.astype(jnp.float32), np.float64)
  # Directly on the (fan_in, fan_out) matrix of the kernel, no layout code.
  mats = x.reshape(-1, shape[-1]) if case in ("conv", "wide_conv") else x
  fan_in, fan_out = mats.shape[-2:]
  gram = _t(mats) @ mats if fan_in >= fan_out else mats @ _t(mats)
  tol = 1e-5 if dtype == jnp.float32 else 3e-2
  assert np.abs(gram - np.eye(gram.shape[-1])).max() <= tol
  assert np.all(np.asarray(m.defect(w, view=v)) <= (1e-5 if dtype == jnp.float32 else 6e-2))
  # Keys matter, and the same key reproduces.
  np.testing.assert_array_equal(m.random(jax.random.key(0), shape, dtype, view=v), w)
  assert not np.allclose(m.random(jax.random.key(1), shape, dtype, view=v), w)


def test_random_is_haar_on_square():
  # For Haar Q in O(n): E[tr Q] = 0, E[tr(Q)^2] = 1, E[Q_ij] = 0, E[Q_ij^2] = 1/n.
  n, samples = 4, 4000
  q = np.asarray(Stiefel().random(jax.random.key(42), (samples, n, n),
                                  view=MatrixView.stacked()), np.float64)
  tr = np.trace(q, axis1=-2, axis2=-1)
  assert abs(tr.mean()) < 0.08
  assert abs((tr**2).mean() - 1.0) < 0.15
  assert np.abs(q.mean(0)).max() < 0.05
  np.testing.assert_allclose((q**2).mean(0), 1.0 / n, atol=0.03)
  # Both orientations occur (a Haar O(n) sample is not confined to SO(n)).
  det_pos = (np.linalg.det(q) > 0).mean()
  assert 0.45 < det_pos < 0.55


def test_random_rejects_int_dtype():
  with pytest.raises(TypeError):
    Stiefel().random(jax.random.key(0), (4, 3), jnp.int32)


# -- tangent projection -----------------------------------------------------------


@pytest.mark.parametrize("case", NAMES)
def test_project_closed_form(case):
  m = Stiefel()
  w, wp = point(case, 1)
  g = np.random.default_rng(2).standard_normal(CASES[case][0]).astype(np.float32)
  gp = jnp.asarray(g)
  vp = m.project(wp, gp, view=view(case))
  assert vp.shape == wp.shape and vp.dtype == jnp.float32
  v = tall(case, vp)
  ref = proj_ref(w, tall(case, g))
  np.testing.assert_allclose(v, ref, atol=1e-5)
  # Tangent: W^T V + V^T W = 0.
  assert np.abs(_t(w) @ v + _t(v) @ w).max() < 1e-5
  # Idempotent, and the identity on tangent vectors.
  np.testing.assert_allclose(m.project(wp, vp, view=view(case)), vp, atol=1e-5)
  _, tp = tangent(case, w, 3)
  np.testing.assert_allclose(m.project(wp, tp, view=view(case)), tp, atol=1e-5)
  # The Euclidean metric's Riemannian gradient is the projection.
  np.testing.assert_allclose(m.egrad_to_rgrad(wp, gp, view=view(case)), vp, atol=1e-6)
  # Normal vectors W S (S symmetric) are removed.
  s = np.random.default_rng(4).standard_normal(w.shape[:-2] + (w.shape[-1],) * 2)
  normal = param(case, w @ (s + _t(s)))
  np.testing.assert_allclose(m.project(wp, normal, view=view(case)), 0.0, atol=2e-5)


@pytest.mark.parametrize("case", NAMES)
def test_canonical_metric_gradient(case):
  m = Stiefel(metric="canonical")
  w, wp = point(case, 5)
  g = np.random.default_rng(6).standard_normal(CASES[case][0]).astype(np.float32)
  r = tall(case, m.egrad_to_rgrad(wp, jnp.asarray(g), view=view(case)))
  gt = tall(case, g)
  np.testing.assert_allclose(r, gt - w @ _t(gt) @ w, atol=1e-5)
  assert np.abs(_t(w) @ r + _t(r) @ w).max() < 2e-5
  # It differs from the Euclidean projection unless W is square.
  if w.shape[-2] > w.shape[-1]:
    assert not np.allclose(r, proj_ref(w, gt), atol=1e-3)
  else:
    np.testing.assert_allclose(r, 2 * proj_ref(w, gt), atol=1e-4)


def test_cayley_generator_gives_projection():
  rng = np.random.default_rng(7)
  for (n, p), options in (((10, 3), (True, False)), ((5, 4), (None,))):
    w = sign_fixed_qr(rng.standard_normal((2, n, p)))
    g = rng.standard_normal((2, n, p))
    for dense in options:
      a = cayley_generator(jnp.asarray(w, jnp.float32), jnp.asarray(g, jnp.float32), dense=dense)
      a = np.asarray(a if isinstance(a, jax.Array) else a.dense(), np.float64)
      np.testing.assert_allclose(a, -_t(a), atol=1e-6)
      np.testing.assert_allclose(a @ w, proj_ref(w, g), atol=1e-5)
  # None picks dense for n < 2p and low rank otherwise.
  assert isinstance(cayley_generator(jnp.ones((5, 4)), jnp.ones((5, 4))), jax.Array)
  assert not isinstance(cayley_generator(jnp.ones((8, 4)), jnp.ones((8, 4))), jax.Array)


# -- retractions ------------------------------------------------------------------


def _cayley_ref(w, v):
  vh = v - 0.5 * w @ (_t(w) @ v)
  a = vh @ _t(w) - w @ _t(vh)
  eye = np.eye(w.shape[-2])
  return np.linalg.solve(eye - 0.5 * a, w + 0.5 * a @ w)


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.parametrize("retraction", sorted(RETRACTIONS))
def test_retraction_basics(case, retraction):
  m = RETRACTIONS[retraction]
  vw = view(case)
  w, wp = point(case, 11)
  v, vp = tangent(case, w, 12, norm=1.0)
  # R_w(0) = w.
  np.testing.assert_allclose(m.retract(wp, jnp.zeros_like(wp), view=vw), wp, atol=2e-6)
  # On the manifold for a unit step (iterative Cayley: approximately, small step).
  step = 0.1 if retraction == "cayley_iter2" else 1.0
  y = tall(case, m.retract(wp, param(case, step * v), view=vw))
  assert y.shape == w.shape
  assert gram_err(y) < (1e-5 if retraction == "cayley_iter2" else 2e-6)
  # First order: (R_w(tV) - W)/t -> V.
  errs = []
  for t in (1e-1, 1e-2):
    y = tall(case, m.retract(wp, param(case, t * v), view=vw))
    errs.append(np.linalg.norm((y - w) / t - v))
  assert errs[1] < 2e-2, errs
  assert errs[1] < 0.2 * errs[0] + 5e-4, errs


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.parametrize("retraction", EXACT)
def test_exact_retractions_large_step_on_manifold(case, retraction):
  m = RETRACTIONS[retraction]
  w, wp = point(case, 13)
  _, vp = tangent(case, w, 14, norm=2.5)
  y = tall(case, m.retract(wp, vp, view=view(case)))
  assert gram_err(y) < 3e-6


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.parametrize("algorithm", Stiefel.QR_ALGORITHMS)
def test_qr_retraction_equals_numpy_qr(case, algorithm):
  w, wp = point(case, 15)
  v, vp = tangent(case, w, 16, norm=1.5)
  y = tall(case, Stiefel("qr", qr_algorithm=algorithm).retract(wp, vp, view=view(case)))
  np.testing.assert_allclose(y, sign_fixed_qr(w + v), atol=1e-5)


def test_an_unknown_qr_algorithm_is_named():
  with pytest.raises(ValueError, match="unknown qr_algorithm='gram_schmidt'; choose one of"):
    Stiefel("qr", qr_algorithm="gram_schmidt")


@pytest.mark.parametrize("case", NAMES)
def test_polar_and_newton_schulz_equal_scipy_polar(case):
  w, wp = point(case, 17)
  for norm in (0.5, 2.0):
    v, vp = tangent(case, w, 18, norm=norm)
    ref = scipy_polar(w + v)
    y = tall(case, Stiefel("polar").retract(wp, vp, view=view(case)))
    np.testing.assert_allclose(y, ref, atol=1e-5)
    y_ns = tall(case, Stiefel("newton_schulz").retract(wp, vp, view=view(case)))
    np.testing.assert_allclose(y_ns, ref, atol=1e-5)


@pytest.mark.parametrize("case", NAMES)
def test_cayley_retraction_equals_dense_formula(case):
  w, wp = point(case, 19)
  v, vp = tangent(case, w, 20, norm=1.5)
  ref = _cayley_ref(w, v)
  y = tall(case, Stiefel("cayley").retract(wp, vp, view=view(case)))
  np.testing.assert_allclose(y, ref, atol=1e-5)
  # Two fixed-point iterations: close for a small step, not exact for a large one.
  it = Stiefel("cayley", cayley_iterations=2)
  v_s, vp_s = tangent(case, w, 20, norm=0.1)
  y_s = tall(case, it.retract(wp, vp_s, view=view(case)))
  np.testing.assert_allclose(y_s, _cayley_ref(w, v_s), atol=2e-5)
  y_big = tall(case, it.retract(wp, vp, view=view(case)))
  assert np.abs(y_big - ref).max() > 1e-4


@pytest.mark.parametrize("shape", [(4, 9, 9), (3, 12, 5), (2, 40, 4)],
                         ids=["square", "tall", "very_tall"])
@pytest.mark.parametrize("iterations", [None, 2])
@pytest.mark.parametrize("tangent_step", [True, False])
def test_cayley_in_coordinates_equals_the_dense_generator(shape, iterations, tangent_step):
  """The exact retraction (every shape) and the iterative one (square) run in ``p × p``
  coordinates (``oj.linalg.cayley_in_coordinates``): equal to the n × n generator's
  transform of ``W`` for any ``V``, tangent or not, in float64 — square (no normal part),
  tall (n < 2p, where the generator was dense) and very tall (where it was low-rank)."""
  m = Stiefel("cayley", cayley_iterations=iterations)
  w = np.linalg.qr(np.random.default_rng(21).standard_normal(shape))[0]
  v = 0.4 * np.random.default_rng(22).standard_normal(shape)
  if tangent_step:
    v = v - w @ (0.5 * (_t(w) @ v + _t(v) @ w))
  vh = v - 0.5 * w @ (_t(w) @ v)
  a = vh @ _t(w) - w @ _t(vh)   # cayley_generator's dense form
  eye = np.eye(shape[-2])
  if iterations is None:
    want = np.linalg.solve(eye - 0.5 * a, w + 0.5 * a @ w)
  else:
    want = w + a @ w
    for _ in range(iterations):
      want = w + 0.5 * a @ (w + want)
  with jax.enable_x64(True):
    got = m.retract(jnp.asarray(w), jnp.asarray(v), view=MatrixView.stacked())
    assert got.dtype == jnp.float64
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-12)


@pytest.mark.parametrize("case", ["tall", "wide_conv"])
@pytest.mark.parametrize("retraction", ["qr", "polar", "cayley"])
def test_retraction_bfloat16(case, retraction):
  m = RETRACTIONS[retraction]
  w, wp = point(case, 21)
  _, vp = tangent(case, w, 22, norm=0.5)
  wb, vb = wp.astype(jnp.bfloat16), vp.astype(jnp.bfloat16)
  y = m.retract(wb, vb, view=view(case))
  assert y.dtype == jnp.bfloat16 and y.shape == wp.shape
  ref = m.retract(wb.astype(jnp.float32), vb.astype(jnp.float32), view=view(case))
  np.testing.assert_allclose(np.asarray(y, np.float32), ref, atol=1e-2)
  assert gram_err(tall(case, y.astype(jnp.float32))) < 3e-2
  p = Stiefel().project(wb, vb, view=view(case))
  assert p.dtype == jnp.bfloat16


def polish_ref(y, u):
  """Cubic Newton–Schulz steps until the predicted defect 3/4 ||YᵀY − I||² is below u."""
  eye = np.eye(y.shape[-1])
  while True:
    s = _t(y) @ y
    y = y @ (1.5 * eye - 0.5 * s)
    if 0.75 * np.linalg.norm(s - eye) ** 2 <= u:
      return y


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_polish_low_precision(dtype):
  rng = np.random.default_rng(30)
  q = np.linalg.qr(rng.standard_normal((12, 5)))[0]
  u = float(jnp.finfo(dtype).eps) / 2
  for off in (0.01, 0.1):  # one step, then two
    y = q + off * rng.standard_normal(q.shape) / np.sqrt(5)
    got = polish(jnp.asarray(y, jnp.float32), dtype)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, polish_ref(f64(y), u), atol=1e-6)
    assert gram_err(f64(got)) < 2 * u
  # float32 and wider points are left as they are.
  y = jnp.asarray(q + 0.1, jnp.float32)
  assert polish(y, jnp.float32) is y


@pytest.mark.parametrize("case", ["tall", "wide_conv"])
def test_cayley_retraction_bfloat16_removes_the_carried_defect(case):
  # A bfloat16 point off the manifold by 0.05: the Cayley retraction keeps that defect's
  # order in float32 (exactly for a square W, to O(defect ||V||) in coordinates for a
  # tall one: oj.linalg.cayley_in_coordinates), the bfloat16 one brings it to rounding.
  m = Stiefel("cayley")
  w, wp = point(case, 26)
  t = tall(case, wp)
  off = param(case, t + 0.05 * np.random.default_rng(27).standard_normal(t.shape) / 3)
  _, vp = tangent(case, w, 28, norm=0.5)
  wb, vb = off.astype(jnp.bfloat16), vp.astype(jnp.bfloat16)
  y32 = m.retract(wb.astype(jnp.float32), vb.astype(jnp.float32), view=view(case))
  carried = gram_err(tall(case, wb.astype(jnp.float32)))
  assert carried > 0.03
  assert 0.5 * carried < gram_err(tall(case, y32)) < 1.5 * carried
  y = m.retract(wb, vb, view=view(case))
  assert y.dtype == jnp.bfloat16
  p = tall(case, y).shape[-1]
  eps = float(jnp.finfo(jnp.bfloat16).eps)
  assert gram_err(tall(case, y.astype(jnp.float32))) < eps * np.sqrt(p) + eps / 2
  want = param(case, polish_ref(tall(case, y32), eps / 2))
  np.testing.assert_allclose(np.asarray(y, np.float32), want, atol=1e-2)


# -- transport, defect, orthonormalize --------------------------------------------


@pytest.mark.parametrize("case", NAMES)
def test_transport_is_tangent_at_new_point(case):
  m = Stiefel("qr")
  vw = view(case)
  w, wp = point(case, 23)
  _, vp = tangent(case, w, 24, norm=1.0)
  mom, mp = tangent(case, w, 25, norm=3.0)
  w_new = m.retract(wp, vp, view=vw)
  tp = m.transport(w_new, mp, view=vw)
  wn, t = tall(case, w_new), tall(case, tp)
  assert np.abs(_t(wn) @ t + _t(t) @ wn).max() < 2e-5
  np.testing.assert_allclose(t, proj_ref(wn, mom), atol=2e-5)
  # The momentum was not tangent at the new point before transport.
  assert np.abs(_t(wn) @ mom + _t(mom) @ wn).max() > 1e-2


@pytest.mark.parametrize("case", NAMES)
def test_defect_and_orthonormalize(case):
  m = Stiefel()
  x = np.random.default_rng(26).standard_normal(CASES[case][0]).astype(np.float32)
  xt = tall(case, x)
  d = np.asarray(m.defect(jnp.asarray(x), view=view(case)))
  ref = np.linalg.norm(_t(xt) @ xt - np.eye(xt.shape[-1]), axis=(-2, -1))
  assert d.shape == xt.shape[:-2]
  np.testing.assert_allclose(d, ref, rtol=1e-5)
  o = m.orthonormalize(jnp.asarray(x), view=view(case))
  assert o.shape == x.shape and o.dtype == jnp.float32
  np.testing.assert_allclose(tall(case, o), scipy_polar(xt), atol=1e-5)
  _, wp = point(case, 27)
  np.testing.assert_allclose(m.defect(wp, view=view(case)), 0.0, atol=2e-6)
  # A Stiefel point is also on the oblique manifold.
  np.testing.assert_allclose(Oblique().defect(wp, view=view(case)), 0.0, atol=2e-6)


@pytest.mark.parametrize("case", NAMES)
@pytest.mark.parametrize("drift", ["near", "far", "small", "large"])
def test_reorthonormalize_is_the_polar_factor(case, drift):
  # Newton–Schulz, scaled where a singular value could exceed sqrt(3), gives
  # the SVD's polar factor: near the manifold (a Cayley iterate's drift), off
  # it (a Gaussian matrix), and at scales 1e-3 and 1e3 (the factor is scale-free).
  m = Stiefel("cayley")
  rng = np.random.default_rng(31)
  _, wp = point(case, 32)
  t = tall(case, wp)
  x = {"near": t + 0.02 * rng.standard_normal(t.shape),
       "far": rng.standard_normal(t.shape),
       "small": 1e-3 * (t + 0.3 * rng.standard_normal(t.shape)),
       "large": 1e3 * (t + 0.3 * rng.standard_normal(t.shape))}[drift]
  got = m.reorthonormalize(param(case, x), view=view(case))
  assert got.shape == wp.shape and got.dtype == jnp.float32
  want = scipy_polar(tall(case, param(case, x)))
  np.testing.assert_allclose(tall(case, got), want, atol=2e-5)
  assert gram_err(tall(case, got)) < 2e-6


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float64])
def test_reorthonormalize_precision(dtype):
  # float64 reaches float64 rounding; bfloat16 runs in float32 and is rounded once.
  rng = np.random.default_rng(33)
  t = np.linalg.qr(rng.standard_normal((40, 9)))[0] + 0.05 * rng.standard_normal((40, 9))
  want = scipy.linalg.polar(t)[0]
  with jax.enable_x64(dtype == jnp.float64):
    got = Stiefel().reorthonormalize(jnp.asarray(t, dtype))
    assert got.dtype == dtype
    got = np.asarray(got.astype(jnp.float32) if dtype == jnp.bfloat16 else got, np.float64)
  if dtype == jnp.float64:
    np.testing.assert_allclose(got, want, atol=1e-13)
  else:
    np.testing.assert_allclose(got, want, atol=float(jnp.finfo(jnp.bfloat16).eps))


def test_reorthonormalize_runs_matrix_products_only():
  # The point of it: no SVD, QR or eigensolver in the compiled program.
  x = jnp.asarray(np.random.default_rng(34).standard_normal((3, 30, 7)), jnp.float32)
  fn = functools.partial(Stiefel().reorthonormalize, view=MatrixView.stacked())
  # On CPU the LAPACK factorizations (SVD, QR, eigh) are custom calls.
  assert "custom_call" not in jax.jit(fn).lower(x).as_text()
  orthonormalize = functools.partial(Stiefel().orthonormalize, view=MatrixView.stacked())
  assert "custom_call" in jax.jit(orthonormalize).lower(x).as_text()
  np.testing.assert_allclose(fn(x), scipy_polar(np.asarray(x, np.float64)), atol=2e-5)


# -- jit, configuration, errors ---------------------------------------------------


def test_methods_under_jit():
  case = "conv"
  vw = view(case)
  w, wp = point(case, 28)
  _, vp = tangent(case, w, 29, norm=0.5)
  g = jnp.asarray(np.random.default_rng(30).standard_normal(wp.shape), jnp.float32)
  for m in (Stiefel("cayley"), Stiefel("newton_schulz", metric="canonical")):
    f = jax.jit(lambda w, v, g: (m.project(w, g, view=vw), m.egrad_to_rgrad(w, g, view=vw),
                                 m.retract(w, v, view=vw), m.transport(w, g, view=vw),
                                 m.defect(w, view=vw), m.orthonormalize(w, view=vw)))
    eager = (m.project(wp, g, view=vw), m.egrad_to_rgrad(wp, g, view=vw),
             m.retract(wp, vp, view=vw), m.transport(wp, g, view=vw),
             m.defect(wp, view=vw), m.orthonormalize(wp, view=vw))
    for a, b in zip(f(wp, vp, g), eager):
      np.testing.assert_allclose(a, b, atol=2e-5)
  r = jax.jit(lambda k: Stiefel().random(k, (3, 3, 4, 8)))(jax.random.key(3))
  np.testing.assert_allclose(r, Stiefel().random(jax.random.key(3), (3, 3, 4, 8)), atol=1e-6)


def test_static_argument_and_value_semantics():
  traces = []

  def f(m, w, v):
    traces.append(m)
    return m.retract(w, v)

  jf = jax.jit(f, static_argnums=0)
  w = Stiefel().random(jax.random.key(0), (6, 3))
  v = Stiefel().project(w, jnp.ones((6, 3)))
  jf(Stiefel("qr"), w, v)
  jf(Stiefel(retraction="qr", metric="euclidean"), w, v)
  assert len(traces) == 1  # equal configuration hits the cache
  jf(Stiefel("polar"), w, v)
  assert len(traces) == 2
  assert Stiefel() == Stiefel("qr") and hash(Stiefel()) == hash(Stiefel("qr"))
  assert Stiefel("cayley", cayley_iterations=2) == Stiefel("cayley", cayley_iterations=2)
  assert Stiefel("cayley", cayley_iterations=2) != Stiefel("cayley")
  assert Stiefel("qr") != Stiefel("polar")
  assert Stiefel(metric="canonical") != Stiefel()
  assert Stiefel() != Oblique()
  assert len({Stiefel(), Stiefel("qr"), Stiefel("polar")}) == 2
  assert "polar" in repr(Stiefel("polar"))


def test_bad_configuration():
  with pytest.raises(ValueError, match="foo"):
    Stiefel("foo")
  with pytest.raises(ValueError, match="bar"):
    Stiefel(metric="bar")
  with pytest.raises(ValueError, match="cayley_iterations"):
    Stiefel("cayley", cayley_iterations=0)
  with pytest.raises(ValueError, match="ns_steps"):
    Stiefel("newton_schulz", ns_steps=0)


def test_bad_inputs():
  m = Stiefel()
  wi = jnp.ones((4, 3), jnp.int32)
  wf = jnp.ones((4, 3), jnp.float32)
  with pytest.raises(TypeError):
    m.project(wi, wi)
  with pytest.raises(TypeError):
    m.retract(wi, wi)
  with pytest.raises(TypeError):
    m.defect(wi)
  with pytest.raises(TypeError):
    m.orthonormalize(wi)
  with pytest.raises(TypeError):
    m.egrad_to_rgrad(wf, wi)
  with pytest.raises(ValueError):
    m.project(jnp.ones((4,)), jnp.ones((4,)))
  with pytest.raises(ValueError):
    m.random(jax.random.key(0), (4,))
  with pytest.raises(ValueError, match="ambiguous"):
    m.defect(jnp.ones((2, 4, 3)))
