"""linalg._rows.rows_partitioned: the map itself everywhere, kept split along the rows on a mesh.

The map under test is CholeskyQR's solve ``X R⁻¹`` (``R`` the Cholesky factor of
``S = XᵀX``), checked against numpy's float64 solve; on 8 devices a row-split ``X``
must come out row-split with no all-gather in the compiled program (a bare
``triangular_solve`` gathers it: the control case).
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from orthojax import linalg
from orthojax.compile import hlo
from orthojax.compile import topology
from orthojax.linalg._rows import rows_partitioned


def _solve(s, x):
  return jax.lax.linalg.triangular_solve(jnp.linalg.cholesky(s), x, left_side=False,
                                         lower=True, transpose_a=True)


solve = rows_partitioned(_solve)


def _reference(x):
  x = np.asarray(x, np.float64)
  r = np.linalg.cholesky(np.swapaxes(x, -1, -2) @ x)
  return np.swapaxes(np.linalg.solve(r, np.swapaxes(x, -1, -2)), -1, -2)


def _gram(x):
  return jnp.swapaxes(x, -1, -2) @ x


@pytest.mark.parametrize("shape", [(40, 8), (3, 24, 6), (2, 2, 16, 16)],
                         ids=["tall", "batched", "square-stack"])
def test_equals_the_solve_jit_vmap_and_grad(shape):
  x = jax.random.normal(jax.random.key(0), shape, jnp.float32)
  np.testing.assert_allclose(jax.jit(lambda x: solve(_gram(x), x))(x), _reference(x),
                             rtol=2e-4, atol=2e-5)
  # vmap over a leading axis, and a batched x with one shared s (broadcast)
  if len(shape) > 2:
    np.testing.assert_allclose(jax.vmap(lambda x: solve(_gram(x), x))(x), _reference(x),
                               rtol=2e-4, atol=2e-5)
  s = _gram(x.reshape(-1, *shape[-2:])[0])
  np.testing.assert_allclose(solve(s, x), _solve(jnp.broadcast_to(s, (*shape[:-2], *s.shape)), x),
                             rtol=1e-6, atol=1e-6)
  # forward and reverse derivatives are the map's own (finite differences agree too)
  loss = lambda f: lambda x: jnp.sum(jnp.sin(f(_gram(x), x)))
  np.testing.assert_allclose(jax.grad(loss(solve))(x), jax.grad(loss(_solve))(x),
                             rtol=1e-5, atol=1e-6)
  d = jax.random.normal(jax.random.key(1), shape, jnp.float32)
  x64 = np.asarray(x, np.float64)
  eps = 1e-4
  value = lambda x: np.sin(_reference(x)).sum()
  fd = (value(x64 + eps * d) - value(x64 - eps * d)) / (2 * eps)
  np.testing.assert_allclose(float(jnp.vdot(jax.grad(loss(solve))(x), d)), fd, rtol=2e-3)


def _mesh():
  if jax.device_count() < 8:
    pytest.skip("needs 8 (simulated) devices")
  return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "fsdp"),
              axis_types=(AxisType.Auto,) * 2)


@pytest.mark.parametrize("shape,spec", [((256, 16), P(("data", "fsdp"), None)),
                                        ((4, 64, 16), P("fsdp", "data", None))],
                         ids=["rows-over-both-axes", "batch-and-rows"])
def test_a_row_split_matrix_stays_split_with_no_gather(shape, spec):
  mesh = _mesh()
  x = jax.device_put(jax.random.normal(jax.random.key(2), shape, jnp.float32),
                     NamedSharding(mesh, spec))
  ours = jax.jit(lambda x: solve(_gram(x), x))
  bare = jax.jit(lambda x: _solve(_gram(x), x))
  out = ours(x)
  np.testing.assert_allclose(out, _reference(x), rtol=2e-4, atol=2e-5)
  assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), len(shape))
  gathers = lambda f: f.lower(x).compile().as_text().count(" all-gather(")
  assert gathers(ours) == 0
  assert gathers(bare) >= 1   # the control: without the rule the compiler gathers x


@pytest.mark.skipif(not topology.libtpu_available(), reason="libtpu not installed")
def test_on_a_tpu_a_row_split_cholesky_qr2_only_all_reduces_gram_matrices():
  """Compiled for 4 abstract v5e chips (libtpu): CholeskyQR2 of a matrix split by rows
  adds only ``p x p`` (and probe-sized) all-reduces in the step no guard fires in; there
  the solve is a product with ``R``'s inverse, which the TPU compiler partitions itself."""
  devices = topology.Topology.parse("v5e:2x2").devices()
  mesh = Mesh(np.array(devices).reshape(4), ("data",), axis_types=(AxisType.Auto,))
  x = jax.ShapeDtypeStruct((512, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))
  text = jax.jit(linalg.cholesky_qr2).lower(x).compile().as_text()
  ops = collections.Counter(
      (ins.op.removesuffix("-start"), ins.type.split("{")[0])
      for ins, _, _ in hlo.Module.from_text(text, branches="cheapest").instructions()
      if ins.op.removesuffix("-start") in hlo.COLLECTIVES)
  assert set(ops) == {("all-reduce", "f32[64,64]"), ("all-reduce", "f32[64,8]")}, ops
