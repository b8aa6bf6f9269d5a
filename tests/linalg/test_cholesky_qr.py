"""CholeskyQR and CholeskyQR2 against the sign-fixed Householder QR: the same Q to
rounding, one pass without a branch where the input is a retraction point, and
CholeskyQR2's Householder fall-back where its guard says the Gram matrix cannot be
trusted."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orthojax import linalg
from orthojax.linalg import _qr
from tests.linalg._helpers import orthonormality_error
from tests.linalg._helpers import well_conditioned

SHAPES = {"tall": (96, 24), "wide": (24, 96), "square": (40, 40), "batched": (3, 50, 20),
          "conv": (3, 3, 16, 32)}   # a conv kernel's (kh, kw) are batch axes here
# Agreement with Householder: a few ulps of the compute dtype (float32 for bfloat16).
ATOL = {jnp.float32: 2e-6, jnp.bfloat16: 1e-2, jnp.float64: 1e-13}


def _retraction_point(rng, shape, step=0.1):
  """``W + ξ``: a Stiefel point (tall view) and a small tangent step, as a retraction sees."""
  x = rng.standard_normal(shape)
  w = np.asarray(linalg.qr_orthonormalize(jnp.asarray(x)), np.float64)
  return w + step * rng.standard_normal(shape) / np.sqrt(shape[-1])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float64])
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("point", ["retraction", "gaussian", "conditioned_100"])
def test_the_same_q_as_householder_to_rounding(name, dtype, point):
  with jax.enable_x64(dtype == jnp.float64):
    rng = np.random.default_rng(0)
    shape = SHAPES[name]
    x = {"retraction": lambda: _retraction_point(rng, shape),
         "gaussian": lambda: rng.standard_normal(shape),
         "conditioned_100": lambda: well_conditioned(rng, shape, cond=100.0)}[point]()
    x = jnp.asarray(x, dtype)
    q, reference = linalg.cholesky_qr2(x), linalg.qr_orthonormalize(x)
    assert q.dtype == dtype and q.shape == x.shape
    np.testing.assert_allclose(np.asarray(q, np.float64), np.asarray(reference, np.float64),
                               atol=ATOL[dtype] * (10 if point == "conditioned_100" else 1))
    if dtype != jnp.bfloat16:
      assert orthonormality_error(q) < 50 * float(jnp.finfo(dtype).eps)


@pytest.mark.parametrize("make", [
    lambda x: x.at[:, 1].set(x[:, 0] * (1 + 1e-7)),   # two columns nearly equal: κ ~ 1e7
    lambda x: x.at[:, 3].set(0.0),                      # rank deficient
    lambda x: x * jnp.logspace(0, 30, x.shape[-1]),     # a Gram matrix past float32's range
])
def test_far_from_the_manifold_it_falls_back_to_householder(make):
  x = make(jnp.asarray(np.random.default_rng(1).standard_normal((64, 16)), jnp.float32))
  np.testing.assert_array_equal(linalg.cholesky_qr2(x), linalg.qr_orthonormalize(x))
  # One bad matrix sends its whole batch to Householder: every Q stays exact.
  batch = jnp.stack([x, jnp.asarray(np.random.default_rng(2).standard_normal((64, 16)),
                                    jnp.float32)])
  np.testing.assert_array_equal(jax.jit(linalg.cholesky_qr2)(batch),
                                linalg.qr_orthonormalize(batch))


def test_column_scaling_alone_needs_no_fall_back():
  """κ = 1e8 from column scales only: Cholesky does not see it (its rounding is scale
  invariant), the guard lets it through, and Q is still Householder's to rounding."""
  x = jnp.asarray(np.random.default_rng(1).standard_normal((64, 16)), jnp.float32)
  x = x * jnp.logspace(0, 8, 16)
  q = linalg.cholesky_qr2(x)
  assert not np.array_equal(q, linalg.qr_orthonormalize(x))   # no fall-back
  np.testing.assert_allclose(q, linalg.qr_orthonormalize(x), atol=2e-6)


def test_the_guard_is_the_first_passs_orthogonality_error():
  x = jnp.asarray(well_conditioned(np.random.default_rng(3), (64, 16), cond=300.0),
                  jnp.float32)   # first-pass error ~ κ² u ≈ 5e-3
  kept, strict = linalg.cholesky_qr2(x), linalg.cholesky_qr2(x, tolerance=1e-6)
  np.testing.assert_array_equal(strict, linalg.qr_orthonormalize(x))
  assert not np.array_equal(kept, strict)
  np.testing.assert_allclose(kept, strict, atol=1e-4)


