"""Tests for orthojax.linalg.newton_schulz."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orthojax import linalg
from orthojax.compile import hlo
from orthojax.linalg import _newton_schulz
from tests.linalg._helpers import orthonormality_error
from tests.linalg._helpers import polar_ref
from tests.linalg._helpers import singular_values
from tests.linalg._helpers import well_conditioned

try:  # public in later optax releases, private in 0.2.8
  from optax.contrib import orthogonalize_via_newton_schulz as optax_ns
except ImportError:
  from optax.contrib._muon import orthogonalize_via_newton_schulz as optax_ns

KJ = (3.4445, -4.7750, 2.0315)
# Tests call the jitted function (one compile per shape, instead of one per
# primitive in eager mode); test_jit_and_vmap_agree_with_eager covers eager.
ns_jit = jax.jit(
    linalg.newton_schulz, static_argnames=("steps", "coeffs", "normalize", "eps", "precision"))

shapes = st.tuples(
    st.sampled_from([(), (2,)]), st.integers(2, 10), st.integers(2, 10)
).map(lambda t: t[0] + (t[1], t[2]))


@given(shape=shapes, seed=st.integers(0, 2**16))
def test_cubic_converges_to_svd_polar(shape, seed):
  x = well_conditioned(np.random.default_rng(seed), shape, cond=4.0)
  y = ns_jit(jnp.asarray(x, jnp.float32), coeffs="cubic")
  assert y.shape == shape and y.dtype == jnp.float32
  np.testing.assert_allclose(y, polar_ref(x), atol=1e-5)


def test_cubic_unnormalized_retraction_converges_in_few_steps():
  rng = np.random.default_rng(0)
  w, _ = np.linalg.qr(rng.standard_normal((3, 24, 8)))
  xi = 0.05 * rng.standard_normal(w.shape)
  x = jnp.asarray(w + xi, jnp.float32)
  target = polar_ref(w + xi)
  y = ns_jit(x, steps=5, coeffs="cubic", normalize=False)
  np.testing.assert_allclose(y, target, atol=1e-5)
  # The same steps from Frobenius normalisation (σ ≈ 1/√8) are not converged.
  y_norm = ns_jit(x, steps=5, coeffs="cubic")
  assert np.abs(np.asarray(y_norm) - target).max() > 1e-3


@pytest.mark.parametrize("shape", [(96, 32), (32, 96)])
def test_quintic_singular_values_band(shape):
  # Keller Jordan's quintic does not converge: it leaves σ in ≈ [0.68, 1.2].
  x = jax.random.normal(jax.random.key(0), shape)
  s = singular_values(ns_jit(x))
  assert s.min() >= 0.66 and s.max() <= 1.21, (s.min(), s.max())
  assert np.abs(s - 1).max() > 0.1  # and it is not the polar factor


@pytest.mark.parametrize("shape", [(40, 12), (12, 40), (24, 24)])
def test_quintic_matches_optax(shape):
  x = jax.random.normal(jax.random.key(1), shape)
  ours = ns_jit(x, 5, "quintic", eps=1e-8)
  theirs = optax_ns(x, jnp.asarray(KJ), ns_steps=5, eps=1e-8)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


def test_quintic_matches_optax_batched():
  x = jax.random.normal(jax.random.key(2), (3, 16, 40))
  ours = ns_jit(x, eps=1e-8)
  dims = _newton_schulz_optax_dims()
  theirs = optax_ns(x, jnp.asarray(KJ), ns_steps=5, eps=1e-8, dimension_numbers=dims)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


def _newton_schulz_optax_dims():
  from optax.contrib import MuonDimensionNumbers
  return MuonDimensionNumbers(reduction_axis=1, output_axis=2)


def test_polar_express_closer_to_polar_than_quintic_at_equal_steps():
  x = jax.random.normal(jax.random.key(3), (96, 32))
  # Polar Express is worst-case optimal for σ ∈ [1e-3, 1]; at its default 5
  # steps it also beats the quintic's ≈ 0.32 plateau on a typical spectrum.
  err_pe = np.abs(singular_values(ns_jit(x, 5, "polar_express")) - 1).max()
  err_kj = np.abs(singular_values(ns_jit(x, 5, "quintic")) - 1).max()
  assert err_pe < 0.2 < 0.3 < err_kj, (err_pe, err_kj)
  y = ns_jit(x, 10, "polar_express")
  np.testing.assert_allclose(y, polar_ref(x), atol=2e-5)


def test_polar_express_coefficients_compose_to_sign_on_design_interval():
  # The published schedule is built for σ ∈ [1e-3, 1] (after the 1.01
  # normalisation cushion): 8 steps bring every such σ to 1.
  sigma = np.logspace(-3, 0, 4000)
  for a, b, c in linalg.NS_PRESETS["polar_express"].coeffs:
    sigma = a * sigma + b * sigma**3 + c * sigma**5
  np.testing.assert_allclose(sigma, 1.0, atol=1e-6)
  assert linalg.NS_PRESETS["polar_express"].coeffs[-1] == (1.875, -1.25, 0.375)


def test_polar_express_published_polynomials_equioscillate():
  # Each published quintic is the minimax approximation of 1 on the interval
  # [l, u] the previous ones leave: its error equioscillates, p(l) = 1 − e and
  # max p = p(u) = 1 + e, and the next interval is [1 − e, 1 + e].
  published = _newton_schulz._PE_PUBLISHED
  lo, hi = 1e-3, 1.0
  for a, b, c in published[:-1]:
    grid = np.linspace(lo, hi, 100001)
    p = a * grid + b * grid**3 + c * grid**5
    p_lo, p_max = a * lo + b * lo**3 + c * lo**5, p.max()
    np.testing.assert_allclose(p_lo + p_max, 2.0, atol=1e-6)
    np.testing.assert_allclose(a * hi + b * hi**3 + c * hi**5, p_max, atol=1e-6)
    assert p.min() >= p_lo - 1e-9
    lo, hi = p_lo, p_max
  assert hi - 1 < 1e-8  # the last designed step has converged
  # The preset applies the paper's 1.01 safety factor (twice on step 1).
  preset = linalg.NS_PRESETS["polar_express"].coeffs
  for k, ((a, b, c), got) in enumerate(zip(published, preset)):
    s = 1.01**2 if k == 0 else (1.0 if k == len(published) - 1 else 1.01)
    np.testing.assert_allclose(got, (a / s, b / s**3, c / s**5), rtol=1e-12)


def test_loop_paths_match_unrolled(monkeypatch):
  # Schedules longer than _MAX_UNROLL run as an unrolled (or scanned) head and
  # a fori_loop tail; they must equal the fully unrolled iteration.
  x = jax.random.normal(jax.random.key(4), (2, 20, 12))
  distinct = tuple((1.5 - 0.01 * k, -0.5 + 0.01 * k, 0.001 * k) for k in range(10))
  cases = [("cubic", 10), ("polar_express", 10), (distinct, None)]
  # A fresh lambda per call: jit must retrace after _MAX_UNROLL changes.
  run = lambda c, s: jax.jit(lambda y: linalg.newton_schulz(y, s, c))(x)
  looped = [run(c, s) for c, s in cases]
  monkeypatch.setattr(_newton_schulz, "_MAX_UNROLL", 1000)
  for (c, s), y in zip(cases, looped):
    np.testing.assert_allclose(y, run(c, s), atol=2e-6)


def test_transpose_equivariance_and_zero_input():
  x = jax.random.normal(jax.random.key(5), (30, 10))
  np.testing.assert_allclose(
      ns_jit(x.T), ns_jit(x).T, atol=1e-6)
  z = ns_jit(jnp.zeros((2, 5, 3)))
  assert not np.any(np.isnan(z)) and np.all(z == 0)


def test_gram_is_formed_on_the_small_side():
  # A 64×8 input must only produce 8×8 Gram products, never 64×64.
  for shape in [(64, 8), (8, 64), (2, 64, 8)]:
    jaxpr = jax.make_jaxpr(lambda x: linalg.newton_schulz(x, coeffs="polar_express"))(
        jnp.ones(shape))
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 3 * 5
    for e in dots:
      assert 64 * 64 not in [np.prod(e.outvars[0].aval.shape[-2:])], e.outvars[0].aval.shape


def test_user_coefficients():
  x = well_conditioned(np.random.default_rng(6), (12, 6))
  per_step = ((1.5, -0.5, 0.0),) * 24
  np.testing.assert_allclose(
      ns_jit(x, coeffs=per_step), ns_jit(x, 24, (1.5, -0.5, 0.0)),
      atol=1e-6)
  np.testing.assert_allclose(ns_jit(x, coeffs=per_step), polar_ref(x), atol=1e-5)
  # A single user triple defaults to 5 steps.
  np.testing.assert_allclose(
      ns_jit(x, coeffs=KJ), ns_jit(x, 5, "quintic"), atol=1e-6)


@pytest.mark.parametrize("coeffs", ["quintic", "cubic"])
def test_bfloat16_returns_bf16_close_to_float32(coeffs):
  x = well_conditioned(np.random.default_rng(7), (2, 48, 16), cond=3.0)
  y32 = ns_jit(jnp.asarray(x, jnp.float32), coeffs=coeffs)
  y16 = ns_jit(jnp.asarray(x, jnp.bfloat16), coeffs=coeffs)
  assert y16.dtype == jnp.bfloat16
  rel = np.linalg.norm(np.asarray(y16, np.float32) - y32) / np.linalg.norm(y32)
  assert rel < (0.1 if coeffs == "quintic" else 0.03), rel
  if coeffs == "cubic":
    assert orthonormality_error(y16) < 5e-2


def test_jit_and_vmap_agree_with_eager():
  x = jax.random.normal(jax.random.key(8), (3, 12, 20))
  eager = linalg.newton_schulz(x, coeffs="polar_express")
  np.testing.assert_allclose(ns_jit(x, coeffs="polar_express"), eager, atol=1e-5)
  vm = jax.vmap(functools.partial(linalg.newton_schulz, coeffs="polar_express"))(x)
  np.testing.assert_allclose(vm, eager, atol=1e-5)


def test_precision_argument_accepted():
  x = jax.random.normal(jax.random.key(9), (12, 8))
  y = ns_jit(x, coeffs="cubic", precision=jax.lax.Precision.HIGHEST)
  np.testing.assert_allclose(y, polar_ref(x), atol=1e-5)


def test_bad_inputs_raise():
  x = jnp.ones((4, 3))
  with pytest.raises(ValueError, match=r"coeffs='septic'.*'quintic'.*'cubic'.*'polar_express'"):
    linalg.newton_schulz(x, coeffs="septic")
  with pytest.raises(ValueError, match="shape"):
    linalg.newton_schulz(x, coeffs=(1.5, -0.5))
  with pytest.raises(ValueError, match="shape"):
    linalg.newton_schulz(x, coeffs=[(1.5, -0.5, 0.0, 1.0)])
  with pytest.raises(ValueError, match="steps=3"):
    linalg.newton_schulz(x, steps=3, coeffs=[(1.5, -0.5, 0.0)] * 2)
  with pytest.raises(ValueError, match="steps"):
    linalg.newton_schulz(x, steps=0)
  with pytest.raises(TypeError, match="steps"):
    linalg.newton_schulz(x, steps=2.5)
  with pytest.raises(ValueError, match="finite"):
    linalg.newton_schulz(x, coeffs=(1.5, float("nan"), 0.0))
  with pytest.raises(TypeError, match="int32"):
    linalg.newton_schulz(jnp.ones((4, 3), jnp.int32))
  with pytest.raises(ValueError, match="ndim"):
    linalg.newton_schulz(jnp.ones((4,)))


gram_jit = jax.jit(linalg.newton_schulz,
                   static_argnames=("steps", "coeffs", "gram", "restart_every"))


@pytest.mark.parametrize("shape", [(48, 384), (384, 48), (3, 40, 300), (2, 64, 64)],
                         ids=["wide", "tall", "batched", "square stack"])
@pytest.mark.parametrize("coeffs, steps", [("quintic", 5), ("polar_express", 8), ("cubic", 24)])
@pytest.mark.parametrize("restart_every", [None, 2])
def test_gram_iteration_equals_the_standard_one(shape, coeffs, steps, restart_every):
  """``gram=True`` is the same iteration on the small side's Gram matrix: in float32 the
  two agree to rounding (~1e-6). A random square matrix has singular values near 0, which
  ``Q`` = the product of the polynomials must raise by orders of magnitude: there the
  rounding it accumulates reaches 5e-5 over 24 steps, and a restart every 2 steps brings
  it back to ~1e-6."""
  x = jax.random.normal(jax.random.key(0), shape)
  standard = ns_jit(x, steps, coeffs)
  gram = gram_jit(x, steps, coeffs, gram=True, restart_every=restart_every)
  square = shape[-1] == shape[-2]
  atol = 1e-4 if square and restart_every is None else 3e-6
  np.testing.assert_allclose(gram, standard, rtol=0, atol=atol)


def test_gram_iteration_equals_the_standard_one_in_float64():
  with jax.enable_x64(True):
    x = jax.random.normal(jax.random.key(1), (40, 300), jnp.float64)
    np.testing.assert_allclose(gram_jit(x, 5, "quintic", gram=True), ns_jit(x, 5, "quintic"),
                               rtol=0, atol=1e-13)


def _dot_flops(fn, x):
  """Multiply-adds of the dot products in ``fn(x)``'s jaxpr."""
  total = 0
  for eqn in jax.make_jaxpr(fn)(x).jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      lhs, out = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
      (contract, _), _ = eqn.params["dimension_numbers"]
      total += int(np.prod(out)) * int(np.prod([lhs[d] for d in contract]))
  return total


