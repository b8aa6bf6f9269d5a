"""One matrix per LAPACK call on CPU (orthojax.linalg._lapack): same numbers, no deadlock."""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from orthojax import linalg
from orthojax.linalg._lapack import per_matrix_on_cpu

RNG = np.random.default_rng(0)


def lapack_operands(fn, x) -> list[tuple[int, ...]]:
  """The first operand's shape of every LAPACK custom call in ``fn``'s compiled CPU program."""
  text = jax.jit(fn).lower(x).compile().as_text()
  return [tuple(int(d) for d in m.group(1).split(","))
          for m in re.finditer(r'custom_call_target="lapack_\w+", '
                               r'operand_layout_constraints=\{f\d+\[([\d,]+)\]', text)]


@pytest.mark.parametrize("fn", [
    linalg.qr_orthonormalize,
    linalg.cholesky_qr2,
    linalg.polar,
    lambda x: linalg.polar(x, method="eigh"),
    lambda x: linalg.cayley_transform(x[..., :24, :24] - jnp.swapaxes(x[..., :24, :24], -1, -2),
                                      x[..., :24, :], tau=0.1),
], ids=["qr", "cholesky_qr2", "polar svd", "polar eigh", "cayley exact"])
@pytest.mark.parametrize("shape", [(6, 40, 24), (2, 3, 24, 40)], ids=["tall stack", "wide 2-D batch"])
def test_each_lapack_call_holds_one_matrix_and_results_are_unchanged(fn, shape):
  x = jnp.asarray(RNG.standard_normal(shape), jnp.float32)
  operands = lapack_operands(fn, x)
  assert operands, "no LAPACK call in the CPU program"
  assert all(len(s) == 2 for s in operands), operands   # one matrix, no batch axis
  # The same routine on the same matrices: the batch's result is each matrix's, bit for bit.
  flat = x.reshape(-1, *x.shape[-2:])
  one_by_one = jnp.stack([jax.jit(fn)(m) for m in flat]).reshape(fn(x).shape)
  np.testing.assert_array_equal(np.asarray(jax.jit(fn)(x)), np.asarray(one_by_one))


def test_batch_axes_broadcast_like_the_wrapped_function():
  solve = per_matrix_on_cpu(jnp.linalg.solve)
  a = jnp.asarray(RNG.standard_normal((3, 5, 5)) + 5 * np.eye(5), jnp.float32)
  b = jnp.asarray(RNG.standard_normal((5, 2)), jnp.float32)   # no batch: broadcast over a's
  np.testing.assert_allclose(solve(a, b), jnp.linalg.solve(a, jnp.broadcast_to(b, (3, 5, 2))),
                             rtol=1e-6, atol=1e-6)


_TWO_STACKS = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from orthojax import linalg
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((16, 400, 400)), jnp.float32)
    y = jnp.asarray(rng.standard_normal((16, 408, 400)), jnp.float32)
    for fn in (linalg.qr_orthonormalize, linalg.cholesky_qr2):
      step = jax.jit(lambda x, y: (fn(x), fn(y)))
      for _ in range(3):
        jax.block_until_ready(step(x, y))
    print("finished")
""")


def test_two_independent_batched_qrs_in_one_program_finish():
  """Batched, this hung in 6 of 6 runs on a 2-core machine (jax 0.10.2): each LAPACK call
  waited on the thread pool whose workers the other held. A hang fails at the timeout."""
  try:
    run = subprocess.run([sys.executable, "-c", _TWO_STACKS], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  except subprocess.TimeoutExpired:
    pytest.fail("two batched QRs in one program did not finish in 300 s (deadlock)")
  assert run.returncode == 0 and "finished" in run.stdout, run.stderr[-2000:]
