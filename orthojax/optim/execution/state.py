"""The state of a sharded update, and its conversions to and from the per-leaf state.

A :class:`ShardedUpdateState` holds one flat buffer per dtype of shape
``(num_owners, length)`` — row ``j`` the packed state of owner ``j``, sharded
over the owner axes — plus the wrapped transformation's state of the leaves
every device updates. :func:`replicated_state` turns it into exactly the state
the wrapped transformation keeps without sharding (checkpoints are written that
way, so they restore on any device count, sharded or not); :func:`sharded_state`
is the inverse.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from orthojax.optim.execution.layout import Role, UpdateLayout, dtype_name, flatten


@jax.tree_util.register_pytree_with_keys_class
class ShardedUpdateState:
  """The state of :func:`orthojax.optim.shard_update`.

  Attributes:
    owned: ``{dtype name: (num_owners, length) array}``, row ``j`` owner ``j``'s
      packed state (sharded over the owner axes).
    replicated: the wrapped transformation's state of the replicated leaves.
    layout: the static :class:`UpdateLayout` (part of the tree structure).
  """

  def __init__(self, owned: dict[str, Any], replicated: Any, layout: UpdateLayout):
    self.owned = owned
    self.replicated = replicated
    self.layout = layout

  def tree_flatten_with_keys(self):
    return ((jax.tree_util.GetAttrKey("owned"), self.owned),
            (jax.tree_util.GetAttrKey("replicated"), self.replicated)), self.layout

  @classmethod
  def tree_unflatten(cls, layout, children):
    return cls(children[0], children[1], layout)

  def __repr__(self) -> str:
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in self.owned.items()}
    return f"ShardedUpdateState(owned={shapes}, owners={self.layout.num_owners})"


def pack(values: Sequence[Any], lengths: dict[str, int]) -> dict[str, Any]:
  """Ravel and concatenate per dtype, zero-padded to ``lengths``."""
  parts: dict[str, list[Any]] = {d: [] for d in lengths}
  for v in values:
    parts[dtype_name(v.dtype)].append(jnp.ravel(v))
  out = {}
  for dtype, length in lengths.items():
    flat = jnp.concatenate(parts[dtype]) if parts[dtype] else jnp.zeros([0], dtype)
    out[dtype] = jnp.pad(flat, (0, length - flat.shape[0]))
  return out


def pack_state(layout: UpdateLayout, owner: int, state_leaves: Sequence[Any]) -> dict[str, Any]:
  """Owner ``owner``'s state leaves (all positions, its own filled) as its packed rows."""
  entries = layout.owner_states[owner].entries
  values = [x for x, slot in zip(state_leaves, entries) if slot is not None]
  return pack(values, dict(layout.state_lengths))


def unpack_state(layout: UpdateLayout, owner: int, rows: dict[str, Any]) -> list[Any]:
  """Owner ``owner``'s state leaves from its packed rows (masked where it holds nothing)."""
  out = []
  for slot in layout.owner_states[owner].entries:
    if slot is None:
      out.append(optax.MaskedNode())
      continue
    n = int(np.prod(slot.shape, dtype=np.int64))
    out.append(jax.lax.slice_in_dim(rows[slot.dtype], slot.offset, slot.offset + n)
               .reshape(slot.shape))
  return out


def _is_node(x: Any) -> bool:
  return isinstance(x, ShardedUpdateState)


def replicated_state(state: Any) -> Any:
  """``state`` with every :class:`ShardedUpdateState` replaced by the wrapped state.

  The result is exactly the state the wrapped transformation keeps when it is
  not sharded (same structure, shapes and values), so it can be saved, read,
  or restored into a replicated run or onto another device count
  (:func:`sharded_state`). Works on global arrays, inside or outside ``jit``.
  """
  return jax.tree.map(lambda node: _to_replicated(node) if _is_node(node) else node, state,
                      is_leaf=_is_node)


def _to_replicated(node: ShardedUpdateState) -> Any:
  layout = node.layout
  owners = [unpack_state(layout, j, {d: node.owned[d][j] for d in node.owned})
            for j in range(layout.num_owners)]
  rest = flatten(node.replicated)[0]
  replicated = set(layout.replicated)
  out = []
  for k, role in enumerate(layout.roles):
    if isinstance(role, Role) or role in replicated:
      out.append(rest[k])
      continue
    parts = [owners[j][k] for j, _ in layout.owners_of(role)]
    axis = layout.state_axis(role, layout.state_avals[k][0])
    out.append(parts[0] if axis is None else jnp.concatenate(parts, axis=axis))
  return layout.state_treedef.unflatten(out)


def sharded_state(state: Any, like: Any) -> Any:
  """The inverse of :func:`replicated_state`: ``state`` in the layout of ``like``.

  Args:
    state: a replicated-layout optimizer state (e.g. restored from a checkpoint).
    like: a state (or its ``jax.eval_shape``) of the sharded transformation,
      whose :class:`ShardedUpdateState` nodes give the layout.
  """
  def convert(target, canonical):
    return _to_sharded(canonical, target.layout) if _is_node(target) else canonical

  return jax.tree.map(convert, like, state, is_leaf=_is_node)


def _to_sharded(canonical: Any, layout: UpdateLayout) -> ShardedUpdateState:
  leaves = flatten(canonical)[0]
  rows: dict[str, list[Any]] = {d: [] for d, _ in layout.state_lengths}
  for j in range(layout.num_owners):
    for dtype, row in pack_state(layout, j, _owner_leaves(layout, j, leaves)).items():
      rows[dtype].append(row)
  replicated = set(layout.replicated)
  rest = [leaves[k] if role is Role.SHARED or role in replicated else optax.MaskedNode()
          for k, role in enumerate(layout.roles)]
  return ShardedUpdateState({d: jnp.stack(r) for d, r in rows.items()},
                            layout.state_treedef.unflatten(rest), layout)


def _owner_leaves(layout: UpdateLayout, owner: int, leaves: Sequence[Any]) -> list[Any]:
  """Owner ``owner``'s slices of the replicated state leaves (None where it holds none)."""
  held = {p.index: p for p in layout.pieces[owner]}
  out = []
  for k, (role, slot) in enumerate(zip(layout.roles, layout.owner_states[owner].entries)):
    if slot is None:
      out.append(None)
    elif isinstance(role, Role):
      out.append(leaves[k])
    else:
      axis = layout.state_axis(role, layout.state_avals[k][0])
      piece = held[role]
      out.append(leaves[k] if axis is None else jax.lax.slice_in_dim(
          leaves[k], piece.start, piece.stop, axis=axis))
  return out
