"""The static plan of a sharded update: :class:`UpdateLayout`.

A layout says which owner updates which matrix (or which layers of a stack), which
leaves every device updates, which single matrices all owners update together
(``split_above``), and where each owner's state and updates sit in its packed
buffers. It is a function of the parameters' shapes and views, the wrapped
transformation's state structure and the owner count only, so it is rebuilt
identically wherever the same tree is sharded the same way. :func:`orthojax.optim.plan`
(``orthojax.optim.execution.planning``) builds one, complete.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from orthojax.optim.execution.owners import MatrixLeaf, Piece

Aval = tuple[tuple[int, ...], str]   # (shape, dtype name)


class Role(enum.Enum):
  """What a position of the wrapped transformation's state holds when it is not a
  parameter's state (those positions hold the parameter's leaf index instead)."""

  MASKED = "masked"   # an ``optax.MaskedNode`` placeholder
  SHARED = "shared"   # a leaf shared by every parameter (a step count)


class Slot(NamedTuple):
  """Where one state leaf sits in an owner's packed rows."""

  shape: tuple[int, ...]
  dtype: str
  offset: int


@dataclasses.dataclass(frozen=True)
class OwnerState:
  """Owner ``j``'s packed state: per state position, its :class:`Slot`, or None where
  this owner holds nothing (a masked position, or another owner's matrix)."""

  entries: tuple[Slot | None, ...]


@dataclasses.dataclass(frozen=True)
class SplitMatrix:
  """A single matrix all owners update together (``split_above``), split by rows.

  Attributes:
    index: its position among the params' leaves.
    axis: the parameter axis split over the owner axes: an axis of the matrix view's
      long side (its rows, as :func:`orthojax.optim.plan` describes).
    cost: the modelled cost each owner carries (:func:`orthojax.optim.split_cost`).
    front: where the update moves ``axis`` to — the first axis of its side — when it is
      an inner one (a 3 x 3 kernel's input channels), so that the view's reshape keeps
      the rows split in blocks; ``axis`` itself when it already is the first.
  """

  index: int
  axis: int
  cost: float
  front: int | None = None

  @property
  def moved(self) -> bool:
    """Whether the update sees the matrix with ``axis`` moved to ``front``."""
    return self.front is not None and self.front != self.axis


