"""Tests for orthojax.linalg.cayley_transform / LowRank / cayley_safe_step.

References are numpy float64 solves of ``(I - tau/2 A) Y = (I + tau/2 A) X``;
the library runs in float32 and is compared at ~1e-5.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orthojax import linalg
from orthojax.linalg import LowRank
from orthojax.manifolds import cayley_generator

ATOL = 2e-5


def _skew(rng, n, batch=(), scale=1.0):
  """A random skew matrix with ||A||_F = scale (per batch matrix)."""
  b = rng.standard_normal(batch + (n, n))
  a = b - np.swapaxes(b, -1, -2)
  return scale * a / np.linalg.norm(a, axis=(-2, -1), keepdims=True)


def _cayley_ref(a, x, tau):
  """``(I - tau/2 A)^{-1} (I + tau/2 A) X`` in float64, batched."""
  a = np.asarray(a, np.float64)
  x = np.asarray(x, np.float64)
  tau = np.asarray(tau, np.float64)
  if tau.ndim:
    tau = tau[..., None, None]
  eye = np.eye(a.shape[-1])
  return np.linalg.solve(eye - 0.5 * tau * a, x + 0.5 * tau * (a @ x))


def _stiefel_point(rng, n, p):
  q, r = np.linalg.qr(rng.standard_normal((n, p)))
  return q * np.sign(np.diag(r))


def _f32(x):
  return jnp.asarray(np.asarray(x, np.float32))


@pytest.mark.parametrize("n", [4, 9])
@pytest.mark.parametrize("tau", [0.3, 1.7])
def test_exact_dense_matches_formula(n, tau):
  rng = np.random.default_rng(n)
  a = _skew(rng, n, scale=2.0)
  x = rng.standard_normal((n, 3))
  y = linalg.cayley_transform(_f32(a), _f32(x), tau=tau)
  assert y.shape == (n, 3) and y.dtype == jnp.float32
  np.testing.assert_allclose(y, _cayley_ref(a, x, tau), atol=ATOL, rtol=ATOL)
  # SPEC's descent form (I + tau/2 A)^{-1}(I - tau/2 A) X is the same call with -tau.
  eye = np.eye(n)
  spec = np.linalg.solve(eye + 0.5 * tau * a, x - 0.5 * tau * (a @ x))
  np.testing.assert_allclose(linalg.cayley_transform(_f32(a), _f32(x), tau=-tau), spec,
                             atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("n", [4, 9])
def test_q_is_orthogonal_and_keeps_gram(n):
  rng = np.random.default_rng(10 + n)
  a = _skew(rng, n, scale=5.0)
  q = np.asarray(linalg.cayley_transform(_f32(a), tau=0.8), np.float64)
  assert q.shape == (n, n)
  np.testing.assert_allclose(q.T @ q, np.eye(n), atol=ATOL)
  np.testing.assert_allclose(q, _cayley_ref(a, np.eye(n), 0.8), atol=ATOL)
  # Y^T Y = X^T X for any X.
  x = rng.standard_normal((n, 2))
  y = np.asarray(linalg.cayley_transform(_f32(a), _f32(x), tau=0.8), np.float64)
  np.testing.assert_allclose(y.T @ y, x.T @ x, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("n", [4, 9])
def test_derivative_at_zero_is_ax(n):
  rng = np.random.default_rng(20 + n)
  a = _skew(rng, n, scale=1.0)
  x = rng.standard_normal((n, 3))
  ax = a @ x
  h = 1e-2
  fd = (np.asarray(linalg.cayley_transform(_f32(a), _f32(x), tau=h), np.float64)
        - np.asarray(linalg.cayley_transform(_f32(a), _f32(x), tau=-h), np.float64)) / (2 * h)
  np.testing.assert_allclose(fd, ax, atol=2e-4)
  # The exact derivative by forward-mode AD.
  d = jax.jacfwd(lambda t: linalg.cayley_transform(_f32(a), _f32(x), tau=t))(0.0)
  np.testing.assert_allclose(d, ax, atol=ATOL)
  np.testing.assert_allclose(linalg.cayley_transform(_f32(a), _f32(x), tau=0.0), x, atol=1e-6)


@pytest.mark.parametrize("n,p", [(40, 4), (6, 5)])
def test_low_rank_woodbury_equals_dense(n, p):
  rng = np.random.default_rng(n * 10 + p)
  w = _stiefel_point(rng, n, p)
  g = rng.standard_normal((n, p))
  a_lr = cayley_generator(_f32(w), _f32(g), dense=False)
  a_d = cayley_generator(_f32(w), _f32(g), dense=True)
  assert isinstance(a_lr, LowRank) and a_lr.u.shape == (n, 2 * p)
  # Independent generator: Vh = G - W (W^T G)/2, A = Vh W^T - W Vh^T (Wen & Yin).
  vh = g - 0.5 * w @ (w.T @ g)
  a_ref = vh @ w.T - w @ vh.T
  np.testing.assert_allclose(a_d, a_ref, atol=ATOL)
  np.testing.assert_allclose(a_lr.dense(), a_ref, atol=ATOL)
  np.testing.assert_allclose(a_d, -np.swapaxes(np.asarray(a_d), -1, -2), atol=0)
  tau = 0.9
  x = rng.standard_normal((n, p))  # same shape as w: one compilation serves both
  for rhs in (w, x):
    ref = _cayley_ref(a_ref, rhs, tau)
    y_lr = linalg.cayley_transform(a_lr, _f32(rhs), tau=tau)
    y_d = linalg.cayley_transform(a_d, _f32(rhs), tau=tau)
    np.testing.assert_allclose(y_lr, ref, atol=5e-5, rtol=1e-5)
    np.testing.assert_allclose(y_d, ref, atol=5e-5, rtol=1e-5)
  # On W it stays on the Stiefel manifold.
  y = np.asarray(linalg.cayley_transform(a_lr, _f32(w), tau=tau), np.float64)
  np.testing.assert_allclose(y.T @ y, np.eye(p), atol=ATOL)
  # x=None with a LowRank generator gives the n x n Q.
  if n < 10:
    np.testing.assert_allclose(linalg.cayley_transform(a_lr, tau=tau),
                               _cayley_ref(a_ref, np.eye(n), tau), atol=5e-5)


def test_low_rank_matmul_and_generator_matmul():
  rng = np.random.default_rng(3)
  u, v, x = (rng.standard_normal(s) for s in ((2, 7, 4), (2, 7, 4), (2, 7, 3)))
  lr = LowRank(_f32(u), _f32(v))
  ref = u @ np.swapaxes(v, -1, -2) @ x
  np.testing.assert_allclose(lr.matmul(_f32(x)), ref, atol=1e-4, rtol=1e-5)
  np.testing.assert_allclose(linalg.generator_matmul(lr, _f32(x)), ref, atol=1e-4, rtol=1e-5)
  dense = u @ np.swapaxes(v, -1, -2)
  np.testing.assert_allclose(linalg.generator_matmul(_f32(dense), _f32(x)), ref, atol=1e-4,
                             rtol=1e-5)


def test_low_rank_frobenius_norm():
  rng = np.random.default_rng(4)
  u = rng.standard_normal((3, 9, 4))
  v = rng.standard_normal((3, 9, 4))
  ref = np.linalg.norm(u @ np.swapaxes(v, -1, -2), axis=(-2, -1))
  got = LowRank(_f32(u), _f32(v)).frobenius_norm()
  assert got.shape == (3,)
  np.testing.assert_allclose(got, ref, rtol=1e-5)
  # And for a generator from the Stiefel manifold.
  w = _stiefel_point(rng, 20, 3)
  g = rng.standard_normal((20, 3))
  a = cayley_generator(_f32(w), _f32(g), dense=False)
  np.testing.assert_allclose(a.frobenius_norm(), np.linalg.norm(np.asarray(a.dense())),
                             rtol=1e-5)


@pytest.mark.parametrize("low_rank", [False, True])
def test_iterative_converges_geometrically(low_rank):
  rng = np.random.default_rng(5)
  n, p = 16, 3
  w = _stiefel_point(rng, n, p)
  g = 3.0 * rng.standard_normal((n, p))
  a = cayley_generator(_f32(w), _f32(g), dense=not low_rank)
  a_dense = np.asarray(a.dense() if low_rank else a, np.float64)
  tau = float(linalg.cayley_safe_step(a, lr=10.0))
  assert tau < 10.0  # the cap is active
  factor = tau * np.linalg.norm(a_dense, 2) / 2
  assert factor <= 0.5 + 1e-6
  ref = _cayley_ref(a_dense, w, tau)
  errs = []
  for k in range(1, 11):
    y = linalg.cayley_transform(a, _f32(w), tau=tau, method="iterative", iterations=k)
    errs.append(np.linalg.norm(np.asarray(y, np.float64) - ref))
  floor = 2e-6
  for e0, e1 in zip(errs, errs[1:]):
    assert e1 <= factor * e0 * 1.05 + floor, errs
  assert errs[0] > 1e-4  # there was something to converge
  assert errs[-1] < 5e-6, errs
  # k = 1 is the second-order Taylor polynomial X + tau A X + tau^2/2 A^2 X.
  y1 = linalg.cayley_transform(a, _f32(w), tau=tau, method="iterative", iterations=1)
  taylor = w + tau * a_dense @ w + 0.5 * tau**2 * a_dense @ (a_dense @ w)
  np.testing.assert_allclose(y1, taylor, atol=ATOL)


@pytest.mark.parametrize("q", [0.5, 0.25])
def test_safe_step_bound(q):
  rng = np.random.default_rng(6)
  a = _skew(rng, 6, batch=(4,)) * np.array([0.1, 1.0, 10.0, 100.0])[:, None, None]
  tau = np.asarray(linalg.cayley_safe_step(_f32(a), lr=1.0, q=q))
  assert tau.shape == (4,)
  norms = np.linalg.norm(a, axis=(-2, -1))
  assert np.all(tau * norms <= 2 * q * (1 + 1e-6))
  np.testing.assert_allclose(tau, np.minimum(1.0, 2 * q / norms), rtol=1e-5)
  # LowRank generators use their Frobenius norm.
  w = _stiefel_point(rng, 12, 2)
  lr_gen = cayley_generator(_f32(w), _f32(rng.standard_normal((12, 2)) * 5), dense=False)
  tau_lr = float(linalg.cayley_safe_step(lr_gen, lr=1.0, q=q))
  norm = np.linalg.norm(np.asarray(lr_gen.dense(), np.float64))
  np.testing.assert_allclose(tau_lr, min(1.0, 2 * q / norm), rtol=1e-5)


@pytest.mark.parametrize("method", ["exact", "iterative"])
@pytest.mark.parametrize("low_rank", [False, True])
def test_batched_per_matrix_tau(method, low_rank):
  rng = np.random.default_rng(7)
  batch, n, p = (2, 3), 8, 2
  ws = np.stack([_stiefel_point(rng, n, p) for _ in range(6)]).reshape(batch + (n, p))
  gs = rng.standard_normal(batch + (n, p))
  a = cayley_generator(_f32(ws), _f32(gs), dense=not low_rank)
  taus = rng.uniform(0.1, 0.5, size=batch)
  x = rng.standard_normal(batch + (n, 3))
  y = np.asarray(linalg.cayley_transform(a, _f32(x), tau=_f32(taus), method=method,
                                         iterations=3))
  assert y.shape == batch + (n, 3)
  a_np = np.asarray(a.dense() if low_rank else a, np.float64)
  for i, j in np.ndindex(*batch):
    a_ij = (LowRank(a.u[i, j], a.v[i, j]) if low_rank else a[i, j])
    single = linalg.cayley_transform(a_ij, _f32(x[i, j]), tau=float(taus[i, j]), method=method,
                                     iterations=3)
    np.testing.assert_allclose(y[i, j], single, atol=1e-6)
  if method == "exact":
    np.testing.assert_allclose(y, _cayley_ref(a_np, x, taus), atol=5e-5)
  # A scalar tau broadcasts over the batch.
  y_s = linalg.cayley_transform(a, _f32(x), tau=0.3, method=method, iterations=3)
  y_a = linalg.cayley_transform(a, _f32(x), tau=_f32(np.full(batch, 0.3)), method=method,
                                iterations=3)
  np.testing.assert_allclose(y_s, y_a, atol=1e-6)


def test_jit():
  rng = np.random.default_rng(8)
  a, x = _f32(_skew(rng, 5)), _f32(rng.standard_normal((5, 2)))
  f = jax.jit(lambda a, x, t: linalg.cayley_transform(a, x, tau=t))
  np.testing.assert_allclose(f(a, x, 0.4), _cayley_ref(a, x, 0.4), atol=ATOL)


def test_errors():
  a = jnp.zeros((4, 4))
  with pytest.raises(ValueError, match="method"):
    linalg.cayley_transform(a, method="newton")
  with pytest.raises(ValueError, match="iterations"):
    linalg.cayley_transform(a, method="iterative", iterations=0)
  with pytest.raises(ValueError, match=r"\(4, 5\)"):
    linalg.cayley_transform(jnp.zeros((4, 5)))
  with pytest.raises(ValueError):
    linalg.cayley_transform(jnp.zeros((4,)))
  with pytest.raises(ValueError, match="rows"):
    linalg.cayley_transform(a, jnp.zeros((5, 2)))
  with pytest.raises(ValueError, match="rows"):
    linalg.cayley_transform(LowRank(jnp.zeros((6, 2)), jnp.zeros((6, 2))), jnp.zeros((5, 2)))


def _step(rng, shape, scale):
  """An orthonormal X, a step V of Frobenius norm ``scale`` per matrix, and Wen & Yin's
  dense generator ``A = V_h X^T - X V_h^T``, ``V_h = V - X X^T V / 2``, in float64."""
  x = np.linalg.qr(rng.standard_normal(shape))[0]
  v = rng.standard_normal(shape)
  v = scale * v / np.linalg.norm(v, axis=(-2, -1), keepdims=True)
  vh = v - 0.5 * x @ (np.swapaxes(x, -1, -2) @ v)
  a = vh @ np.swapaxes(x, -1, -2) - x @ np.swapaxes(vh, -1, -2)
  return x, v, a


def _coordinates(x, v):
  c = np.swapaxes(x, -1, -2) @ v
  return 0.5 * (c - np.swapaxes(c, -1, -2)), v - x @ c


@pytest.mark.parametrize("shape", [(7, 7), (3, 9, 9), (12, 5), (2, 8, 3), (40, 4)],
                         ids=["square", "batched", "tall", "batched_tall", "very_tall"])
@pytest.mark.parametrize("scale", [0.2, 3.0])
def test_cayley_in_coordinates_exact_equals_the_generators_transform(shape, scale):
  """``X + (X C + N) M^{-1}`` against the n x n generator's solve in float64, for a small
  and a large step (not tangent: the normal part is V's own)."""
  rng = np.random.default_rng(31)
  x, v, a = _step(rng, shape, scale)
  want = _cayley_ref(a, x, 1.0)
  omega, normal = _coordinates(x, v)
  normal = None if shape[-1] == shape[-2] else normal
  got = linalg.cayley_in_coordinates(_f32(x), _f32(omega),
                                     None if normal is None else _f32(normal))
  np.testing.assert_allclose(got, want, atol=ATOL)
  with jax.enable_x64(True):
    got = linalg.cayley_in_coordinates(jnp.asarray(x), jnp.asarray(omega),
                                       None if normal is None else jnp.asarray(normal))
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-13)


