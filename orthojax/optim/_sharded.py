"""Owner-sharded updates: each matrix's update computed once, by its owner.

Data parallelism replicates the optimizer: every device computes the whole
orthogonalizing update (projection, transport, retraction, Newton–Schulz) of
every matrix, while its share of the network's work shrinks with the number of
devices. :func:`shard_update` wraps a per-leaf transformation so that

1. every matrix (in its matrix view; a scanned stack counts as its layers) has
   one *owner* among the ``N`` devices of the data-parallel mesh axes, chosen to
   balance the update's cost (:func:`orthojax.optim.assign_owners`);
2. each owner runs the wrapped transformation on its own matrices only, and
   holds their optimizer state only (per-device state ~ 1/N of the replicated
   one);
3. the owners' new updates are shared by ``all_gather`` s over those axes, one
   of the packed updates per dtype; a *striped* stack (owner ``j`` holding
   layers ``[j s, (j + 1) s)``, as :func:`orthojax.optim.assign_owners` lays out
   a lone stack), zero-padded to ``N s`` layers, enters and leaves as each
   device's own block of layers instead, so that under FSDP the compiler moves
   it with all-to-alls and no device holds the whole stack.

Vectors and scalars (biases, scales, anything without a matrix view) are
cheap and stay replicated: every device updates them, as before.

Split matrices (``split_above``, off by default): one owner per matrix cannot
bring the most loaded device below the largest matrix (ResNet-50's
``1 x 1 x 1024 x 2048`` projection kernel is 19 % of its conv kernels' update
cost, 3.1x the mean load on 16 owners). A single matrix above ``split_above``
times the mean owner load (and with an axis to split, see ``_split_matrix``)
is instead updated by all owners together: its gradient, parameter and
param-shaped state are constrained to have one side of the matrix view (the
long one where it divides) split over the owner axes, and the compiler (GSPMD)
partitions the wrapped transformation's products. Each owner then does
``1/N`` of the ``n``-long work and repeats the ``p x p`` work; the price is an
all-reduce of a ``p x p`` partial product (a Gram matrix) per contracted
product, *inside* the Newton–Schulz / Cayley iterations — the very collectives
whole-matrix ownership avoids (goodfire-ai/spd measured a 3.3x step-time loss
when every matrix was split that way), which is why it is opt-in and meant for
the few largest matrices only.

Execution: a ``jax.shard_map`` over the mesh whose body switches
(``lax.switch`` on ``lax.axis_index``) to its owner's program; owners whose
pieces have the same shapes (e.g. equal chunks of one stack) share one branch
and differ only in their slice offsets, so a stack compiles once however many
devices share it. No collective runs inside an orthogonalization: the only
collectives the wrapper adds are the all-gathers of the finished updates (and the
gradients arrive all-reduced, as for the replicated update). Dion
(microsoft/dion) shares same-shape stacks with all-to-alls; here whole
matrices of any shape are assigned, which is what ResNet-style kernels with
many distinct shapes need.

Exactness: an owner computes its matrices with the same operations as the
replicated update computes them (a stack is sliced along its batch axis, which
batched matrix products treat independently), so the sharded step equals the
replicated one to float rounding: within a few ulps in float32 on XLA:CPU, not
bit for bit, because XLA fuses the element-wise work of the per-device program
differently.

State: a :class:`ShardedUpdateState` — one flat buffer per dtype of shape
``(N, length)``, row ``j`` the packed state of owner ``j`` (sharded over the
owner axes), plus the replicated leaves' state. :func:`replicated_state`
turns it into exactly the state the wrapped transformation would have without
sharding (checkpoints are written that way, so they restore on any device
count, sharded or not); :func:`sharded_state` is the inverse.

Requirement on the wrapped transformation: it must be *per leaf* — a leaf's
update depends on that leaf's gradient, parameter and state only (plus shared
counters such as a step count). Every orthojax optimizer and optax's
element-wise ones are; a global-norm clip or a penalty summed over leaves is
not, and must stay outside the wrapper.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from orthojax import linalg
from orthojax.optim._owners import (MatrixLeaf, Piece, assign_owners, matrix_cost, split_cost,
                                    split_matrices)

DEFAULT_AXES = ("data", "fsdp")
_MASKED = -2   # role of a canonical state position that holds an optax.MaskedNode
_SHARED = -1   # role of a state leaf that is not per parameter (step counts, ...)


def _is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def _flatten(tree: Any) -> tuple[list[Any], Any]:
  """Leaves with ``optax.MaskedNode`` kept as leaves (positions stay aligned)."""
  return jax.tree_util.tree_flatten(tree, is_leaf=_is_masked)


def _dtype_name(dtype: Any) -> str:
  return np.dtype(dtype).name


# ------------------------------------------------------------------ Layout --

@dataclasses.dataclass(frozen=True)
class _OwnerState:
  """Where owner ``j``'s state leaves sit in its packed rows.

  ``entries[k]`` is None for a canonical position this owner does not hold,
  else ``(shape, dtype name, offset)``.
  """

  entries: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class SplitMatrix:
  """A single matrix all owners update together (``split_above``).

  Attributes:
    index: its position among the params' leaves.
    axis: the parameter axis split over the owner axes (the outermost axis of a
      side of the matrix view, as :func:`orthojax.optim.shard_update` describes).
    cost: the modelled cost each owner carries (:func:`orthojax.optim.split_cost`).
  """

  index: int
  axis: int
  cost: float


@dataclasses.dataclass(frozen=True, eq=False)
class UpdateLayout:
  """The static plan of a sharded update: owners, pieces, and the state packing.

  A function of the parameters' shapes, views and the owner count only, so it
  is rebuilt identically wherever the same tree is sharded the same way.

  Attributes:
    num_owners: devices that own matrices (the product of the owner axes).
    axes: the mesh axes the owners run along.
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
    params_treedef: the params' tree structure.
    param_avals: per leaf of params, ``(shape, dtype name)``.
    state_treedef: the wrapped transformation's state structure
      (``optax.MaskedNode`` s as leaves).
    roles: per state position, the param leaf it belongs to, ``_SHARED`` or ``_MASKED``.
    state_avals: per state position, its replicated ``(shape, dtype name)`` (None if masked).
    owner_states: per owner, where its state leaves sit in its packed rows.
    state_lengths: per dtype name, the length of each owner's packed state.
    update_lengths: per dtype name, the length of each owner's packed updates
      (striped stacks' not included).
  """

  num_owners: int
  axes: tuple[str, ...]
  leaves: tuple[MatrixLeaf, ...]
  replicated: tuple[int, ...]
  split: tuple[SplitMatrix, ...]
  pieces: tuple[tuple[Piece, ...], ...]
  striped: tuple[tuple[int, int], ...]
  branch: tuple[int, ...]
  params_treedef: Any
  param_avals: tuple[tuple[tuple[int, ...], str], ...]
  state_treedef: Any
  roles: tuple[int, ...]
  state_avals: tuple[Any, ...]
  owner_states: tuple[Any, ...]
  state_lengths: tuple[tuple[str, int], ...]
  update_lengths: tuple[tuple[str, int], ...]

  @functools.cached_property
  def _key(self) -> tuple[Any, ...]:
    return (self.num_owners, self.axes, self.pieces, self.split, self.params_treedef,
            self.param_avals, self.state_treedef, self.roles, self.state_lengths)

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: Any) -> bool:
    return self is other or (isinstance(other, UpdateLayout) and self._key == other._key)

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
      if role == _SHARED or role in kept:
        if k in positions:
          out.append(NamedSharding(mesh, self.split_spec(positions[k])))
        elif (param_shardings is not None and role != _SHARED
              and self.state_avals[k][0] == self.param_avals[role][0]):
          out.append(param_shardings[role])
        else:
          out.append(NamedSharding(mesh, P()))
      else:
        out.append(optax.MaskedNode())
    return self.state_treedef.unflatten(out)

  def state_bytes_per_owner(self) -> int:
    """Bytes of the matrices' state each owner holds: its packed rows, plus its share
    of the split matrices' param-shaped state."""
    split = sum(int(np.prod(self.state_avals[k][0], dtype=np.int64)) *
                np.dtype(self.state_avals[k][1]).itemsize for k in self.split_positions())
    return sum(n * np.dtype(d).itemsize for d, n in self.state_lengths) + split // self.num_owners


def _split_matrix(leaf: MatrixLeaf, view: Any, name: str, num_owners: int
                  ) -> SplitMatrix | None:
  """``leaf`` split over ``num_owners`` (the axis ``plan`` describes), or None."""
  lo = linalg.layout(leaf.shape, view, name)
  inner = lo.perm[len(lo.batch_shape):]
  k, size = 0, 1
  while size < lo.fan_in:
    size *= leaf.shape[inner[k]]
    k += 1
  fan_in, fan_out = inner[:k], inner[k:]
  for side in ((fan_out, fan_in) if lo.transposed else (fan_in, fan_out)):
    outer = [a for a in side if leaf.shape[a] > 1][:1]
    if outer and leaf.shape[outer[0]] % num_owners == 0:
      return SplitMatrix(leaf.index, outer[0], split_cost(lo.fan_in, lo.fan_out, num_owners))
  return None


def _matrix_leaf(index: int, leaf: Any, view: Any, name: str) -> MatrixLeaf | None:
  """The owner-updated description of a leaf, or None for a replicated one."""
  if view is False or jnp.ndim(leaf) < 2:
    return None
  lo = linalg.layout(jnp.shape(leaf), view, name)
  batch_axes = lo.perm[:len(lo.batch_shape)]
  inner = int(np.prod([lo.shape[a] for a in batch_axes[1:]], dtype=np.int64))
  return MatrixLeaf(index, lo.shape, batch_axes, matrix_cost(lo.fan_in, lo.fan_out) * inner)


def _stripe_share(leaf: MatrixLeaf, pieces: Sequence[Sequence[Piece]]) -> int:
  """``s`` where owner ``j`` holds layers ``[j s, (j + 1) s)`` of ``leaf`` (clipped to
  its length; owners past its end none), else 0."""
  first = [p for p in pieces[0] if p.index == leaf.index]
  if leaf.batch_axis is None or not first or first[0].start != 0:
    return 0
  s = first[0].size
  for j, mine in enumerate(pieces):
    expected = Piece(leaf.index, j * s, min((j + 1) * s, leaf.length))
    held = [p for p in mine if p.index == leaf.index]
    if held != ([expected] if expected.start < leaf.length else []):
      return 0
  return s


def _slice(x: Any, leaf: MatrixLeaf, start: Any, size: int) -> Any:
  if leaf.batch_axis is None:
    return x
  if isinstance(start, int):
    return jax.lax.slice_in_dim(x, start, start + size, axis=leaf.batch_axis)
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis=leaf.batch_axis)