@dataclasses.dataclass(frozen=True, eq=False)
class UpdateLayout:
  """The static plan of a sharded update: owners, pieces, and the state packing.

  Attributes:
    num_owners: devices that own matrices (the product of the owner axes).
    axes: the mesh axes the owners run along.
    params_treedef: the params' tree structure.
    param_avals: per leaf of params, ``(shape, dtype name)``.
    leaves: the matrix leaves owners update (:class:`MatrixLeaf`).
    replicated: indices of the leaves every device updates (the split ones among them).
    split: the :class:`SplitMatrix` s, updated by all owners with one axis split.
    pieces: per owner, its :class:`Piece` s.
    striped: ``(leaf, s)`` of the stacks whose owner ``j`` holds layers
      ``[j s, (j + 1) s)`` (the last owners fewer or none): their updates leave by
      one all-gather of ``s``-layer blocks straight into the stack's layout; where
      the owners' blocks tile the stack exactly, its gradients and parameters also
      enter as each device's own block.
    branch: per owner, the program it runs (owners with equal piece shapes share).
    state_treedef: the wrapped transformation's state structure
      (``optax.MaskedNode`` s as leaves).
    roles: per state position, the index of the param leaf it belongs to, or a
      ``orthojax.optim.execution.Role`` (``SHARED``: a step count; ``MASKED``: a
      placeholder).
    state_avals: per state position, its replicated ``(shape, dtype name)`` (None if masked).
    owner_states: per owner, where its state leaves sit in its packed rows.
    state_lengths: per dtype name, the length of each owner's packed state.
    update_lengths: per dtype name, the length of each owner's packed updates
      (striped stacks' not included): the longest owner's.
    update_sharing: how the packed updates reach every device: ``"gather"`` (one
      all-gather of the owners' rows, each padded to ``update_lengths``) or ``"sum"``
      (one all-reduce of a buffer where each owner has written its row at its own
      offset, ``update_bases``, and every other device zeros), chosen by
      :func:`orthojax.optim.plan` from the bytes each moves.
  """

  num_owners: int
  axes: tuple[str, ...]
  params_treedef: Any
  param_avals: tuple[Aval, ...]
  leaves: tuple[MatrixLeaf, ...]
  replicated: tuple[int, ...]
  split: tuple[SplitMatrix, ...]
  pieces: tuple[tuple[Piece, ...], ...]
  striped: tuple[tuple[int, int], ...]
  branch: tuple[int, ...]
  state_treedef: Any
  roles: tuple[int | Role, ...]
  state_avals: tuple[Aval | None, ...]
  owner_states: tuple[OwnerState, ...]
  state_lengths: tuple[tuple[str, int], ...]
  update_lengths: tuple[tuple[str, int], ...]
  update_sharing: str = "gather"

  @functools.cached_property
  def _key(self) -> tuple[Any, ...]:
    return (self.num_owners, self.axes, self.pieces, self.split, self.params_treedef,
            self.param_avals, self.state_treedef, self.roles, self.state_lengths,
            self.update_sharing)

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: Any) -> bool:
    return self is other or (isinstance(other, UpdateLayout) and self._key == other._key)

  # ------------------------------------------------------------ Matrices --

  @functools.cached_property
  def stripe_share(self) -> dict[int, int]:
    """``{leaf: s}`` of the striped stacks."""
    return dict(self.striped)

  def leaf(self, index: int) -> MatrixLeaf:
    return self._by_index[index]

  @functools.cached_property
  def _by_index(self) -> dict[int, MatrixLeaf]:
    return {leaf.index: leaf for leaf in self.leaves}

  def owners_of(self, index: int) -> list[tuple[int, Piece]]:
    """``(owner, piece)`` of leaf ``index``, in batch order."""
    found = [(j, p) for j, mine in enumerate(self.pieces) for p in mine if p.index == index]
    return sorted(found, key=lambda jp: jp[1].start)

  def loads(self) -> list[float]:
    """The modelled cost per owner (``n p (p + 16)`` per tall ``(n, p)`` matrix it owns,
    plus its share of the split ones)."""
    shared = sum(s.cost for s in self.split)
    return [sum(self.leaf(p.index).matrix_cost * p.size for p in mine) + shared
            for mine in self.pieces]

  def piece_shape(self, piece: Piece) -> tuple[int, ...]:
    return piece_shape(self.leaf(piece.index), piece)

  def piece_size(self, piece: Piece) -> int:
    return int(np.prod(self.piece_shape(piece), dtype=np.int64))

  def update_offsets(self, owner: int) -> dict[int, int]:
    """``{leaf: offset}`` of owner ``owner``'s pieces in its packed updates (of their dtype)."""
    offsets, used = {}, {}
    for piece in self.pieces[owner]:
      if piece.index in self.stripe_share:
        continue
      dtype = self.param_avals[piece.index][1]
      offsets[piece.index] = used.get(dtype, 0)
      used[dtype] = used.get(dtype, 0) + self.piece_size(piece)
    return offsets

  @functools.cached_property
  def _used_update_lengths(self) -> tuple[dict[str, int], ...]:
    """Per owner, per dtype name, how much of its packed updates row its pieces fill."""
    return tuple(update_sizes(mine, self.param_avals, self._by_index, self.stripe_share)
                 for mine in self.pieces)

  @functools.cached_property
  def _update_bases(self) -> tuple[dict[str, int], ...]:
    bases, running = [], {d: 0 for d, _ in self.update_lengths}
    for used in self._used_update_lengths:
      bases.append(dict(running))
      running = {d: n + used.get(d, 0) for d, n in running.items()}
    return tuple(bases)

  def update_bases(self, owner: int) -> dict[str, int]:
    """Per dtype name, where owner ``owner``'s row starts in the summed buffer
    (``update_sharing == "sum"``): after every earlier owner's filled length."""
    return self._update_bases[owner]

  def summed_lengths(self) -> dict[str, int]:
    """Per dtype name, the summed buffer's length: every owner's filled length, plus one
    row's padding past the last owner's start."""
    return {d: self.update_bases(self.num_owners - 1)[d] + n for d, n in self.update_lengths}

  def piece_tree(self, leaves: Sequence[Any], pieces: Sequence[Piece],
                 starts: Sequence[Any] | None = None) -> Any:
    """The params-structured tree an owner's transformation sees: its pieces, masks elsewhere."""
    return piece_tree(self.params_treedef, self._by_index, leaves, pieces, starts)

  def replicated_tree(self, leaves: Sequence[Any]) -> Any:
    """The params-structured tree of the leaves every device updates, masks elsewhere."""
    out = [optax.MaskedNode()] * len(self.param_avals)
    for i in self.replicated:
      out[i] = leaves[i]
    return self.params_treedef.unflatten(out)

  # --------------------------------------------------------------- Split --

  def split_spec(self, index: int) -> P:
    """The ``PartitionSpec`` of split matrix ``index`` (its split axis over the owner axes)."""
    found = {s.index: s.axis for s in self.split}[index]
    ndim = len(self.param_avals[index][0])
    return P(*(self.axes if a == found else None for a in range(ndim)))

  def split_positions(self) -> dict[int, int]:
    """``{state position: split param}`` of the param-shaped state of the split matrices."""
    split = {s.index for s in self.split}
    return {k: role for k, (role, aval) in enumerate(zip(self.roles, self.state_avals))
            if role in split and aval[0] == self.param_avals[role][0]}

  # --------------------------------------------------------------- State --

  def state_axis(self, role: int, shape: tuple[int, ...]) -> int | None:
    """Along which axis a state leaf of param ``role`` splits like the param's pieces."""
    return state_axis(self.leaf(role), shape)

  def replicated_shardings(self, mesh: Any, param_shardings: Sequence[Any] | None = None
                           ) -> Any:
    """Shardings of a :class:`ShardedUpdateState`'s ``replicated`` part on ``mesh``: the
    split matrices' param-shaped state split like them; with ``param_shardings`` (one per
    param leaf, e.g. FSDP's), the param-shaped state of the leaves every device updates
    (Muon's AdamW group: embedding, head) sharded like its param; everything else
    replicated."""
    positions = self.split_positions()
    kept = set(self.replicated)
    out = []
    for k, role in enumerate(self.roles):
      if role is Role.MASKED or (role is not Role.SHARED and role not in kept):
        out.append(optax.MaskedNode())
      elif k in positions:
        out.append(NamedSharding(mesh, self.split_spec(positions[k])))
      elif (param_shardings is not None and role is not Role.SHARED
            and self.state_avals[k][0] == self.param_avals[role][0]):
        out.append(param_shardings[role])
      else:
        out.append(NamedSharding(mesh, P()))
    return self.state_treedef.unflatten(out)

  def state_bytes_per_owner(self) -> int:
    """Bytes of the matrices' state each owner holds: its packed rows, plus its share
    of the split matrices' param-shaped state."""
    split = sum(int(np.prod(self.state_avals[k][0], dtype=np.int64)) *
                np.dtype(self.state_avals[k][1]).itemsize for k in self.split_positions())
    return sum(n * np.dtype(d).itemsize for d, n in self.state_lengths) + split // self.num_owners


