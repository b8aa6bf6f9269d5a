"""Striped stacks in the owners' ``shard_map``: their specs, padding and blocks.

A stack striped over the owners (owner ``j`` holding layers ``[j s, (j + 1) s)``,
:attr:`UpdateLayout.striped`) enters the ``shard_map`` zero-padded to ``owners × s``
layers and split over the owner axes, so each device receives its own block; its
update leaves the same way and is cut back to the stack's length.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from orthojax.optim.execution.layout import UpdateLayout


def block(layout: UpdateLayout, index: int, share: int, mine: Sequence[Any],
           u_leaves: Sequence[Any], dtype: Any) -> Any:
  """This owner's update of striped leaf ``index`` as a ``share``-layer block
  (zero-padded at the stack's end)."""
  leaf = layout.leaf(index)
  shape = list(leaf.shape)
  shape[leaf.batch_axis] = share
  held = [p for p in mine if p.index == index]
  if not held:
    return jnp.zeros(shape, dtype)
  u = u_leaves[index].astype(dtype)
  if held[0].size == share:
    return u
  pad = [(0, 0)] * len(shape)
  pad[leaf.batch_axis] = (0, share - held[0].size)
  return jnp.pad(u, pad)


def stack_spec(layout: UpdateLayout, index: int) -> P:
  """A striped stack's layers split over the owners; every other matrix whole."""
  if index not in layout.stripe_share:
    return P()
  axis, ndim = layout.leaf(index).batch_axis, len(layout.param_avals[index][0])
  return P(*(layout.axes if a == axis else None for a in range(ndim)))


def pad_stack(layout: UpdateLayout, x: Any, index: int) -> Any:
  """A striped stack zero-padded to owners × share layers; anything else as it is."""
  if index not in layout.stripe_share:
    return x
  leaf = layout.leaf(index)
  extra = layout.stripe_share[index] * layout.num_owners - leaf.length
  if extra == 0:
    return x
  pad = [(0, 0)] * x.ndim
  pad[leaf.batch_axis] = (0, extra)
  return jnp.pad(x, pad)


def unpad_stack(layout: UpdateLayout, u: Any, index: int) -> Any:
  if index not in layout.stripe_share:
    return u
  leaf = layout.leaf(index)
  return jax.lax.slice_in_dim(u, 0, leaf.length, axis=leaf.batch_axis)