def test_bad_inputs_raise():
  with pytest.raises(TypeError):
    linalg.cholesky_qr2(jnp.ones((4, 3), jnp.int32))
  with pytest.raises(ValueError, match="ndim >= 2"):
    linalg.cholesky_qr2(jnp.ones((4,)))


def _one_pass(x):
  """CholeskyQR's first pass alone, in float32: ``X R⁻¹`` with ``RᵀR = XᵀX``."""
  with jax.default_matmul_precision("highest"):
    lower = jnp.linalg.cholesky(jnp.swapaxes(x, -1, -2) @ x)
    return jax.scipy.linalg.solve_triangular(lower, jnp.swapaxes(x, -1, -2), lower=True).mT


@pytest.mark.parametrize("name", ["tall", "square", "batched"])
def test_a_retraction_point_needs_one_pass(name):
  """At ``W + ξ`` the first pass is orthonormal to rounding (within ``p ε``): that is the
  result, the second pass skipped; at κ = 100 the first pass is not, and both run."""
  rng = np.random.default_rng(4)
  shape = SHAPES[name]
  x = jnp.asarray(_retraction_point(rng, shape), jnp.float32)
  q = linalg.cholesky_qr2(x)
  np.testing.assert_allclose(q, _one_pass(x), rtol=0, atol=2e-7)
  assert orthonormality_error(q) < shape[-1] * float(jnp.finfo(jnp.float32).eps)
  np.testing.assert_allclose(q, linalg.qr_orthonormalize(x), atol=2e-6)
  y = jnp.asarray(well_conditioned(rng, shape, cond=100.0), jnp.float32)
  one, two = _one_pass(y), linalg.cholesky_qr2(y)
  assert orthonormality_error(one) > shape[-1] * float(jnp.finfo(jnp.float32).eps)
  assert orthonormality_error(one) > 10 * orthonormality_error(two)


@pytest.mark.parametrize("shape", [(64, 8), (30, 5), (96, 24), (3, 400, 100), (40, 40)])
@pytest.mark.parametrize("cond", [None, 100.0])
def test_the_one_pass_test_estimates_the_orthogonality_error(shape, cond):
  """The probes' estimate of ``‖QᵀQ − I‖_F`` against the exact value: equal for ``p ≤ 8``
  (the probes are the identity), within a small factor otherwise, both at rounding level
  (a retraction point's first pass) and far above it (κ = 100)."""
  rng = np.random.default_rng(5)
  x = (_retraction_point(rng, shape) if cond is None else well_conditioned(rng, shape, cond))
  q = _one_pass(jnp.asarray(x, jnp.float32))
  exact = np.linalg.norm(np.swapaxes(np.asarray(q, np.float64), -1, -2) @ np.asarray(q, np.float64)
                         - np.eye(shape[-1]), axis=(-2, -1))
  estimate = np.asarray(_qr._orthogonality_estimate(q), np.float64)
  if shape[-1] <= _qr._PROBES:
    # the float32 Gram matrix of the estimate rounds too: to about 1e-7
    np.testing.assert_allclose(estimate, exact, rtol=0.25 if cond else 1.0)
  else:
    assert np.all(estimate > 0.5 * exact) and np.all(estimate < 3 * exact)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("point", ["retraction", "conditioned_100"])
def test_the_accelerator_solve_gives_the_same_q(name, dtype, point, monkeypatch):
  """On a GPU or TPU the solve ``X R⁻¹`` is a product with ``R``'s ``p × p`` inverse (which
  the compiler partitions by rows): the same Q as Householder to the same rounding as
  LAPACK's solve, run here on the CPU by putting it in the solve's place."""
  calls = []
  monkeypatch.setattr(_qr, "_factor_and_solve",
                      lambda gram, x: calls.append(1) or _qr._solve_by_inverse(gram, x))
  with jax.enable_x64(dtype == jnp.float64):
    rng = np.random.default_rng(3)
    shape = SHAPES[name]
    x = {"retraction": lambda: _retraction_point(rng, shape),
         "conditioned_100": lambda: well_conditioned(rng, shape, cond=100.0)}[point]()
    x = jnp.asarray(x, dtype)
    q, reference = jax.jit(lambda x: linalg.cholesky_qr2(x))(x), linalg.qr_orthonormalize(x)
    assert calls   # traced afresh with the accelerator solve in place
    np.testing.assert_allclose(np.asarray(q, np.float64), np.asarray(reference, np.float64),
                               atol=ATOL[dtype] * (10 if point == "conditioned_100" else 1))
    assert orthonormality_error(q) < 50 * float(jnp.finfo(dtype).eps)


