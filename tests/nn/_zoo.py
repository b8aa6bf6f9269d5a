"""Every ``oj.nn`` layer and ``oj.models`` model (small sizes), for the tests that walk
them all, and :func:`miniature`: a model's tree and metadata with tiny values."""

from __future__ import annotations

from typing import Any, Callable

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

import orthojax as oj

R = lambda: nnx.Rngs(0)
LAYERS: dict[str, Callable[[], nnx.Module]] = {
    "GmPDense": lambda: oj.nn.GmPDense(4, 3, rngs=R()),
    "GmPConv": lambda: oj.nn.GmPConv(2, 3, 3, rngs=R()),
    "InputMeanNorm": lambda: oj.nn.InputMeanNorm(3, rngs=R()),
    "ManifoldLinear stiefel": lambda: oj.nn.ManifoldLinear(4, 3, rngs=R()),
    "ManifoldLinear oblique": lambda: oj.nn.ManifoldLinear(4, 3, manifold="oblique", rngs=R()),
    "MeanOnlyBatchNorm": lambda: oj.nn.MeanOnlyBatchNorm(3, rngs=R()),
    "OrthogonalDense cayley": lambda: oj.nn.OrthogonalDense(4, 3, learn_gain=True, rngs=R()),
    "OrthogonalDense householder": lambda: oj.nn.OrthogonalDense(
        4, 4, parametrization="householder", rngs=R()),
    "OrthogonalConv": lambda: oj.nn.OrthogonalConv(2, 3, 3, rngs=R()),
    "WeightNormDense": lambda: oj.nn.WeightNormDense(4, 3, rngs=R()),
    "WeightNormConv": lambda: oj.nn.WeightNormConv(2, 3, 3, rngs=R()),
}
MODELS: dict[str, Callable[[], nnx.Module]] = {
    **{f"MLP {v}": (lambda v=v: oj.models.MLP(3, 4, 2, variant=v, rngs=R()))
       for v in oj.models.MLP.VARIANTS},
    **{f"DeepMLP {w}": (lambda w=w: oj.models.DeepMLP(5, 3, 4, 2, q_star=0.5, weights=w,
                                                      rngs=R()))
       for w in oj.models.DeepMLP.WEIGHTS},
    "DeepLinear": lambda: oj.models.DeepLinear(3, 4, 5, 2, rngs=R()),
    **{f"ResNet18 {n}": (lambda n=n: oj.models.ResNet(18, n, 10, rngs=R()))
       for n in ("bn", "wn_mbn", "gmp_imn")},
    **{f"VGG6 {v}": (lambda v=v: oj.models.VGG6(v, 10, widths=(4, 4, 4), rngs=R()))
       for v in oj.models.VGG6.VARIANTS},
    "SequenceRNN": lambda: oj.models.SequenceRNN(3, 4, 2, rngs=R()),
    "SequenceRNN stiefel": lambda: oj.models.SequenceRNN(3, 4, 2, recurrent="stiefel",
                                                         recurrent_init="orthogonal", rngs=R()),
    "TransformerLM": lambda: oj.models.TransformerLM(11, depth=2, width=8, heads=2, rngs=R()),
    "TransformerLM stiefel": lambda: oj.models.TransformerLM(
        11, depth=2, width=8, heads=2, stiefel="attention", oblique="mlp", scale="output",
        qk_norm=True, rngs=R()),
}
ALL = {**LAYERS, **MODELS}


def miniature(build: Callable[[], nnx.Module], size: int = 3, seed: int = 0) -> nnx.Module:
  """``build()``'s module — its tree, Variable types and metadata — built abstractly, with
  each value replaced by a random one of at most ``size`` per axis (same rank and dtype).

  For tests of *which* view each parameter gets (the optimizers, the penalty): no
  parameter is initialised at full size (ResNet-18's GmP angles take a minute), and a
  step costs what a handful of tiny matrices do. Not callable as a network: the
  shapes no longer fit together.
  """
  graphdef, state = nnx.split(nnx.eval_shape(build))
  leaves, treedef = jax.tree.flatten(state)
  rng = np.random.default_rng(seed)   # numpy: no program compiled per shape

  def small(x: Any) -> Any:
    shape = tuple(min(d, size) for d in x.shape)
    if jnp.issubdtype(x.dtype, jnp.floating):
      return jnp.asarray(rng.standard_normal(shape), x.dtype)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.split(jax.random.key(seed), shape) if shape else jax.random.key(seed)
    return jnp.zeros(shape, x.dtype)

  return nnx.merge(graphdef, treedef.unflatten([small(x) for x in leaves]))