@pytest.mark.parametrize("n, p", [(4608, 512), (512, 4608), (96, 32), (64, 64)])
@pytest.mark.parametrize("coeffs, steps", [("quintic", 5), ("cubic", 7)])
@pytest.mark.parametrize("gram, restart_every", [(False, None), (True, None), (True, 2),
                                                 (True, 3)])
def test_the_cost_model_counts_the_traced_products(n, p, coeffs, steps, gram, restart_every):
  x = jnp.ones((n, p), jnp.float32)
  traced = _dot_flops(lambda y: linalg.newton_schulz(y, steps, coeffs, gram=gram,
                                                     restart_every=restart_every), x)
  assert traced == linalg.newton_schulz_multiply_adds(
      n, p, steps, gram=gram, restart_every=restart_every, cubic=coeffs == "cubic")


@pytest.mark.parametrize("n, p", [(1024, 256), (256, 1024)])
@pytest.mark.parametrize("restart_every", [None, 2, 3])
def test_the_cost_model_counts_the_compiled_products(n, p, restart_every):
  """What XLA keeps: a product traced but never read (the Gram update before a restart)
  would be counted by the traced test above and removed by the compiler."""
  fn = lambda y: linalg.newton_schulz(y, 5, gram=True, restart_every=restart_every)
  compiled = jax.jit(fn).lower(jnp.ones((n, p), jnp.float32)).compile()
  flops = hlo.Module.from_text(compiled.as_text()).matmul_flops()
  assert flops == 2 * linalg.newton_schulz_multiply_adds(n, p, 5, gram=True,
                                                         restart_every=restart_every)