def _stiefel_step(rng, shape, spectral_norm):
  """``(W, ξ)``: a Stiefel point (tall view) and a tangent of the given spectral norm."""
  w = np.asarray(linalg.qr_orthonormalize(jnp.asarray(rng.standard_normal(shape))), np.float64)
  g = rng.standard_normal(shape)
  a = np.swapaxes(w, -1, -2) @ g
  xi = g - w @ ((a + np.swapaxes(a, -1, -2)) / 2)   # Wᵀξ skew: a tangent
  return w, xi * spectral_norm / np.linalg.norm(xi, ord=2, axis=(-2, -1), keepdims=True)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float64])
@pytest.mark.parametrize("name", list(SHAPES))
def test_one_pass_at_a_retraction_point_is_householders_q(name, dtype):
  """``cholesky_qr`` of ``W + ξ`` (a step of spectral norm 1, κ² ≤ 2): Householder's Q to
  the same rounding as CholeskyQR2's, orthonormal within a few ``ε``."""
  shape = SHAPES[name]
  wide = shape[-2] < shape[-1]
  with jax.enable_x64(dtype == jnp.float64):
    w, xi = _stiefel_step(np.random.default_rng(6), shape[:-2] + tuple(sorted(shape[-2:])[::-1]),
                          1.0)
    x = np.swapaxes(w + xi, -1, -2) if wide else w + xi   # wide: orthonormal rows
    x = jnp.asarray(x, dtype)
    assert x.shape == shape
    q, reference = linalg.cholesky_qr(x), linalg.qr_orthonormalize(x)
    assert q.dtype == dtype and q.shape == x.shape
    np.testing.assert_allclose(np.asarray(q, np.float64), np.asarray(reference, np.float64),
                               atol=ATOL[dtype])
    if dtype != jnp.bfloat16:
      assert orthonormality_error(q) < 50 * float(jnp.finfo(dtype).eps)


def test_one_pass_error_grows_with_the_steps_condition_number():
  """The one-pass error is of order ``κ² u``, and a tangent step ``ξ`` sets
  ``κ(W + ξ)² ≤ 1 + ‖ξ‖₂²``. A rank-one step ``t u vᵀ`` (``u`` normal to ``W``, ``v`` not
  a column: column scales alone cost Cholesky nothing) reaches the bound: at rounding for
  ``t ≤ 1``, within ``κ²`` times that beyond, and CholeskyQR2's second pass removes it."""
  rng = np.random.default_rng(7)
  w = np.linalg.qr(rng.standard_normal((96, 24)))[0]
  u = rng.standard_normal(96)
  u -= w @ (w.T @ u)
  v = rng.standard_normal(24)
  eps = float(jnp.finfo(jnp.float32).eps)
  errors = {}
  for t in (0.1, 1.0, 10.0, 100.0):
    x = w + t * np.outer(u / np.linalg.norm(u), v / np.linalg.norm(v))
    s = np.linalg.svd(x, compute_uv=False)
    np.testing.assert_allclose(s.max() ** 2, 1 + t ** 2, rtol=1e-10)
    np.testing.assert_allclose(s.min(), 1.0, rtol=1e-10)
    x = jnp.asarray(x, jnp.float32)
    errors[t] = orthonormality_error(linalg.cholesky_qr(x))
    assert orthonormality_error(linalg.cholesky_qr2(x)) < 24 * eps
    assert errors[t] < (1 + t ** 2) * 24 * eps
  assert max(errors[0.1], errors[1.0]) < 24 * eps
  assert errors[100.0] > 100 * errors[1.0]   # the κ² growth is real: CholeskyQR2's reason


def test_one_pass_has_no_conditional_and_cholesky_qr2_has_two():
  """In the compiled program (``platform_dependent``'s choice is made when lowering)."""
  x = jnp.zeros((3, 40, 12), jnp.float32)
  conds = lambda f: jax.jit(f).lower(x).compile().as_text().count(" conditional(")
  assert conds(linalg.cholesky_qr) == 0
  assert conds(linalg.cholesky_qr2) == 2
