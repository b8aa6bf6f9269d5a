"""Logical sharding metadata on orthojax layers, resolved by rules onto a mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax.core import spmd
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import orthojax as oj

_LAYERS = {
    "gmp_dense": lambda r: oj.nn.GmPDense(16, 8, rngs=r),
    "gmp_conv": lambda r: oj.nn.GmPConv(4, 8, (3, 3), rngs=r),
    "gmp_fan_in_1": lambda r: oj.nn.GmPDense(1, 8, rngs=r),
    "imn": lambda r: oj.nn.InputMeanNorm(8, rngs=r),
    "mbn": lambda r: oj.nn.MeanOnlyBatchNorm(8, rngs=r),
    "wn_dense": lambda r: oj.nn.WeightNormDense(16, 8, rngs=r),
    "wn_conv": lambda r: oj.nn.WeightNormConv(4, 8, (3, 3), rngs=r),
    "manifold_linear": lambda r: oj.nn.ManifoldLinear(16, 8, rngs=r),
}


def _variables(module):
  state = nnx.state(module)
  return jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))


@pytest.mark.parametrize("name", sorted(_LAYERS))
def test_every_array_variable_has_logical_axes_of_its_rank(name):
  layer = _LAYERS[name](nnx.Rngs(0))          # no mesh in scope: must build
  for var in _variables(layer):
    value = var.get_value()
    if jnp.ndim(value) == 0:
      continue
    names = var.get_metadata().get("out_sharding")
    assert names is not None, f"{name}: {type(var).__name__}{value.shape} has no out_sharding"
    assert len(names) == jnp.ndim(value), (name, names, value.shape)


def test_rules_shard_fan_out_over_fsdp():
  """Abstract init + rules -> NamedShardings; the jitted init places params there."""
  mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
  rules = (("fan_out", "fsdp"), ("fan_in", None), ("spatial", None), ("angles", None))

  def init():
    return nnx.state(oj.nn.GmPConv(4, 8, (3, 3), rngs=nnx.Rngs(0)))

  abstract = jax.eval_shape(init)
  with spmd.logical_axis_rules(rules):
    specs = nnx.get_partition_spec(abstract)
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), nnx.to_pure_dict(specs),
                           is_leaf=lambda x: isinstance(x, P))
  state = jax.jit(lambda: nnx.to_pure_dict(init()), out_shardings=shardings)()
  assert state["theta"].sharding.spec == P("fsdp", None)
  assert state["r"].sharding.spec == P("fsdp")
  assert len(state["theta"].addressable_shards) == 8
  # Sharded values equal the unsharded ones (the same jitted program, placed otherwise).
  np.testing.assert_array_equal(np.asarray(state["theta"]),
                                np.asarray(jax.jit(lambda: nnx.to_pure_dict(init()))()["theta"]))
