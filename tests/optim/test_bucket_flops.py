"""Buckets pay on arithmetic as well as launches: a bucketed update costs at most 1.1x the
FLOPs of the same update run leaf by leaf (``oj.linalg.PADDED_FLOPS``), counted from the
compiled CPU program (``orthojax.compile.hlo``: matrix products and LAPACK calls, a loop
body per trip, a guarded clean-up at its cheaper branch).

The shapes are those that once cost several times per leaf's work: E5's input kernel
beside its square hidden stack (both 400 columns: the stack was padded to 3072 rows,
6.79x the Euclidean step's FLOPs on v5e:2x4), a scanned transformer's attention, MLP
and output matrices (one small side), and ResNet kernels of one output width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import orthojax as oj
from orthojax.compile import hlo

STACK = oj.linalg.MatrixView.stacked()

CASES = {
    # E5 at reduced depth: a 3072 x 400 input kernel and a stack of 400 x 400 layers.
    "e5": ({"input": (3072, 400), "stack": (4, 400, 400)}, {"stack": STACK}),
    # A scanned 2-layer transformer of width 64: QKV, output, MLP in and out.
    "transformer": ({"qkv": (2, 64, 192), "attn_out": (2, 64, 64), "mlp_in": (2, 64, 256),
                     "mlp_out": (2, 256, 64)},
                    {k: STACK for k in ("qkv", "attn_out", "mlp_in", "mlp_out")}),
    # ResNet kernels with 64 output channels: 3 x 3 (576 rows) and 1 x 1 (64, 256 rows).
    "resnet": ({"c3a": (3, 3, 64, 64), "c3b": (3, 3, 64, 64), "c1": (1, 1, 64, 64),
                "c1_256": (1, 1, 256, 64)}, {}),
}

OPTIMIZERS = {
    "radam": lambda views, bucket: oj.optim.radam(1e-3, views=views, bucket=bucket),
    "muon": lambda views, bucket: oj.optim.muon(0.02, views=views, bucket=bucket),
}


def _update_flops(tx, shapes, views):
  """The matrix-product and LAPACK FLOPs of ``tx``'s compiled update of ``shapes``."""
  keys = jax.random.split(jax.random.key(0), len(shapes))
  params = {name: oj.manifolds.Stiefel().random(key, shape, view=views.get(name))
            for key, (name, shape) in zip(keys, shapes.items())}
  grads = jax.tree.map(lambda p: 0.01 * jnp.ones_like(p), params)
  compiled = jax.jit(tx.update).lower(grads, tx.init(params), params).compile()
  module = hlo.Module.from_text(compiled.as_text(), branches="cheapest")
  return module.matmul_flops() + hlo.lapack_flops(module)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bucketed_update_costs_at_most_a_tenth_more_than_per_leaf(case, optimizer):
  shapes, views = CASES[case]
  make = OPTIMIZERS[optimizer]
  per_leaf = _update_flops(make(views, "per_leaf"), shapes, views)
  padded = _update_flops(make(views, "pad"), shapes, views)
  assert per_leaf > 0
  assert padded <= oj.linalg.PADDED_FLOPS * per_leaf, (padded / per_leaf, case, optimizer)