def _piece_tree(layout: UpdateLayout, leaves: Sequence[Any], pieces: Sequence[Piece],
                starts: Sequence[Any] | None = None) -> Any:
  """The params-structured tree an owner's transformation sees: its pieces, masks elsewhere."""
  out = [optax.MaskedNode()] * len(layout.param_avals)
  for i, piece in enumerate(pieces):
    start = piece.start if starts is None else starts[i]
    out[piece.index] = _slice(leaves[piece.index], layout.leaf(piece.index), start, piece.size)
  return layout.params_treedef.unflatten(out)


def _replicated_tree(layout: UpdateLayout, leaves: Sequence[Any]) -> Any:
  out = [optax.MaskedNode()] * len(layout.param_avals)
  for i in layout.replicated:
    out[i] = leaves[i]
  return layout.params_treedef.unflatten(out)


def _aval(x: Any) -> tuple[tuple[int, ...], str]:
  return tuple(int(s) for s in jnp.shape(x)), _dtype_name(x.dtype)


def _state_axis(layout: UpdateLayout, role: int, shape: tuple[int, ...]) -> int | None:
  """Along which axis a state leaf of param ``role`` splits like the param's pieces."""
  leaf = layout.leaf(role)
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


def plan(tx: optax.GradientTransformation, params: Any, *, num_owners: int,
         axes: Sequence[str] = DEFAULT_AXES, views: Any = None,
         split_above: float | None = None, stripe_stacks: bool = False) -> UpdateLayout:
  """The :class:`UpdateLayout` of sharding ``tx``'s update of ``params`` over ``num_owners``.

  ``params`` may be arrays or ``ShapeDtypeStruct`` s; ``split_above`` as in
  :func:`shard_update`. A split matrix's axis is the outermost axis longer than 1
  of its view's long side, or of the short side where the long side's does not
  divide by ``num_owners`` (none: it stays whole): the view's reshape merges a
  side's axes with that one outermost, so the merged dimension stays split in
  blocks. Splitting an inner axis (a 3 x 3 kernel's input channels) interleaves
  it, and the TPU compiler gathers the whole matrix on every device.
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  names = linalg.leaf_names(params)
  per_view = linalg.views_for(params, views)
  matrices, replicated = [], []
  for i, (leaf, view, name) in enumerate(zip(leaves, per_view, names)):
    described = _matrix_leaf(i, leaf, view, name)
    if described is None:
      replicated.append(i)
    else:
      matrices.append(described)
  candidates = {leaf.index: _split_matrix(leaf, per_view[leaf.index], names[leaf.index],
                                          num_owners) for leaf in matrices}
  splittable = [i for i, c in candidates.items() if c is not None]
  to_split = set(split_matrices(matrices, num_owners, split_above, splittable))
  split = tuple(candidates[leaf.index] for leaf in matrices if leaf.index in to_split)
  matrices = [leaf for leaf in matrices if leaf.index not in to_split]
  replicated = sorted(replicated + list(to_split))
  pieces = assign_owners(matrices, num_owners, stripe_stacks=stripe_stacks)
  striped = tuple((leaf.index, share) for leaf in matrices
                  if (share := _stripe_share(leaf, pieces)))
  signatures: dict[tuple[tuple[int, int], ...], int] = {}
  branch = tuple(signatures.setdefault(tuple((p.index, p.size) for p in mine), len(signatures))
                 for mine in pieces)
  avals = tuple(_aval(x) for x in leaves)
  abstract = [jax.ShapeDtypeStruct(s, d) for s, d in avals]

  canonical = jax.eval_shape(tx.init, treedef.unflatten(abstract))
  state_leaves, state_treedef = _flatten(canonical)
  index_tree = treedef.unflatten(list(range(len(leaves))))
  roles_tree = optax.tree_map_params(
      tx, lambda _, i: i, canonical, index_tree,
      transform_non_params=lambda v: jax.tree.map(lambda _: _SHARED, v, is_leaf=_is_masked),
      is_leaf=lambda x: _is_masked(x) or isinstance(x, jax.ShapeDtypeStruct))
  roles = tuple(_MASKED if _is_masked(r) or _is_masked(x) else int(r)
                for r, x in zip(_flatten(roles_tree)[0], state_leaves))
  state_avals = tuple(None if _is_masked(x) else _aval(x) for x in state_leaves)

  layout = UpdateLayout(
      num_owners=num_owners, axes=tuple(axes), leaves=tuple(matrices),
      replicated=tuple(replicated), split=split, pieces=pieces, striped=striped, branch=branch,
      params_treedef=treedef,
      param_avals=avals, state_treedef=state_treedef, roles=roles, state_avals=state_avals,
      owner_states=(), state_lengths=(), update_lengths=())
  owned_leaves = {leaf.index for leaf in matrices}
  for role, aval in zip(roles, state_avals):
    if role in owned_leaves:
      _state_axis(layout, role, aval[0])   # raises for state that cannot be split

  owner_states, state_len, update_len = [], {}, {}
  for j, mine in enumerate(pieces):
    owned = jax.eval_shape(lambda leaves, mine=mine: tx.init(_piece_tree(layout, leaves, mine)),
                           abstract)   # sliced under eval_shape: abstract params allowed
    got, got_treedef = _flatten(owned)
    if got_treedef != state_treedef:
      raise ValueError("shard_update: the wrapped transformation's state structure depends on "
                       "which parameters it is given; it is not a per-leaf transformation")
    offsets: dict[str, int] = {}
    entries = []
    for role, x in zip(roles, got):
      if _is_masked(x):
        entries.append(None)
        continue
      shape, dtype = _aval(x)
      entries.append((shape, dtype, offsets.get(dtype, 0)))
      offsets[dtype] = offsets.get(dtype, 0) + int(np.prod(shape, dtype=np.int64))
    owner_states.append(_OwnerState(tuple(entries)))
    for dtype, n in offsets.items():
      state_len[dtype] = max(state_len.get(dtype, 0), n)
    sizes: dict[str, int] = {}
    for p in mine:
      if p.index in layout.stripe_share:
        continue
      shape, dtype = avals[p.index]
      n = int(np.prod(shape, dtype=np.int64)) // layout.leaf(p.index).length * p.size
      sizes[dtype] = sizes.get(dtype, 0) + n
    for dtype, n in sizes.items():
      update_len[dtype] = max(update_len.get(dtype, 0), n)
  return dataclasses.replace(
      layout, owner_states=tuple(owner_states),
      state_lengths=tuple(sorted(state_len.items())),
      update_lengths=tuple(sorted(update_len.items())))


# ------------------------------------------------------------------- State --

@jax.tree_util.register_pytree_with_keys_class
class ShardedUpdateState:
  """The state of :func:`shard_update`.

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