def update_sizes(mine: Sequence[Piece], avals: Sequence[Aval], by_index: dict[int, MatrixLeaf],
                 striped: dict[int, int]) -> dict[str, int]:
  """Per dtype name, how long one owner's packed updates are (striped stacks leave apart)."""
  sizes: dict[str, int] = {}
  for p in mine:
    if p.index in striped:
      continue
    shape, dtype = avals[p.index]
    n = int(np.prod(shape, dtype=np.int64)) // by_index[p.index].length * p.size
    sizes[dtype] = sizes.get(dtype, 0) + n
  return sizes


def piece_shape(leaf: MatrixLeaf, piece: Piece) -> tuple[int, ...]:
  """The shape of ``piece`` of ``leaf``: its layers of a stack, or the whole leaf."""
  if leaf.batch_axis is None:
    return leaf.shape
  shape = list(leaf.shape)
  shape[leaf.batch_axis] = piece.size
  return tuple(shape)


def take(x: Any, leaf: MatrixLeaf, start: Any, size: int) -> Any:
  """``size`` layers of ``x`` from ``start`` (static or traced) along ``leaf``'s batch axis."""
  if leaf.batch_axis is None:
    return x
  if isinstance(start, int):
    return jax.lax.slice_in_dim(x, start, start + size, axis=leaf.batch_axis)
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis=leaf.batch_axis)


def piece_tree(treedef: Any, by_index: dict[int, MatrixLeaf], leaves: Sequence[Any],
               pieces: Sequence[Piece], starts: Sequence[Any] | None = None) -> Any:
  """The params-structured tree of ``pieces`` (from ``starts`` if given), masks elsewhere."""
  out = [optax.MaskedNode()] * treedef.num_leaves
  for i, piece in enumerate(pieces):
    start = piece.start if starts is None else starts[i]
    out[piece.index] = take(leaves[piece.index], by_index[piece.index], start, piece.size)
  return treedef.unflatten(out)


def state_axis(leaf: MatrixLeaf, shape: tuple[int, ...]) -> int | None:
  """Along which axis a state leaf of ``shape`` splits like ``leaf``'s pieces."""
  if leaf.batch_axis is None:
    return None
  if shape == leaf.shape:
    return leaf.batch_axis
  if shape == leaf.batch_shape:
    return 0
  raise ValueError(
      f"shard_update: the wrapped transformation keeps a state leaf of shape {shape} for the "
      f"parameter of shape {leaf.shape}; only state shaped like the parameter or like its batch "
      f"axes can be split by matrices. Keep this transformation replicated.")


def is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def flatten(tree: Any) -> tuple[list[Any], Any]:
  """Leaves with ``optax.MaskedNode`` kept as leaves (positions stay aligned)."""
  return jax.tree_util.tree_flatten(tree, is_leaf=is_masked)


def dtype_name(dtype: Any) -> str:
  return np.dtype(dtype).name


def aval(x: Any) -> Aval:
  return tuple(int(s) for s in jnp.shape(x)), dtype_name(x.dtype)
