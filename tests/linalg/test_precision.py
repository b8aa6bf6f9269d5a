"""``at_precision``: the tensor cores' products emulated exactly on a CPU, and the
accelerator programs carrying the reduced-precision algorithm."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from orthojax import linalg

SHAPES = {"square": ((48, 48), (48, 48)), "tall": ((96, 24), (24, 16)),
          "wide": ((16, 80), (80, 40)), "batched": ((3, 32, 24), (3, 24, 20))}


def _operands(shape_a, shape_b, seed=0):
  ka, kb = jax.random.split(jax.random.key(seed))
  return jax.random.normal(ka, shape_a), jax.random.normal(kb, shape_b)


def _bf16_parts(x):
  hi = x.astype(ml_dtypes.bfloat16).astype(np.float64)
  lo = (x.astype(np.float64) - hi).astype(np.float32).astype(ml_dtypes.bfloat16)
  return hi, lo.astype(np.float64)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("precision,terms", [("bf16x3", 3), ("bf16", 1)])
def test_emulated_product_is_the_split_products_summed_in_float32(shape, precision, terms):
  """The emulation against the same split computed independently in float64 (numpy and
  ml_dtypes' bfloat16 rounding): equal to float32 accumulation, and measurably far
  from the exact float32 product, so a CPU silently multiplying at float32 fails."""
  a, b = _operands(*SHAPES[shape])
  got = np.asarray(jax.jit(linalg.at_precision(jnp.matmul, precision))(a, b), np.float64)
  (a_hi, a_lo), (b_hi, b_lo) = _bf16_parts(np.asarray(a)), _bf16_parts(np.asarray(b))
  split = a_hi @ b_hi + ((a_hi @ b_lo + a_lo @ b_hi) if terms == 3 else 0.0)
  exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  scale = np.abs(a).max() * np.abs(b).max() * a.shape[-1]
  np.testing.assert_allclose(got, split, rtol=0, atol=4 * 2.0 ** -24 * scale)
  error = np.abs(got - exact).max() / scale
  float32 = np.abs(np.asarray(jnp.matmul(a, b, precision="highest"), np.float64)
                   - exact).max() / scale
  bound = {3: 2.0 ** -15, 1: 2.0 ** -7}[terms]
  assert 4 * float32 < error < bound, (error, float32)


def test_highest_and_the_cpu_default_are_float32():
  a, b = _operands(*SHAPES["tall"])
  exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  for precision in ("highest", None):
    got = jax.jit(linalg.at_precision(jnp.matmul, precision))(a, b)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-5)


def test_emulation_reaches_products_inside_loops_and_branches():
  """fori_loop (scan), while_loop and cond bodies are emulated like straight-line code:
  the same numbers as the loop unrolled by hand with split products."""
  a, b = _operands((32, 32), (32, 32))
  c = 0.1 * b

  def looped(a, c):
    x = jax.lax.fori_loop(0, 3, lambda i, x: x @ c, a)
    x = jax.lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] @ c), (0, x))[1]
    return jax.lax.cond(jnp.sum(a) > -1e30, lambda x: x @ c, lambda x: x, x)

  got = jax.jit(linalg.at_precision(looped, "bf16x3"))(a, c)
  x = a
  for _ in range(6):
    x = linalg.split_product(x, c, 3, dimension_numbers=(((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
  np.testing.assert_allclose(got, x, rtol=1e-6, atol=1e-6)
  assert float(jnp.abs(got - looped(a, c)).max()) > 1e-7   # not float32 products


def test_a_nested_highest_region_keeps_float32():
  a, b = _operands(*SHAPES["square"])
  inner = linalg.at_precision(jnp.matmul, "highest")
  got = jax.jit(linalg.at_precision(lambda a, b: inner(a, b), "bf16x3"))(a, b)
  np.testing.assert_array_equal(got, jax.jit(inner)(a, b))


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
@pytest.mark.parametrize("precision,passes", [(None, 3), ("bf16x3", 3), ("bf16", 1)])
def test_accelerator_programs_carry_the_bfloat16_algorithm(platform, precision, passes):
  """Exported for a GPU or TPU (no device needed), the products are lowered with bfloat16
  operands and float32 accumulation in ``passes`` primitive products; for the CPU the same
  ``precision=None`` program is plain float32 with no conditional left."""
  a, b = _operands(*SHAPES["square"])
  fn = jax.jit(linalg.at_precision(jnp.matmul, precision))
  text = jax.export.export(fn, platforms=[platform])(a, b).mlir_module()
  assert ("lhs_precision_type = bf16, rhs_precision_type = bf16, accumulation_type = f32"
          in text)
  assert f"num_primitive_operations = {passes}" in text
  if precision is None:
    compiled = fn.lower(a, b).compile().as_text()
    assert "conditional" not in compiled and "bf16" not in compiled


def test_roundoff_follows_the_backend():
  cpu = jax.jit(lambda: linalg.roundoff(None, jnp.float32))()
  assert float(cpu) == float(jnp.finfo(jnp.float32).eps)
  assert float(linalg.roundoff("bf16x3", jnp.float32)) == 2.0 ** -16


@pytest.mark.parametrize("bad", ["fp8", "HIGHEST", 3, {"cpu": "highest", "gpu": "tf16"}])
def test_a_bad_precision_is_one_line_naming_the_argument(bad):
  with pytest.raises(ValueError, match=r"^Stiefel: precision=.* is not a precision; use one of"):
    from orthojax.manifolds import Stiefel
    Stiefel(precision=bad)


def test_float64_keeps_float64_products_on_every_backend():
  """The presets would cast float64 operands to float32 on a GPU: float64 stays HIGHEST."""
  with jax.enable_x64(True):
    a = jnp.ones((8, 8), jnp.float64)
    text = jax.export.export(jax.jit(linalg.at_precision(jnp.matmul, "bf16x3")),
                             platforms=["cuda"])(a, a).mlir_module()
    assert "algorithm" not in text and "tensor<8x8xf64>" in text