def _pack(values: Sequence[Any], lengths: dict[str, int]) -> dict[str, Any]:
  """Ravel and concatenate per dtype, zero-padded to ``lengths``."""
  parts: dict[str, list[Any]] = {d: [] for d in lengths}
  for v in values:
    parts[_dtype_name(v.dtype)].append(jnp.ravel(v))
  out = {}
  for dtype, length in lengths.items():
    flat = jnp.concatenate(parts[dtype]) if parts[dtype] else jnp.zeros([0], dtype)
    out[dtype] = jnp.pad(flat, (0, length - flat.shape[0]))
  return out


def _unpack_state(layout: UpdateLayout, owner: int, rows: dict[str, Any]) -> list[Any]:
  out = []
  for entry in layout.owner_states[owner].entries:
    if entry is None:
      out.append(optax.MaskedNode())
      continue
    shape, dtype, offset = entry
    n = int(np.prod(shape, dtype=np.int64))
    out.append(jax.lax.slice_in_dim(rows[dtype], offset, offset + n).reshape(shape))
  return out


def _pack_state(layout: UpdateLayout, owner: int, state_leaves: Sequence[Any]) -> dict[str, Any]:
  values = [x for x, e in zip(state_leaves, layout.owner_states[owner].entries) if e is not None]
  return _pack(values, dict(layout.state_lengths))