@pytest.mark.parametrize("n, p", [(4608, 512), (512, 512)])
def test_gram_iteration_costs_what_its_docstring_says(n, p):
  """``2 n p² + (4K − 3) p³`` multiply-adds against the standard ``K (2 n p² + p³)``
  (K = 5 quintic steps): 2.7x fewer on a 3 x 3 x 512 x 512 conv kernel, more on a square.
  At p = 512 the symmetric products ``X Xᵀ`` and ``A²`` take three of their four blocks
  (``orthojax.linalg.gram``): ``7/4 n p² + (15/4 K − 3) p³`` against
  ``K (7/4 n p² + 3/4 p³)``."""
  assert p >= linalg.SYMMETRIC_FROM
  x = jnp.ones((n, p), jnp.float32)
  standard = _dot_flops(lambda y: linalg.newton_schulz(y, 5), x)
  gram = _dot_flops(lambda y: linalg.newton_schulz(y, 5, gram=True), x)
  assert 4 * standard == 5 * (7 * n * p * p + 3 * p ** 3)
  assert 4 * gram == 7 * n * p * p + (15 * 5 - 12) * p ** 3
  assert (gram < standard) == (n >= 2 * p)


@pytest.mark.parametrize("shape", [(512, 96), (2, 600, 40), (1023, 8)])
def test_the_gram_from_three_blocks_is_the_product(shape):
  x = jax.random.normal(jax.random.key(0), shape)
  got = jax.jit(linalg.gram)(x)
  want = np.einsum("...ik,...jk->...ij", np.asarray(x, np.float64), np.asarray(x, np.float64))
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())
  np.testing.assert_array_equal(got, np.swapaxes(got, -1, -2))   # exactly symmetric
  batch = int(np.prod(shape[:-2]))
  assert _dot_flops(linalg.gram, x) < batch * shape[-2] ** 2 * shape[-1]   # three blocks


