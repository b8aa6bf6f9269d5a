"""The Flax-recipe throughput baseline is the model it claims to be."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from benchmarks import _flax_recipe
from orthojax import models
from tests import compile_cache


def _count(tree) -> int:
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("depth", [18, 50])
def test_same_parameter_count_as_orthojax_bn_resnet(depth):
  recipe = _flax_recipe.resnet(depth)
  variables = jax.eval_shape(lambda: recipe.init(jax.random.key(0), jnp.zeros((1, 224, 224, 3)),
                                                 train=False))
  ours = nnx.eval_shape(lambda: models.ResNet(depth, "bn", num_classes=1000, rngs=nnx.Rngs(0)))
  assert _count(variables["params"]) == _count(nnx.state(ours, nnx.Param))
  if depth == 50:
    assert _count(variables["params"]) == 25_557_032  # He et al.'s ResNet-50


def test_recipe_step_trains_in_bfloat16_and_updates_statistics():
  recipe = _flax_recipe.resnet(18, num_classes=10)
  tx = _flax_recipe.optimizer(batch_size=256, steps_per_epoch=1, num_epochs=20, warmup_epochs=0)
  params, stats, opt_state = _flax_recipe.init(recipe, tx, image_size=32)
  # 8 steps of a ResNet-18: -O1's vectorised loops (tests/compile_cache.py).
  step = jax.jit(_flax_recipe.make_train_step(recipe, tx, weight_decay=0.0),
                 compiler_options=compile_cache.RUN_BOUND_JIT)
  x = jax.random.normal(jax.random.key(0), (8, 32, 32, 3))
  y = jnp.arange(8) % 10
  losses = []
  for _ in range(8):
    params, new_stats, opt_state, metrics = step(params, stats, opt_state, x, y)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.5 * losses[0]
  assert not np.allclose(jax.tree.leaves(new_stats)[0], jax.tree.leaves(stats)[0])
  apply = jax.jit(recipe.apply, static_argnames="train")   # one compile, not one per op
  logits = apply({"params": params, "batch_stats": new_stats}, x, train=False)
  assert logits.dtype == jnp.float32


def test_unknown_depth_is_rejected():
  with pytest.raises(ValueError, match="depth must be one of"):
    _flax_recipe.resnet(42)