@pytest.mark.parametrize("shape", [(64, 64), (96, 24)], ids=["square", "tall"])
def test_cayley_in_coordinates_keeps_an_orthonormal_point_orthonormal(shape):
  rng = np.random.default_rng(32)
  x, v, _ = _step(rng, shape, 5.0)
  omega, normal = _coordinates(x, v)
  y = linalg.cayley_in_coordinates(_f32(x), _f32(omega),
                                   None if shape[0] == shape[1] else _f32(normal))
  np.testing.assert_allclose(y.T @ y, np.eye(shape[1]), atol=3e-5)


@pytest.mark.parametrize("shape", [(6, 6), (10, 4)], ids=["square", "tall"])
@pytest.mark.parametrize("iterations", [1, 3])
def test_cayley_in_coordinates_iterative_is_the_generators_fixed_point(shape, iterations):
  rng = np.random.default_rng(33)
  x, v, a = _step(rng, shape, 0.3)
  want = x + a @ x
  for _ in range(iterations):
    want = x + 0.5 * a @ (x + want)
  omega, normal = _coordinates(x, v)
  with jax.enable_x64(True):
    got = linalg.cayley_in_coordinates(
        jnp.asarray(x), jnp.asarray(omega),
        None if shape[0] == shape[1] else jnp.asarray(normal),
        method="iterative", iterations=iterations)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-13)