def replicated_state(state: Any) -> Any:
  """``state`` with every :class:`ShardedUpdateState` replaced by the wrapped state.

  The result is exactly the state the wrapped transformation keeps when it is
  not sharded (same structure, shapes and values), so it can be saved, read,
  or restored into a replicated run or onto another device count
  (:func:`sharded_state`). Works on global arrays, inside or outside ``jit``.
  """
  def convert(node):
    if not isinstance(node, ShardedUpdateState):
      return node
    layout = node.layout
    owners = [_unpack_state(layout, j, {d: node.owned[d][j] for d in node.owned})
              for j in range(layout.num_owners)]
    rest = _flatten(node.replicated)[0]
    replicated = set(layout.replicated)
    out = []
    for k, role in enumerate(layout.roles):
      if role == _MASKED or role == _SHARED or role in replicated:
        out.append(rest[k])
        continue
      parts = [owners[j][k] for j, _ in layout.owners_of(role)]
      axis = _state_axis(layout, role, layout.state_avals[k][0])
      out.append(parts[0] if axis is None else jnp.concatenate(parts, axis=axis))
    return layout.state_treedef.unflatten(out)

  return jax.tree.map(convert, state, is_leaf=lambda x: isinstance(x, ShardedUpdateState))


def sharded_state(state: Any, like: Any) -> Any:
  """The inverse of :func:`replicated_state`: ``state`` in the layout of ``like``.

  Args:
    state: a replicated-layout optimizer state (e.g. restored from a checkpoint).
    like: a state (or its ``jax.eval_shape``) of the sharded transformation,
      whose :class:`ShardedUpdateState` nodes give the layout.
  """
  def convert(target, canonical):
    if not isinstance(target, ShardedUpdateState):
      return canonical
    layout = target.layout
    leaves = _flatten(canonical)[0]
    rows: dict[str, list[Any]] = {d: [] for d, _ in layout.state_lengths}
    for j, mine in enumerate(layout.pieces):
      held = {p.index: p for p in mine}
      owner = []
      for k, (role, entry) in enumerate(zip(layout.roles, layout.owner_states[j].entries)):
        if entry is None:
          owner.append(None)
        elif role < 0:
          owner.append(leaves[k])
        else:
          axis = _state_axis(layout, role, layout.state_avals[k][0])
          piece = held[role]
          owner.append(leaves[k] if axis is None else jax.lax.slice_in_dim(
              leaves[k], piece.start, piece.stop, axis=axis))
      for dtype, row in _pack_state(layout, j, owner).items():
        rows[dtype].append(row)
    owned = {d: jnp.stack(r) for d, r in rows.items()}
    rest = []
    replicated = set(layout.replicated)
    for k, role in enumerate(layout.roles):
      keep = role == _SHARED or role in replicated
      rest.append(leaves[k] if keep else optax.MaskedNode())
    return ShardedUpdateState(owned, layout.state_treedef.unflatten(rest), layout)

  return jax.tree.map(convert, like, state, is_leaf=lambda x: isinstance(x, ShardedUpdateState))


