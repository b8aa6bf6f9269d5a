"""Who updates which matrix: the owners of a sharded update and their assignment.

The owners are the devices along a mesh's data-parallel axes (:func:`owner_axes`,
:func:`num_owners`). Pure Python over shapes (no arrays): :func:`assign_owners`
splits the matrix parameters of a tree into *pieces* — a whole kernel, or a
contiguous range of the first batch axis of a stack (a scanned stack counts as
its layers) — and gives each piece to one of ``num_owners`` devices so that the most loaded
device carries as little of the update's cost as possible.

Cost model: the orthogonalizing updates here (tangent projection, transport,
QR / Cayley / polar / Newton–Schulz retractions, Muon's Newton–Schulz) are a
fixed number of ``n x p x p`` matrix products on the tall view ``(n, p)``,
``n >= p``, plus ``O(n p)`` elementwise work. A matrix costs
``n p (p + ELEMENTWISE_WEIGHT)`` (the constant stands for Adam's moments, the
casts and the final subtraction, each a pass over ``n p`` entries).

Assignment (:func:`assign_owners`): single matrices longest-processing-time
first (Graham 1969, "Bounds on multiprocessing timing anomalies": the most
loaded owner is within 4/3 of the optimum; Megatron-LM's layer-wise optimizer
bin-packs its Newton–Schulz costs the same way), then the layers of the stacks
water-filled on top, each owner taking one contiguous run — a
``(200, 400, 400)`` stack on 8 devices gives each 25 consecutive layers, on 16
devices 12 or 13. Deterministic: ties go to the lower device index.

Splitting (:func:`split_matrices`, opt-in): whole-matrix ownership cannot bring
the most loaded owner below the largest single matrix. A single matrix whose
cost is above ``split_above`` times the mean owner load is taken out of the
assignment and updated by all owners together, the long side of its matrix view
(its rows) split over them; each then carries :func:`split_cost` of it.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from typing import Any, Sequence

import numpy as np

ELEMENTWISE_WEIGHT = 16
DEFAULT_AXES = ("data", "fsdp")


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


def matrix_cost(n: int, p: int) -> int:
  """The modelled cost of one tall ``(n, p)`` matrix's update."""
  n, p = max(n, p), min(n, p)
  return n * p * (p + ELEMENTWISE_WEIGHT)


def split_cost(n: int, p: int, num_owners: int) -> float:
  """The modelled cost per owner of one tall ``(n, p)`` matrix split over ``num_owners``:
  its ``n``-long products and element-wise work divided, plus the ``p x p`` products
  (Gram matrices, the Newton–Schulz polynomial, Cayley's inner systems) that each
  owner repeats."""
  n, p = max(n, p), min(n, p)
  return n * p * (p + ELEMENTWISE_WEIGHT) / num_owners + p ** 3


@dataclasses.dataclass(frozen=True)
class MatrixLeaf:
  """One parameter that owners update.

  Attributes:
    index: its position among the tree's leaves.
    shape: the parameter's shape.
    batch_axes: the batch axes of its matrix view, in order (none for a single
      matrix); pieces are cut along the first.
    matrix_cost: the cost of one index along the first batch axis (every other
      batch axis folded in), or of the whole leaf.
  """

  index: int
  shape: tuple[int, ...]
  batch_axes: tuple[int, ...]
  matrix_cost: int

  @property
  def batch_axis(self) -> int | None:
    """The axis pieces are cut along, or None for a single matrix."""
    return self.batch_axes[0] if self.batch_axes else None

  @property
  def batch_shape(self) -> tuple[int, ...]:
    return tuple(self.shape[a] for a in self.batch_axes)

  @property
  def length(self) -> int:
    return 1 if self.batch_axis is None else self.shape[self.batch_axis]


@dataclasses.dataclass(frozen=True, order=True)
class Piece:
  """A leaf, or the range ``[start, stop)`` of its batch axis, on one owner."""

  index: int
  start: int
  stop: int

  @property
  def size(self) -> int:
    return self.stop - self.start


def assign_owners(leaves: Sequence[MatrixLeaf], num_owners: int, *,
                  stripe_stacks: bool = False) -> tuple[tuple[Piece, ...], ...]:
  """Pieces per owner (each owner's sorted by leaf).

  ``stripe_stacks``: stripe every stack over all owners (owner ``j`` takes layers
  ``[j s, (j + 1) s)``, ``s = ⌈length / num_owners⌉``) instead of water-filling them.
  Each owner then holds one block of each stack, which an FSDP-sharded stack reaches by
  an all-to-all; the price is balance (the stacks' layers no longer spread over the
  owners that singles leave idle).

  Every index of every leaf is in exactly one piece, and no owner holds two
  pieces of one leaf. Single matrices go first, longest-processing-time-first
  to the least loaded owner (ties to the highest index, so the owners without
  singles come first); then the stacks' layers fill the owners up to a common
  level (water-filling): the layers of all stacks, laid end to end, are cut
  where the owners' remaining capacities add up, so each owner gets one
  contiguous run and overshoots the level by less than one layer.

  A lone stack (a scanned network) is *striped* where that costs no balance:
  owners ``0, 1, …`` take ``s`` layers each in order, the last of them the rest —
  the layout an all-gather of equal blocks writes in place. ``s`` is the
  largest share of the water-filled assignment (its layer counts by largest
  remainder), and no owner goes above that assignment's most loaded one.
  """
  if num_owners < 1:
    raise ValueError(f"num_owners must be >= 1, got {num_owners}")
  owned, loads = _place_singles(leaves, num_owners)
  stacks = [leaf for leaf in leaves if leaf.length > 1]
  if stripe_stacks:
    for leaf in stacks:
      for owner, piece in _stripe_evenly(leaf, num_owners):
        owned[owner].append(piece)
    return tuple(tuple(sorted(pieces, key=lambda p: p.index)) for pieces in owned)
  placed = _stripe(stacks[0], loads) if len(stacks) == 1 else _water_fill(stacks, loads)
  for owner, piece in placed:
    owned[owner].append(piece)
  return tuple(tuple(sorted(pieces)) for pieces in owned)