def test_identity_transform_is_formed_without_the_product():
  """``x=None`` returns ``Q`` itself; its right-hand side is ``I + A/2``, not a product."""
  rng = np.random.default_rng(34)
  a = _f32(_skew(rng, 5, (2,), 0.7))
  np.testing.assert_allclose(linalg.cayley_transform(a, tau=0.6),
                             _cayley_ref(a, np.broadcast_to(np.eye(5), a.shape), 0.6),
                             atol=ATOL)
  jaxpr = jax.make_jaxpr(lambda a: linalg.cayley_transform(a))(a)
  assert not any(e.primitive is jax.lax.dot_general_p for e in jaxpr.eqns)
  # A square point's exact retraction is one p × p solve and one product.
  square = jax.make_jaxpr(lambda x, o: linalg.cayley_in_coordinates(x, o))(a, a)
  assert sum(e.primitive is jax.lax.dot_general_p for e in square.eqns) == 1


def test_cayley_in_coordinates_errors():
  x, o = jnp.zeros((5, 3)), jnp.zeros((3, 3))
  with pytest.raises(ValueError, match=r"cayley_in_coordinates: .* Omega must be \(\.\.\., 3, 3\)"):
    linalg.cayley_in_coordinates(x, jnp.zeros((4, 4)))
  with pytest.raises(ValueError, match="N like X"):
    linalg.cayley_in_coordinates(x, o, jnp.zeros((6, 3)))
  with pytest.raises(ValueError, match="method"):
    linalg.cayley_in_coordinates(x, o, method="newton")
  with pytest.raises(ValueError, match="iterations"):
    linalg.cayley_in_coordinates(x, o, method="iterative", iterations=0)


@pytest.mark.parametrize("shape", [(16, 4), (8, 8)], ids=["tall", "square"])
def test_cayley_in_coordinates_rounds_with_the_step_not_the_point(shape):
  """Evaluated as ``X + (X C + N) M^{-1}``, one float32 step leaves less defect than the
  dense transform does (``(2X + N) M^{-1} - X`` left twice the dense one's)."""
  rng = np.random.default_rng(35)
  batch = (2000,)
  x = np.stack([_stiefel_point(rng, *shape) for _ in range(batch[0])])
  v = 0.05 * rng.standard_normal(batch + shape) / np.sqrt(np.prod(shape))
  x32, v32 = _f32(x), _f32(v)
  c = x32.mT @ v32
  got = linalg.cayley_in_coordinates(x32, linalg.skew(c),
                                     None if shape[0] == shape[1] else v32 - x32 @ c)
  dense = linalg.cayley_transform(cayley_generator(x32, v32, dense=True), x32)
  defect = lambda y: np.linalg.norm(
      np.swapaxes(np.asarray(y, np.float64), -1, -2) @ np.asarray(y, np.float64)
      - np.eye(shape[1]), axis=(-2, -1)).mean()
  assert defect(got) < 0.6 * defect(dense), (defect(got), defect(dense))