def test_restart_needs_the_gram_iteration():
  with pytest.raises(ValueError, match="restart_every=2 needs gram=True"):
    linalg.newton_schulz(jnp.ones((4, 8)), 5, restart_every=2)


rows_jit = jax.jit(linalg.newton_schulz, static_argnames=("steps", "coeffs", "row_blocks"))


@pytest.mark.parametrize("shape", [(256, 64), (64, 256), (3, 96, 32), (2, 32, 32)],
                         ids=["tall", "wide", "batched", "square stack"])
@pytest.mark.parametrize("coeffs, steps", [("quintic", 5), ("polar_express", 8)])
@pytest.mark.parametrize("row_blocks", [2, 8, 64])
def test_the_polynomial_applied_twice_equals_its_square(shape, coeffs, steps, row_blocks):
  """``row_blocks`` above ``n / p`` computes ``a X + b (A X) + c A (A X)`` in place of
  ``(a I + b A + c A²) X``: the same iterates, to float32 rounding."""
  x = jax.random.normal(jax.random.key(0), shape)
  np.testing.assert_allclose(rows_jit(x, steps, coeffs, row_blocks=row_blocks),
                             ns_jit(x, steps, coeffs), rtol=0, atol=3e-6)


def test_the_polynomial_applied_twice_in_float64():
  with jax.enable_x64(True):
    x = jax.random.normal(jax.random.key(1), (40, 300), jnp.float64)
    np.testing.assert_allclose(rows_jit(x, 5, "quintic", row_blocks=64),
                               ns_jit(x, 5, "quintic"), rtol=0, atol=1e-13)


