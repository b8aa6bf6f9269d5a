"""Per-leaf matrix views and masks over parameter trees (one convention, shared).

Transforms and penalties map a function over the leaves of ``params`` (and
same-structured trees), giving it each leaf's matrix view. ``views`` may be:

* None — the views the tree *records*, else inferred: where ``params`` holds
  Flax NNX Variables (what ``nnx.Optimizer(model, tx, wrt=nnx.Param)`` hands
  ``tx.init``), each Variable's ``matrix_view`` metadata (:func:`recorded_views`);
  any leaf without one (bare arrays: what ``tx.update`` gets, or a plain parameter
  dict) is inferred (:func:`infer_view`: 2-D Dense, 4-D conv);
* a :class:`RecordedViews` — the views read from such Variables earlier, by key path
  (an ``orthojax.optim`` transformation reads them at ``init`` and keeps them in its
  state for ``update``, which gets bare arrays); a leaf without an entry is inferred;
* one view (``MatrixView`` / ``MuonDimensionNumbers``) for every leaf;
* a tree shaped like ``params`` — possibly *partial*: it is followed along
  each leaf's key path, a view met on the way applies to the whole subtree
  below it, and a missing key/index or a None means "infer";
* a callable ``params -> such a tree`` (e.g. reading Flax metadata).

``mask`` (where a function takes one) selects leaves the same way: None
(every leaf with at least 2 axes), a bool, a partial tree of bools, or a
callable. A bool met at an inner node covers the leaves with at least 2 axes
below it (so ``{"dense": True}`` means the kernel, not the bias); a bool at a
leaf is taken literally.

Empty subtrees — ``optax.MaskedNode`` placeholders left by
``optax.partition``, None entries — have no leaves, so they pass through
untouched without special cases.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from orthojax.linalg._matrix_view import MatrixView, check_float, infer_view, is_view, layout

_MISSING = object()


def _child(node: Any, key: Any) -> Any:
  if isinstance(key, jax.tree_util.DictKey):
    return node.get(key.key, _MISSING) if hasattr(node, "get") else _MISSING
  if isinstance(key, jax.tree_util.SequenceKey):
    ok = isinstance(node, (list, tuple)) and key.idx < len(node)
    return node[key.idx] if ok else _MISSING
  if isinstance(key, jax.tree_util.GetAttrKey):
    return getattr(node, key.name, _MISSING)
  return _MISSING


def _walk(tree: Any, path: Sequence[Any], stop: Callable[[Any], bool]) -> tuple[Any, bool]:
  """Follow ``path`` into ``tree``; returns (value, reached the end of path)."""
  node = tree
  for depth, key in enumerate(path):
    if stop(node):
      return node, depth == len(path)
    node = _child(node, key)
    if node is _MISSING:
      return _MISSING, False
  return node, True


def _view_stop(x: Any) -> bool:
  return x is None or x is False or is_view(x)


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class RecordedViews:
  """The matrix views a tree's Variables record, by key path; a pytree with no leaves.

  Static (part of a tree's structure, like ``optax.EmptyState``), so a
  transformation's state can carry it through ``jax.jit``, ``nnx.Optimizer`` and
  checkpoints without adding arrays.

  Attributes:
    entries: ``(jax.tree_util.keystr(path), view)`` per Variable that records a view
      (a :class:`MatrixView` / ``MuonDimensionNumbers``, or False: not a matrix).
  """

  entries: tuple[tuple[str, Any], ...]

  @functools.cached_property
  def _by_name(self) -> dict[str, Any]:
    return dict(self.entries)

  def per_leaf(self, params: Any) -> list[Any]:
    """One view per leaf of ``params`` (None where none is recorded); ``params`` may
    hold the Variables themselves or their bare values (same key paths)."""
    out = []
    for path, node in _variable_pairs(params):
      out += [self._by_name.get(jax.tree_util.keystr(path))] * len(jax.tree_util.tree_leaves(node))
    return out


def _variable_type() -> Any:
  """``flax.nnx.Variable``, or None where Flax was never imported (this layer never
  imports it: a tree can only hold Variables if the caller did)."""
  nnx = sys.modules.get("flax.nnx")
  return getattr(nnx, "Variable", None)


def variable_values(tree: Any) -> Any:
  """``tree`` with each Flax NNX Variable replaced by its value: the bare tree
  ``nnx.Optimizer`` hands ``tx.update`` where it handed ``tx.init`` the Variables."""
  variable = _variable_type()
  if variable is None:
    return tree
  return jax.tree.map(lambda x: x.get_value() if isinstance(x, variable) else x, tree,
                      is_leaf=lambda x: isinstance(x, variable))


def _variable_pairs(tree: Any) -> list[tuple[Any, Any]]:
  """``(path, node)`` with each Variable one node (its value's leaves below it)."""
  variable = _variable_type()
  is_leaf = None if variable is None else (lambda x: isinstance(x, variable))
  return jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]


def _hashable(view: Any) -> Any:
  try:
    hash(view)
    return view
  except TypeError:   # a view with list axes: the same view with tuples
    as_tuple = lambda a: tuple(a) if isinstance(a, (list, tuple)) else a
    return MatrixView(as_tuple(view.reduction_axis), as_tuple(view.output_axis))


def recorded_views(tree: Any) -> RecordedViews | None:
  """The ``matrix_view`` metadata of the Flax NNX Variables in ``tree``.

  ``tree`` is what ``nnx.Optimizer(model, tx, wrt=...)`` hands ``tx.init``
  (``nnx.state(model, wrt)``: the Variables themselves), a sub-tree of it
  (``optax.partition`` masks the rest), or anything else. Returns None where it
  holds no Variable that records a view (bare arrays, a plain ``nnx.Linear``).
  """
  variable = _variable_type()
  if variable is None:
    return None
  entries = []
  for path, node in _variable_pairs(tree):
    if isinstance(node, variable):
      view = node.get_metadata().get("matrix_view")
      if view is not None:
        entries.append((jax.tree_util.keystr(path), _hashable(view)))
  return RecordedViews(tuple(entries)) if entries else None


def views_for(params: Any, views: Any) -> list[Any]:
  """One view per leaf of ``params`` (flattening order); None = infer, False = none."""
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  if views is None:
    views = recorded_views(params)
    if views is None:
      return [None] * len(paths)
  if isinstance(views, RecordedViews):
    return views.per_leaf(params)
  if callable(views) and not is_view(views):
    views = views(params)
  out = []
  for path in paths:
    value, _ = _walk(views, path, _view_stop)
    if value is _MISSING:
      value = None
    if not _view_stop(value):
      raise TypeError(f"views entry for {jax.tree_util.keystr(path)} must be a MatrixView, "
                      f"MuonDimensionNumbers or None, got {value!r}")
    out.append(value)
  return out


def mask_for(params: Any, mask: Any) -> list[bool]:
  """One bool per leaf of ``params`` (flattening order), optax-mask style."""
  pairs = jax.tree_util.tree_flatten_with_path(params)[0]
  if callable(mask):
    mask = mask(params)
  out = []
  for path, leaf in pairs:
    matrix = jnp.ndim(leaf) >= 2
    if mask is None:
      out.append(matrix)
      continue
    value, at_leaf = _walk(mask, path, lambda x: isinstance(x, bool))
    if value is _MISSING:
      out.append(False)
    elif not isinstance(value, bool):
      raise TypeError(f"mask entry for {jax.tree_util.keystr(path)} must be a Python bool, "
                      f"got {value!r}")
    else:
      out.append(value if at_leaf else (value and matrix))
  return out


def leaf_names(params: Any) -> list[str]:
  """``jax.tree_util.keystr`` of each leaf's path, for error messages."""
  return [jax.tree_util.keystr(p) or "params"
          for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]


BUCKETS = ("pad", "shape", "per_leaf")
"""The ways :func:`map_views` runs a per-matrix function over many leaves (its
``bucket`` argument, and the ``bucket`` keyword of every ``orthojax.optim`` optimizer that
passes it on): zero-padded stacks of a shared small side, stacks of one shape, or one
call per leaf."""


def map_views(fn: Callable[..., Any], params: Any, *trees: Any, views: Any = None,
              mask: Any = None, default: Callable[..., Any] | None = None,
              bucket: str = "per_leaf") -> Any:
  """``fn(leaf, *matching_leaves, view=view)`` over the selected leaves of ``params``.

  Each selected leaf is validated first (floating dtype, a valid layout under
  its view), so errors name its path. Unselected leaves become
  ``default(leaf, *matching_leaves)`` (default: the first matching leaf, or
  the leaf itself). ``trees`` must have ``params``' structure (masked
  placeholders included). ``mask`` None selects every leaf — callers that
  route leaves elsewhere (``optax.partition``) constrain all they receive.

  ``bucket`` (one of :data:`BUCKETS`) — how the selected leaves are run:

  * ``"per_leaf"`` (the default here): one call of ``fn`` per leaf.
  * ``"shape"``: one call per *bucket* of leaves that share shape, dtype, view and the
    shapes and dtypes of their matching leaves, stacked on a new leading batch axis;
    each leaf gets its slice of the results. One chain of kernels then serves a bucket,
    not each leaf: ResNet-50's 53 conv kernels have 20 shapes. Only for an ``fn`` that
    treats batch axes as independent matrices and returns arrays batched like its first
    argument (an optimizer's per-matrix update; not a penalty summed over its
    matrices). The results equal the per-leaf ones to rounding (batched products).
  * ``"pad"``: also stack matrices that differ only in their long side — every
    selected leaf as its tall matrices ``(n, p)`` (:meth:`Layout.to_tall`, batch axes
    flattened), zero rows appended up to the bucket's longest ``n`` — so a bucket is a
    small side ``p`` and a dtype (Dion's "megabatching"), as long as the padded rows cost
    at most :data:`PADDED_FLOPS` (1.1) times the members' own (longest first, each joins
    the bucket before it while that stays within the bound): padding buys fewer launches
    with arithmetic, and where the arithmetic is the cost (a GPU, a pod's step) it must
    stay near per leaf. ``fn`` then sees ``(B, n_max, p)`` and must map zero rows to zero
    rows and not depend on how many there are: true of Muon's Newton–Schulz (``X Xᵀ``
    ignores them), a Stiefel or oblique projection and their retractions (QR,
    CholeskyQR, Cayley, polar, the columns' exponential map), elementwise moments; not
    of a per-matrix mean (a matrix second moment). Leaves whose matching leaves are
    shaped otherwise (a per-matrix state) keep exact-shape buckets. Members of one shape
    are stacked as tall matrices too: stacked in their own shape, conv kernels were
    copied twice per operand (once as the products read them, once for the element-wise
    work).
  """
  if bucket not in BUCKETS:
    raise ValueError(f"map_views: bucket={bucket!r}; choose one of {BUCKETS}")
  leaves, treedef = jax.tree_util.tree_flatten(params)
  others = [treedef.flatten_up_to(t) for t in trees]
  names = leaf_names(params)
  per_view = views_for(params, views)
  selected = [True] * len(leaves) if mask is None else mask_for(params, mask)
  out: list[Any] = [None] * len(leaves)
  layouts: dict[int, Any] = {}
  buckets: dict[Any, list[int]] = {}
  for i, (leaf, name, view, keep) in enumerate(zip(leaves, names, per_view, selected)):
    rest = [o[i] for o in others]
    if not keep or view is False:
      out[i] = default(leaf, *rest) if default else (rest[0] if rest else leaf)
      continue
    check_float(leaf, name)
    lo = layout(jnp.shape(leaf), view, name)
    layouts[i] = lo
    key = None if bucket == "per_leaf" else _bucket_key(leaf, rest, lo, bucket == "pad")
    buckets.setdefault(key if key is not None else ("leaf", i), []).append(i)
  trees = (leaves, *others)
  groups = [(part, key[0] == "padded") for key, members in buckets.items()
            for part in (_padded_buckets(members, layouts) if key[0] == "padded" else [members])]
  for members, padded in groups:
    first = members[0]
    if len(members) == 1:
      out[first] = fn(*[t[first] for t in trees], view=per_view[first])
    elif not padded and len({layouts[i] for i in members}) == 1:   # stacked as they are
      stacked = [jnp.stack([t[i] for i in members]) for t in trees]
      view = MatrixView.stacked(_explicit(per_view[first], jnp.shape(leaves[first])), 1)
      result = fn(*stacked, view=view)
      for n, i in enumerate(members):
        out[i] = jax.tree.map(lambda r, n=n: r[n], result)
    else:
      _run_padded(fn, trees, [layouts[i] for i in members], members, out)
  return treedef.unflatten(out)


def _run_padded(fn: Callable[..., Any], trees: Sequence[list[Any]], layouts: list[Any],
                members: list[int], out: list[Any]) -> None:
  """One call of ``fn`` on the members' tall matrices, zero-padded to the longest side;
  each member's result is its own rows, back in its shape."""
  n_max = max(lo.n for lo in layouts)

  def tall(lo, x):
    m = lo.to_tall(x).reshape((-1, lo.n, lo.p))
    return jnp.pad(m, ((0, 0), (0, n_max - lo.n), (0, 0)))

  stacked = [jnp.concatenate([tall(lo, t[i]) for lo, i in zip(layouts, members)])
             for t in trees]
  result = fn(*stacked, view=MatrixView.stacked()._replace(row_blocks=layouts[0].row_blocks))
  start = 0
  for lo, i in zip(layouts, members):
    count = math.prod(lo.batch_shape)
    out[i] = jax.tree.map(
        lambda r, lo=lo, start=start, count=count: lo.from_tall(
            r[start:start + count, :lo.n].reshape(lo.batch_shape + (lo.n, lo.p))), result)
    start += count


PADDED_FLOPS = 1.1
"""The most a padded bucket may cost over its members' own matrices: a per-matrix update
on ``(n, p)`` costs ``∝ n p²`` (Newton–Schulz, CholeskyQR, a projection, a Cayley
retraction in low-rank form), so a bucket of ``B`` matrices padded to ``n_max`` rows may
hold them while ``B · n_max <= PADDED_FLOPS · Σ n``."""


def _padded_buckets(members: list[int], layouts: dict[int, Any]) -> list[list[int]]:
  """``members`` (one small side and dtype) in padded buckets within :data:`PADDED_FLOPS`.

  Taken by long side, longest first, each joins the bucket before it while that bucket's
  padded rows stay within ``PADDED_FLOPS`` times its own (equal shapes always do), else
  starts the next. A bucket pads its matrices to its first one's rows.
  """
  out: list[list[int]] = []
  padded = own = 0
  for i in sorted(members, key=lambda i: -layouts[i].n):
    lo = layouts[i]
    count = math.prod(lo.batch_shape)
    if out:
      n_max = layouts[out[-1][0]].n
      if (padded + count * n_max) <= PADDED_FLOPS * (own + count * lo.n):
        out[-1].append(i)
        padded, own = padded + count * n_max, own + count * lo.n
        continue
    out.append([i])
    padded = own = count * lo.n
  return out


def _bucket_key(leaf: Any, rest: Sequence[Any], lo: Any, pad: bool = False) -> Any:
  """What leaves must share to be stacked: their layout and every matching leaf's
  shape and dtype (``pad``: only the tall matrices' small side and the dtypes, where
  every matching leaf is shaped like the leaf — :func:`_padded_buckets` then splits them
  by cost); None (a bucket of its own) for a matching leaf that is no array."""
  avals = []
  for x in (leaf, *rest):
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
      return None
    avals.append((tuple(x.shape), str(x.dtype)))
  if pad and all(shape == avals[0][0] for shape, _ in avals):
    return ("padded", lo.p, tuple(dtype for _, dtype in avals), lo.row_blocks)
  return (tuple(avals), tuple(lo.perm), lo.transposed, lo.row_blocks)


def _explicit(view: Any, shape: Sequence[int]) -> MatrixView:
  """``view`` (None: inferred) as a MatrixView with explicit axes."""
  view = infer_view(shape) if view is None else view
  return MatrixView(reduction_axis=view.reduction_axis, output_axis=view.output_axis,
                    row_blocks=getattr(view, "row_blocks", 1))


def unzip(pairs: Any, like: Any) -> tuple[Any, Any]:
  """Split a tree whose leaves (at ``like``'s leaf positions) are 2-tuples."""
  treedef = jax.tree_util.tree_structure(like)
  flat = treedef.flatten_up_to(pairs)
  return treedef.unflatten([p[0] for p in flat]), treedef.unflatten([p[1] for p in flat])
