"""Lanczos, power iteration and SLQ against dense numpy eigendecompositions.

The solvers are called through a few jitted helpers taking the matrix as an
argument, so each configuration compiles once for the whole module.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orthojax import analysis as oa

N = 48
# A well-separated top (5 outliers) above a bulk, and a separated bottom.
SPECTRUM = np.concatenate([[0.05, 0.1, 0.2], np.linspace(0.5, 1.0, N - 8),
                           [2.0, 3.0, 4.5, 6.0, 8.0]])


def _with_spectrum(seed: int, eigenvalues) -> np.ndarray:
  """A dense symmetric matrix with the given spectrum and a random eigenbasis."""
  q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(eigenvalues),) * 2))
  return (q * np.asarray(eigenvalues)) @ q.T


@functools.partial(jax.jit, static_argnames=("k", "which", "max_iters", "tol"))
def _top(a, k, which="largest", max_iters=None, tol=1e-6):
  return oa.top_eigenvalues(lambda v: a @ v, a.shape[0], k, which=which, max_iters=max_iters,
                            tol=tol)


@jax.jit
def _lanczos_full(a):
  return oa.lanczos(lambda v: a @ v, a.shape[0], a.shape[0], jax.random.key(3))


@functools.partial(jax.jit, static_argnames=("max_iters",))
def _power(a, max_iters, tol):
  return oa.power_iteration(lambda v: a @ v, a.shape[0], max_iters=max_iters, tol=tol)


@pytest.fixture(scope="module")
def spd():
  a = _with_spectrum(0, SPECTRUM)
  return a, jnp.asarray(a, jnp.float32)


def test_top_k_equals_eigh(spd):
  a, aj = spd
  ev, vecs = np.linalg.eigh(a)
  res = _top(aj, 5)
  np.testing.assert_allclose(res.values, ev[::-1][:5], rtol=2e-5)
  assert bool(res.converged) and 5 <= int(res.num_iters) < N  # stopped early
  # Each returned pair really is one, within the reported residual bound.
  u = np.asarray(res.vectors, np.float64)
  np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, atol=1e-5)
  actual = np.linalg.norm(u @ a - np.asarray(res.values)[:, None] * u, axis=1)
  assert np.all(actual <= np.asarray(res.residuals) + 1e-4)
  assert np.all(np.asarray(res.residuals) <= 1e-6 * np.asarray(res.values) + 1e-5)
  np.testing.assert_allclose(np.abs(u @ vecs[:, ::-1][:, :5]), np.eye(5), atol=1e-3)
  # The same matrix scaled: the jitted solver is reused, the values scale.
  np.testing.assert_allclose(_top(2.0 * aj, 5).values, 2.0 * ev[::-1][:5], rtol=2e-5)


def test_smallest_and_both_with_the_full_krylov_space(spd):
  a, aj = spd
  ev = np.linalg.eigh(a)[0]
  both = _top(aj, 3, which="both", max_iters=N)
  assert both.values.shape == (2, 3) and both.vectors.shape == (2, 3, N)
  np.testing.assert_allclose(both.values[0], ev[::-1][:3], rtol=1e-5)
  np.testing.assert_allclose(both.values[1], ev[:3], rtol=1e-4)   # the smallest, ascending
  assert bool(both.converged)
  # A rank-2 matrix: both non-zero eigenvalues, then zeros, at both ends.
  u = np.linalg.qr(np.random.default_rng(1).standard_normal((N, 2)))[0]
  low = _top(jnp.asarray((u * [3.0, 1.5]) @ u.T, jnp.float32), 3, which="both", max_iters=N)
  np.testing.assert_allclose(low.values, [[3.0, 1.5, 0.0], [0.0, 0.0, 0.0]], atol=1e-5)


def test_fixed_lanczos_is_an_exact_tridiagonalisation(spd):
  a, aj = spd
  res = _lanczos_full(aj)
  v = np.asarray(res.basis, np.float64)
  np.testing.assert_allclose(v @ v.T, np.eye(N), atol=2e-5)   # full reorthogonalisation
  t = np.asarray(oa.tridiagonal(res.alpha, res.beta), np.float64)
  np.testing.assert_allclose(v @ a @ v.T, t, atol=5e-5)
  np.testing.assert_allclose(res.ritz_values, np.linalg.eigh(a)[0], atol=3e-5)
  assert float(res.residuals.max()) < 1e-4
  r = np.asarray(res.ritz_vectors(), np.float64)
  np.testing.assert_allclose(r @ a, np.asarray(res.ritz_values)[:, None] * r, atol=1e-4)


def test_invariant_subspace_restarts(spd):
  """On the identity every Krylov space is invariant after one step (β = 0)."""
  eye = jnp.eye(N)
  res = _lanczos_full(eye)
  np.testing.assert_allclose(res.ritz_values, 1.0, atol=1e-6)
  np.testing.assert_allclose(res.beta, 0.0)
  v = np.asarray(res.basis)
  np.testing.assert_allclose(v @ v.T, np.eye(N), atol=1e-5)  # restarts stayed orthogonal
  # Each restart breaks down again; converged once a restart leaves the top 5 unchanged.
  top = _top(eye, 5)
  np.testing.assert_allclose(top.values, 1.0, atol=1e-6)
  assert int(top.num_iters) == 6 and bool(top.converged)


def test_power_iteration(spd):
  a, aj = spd
  res = _power(aj, 500, 1e-7)
  assert bool(res.converged) and int(res.num_iters) < 500
  np.testing.assert_allclose(res.eigenvalue, 8.0, rtol=1e-5)
  np.testing.assert_allclose(abs(float(res.vector @ np.linalg.eigh(a)[1][:, -1])), 1.0, atol=1e-3)
  assert float(res.residual) < 0.05
  capped = _power(aj, 3, 1e-12)
  assert int(capped.num_iters) == 3 and not bool(capped.converged)
  assert float(capped.residual) > 1e-2
  # Batched under vmap (inside jit): each matrix its own loop length.
  got = jax.jit(jax.vmap(lambda m: _power(m, 500, 1e-7).eigenvalue))(jnp.stack([aj, 0.5 * aj]))
  np.testing.assert_allclose(got, [8.0, 4.0], rtol=1e-5)


def test_spectral_density(spd):
  _, aj = spd
  res = jax.jit(lambda m: oa.spectral_density(lambda v: m @ v, N, num_iters=24, num_probes=16,
                                              key=jax.random.key(5)))(aj)
  np.testing.assert_allclose(res.weights.sum(axis=1), 1.0, atol=1e-5)   # Gauss weights
  np.testing.assert_allclose(float(jnp.trapezoid(res.density, res.grid)), 1.0, atol=1e-3)
  # Gauss quadrature with m nodes is exact for t and t², so the mean and second
  # moment of the spectrum are Hutchinson estimates: unbiased, up to probe noise.
  mean = float(jnp.mean(jnp.sum(res.weights * res.nodes, axis=1)))
  second = float(jnp.mean(jnp.sum(res.weights * res.nodes**2, axis=1)))
  np.testing.assert_allclose(mean, SPECTRUM.mean(), rtol=0.08)
  np.testing.assert_allclose(second, np.mean(SPECTRUM**2), rtol=0.15)
  assert float(res.nodes.max()) == pytest.approx(8.0, rel=1e-4)   # the edges converge


def test_bad_input(spd):
  _, aj = spd
  mv = lambda v: aj @ v
  with pytest.raises(ValueError, match="k=49"):
    oa.top_eigenvalues(mv, N, 49)
  with pytest.raises(ValueError, match="which"):
    oa.top_eigenvalues(mv, N, 1, which="middle")
  with pytest.raises(ValueError, match="max_iters"):
    oa.top_eigenvalues(mv, N, 1, max_iters=N + 1)
  with pytest.raises(ValueError, match="max_iters=2 must be >= k=3"):
    oa.top_eigenvalues(mv, N, 3, max_iters=2)
  with pytest.raises(ValueError, match="num_iters"):
    oa.lanczos(mv, N, 0)
  with pytest.raises(ValueError, match="dim"):
    oa.lanczos(mv, 0, 1)
  with pytest.raises(ValueError, match="v0"):
    oa.lanczos(mv, N, 4, v0=jnp.ones(3))
  with pytest.raises(ValueError, match="matvec"):
    oa.lanczos(lambda v: v[:3], N, 4)
  with pytest.raises(ValueError, match="tol"):
    oa.power_iteration(mv, N, tol=-1.0)
  with pytest.raises(ValueError, match="max_iters"):
    oa.power_iteration(mv, N, max_iters=0)
  with pytest.raises(TypeError, match="floating"):
    oa.lanczos(mv, N, 4, dtype=jnp.int32)
  with pytest.raises(ValueError, match="num_probes"):
    oa.spectral_density(mv, N, num_probes=0)