@pytest.mark.parametrize("n, p, row_blocks, twice", [
    (2048, 1024, 64, True),     # ResNet-50's projection on 64 chips: 32 rows each
    (4608, 512, 64, True),      # a 3 x 3 x 512 x 512 kernel: 72 rows each
    (4608, 512, 8, False),      # 576 rows each: A² is cheaper
    (64, 16, 8, True),
    (64, 16, 1, False)])        # a whole matrix never
def test_split_rows_cost_per_device(n, p, row_blocks, twice):
  """Per device: the ``n``-long products divided by ``row_blocks``, the ``p x p`` square
  repeated unless two products with the block cost less. Where the polynomial is applied
  twice, the traced products are all ``n``-long, so the whole trace is ``row_blocks``
  devices' work."""
  assert _newton_schulz._applies_twice(n, p, row_blocks) == twice
  per_device = linalg.newton_schulz_multiply_adds(n, p, 5, row_blocks=row_blocks)
  whole = linalg.newton_schulz_multiply_adds(n, p, 5)
  local = n // row_blocks
  square = _newton_schulz._gram_multiply_adds(p, p)
  gram = _newton_schulz._gram_multiply_adds(p, local)
  assert per_device == 5 * (gram + local * p * p + (local * p * p if twice else square))
  assert (per_device < whole) == (row_blocks > 1)
  if twice and p < linalg.SYMMETRIC_FROM:
    traced = _dot_flops(lambda y: linalg.newton_schulz(y, 5, row_blocks=row_blocks),
                        jnp.ones((n, p), jnp.float32))
    assert traced == row_blocks * per_device


@pytest.mark.parametrize("row_blocks", [0, -2, 1.5, True])
def test_row_blocks_is_checked(row_blocks):
  with pytest.raises(ValueError, match="row_blocks"):
    linalg.newton_schulz(jnp.ones((8, 4)), 5, row_blocks=row_blocks)
