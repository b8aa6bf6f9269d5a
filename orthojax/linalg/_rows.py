"""Row-local maps, kept split along the rows when the compiler partitions them.

A map ``(S, X) ↦ Y`` is *row-local* when each row of ``Y`` depends only on the same row
of ``X`` and on a small ``S`` that every row shares: the right triangular solve
``Y = X R⁻¹`` of CholeskyQR, where ``S = XᵀX`` gives ``R``, is one. Split ``X`` by
rows over devices and each device can compute its own rows of ``Y`` from its rows of
``X`` and a replicated ``S``, with no collective.

The compiler knows that of a matrix product but not of a triangular solve: GSPMD and
Shardy gather the whole ``X`` onto every device before a ``triangular_solve``. That
undid the row split of a matrix updated by all owners
(``orthojax.optim.shard_update(split_above=...)``): CholeskyQR's Gram matrix is
all-reduced as it should be (``XᵀX`` is a sum over row blocks), but its solve gathered
the matrix twice per step. :func:`rows_partitioned` states the row locality with
``jax.experimental.custom_partitioning``: a row-split ``X`` stays split, ``S`` is
replicated, each device runs the map on its rows. Without a mesh, and in
``jax.export``, it is the map itself. Differentiation and ``jax.vmap`` go through the
map itself as well (``custom_partitioning`` has neither rule), so it is a drop-in.

Where: CholeskyQR's solve on a CPU (:func:`orthojax.linalg.cholesky_qr2`). A compile for
TPU devices without the TPU (``jax.experimental.topologies``) cannot partition a
``custom_partitioning`` call — libtpu's compile-only plugin has no partitioner for it
("Custom emitter for CustomSPMDPartitioning not found") — so on accelerators the solve
is a product with ``R``'s ``p × p`` inverse instead, which the compiler partitions by
rows itself.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import custom_batching
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def rows_partitioned(fn: Callable[[jax.Array, jax.Array], jax.Array]
                     ) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """``fn(s, x)``, row-local in ``x``, partitioned by the compiler along ``x``'s rows.

  Args:
    fn: ``(s, x) ↦ y`` with ``s`` of shape ``(..., p, q)``, ``x`` and ``y`` of shape
      ``(..., n, q)``, the same leading (batch) axes, and each row of ``y`` a function
      of the same row of ``x`` and of ``s`` only.

  Returns:
    The same function. Under ``jit`` on a mesh, ``x``'s rows and batch axes keep their
    sharding, its columns and ``s``'s matrix axes are replicated, and each device
    applies ``fn`` to its block; no collective is added for a row-split ``x``.
  """
  def specs(mesh: Any, x_sharding: Any, ndim: int) -> tuple[NamedSharding, NamedSharding]:
    spec = tuple(getattr(x_sharding, "spec", ())) + (None,) * ndim
    rows = P(*spec[:ndim - 1], None)          # batch and rows as x's, columns whole
    small = P(*spec[:ndim - 2], None, None)   # batch as x's, the matrix whole
    return NamedSharding(mesh, small), NamedSharding(mesh, rows)

  def partition(mesh, arg_shapes, result_shape):
    x = arg_shapes[1]
    s_at, x_at = specs(mesh, x.sharding, len(x.shape))
    return mesh, fn, x_at, (s_at, x_at)

  def infer(mesh, arg_shapes, result_shape):
    x = arg_shapes[1]
    return specs(mesh, x.sharding, len(x.shape))[1]

  partitioned = custom_partitioning(fn)
  partitioned.def_partition(partition, infer_sharding_from_operands=infer,
                            sharding_rule="... p q, ... n q -> ... n q",
                            need_replication_factors=("p", "q"))

  def call(s: jax.Array, x: jax.Array) -> jax.Array:
    batch = jnp.broadcast_shapes(s.shape[:-2], x.shape[:-2])
    s = jnp.broadcast_to(s, (*batch, *s.shape[-2:]))
    x = jnp.broadcast_to(x, (*batch, *x.shape[-2:]))
    return partitioned(s, x)

  batched = custom_batching.custom_vmap(call)

  @batched.def_vmap
  def _vmap_rule(axis_size, in_batched, s, x):   # a leading axis more: still row-local
    s, x = (v if b else jnp.broadcast_to(v, (axis_size, *v.shape))
            for v, b in zip((s, x), in_batched))
    return batched(s, x), True

  @jax.custom_jvp
  def wrapped(s: jax.Array, x: jax.Array) -> jax.Array:
    return batched(s, x)

  @wrapped.defjvp
  def _jvp(primals, tangents):   # the map's own derivative (not row-partitioned)
    return jax.jvp(fn, primals, tangents)

  return wrapped
