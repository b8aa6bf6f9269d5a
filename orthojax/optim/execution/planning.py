"""Building the plan of a sharded update: :func:`plan`.

Four steps, each its own function: describe the parameters (which leaves are
matrices owners update, which every device updates, which single matrices all
owners split), assign the matrices' pieces to owners
(:func:`orthojax.optim.assign_owners`), read the wrapped transformation's state
structure (which state leaf belongs to which parameter), and lay out each owner's
packed state and updates. The result, an :class:`UpdateLayout`, is built once and
complete.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from orthojax import linalg
from orthojax.optim.execution.layout import (OwnerState, Role, Slot, SplitMatrix, UpdateLayout,
                                             aval, flatten, is_masked, piece_tree, state_axis,
                                             update_sizes)
from orthojax.optim.execution.owners import (DEFAULT_AXES, MatrixLeaf, Piece, assign_owners,
                                             matrix_cost, split_cost, split_matrices)


def plan(tx: optax.GradientTransformation, params: Any, *, num_owners: int,
         axes: Sequence[str] = DEFAULT_AXES, views: Any = None,
         split_above: float | None = None, stripe_stacks: bool = False) -> UpdateLayout:
  """The :class:`UpdateLayout` of sharding ``tx``'s update of ``params`` over ``num_owners``.

  ``params`` may be arrays or ``ShapeDtypeStruct`` s; ``split_above`` as in
  :func:`shard_update`.

  Each matrix is one of three kinds. *Replicated*: no matrix view (vectors, scalars),
  updated by every device. *Owned*: updated whole by one owner, assigned by the cost
  model of ``orthojax.optim.execution.owners`` (``n p (p + 16)`` per tall ``n x p``
  view). *Split by rows*: a single matrix whose cost is above ``split_above`` times
  the mean owner load, and whose view's long side has an axis ``num_owners`` divides
  (the outermost such axis); each owner then does ``1/N`` of its ``n``-long work and
  repeats its ``p x p`` work, at the price of one all-reduce of a ``p x p`` Gram
  matrix per product contracted over the rows (the sum of the row blocks' own) and no
  gather of the matrix. Such a split needs a side's axes to be consecutive: when the
  axis is an inner one (a 3 x 3 kernel's input channels), the update moves it to the
  front of its side, so the view's reshape keeps the rows split in blocks, and the
  transformation sees the rows permuted — which every orthojax update commutes with
  (each is equivariant under a permutation of the rows). A matrix with no such axis
  stays owned: splitting its short side would make every product gather it (the
  TPU compiler did: 1.6 GiB per chip per step for ResNet-50 on ``v5e:4x4``).

  The finished updates reach every device by one collective per dtype. An all-gather
  takes equal rows, so each owner's is padded to the longest: ``N · max_j u_j`` elements
  arrive at each device for ``Σ_j u_j`` of updates (``u_j`` owner ``j``'s). Where one
  matrix dominates (ResNet-50's largest kernel on 256 owners: 23× the updates), the
  owners instead write their rows at their own offsets into a zero buffer of
  ``Σ_j u_j + max_j u_j`` and all-reduce it: a ring all-reduce moves about twice its
  buffer, so the plan takes the sum when ``N · max_j u_j > 2 (Σ_j u_j + max_j u_j)``
  (``UpdateLayout.update_sharing``). The sum is exact: each element has one
  owner's value and zeros.
  """
  leaves, treedef = jax.tree_util.tree_flatten(params)
  matrices, replicated, split = _describe(params, views, num_owners, split_above)
  pieces = assign_owners(matrices, num_owners, stripe_stacks=stripe_stacks)
  striped = tuple((leaf.index, share) for leaf in matrices
                  if (share := _stripe_share(leaf, pieces)))
  avals = tuple(aval(x) for x in leaves)
  abstract = [jax.ShapeDtypeStruct(s, d) for s, d in avals]
  state_treedef, roles, state_avals = _state_roles(tx, treedef, abstract)
  by_index = {leaf.index: leaf for leaf in matrices}
  for role, state_aval in zip(roles, state_avals):
    if role in by_index:
      state_axis(by_index[role], state_aval[0])   # raises for state that cannot be split
  owner_states = tuple(_owner_state(tx, treedef, by_index, abstract, mine, state_treedef)
                       for mine in pieces)
  used = [update_sizes(mine, avals, by_index, dict(striped)) for mine in pieces]
  update_lengths = _longest(used)
  return UpdateLayout(
      num_owners=num_owners, axes=tuple(axes), params_treedef=treedef, param_avals=avals,
      leaves=tuple(matrices), replicated=tuple(replicated), split=split, pieces=pieces,
      striped=striped, branch=_branches(pieces), state_treedef=state_treedef, roles=roles,
      state_avals=state_avals, owner_states=owner_states,
      state_lengths=_longest(_slot_lengths(o) for o in owner_states),
      update_lengths=update_lengths, update_sharing=_sharing(used, update_lengths))


def _sharing(used: Sequence[dict[str, int]], update_lengths: Sequence[tuple[str, int]]) -> str:
  """``"sum"`` where the gather's padded rows would move more bytes than the all-reduce of
  the filled ones does, else ``"gather"`` (:func:`plan`)."""
  width = {d: jnp.dtype(d).itemsize for d, _ in update_lengths}
  gathered = len(used) * sum(n * width[d] for d, n in update_lengths)
  filled = sum(n * width[d] for lengths in used for d, n in lengths.items())
  longest = sum(n * width[d] for d, n in update_lengths)
  return "sum" if gathered > 2 * (filled + longest) else "gather"


def _describe(params: Any, views: Any, num_owners: int, split_above: float | None
              ) -> tuple[list[MatrixLeaf], list[int], tuple[SplitMatrix, ...]]:
  """The matrices owners update, the indices every device updates (the split ones among
  them), and the split matrices."""
  leaves = jax.tree_util.tree_leaves(params)
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
  return matrices, sorted(replicated + list(to_split)), split


def _matrix_leaf(index: int, leaf: Any, view: Any, name: str) -> MatrixLeaf | None:
  """The owner-updated description of a leaf, or None for a replicated one."""
  if view is False or jnp.ndim(leaf) < 2:
    return None
  lo = linalg.layout(jnp.shape(leaf), view, name)
  batch_axes = lo.perm[:len(lo.batch_shape)]
  inner = int(np.prod([lo.shape[a] for a in batch_axes[1:]], dtype=np.int64))
  return MatrixLeaf(index, lo.shape, batch_axes, matrix_cost(lo.fan_in, lo.fan_out) * inner)


def _split_matrix(leaf: MatrixLeaf, view: Any, name: str, num_owners: int
                  ) -> SplitMatrix | None:
  """``leaf`` split over ``num_owners`` (the axis ``plan`` describes), or None."""
  lo = linalg.layout(leaf.shape, view, name)
  inner = lo.perm[len(lo.batch_shape):]
  k, size = 0, 1
  while size < lo.fan_in:
    size *= leaf.shape[inner[k]]
    k += 1
  rows = inner[k:] if lo.transposed else inner[:k]   # the long side's axes
  axis = next((a for a in rows if leaf.shape[a] > 1 and leaf.shape[a] % num_owners == 0), None)
  if axis is None:
    return None
  front = min(rows)
  if axis != front and sorted(rows) != list(range(front, front + len(rows))):
    return None   # moving it would move the side's other axes out of place
  return SplitMatrix(leaf.index, axis, split_cost(lo.fan_in, lo.fan_out, num_owners), front)


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


def _branches(pieces: Sequence[Sequence[Piece]]) -> tuple[int, ...]:
  """Per owner, its program: owners whose pieces have equal leaves and sizes share one."""
  signatures: dict[tuple[tuple[int, int], ...], int] = {}
  return tuple(signatures.setdefault(tuple((p.index, p.size) for p in mine), len(signatures))
               for mine in pieces)


def _state_roles(tx: optax.GradientTransformation, treedef: Any, abstract: list[Any]
                 ) -> tuple[Any, tuple[int | Role, ...], tuple[Any, ...]]:
  """The wrapped state's structure, and per position its role (the param leaf it
  belongs to, ``Role.SHARED`` or ``Role.MASKED``) and its ``(shape, dtype name)``."""
  canonical = jax.eval_shape(tx.init, treedef.unflatten(abstract))
  state_leaves, state_treedef = flatten(canonical)
  index_tree = treedef.unflatten(list(range(len(abstract))))
  roles_tree = optax.tree_map_params(
      tx, lambda _, i: i, canonical, index_tree,
      transform_non_params=lambda v: jax.tree.map(lambda _: Role.SHARED, v, is_leaf=is_masked),
      is_leaf=lambda x: is_masked(x) or isinstance(x, jax.ShapeDtypeStruct))
  roles = tuple(Role.MASKED if is_masked(r) or is_masked(x) else r if r is Role.SHARED
                else int(r) for r, x in zip(flatten(roles_tree)[0], state_leaves))
  state_avals = tuple(None if is_masked(x) else aval(x) for x in state_leaves)
  return state_treedef, roles, state_avals


def _owner_state(tx: optax.GradientTransformation, treedef: Any,
                 by_index: dict[int, MatrixLeaf], abstract: list[Any], mine: Sequence[Piece],
                 state_treedef: Any) -> OwnerState:
  """Where the state of an owner holding ``mine`` sits in its packed rows."""
  owned = jax.eval_shape(lambda leaves: tx.init(piece_tree(treedef, by_index, leaves, mine)),
                         abstract)   # sliced under eval_shape: abstract params allowed
  got, got_treedef = flatten(owned)
  if got_treedef != state_treedef:
    raise ValueError("shard_update: the wrapped transformation's state structure depends on "
                     "which parameters it is given; it is not a per-leaf transformation")
  offsets: dict[str, int] = {}
  entries = []
  for x in got:
    if is_masked(x):
      entries.append(None)
      continue
    shape, dtype = aval(x)
    entries.append(Slot(shape, dtype, offsets.get(dtype, 0)))
    offsets[dtype] = offsets.get(dtype, 0) + int(np.prod(shape, dtype=np.int64))
  return OwnerState(tuple(entries))


def _slot_lengths(owner: OwnerState) -> dict[str, int]:
  """Per dtype name, how long one owner's packed state is."""
  lengths: dict[str, int] = {}
  for slot in owner.entries:
    if slot is not None:
      n = slot.offset + int(np.prod(slot.shape, dtype=np.int64))
      lengths[slot.dtype] = max(lengths.get(slot.dtype, 0), n)
  return lengths


def _longest(per_owner: Any) -> tuple[tuple[str, int], ...]:
  """Per dtype name, the longest of the owners' lengths, sorted by name."""
  out: dict[str, int] = {}
  for lengths in per_owner:
    for dtype, n in lengths.items():
      out[dtype] = max(out.get(dtype, 0), n)
  return tuple(sorted(out.items()))