def _place_singles(leaves: Sequence[MatrixLeaf], num_owners: int
                   ) -> tuple[list[list[Piece]], list[int]]:
  """The single matrices, longest first, each to the least loaded owner (ties to the
  highest index): the pieces and the load of each owner."""
  loads = [0] * num_owners
  owned: list[list[Piece]] = [[] for _ in range(num_owners)]
  singles = sorted((leaf for leaf in leaves if leaf.length == 1),
                   key=lambda leaf: (-leaf.matrix_cost, leaf.index))
  for leaf in singles:
    owner = min(range(num_owners), key=lambda j: (loads[j], -j))
    loads[owner] += leaf.matrix_cost
    owned[owner].append(Piece(leaf.index, 0, 1))
  return owned, loads


def _stripe_evenly(leaf: MatrixLeaf, num_owners: int) -> list[tuple[int, Piece]]:
  """Owner ``j`` takes layers ``[j s, (j + 1) s)``, ``s = ⌈length / num_owners⌉``."""
  share = -(-leaf.length // num_owners)
  return [(j, Piece(leaf.index, j * share, min((j + 1) * share, leaf.length)))
          for j in range(num_owners) if j * share < leaf.length]


def _water_fill(stacks: Sequence[MatrixLeaf], loads: Sequence[int]) -> list[tuple[int, Piece]]:
  """The stacks' layers, laid end to end, cut where the owners' room below the common
  level adds up: ``(owner, piece)``, one contiguous run per owner and stack."""
  total = sum(leaf.matrix_cost * leaf.length for leaf in stacks)
  if not total:
    return []
  level = _water_level(loads, total)
  ends = list(itertools.accumulate(max(level - load, 0.0) for load in loads))
  done, out = 0.0, []
  for leaf in stacks:
    runs: dict[int, list[int]] = {}
    for i in range(leaf.length):
      owner = _segment(ends, done + leaf.matrix_cost / 2)
      runs.setdefault(owner, [i, i])[1] = i
      done += leaf.matrix_cost
    out += [(owner, Piece(leaf.index, first, last + 1)) for owner, (first, last) in runs.items()]
  return out


def _segment(ends: Sequence[float], position: float) -> int:
  """The owner whose segment of the cumulative ``ends`` holds ``position``."""
  owner = min(bisect.bisect_right(ends, position), len(ends) - 1)
  while ends[owner] == (ends[owner - 1] if owner else 0.0) and owner > 0:
    owner -= 1   # an owner above the level has an empty segment
  return owner


def split_matrices(leaves: Sequence[MatrixLeaf], num_owners: int,
                   split_above: float | None,
                   splittable: Sequence[int] | None = None) -> tuple[int, ...]:
  """The indices of the single matrices to split over all owners, largest first.

  A single matrix is split when its cost is above ``split_above`` times the mean
  owner load (``sum of all matrices' costs / num_owners``): whole-matrix
  ownership would leave its owner that much above the mean. Only the indices in
  ``splittable`` (default: all) are candidates. ``None`` (the default of
  :func:`orthojax.optim.shard_update`) splits nothing.
  """
  if split_above is None or num_owners < 2:
    return ()
  level = split_above * sum(leaf.matrix_cost * leaf.length for leaf in leaves) / num_owners
  allowed = None if splittable is None else set(splittable)
  big = [leaf for leaf in leaves if leaf.length == 1 and leaf.matrix_cost > level
         and (allowed is None or leaf.index in allowed)]
  return tuple(leaf.index for leaf in sorted(big, key=lambda l: (-l.matrix_cost, l.index)))


def _stripe(leaf: MatrixLeaf, loads: Sequence[int]) -> list[tuple[int, Piece]]:
  """One stack over owners already carrying ``loads``: ``(owner, piece)`` in order."""
  cost, n = leaf.matrix_cost, len(loads)
  level = _water_level(loads, cost * leaf.length)
  room = [max(level - load, 0.0) / cost for load in loads]
  counts = [int(r) for r in room]   # largest remainder (Hamilton) to the layer count
  by_remainder = sorted(range(n), key=lambda j: (-(room[j] - counts[j]), j))
  for j in by_remainder[:leaf.length - sum(counts)]:
    counts[j] += 1
  most = max(load + cost * k for load, k in zip(loads, counts))
  share, start, out = max(counts), 0, []
  for j in range(n):
    take = min(share, leaf.length - start, int((most - loads[j]) // cost))
    if take > 0:
      out.append((j, Piece(leaf.index, start, start + take)))
      start += take
  assert start == leaf.length, "the striped shares hold every layer"
  return out


def _water_level(loads: Sequence[int], amount: int) -> float:
  """The level ``L`` with ``sum(max(L - load, 0)) == amount``."""
  ordered = sorted(loads)
  for k in range(1, len(ordered) + 1):
    level = (amount + sum(ordered[:k])) / k
    if k == len(ordered) or level <= ordered[k]:
      return level
  raise AssertionError("unreachable")


def loads(leaves: Sequence[MatrixLeaf], pieces: Sequence[Sequence[Piece]]) -> list[int]:
  """The modelled cost each owner carries."""
  cost = {leaf.index: leaf.matrix_cost for leaf in leaves}
  return [sum(cost[p.index] * p.size for p in mine) for mine in pieces]