# -------------------------------------------------------------- Transform --

def owner_axes(mesh: Any, axes: Sequence[str] | None = None) -> tuple[str, ...]:
  """The mesh axes owners run along: ``axes``, or those of ("data", "fsdp") the mesh has."""
  names = tuple(mesh.axis_names)
  if axes is None:
    axes = tuple(a for a in DEFAULT_AXES if a in names)
    if not axes:
      raise ValueError(f"shard_update: the mesh has axes {names} and neither 'data' nor "
                       f"'fsdp'; pass axes=(...) naming its data-parallel axes")
  axes = tuple(axes)
  missing = [a for a in axes if a not in names]
  if missing:
    raise ValueError(f"shard_update: axes {missing} are not axes of the mesh {names}")
  return axes


def num_owners(mesh: Any, axes: Sequence[str] | None = None) -> int:
  """How many devices own matrices: the product of the owner axes' sizes."""
  return int(np.prod([mesh.shape[a] for a in owner_axes(mesh, axes)]))


def _place(x: Any, sharding: NamedSharding) -> Any:
  """``x`` laid out as ``sharding``, on Auto (GSPMD) and Explicit meshes alike."""
  explicit = jax.sharding.AxisType.Explicit
  if any(t == explicit for t in getattr(sharding.mesh, "axis_types", ())):
    return jax.sharding.reshard(x, sharding)
  return jax.lax.with_sharding_constraint(x, sharding)


def _update_offsets(layout: UpdateLayout, owner: int) -> dict[int, int]:
  offsets, used = {}, {}
  for piece in layout.pieces[owner]:
    if piece.index in layout.stripe_share:
      continue
    dtype = layout.param_avals[piece.index][1]
    offsets[piece.index] = used.get(dtype, 0)
    used[dtype] = used.get(dtype, 0) + _piece_size(layout, piece)
  return offsets


def _block(layout: UpdateLayout, index: int, share: int, mine: Sequence[Piece],
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


def _piece_shape(layout: UpdateLayout, piece: Piece) -> tuple[int, ...]:
  leaf = layout.leaf(piece.index)
  if leaf.batch_axis is None:
    return leaf.shape
  shape = list(leaf.shape)
  shape[leaf.batch_axis] = piece.size
  return tuple(shape)


def _piece_size(layout: UpdateLayout, piece: Piece) -> int:
  return int(np.prod(_piece_shape(layout, piece), dtype=np.int64))


def shard_update(tx: optax.GradientTransformation, mesh: Any, *, views: Any = None,
                 axes: Sequence[str] | None = None,
                 split_above: float | None = None,
                 stripe_stacks: bool = False) -> optax.GradientTransformation:
  """``tx`` with each matrix's update computed once, by its owner device.

  Example, in a hand-written loop over a ``("data",)`` mesh::

      mesh = jax.make_mesh((8,), ("data",))
      tx = oj.optim.shard_update(oj.optim.radam(1e-3), mesh, views=views)
      state = jax.jit(tx.init)(params)
      updates, state = jax.jit(tx.update)(grads, state, params)

  The trainer does this for every orthogonalizing optimizer when
  ``config.mesh.shard_update`` is true (the default); see the module docstring
  for the design and :func:`replicated_state` for checkpoints.

  Args:
    tx: a per-leaf transformation (every orthojax optimizer, or your own).
    mesh: the ``jax.sharding.Mesh`` the step runs on (real or abstract devices).
    views: the per-leaf matrix views ``tx`` uses (``orthojax.linalg.map_views``);
      leaves without a matrix view (rank < 2, or a view ``False``) are updated
      on every device.
    axes: the mesh axes whose devices own matrices (default: those of
      ``("data", "fsdp")`` the mesh has). Devices along other axes (``model``)
      repeat their owner's work.
    split_above: split a single matrix whose modelled cost is above this multiple
      of the mean owner load over all owners (one axis sharded: the outermost axis
      longer than 1 of its view's long side, or of the short side where that one's
      does not divide by the owner count; the products partitioned by the
      compiler, with collectives inside its iterations; see the module
      docstring). ``None`` (default): every matrix has one owner and no collective
      runs inside an orthogonalization.

    stripe_stacks: stripe every stacked leaf over all owners
      (:func:`orthojax.optim.assign_owners`), so that its gradient, parameter and update
      move as each owner's block of layers (all-to-alls under FSDP) rather than whole to
      every device. The trainer sets it when ``config.mesh.fsdp`` > 1.

  Returns:
    A ``GradientTransformation`` with the same updates as ``tx`` (to float
    rounding) and a :class:`ShardedUpdateState`; ``tx`` itself when there is a
    single owner.
  """
  axes = owner_axes(mesh, axes)
  owners = num_owners(mesh, axes)
  if split_above is not None and not split_above > 0:
    raise ValueError(f"shard_update: split_above={split_above!r}; pass a positive multiple of "
                     f"the mean owner load (e.g. 1.0), or None to split nothing")
  if owners == 1:
    return tx
  layouts: dict[Any, UpdateLayout] = {}

  def layout_for(params):
    leaves, treedef = jax.tree_util.tree_flatten(params)
    key = (treedef, tuple(_aval(x) for x in leaves))
    if key not in layouts:
      layouts[key] = plan(tx, params, num_owners=owners, axes=axes, views=views,
                          split_above=split_above, stripe_stacks=stripe_stacks)
    return layouts[key]

  rows_sharding = NamedSharding(mesh, P(axes))

  def init_fn(params):
    layout = layout_for(params)
    leaves = jax.tree_util.tree_leaves(params)
    rows: dict[str, list[Any]] = {d: [] for d, _ in layout.state_lengths}
    for j, mine in enumerate(layout.pieces):
      state = tx.init(_piece_tree(layout, leaves, mine))
      for dtype, row in _pack_state(layout, j, _flatten(state)[0]).items():
        rows[dtype].append(row)
    owned = {d: _place(jnp.stack(r), rows_sharding) for d, r in rows.items()}
    rest = _constrain_split(layout, mesh, tx.init(_replicated_tree(layout, leaves)))
    return ShardedUpdateState(owned, rest, layout)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("shard_update needs the current params: call tx.update(updates, state, params)")
    layout = layout_for(params)
    if not isinstance(state, ShardedUpdateState) or state.layout != layout:
      raise ValueError("shard_update: the state was not made by this transformation's init for "
                       "these params (convert a replicated state with oj.optim.sharded_state)")
    p_leaves = jax.tree_util.tree_leaves(params)
    g_leaves = layout.params_treedef.flatten_up_to(updates)
    for leaf in layout.leaves:
      g, p = g_leaves[leaf.index], p_leaves[leaf.index]
      if g.dtype != p.dtype:
        raise ValueError(f"shard_update: a gradient of dtype {g.dtype} for a parameter of dtype "
                         f"{p.dtype}; cast the gradients to the parameters' dtype first")
    g_leaves, p_leaves = list(g_leaves), list(p_leaves)
    # The compiler partitions the split matrices' updates over the owners. Each enters
    # pinned whole first: without the pin the TPU partitioner carries the split back
    # into the backward pass (ResNet-50 on v5e:4x4: 132 collective-permutes, +10 % FLOPs).
    whole = NamedSharding(mesh, P())
    for split in layout.split:
      at = NamedSharding(mesh, layout.split_spec(split.index))
      g_leaves[split.index] = _place(_place(g_leaves[split.index], whole), at)
      p_leaves[split.index] = _place(_place(p_leaves[split.index], whole), at)
    rest_updates, rest_state = tx.update(_replicated_tree(layout, g_leaves),
                                         _constrain_split(layout, mesh, state.replicated),
                                         _replicated_tree(layout, p_leaves))
    rest_state = _constrain_split(layout, mesh, rest_state)
    rest_updates = layout.params_treedef.flatten_up_to(rest_updates)

    owned = [leaf.index for leaf in layout.leaves]
    striped = layout.stripe_share
    # A striped stack, zero-padded to owners × share layers, enters and leaves as each
    # device's own block of layers: under FSDP the compiler moves it between the
    # parameter's sharding and the owners' blocks with all-to-alls, and no device holds
    # a whole stack (GPT-2 small on v5e:8x8: 576 MiB gathered per chip otherwise).
    blocked = set(striped)
    representative = {}
    for j, b in enumerate(layout.branch):
      representative.setdefault(b, j)
    max_pieces = max(len(m) for m in layout.pieces)
    starts = np.zeros((owners, max(max_pieces, 1)), np.int32)
    for j, mine in enumerate(layout.pieces):
      starts[j, :len(mine)] = [p.start for p in mine]
    update_lengths = dict(layout.update_lengths)

    def run(rep, p_owned, g_owned, rows, my_starts):
      p_all = [None] * len(layout.param_avals)
      g_all = [None] * len(layout.param_avals)
      for i, p, g in zip(owned, p_owned, g_owned):
        p_all[i], g_all[i] = p, g
      mine = layout.pieces[rep]
      piece_starts = [0 if p.index in blocked else my_starts[k] for k, p in enumerate(mine)]
      state_j = layout.state_treedef.unflatten(_unpack_state(layout, rep, rows))
      new_u, new_state = tx.update(_piece_tree(layout, g_all, mine, piece_starts), state_j,
                                   _piece_tree(layout, p_all, mine, piece_starts))
      u_leaves = layout.params_treedef.flatten_up_to(new_u)
      u_packed = _pack([u_leaves[p.index].astype(g_all[p.index].dtype) for p in mine
                        if p.index not in striped], update_lengths)
      u_striped = tuple(_block(layout, i, share, mine, u_leaves, g_all[i].dtype)
                        for i, share in layout.striped)
      return u_packed, u_striped, _pack_state(layout, rep, _flatten(new_state)[0])

    def body(p_owned, g_owned, rows):
      j = jax.lax.axis_index(axes)
      rows = {d: r[0] for d, r in rows.items()}
      my_starts = jnp.asarray(starts)[j]
      branches = [functools.partial(run, representative[b]) for b in range(len(representative))]
      branch_of = jnp.asarray(layout.branch, jnp.int32)[j]
      u_packed, u_striped, s_packed = jax.lax.switch(branch_of, branches, p_owned, g_owned,
                                                     rows, my_starts)
      with jax.named_scope("owner_sharded"):
        return share(u_packed, u_striped, s_packed)

    def share(u_packed, u_striped, s_packed):
      gathered = {d: jax.lax.all_gather(v, axes) for d, v in u_packed.items()}
      in_place = {}
      for (i, _), u in zip(layout.striped, u_striped):
        in_place[i] = u   # this owner's block; out_specs tile the blocks into the stack
      offsets = [_update_offsets(layout, j_) for j_ in range(owners)]
      full = []
      for leaf in layout.leaves:
        if leaf.index in in_place:
          full.append(in_place[leaf.index])
          continue
        dtype = layout.param_avals[leaf.index][1]
        parts = []
        for owner, piece in layout.owners_of(leaf.index):
          start = offsets[owner][leaf.index]
          flat = jax.lax.slice_in_dim(gathered[dtype][owner], start,
                                      start + _piece_size(layout, piece))
          parts.append(flat.reshape(_piece_shape(layout, piece)))
        full.append(parts[0] if len(parts) == 1 else
                    jnp.concatenate(parts, axis=leaf.batch_axis))
      return tuple(full), {d: s[None] for d, s in s_packed.items()}

    # The owners' ops keep the wrapped transformation's own scope names; the sharing
    # (all-gather and unpacking) is named "owner_sharded".
    def spec(i):   # a blocked stack's layers split over the owners, the rest whole
      if i not in blocked:
        return P()
      axis, ndim = layout.leaf(i).batch_axis, len(layout.param_avals[i][0])
      return P(*(axes if a == axis else None for a in range(ndim)))

    def padded(x, i):   # a striped stack to owners × share layers
      if i not in blocked:
        return x
      leaf = layout.leaf(i)
      extra = striped[i] * owners - leaf.length
      if extra == 0:
        return x
      pad = [(0, 0)] * x.ndim
      pad[leaf.batch_axis] = (0, extra)
      return jnp.pad(x, pad)

    leaf_specs = tuple(spec(i) for i in owned)
    sharded = jax.shard_map(body, mesh=mesh, in_specs=(leaf_specs, leaf_specs, P(axes)),
                            out_specs=(leaf_specs, P(axes)), check_vma=False)
    full, new_rows = sharded(tuple(padded(p_leaves[i], i) for i in owned),
                             tuple(padded(g_leaves[i], i) for i in owned), state.owned)
    out = list(rest_updates)
    for i, u in zip(owned, full):
      if i in blocked:
        leaf = layout.leaf(i)
        u = jax.lax.slice_in_dim(u, 0, leaf.length, axis=leaf.batch_axis)
      out[i] = u
    return (layout.params_treedef.unflatten(out),
            ShardedUpdateState(new_rows, rest_state, layout))

  return optax.GradientTransformation(init_fn, update_fn)


def _constrain_split(layout: UpdateLayout, mesh: Any, rest: Any) -> Any:
  """The replicated part of the state with the split matrices' state split like them."""
  if not layout.split:
    return rest
  return jax.tree.map(lambda x, at: x if _is_masked(x) else _place(x, at),
                      rest, layout.replicated_shardings(mesh), is_leaf=_is_masked)


# ----------------------------------------------------------------- Context --

_CONTEXT: contextvars.ContextVar[Any] = contextvars.ContextVar("orthojax_shard_update",
                                                               default=None)


@contextlib.contextmanager
def sharded_updates(mesh: Any, axes: Sequence[str] | None = None,
                    split_above: float | None = None, stripe_stacks: bool = False):
  """Build orthojax's orthogonalizing optimizers owner-sharded over ``mesh`` in this block.

  Inside the block ``oj.optim.radam(...)`` (and ``rsgd``, ``projected_gradient``,
  ``cayley_sgd``, ``cayley_adam``, ``landing``, ``muon``, ``stiefel_muon``,
  ``fused_stiefel_adam``) returns ``shard_update(<the optimizer>, mesh,
  views=<its views>, split_above=split_above, stripe_stacks=stripe_stacks)``; the
  trainer builds a run's
  optimizer this way. It affects construction only: a transformation built
  outside keeps its layout.
  """
  owner_axes(mesh, axes)   # validate now
  token = _CONTEXT.set((mesh, axes, split_above, stripe_stacks))
  try:
    yield
  finally:
    _CONTEXT.reset(token)


def owner_sharded(constructor: Callable[..., optax.GradientTransformation]
                  ) -> Callable[..., optax.GradientTransformation]:
  """Decorate an optimizer constructor to honour :func:`sharded_updates`."""
  signature = inspect.signature(constructor)

  @functools.wraps(constructor)
  def build(*args: Any, **kwargs: Any) -> optax.GradientTransformation:
    context = _CONTEXT.get()
    if context is None:
      return constructor(*args, **kwargs)
    token = _CONTEXT.set(None)   # the constructor's own parts are not sharded again
    try:
      tx = constructor(*args, **kwargs)
    finally:
      _CONTEXT.reset(token)
    views = signature.bind(*args, **kwargs).arguments.get("views")
    mesh, axes, split_above, stripe_stacks = context
    return shard_update(tx, mesh, views=views, axes=axes, split_above=split_above,
                        stripe_stacks=stripe_stacks)

  return build
