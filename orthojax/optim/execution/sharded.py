"""Owner-sharded updates: :func:`shard_update`, each matrix's update computed once, by its owner.

Execution: a ``jax.shard_map`` over the mesh whose body switches
(``lax.switch`` on ``lax.axis_index``) to its owner's program; owners whose
pieces have the same shapes (e.g. equal chunks of one stack) share one branch
and differ only in their slice offsets, so a stack compiles once however many
devices share it. Each owner runs the wrapped transformation on its own pieces
(:meth:`UpdateLayout.piece_tree`) and packs its updates per dtype; the only
collectives the wrapper adds are the all-gathers of those finished updates (the
gradients arrive all-reduced, as for the replicated update). A striped stack,
zero-padded to ``owners × share`` layers, enters and leaves as each device's own
block of layers instead, so that under FSDP the compiler moves it with
all-to-alls and no device holds the whole stack. The leaves every device updates
(vectors, scalars, and the split matrices, whose products the compiler
partitions) run through the wrapped transformation outside the ``shard_map``.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from orthojax import linalg
from orthojax.optim.execution import stripes
from orthojax.optim.execution.layout import UpdateLayout, aval, flatten, is_masked
from orthojax.optim.execution.owners import num_owners, owner_axes
from orthojax.optim.execution.planning import plan
from orthojax.optim._keeps import keeps_manifold, keeping
from orthojax.optim._recorded import ViewsFromInit, views_from_init
from orthojax.optim.execution.state import (ShardedUpdateState, pack, pack_state,
                                            unpack_state)


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

  The trainer wraps every optimizer of the library's table
  (:data:`orthojax.optim.OPTIMIZER_TABLE`) this way when ``config.mesh.shard_update``
  is true (the default); see the ``orthojax.optim.execution`` overview for the design and
  :func:`replicated_state` for checkpoints.

  Args:
    tx: a per-leaf transformation (every orthojax optimizer, or your own).
    mesh: the ``jax.sharding.Mesh`` the step runs on (real or abstract devices).
    views: the per-leaf matrix views ``tx`` uses (``orthojax.linalg.map_views``);
      leaves without a matrix view (rank < 2, or a view ``False``) are updated
      on every device. None: inferred, or on the ``nnx.Optimizer`` path the views the
      model's Variables record, read at ``init`` and kept in the state
      (:class:`orthojax.optim.RecordedViewsState`); a ``tx`` built without ``views=``
      (a :class:`orthojax.optim.ViewsFromInit`) then runs its owners' pieces with the
      same views (:meth:`~orthojax.optim.ViewsFromInit.with_views`).
    axes: the mesh axes whose devices own matrices (default: those of
      ``("data", "fsdp")`` the mesh has). Devices along other axes (``model``)
      repeat their owner's work.
    split_above: split a single matrix whose modelled cost is above this multiple
      of the mean owner load over all owners, by rows (the outermost axis of its
      view's long side that the owner count divides, :func:`orthojax.optim.plan`; the
      products partitioned by the compiler, with ``p x p`` all-reduces inside its
      iterations; see the ``orthojax.optim.execution`` overview). A ``tx`` built
      without ``views=`` runs them under views whose ``row_blocks`` is the owner count
      (``MatrixView.row_blocks``: Newton–Schulz then applies its
      polynomial to the row blocks instead of repeating its ``p x p`` square on every
      device). ``None`` (default): every matrix has one owner and no collective runs
      inside an orthogonalization.
    stripe_stacks: stripe every stacked leaf over all owners
      (:func:`orthojax.optim.assign_owners`), so that its gradient, parameter and update
      move as each owner's block of layers (all-to-alls under FSDP) rather than whole to
      every device. The trainer sets it when ``config.mesh.fsdp`` > 1.

  Returns:
    A ``GradientTransformation`` with the same updates as ``tx`` (to float
    rounding) and a :class:`ShardedUpdateState` — a
    :class:`~orthojax.optim.ManifoldTransformation` where ``tx`` is one; ``tx`` itself
    when there is a single owner.
  """
  axes = owner_axes(mesh, axes)
  owners = num_owners(mesh, axes)
  if split_above is not None and not split_above > 0:
    raise ValueError(f"shard_update: split_above={split_above!r}; pass a positive multiple of "
                     f"the mean owner load (e.g. 1.0), or None to split nothing")
  if owners == 1:
    return tx
  options = dict(mesh=mesh, axes=axes, owners=owners, split_above=split_above,
                 stripe_stacks=stripe_stacks)
  return views_from_init(lambda v: _sharded(tx, views=v, **options), views)


def _with_views(tx: optax.GradientTransformation, views: Any) -> optax.GradientTransformation:
  """``tx`` as it runs under ``views``: a transformation built without ``views=`` follows
  them (:meth:`orthojax.optim.ViewsFromInit.with_views`), any other is as given."""
  return tx.with_views(views) if isinstance(tx, ViewsFromInit) else tx


def _split_views(views: Any, layout: UpdateLayout, params: Any) -> Any:
  """``views`` as a tree like ``params``, each split matrix's view with ``row_blocks``
  the owner count (``MatrixView.row_blocks``)."""
  per_leaf = linalg.views_for(params, views)
  for split in layout.split:
    view = per_leaf[split.index]
    view = linalg.infer_view(layout.param_avals[split.index][0]) if view is None else view
    per_leaf[split.index] = linalg.MatrixView(view.reduction_axis, view.output_axis,
                                              row_blocks=layout.num_owners)
  return layout.params_treedef.unflatten(per_leaf)


def _sharded(tx: optax.GradientTransformation, *, views: Any, mesh: Any, axes: Sequence[str],
             owners: int, split_above: float | None, stripe_stacks: bool
             ) -> optax.GradientTransformation:
  """:func:`shard_update` of ``tx`` for the given ``views``.

  The owners run ``tx`` under ``views``; the leaves every device updates run it under
  the same views with the split matrices' ``row_blocks`` set, where ``tx`` was built
  without ``views=`` (a :class:`~orthojax.optim.ViewsFromInit`), so that their products
  are arranged for rows split over the owners."""
  layouts: dict[Any, tuple[UpdateLayout, optax.GradientTransformation]] = {}
  owned_tx = _with_views(tx, views)

  def layout_of(params: Any) -> tuple[UpdateLayout, optax.GradientTransformation]:
    """The layout for ``params``' shapes and the transformation of its replicated part."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    key = (treedef, tuple(aval(x) for x in leaves))
    if key not in layouts:
      layout = plan(owned_tx, params, num_owners=owners, axes=axes, views=views,
                    split_above=split_above, stripe_stacks=stripe_stacks)
      rest_tx = owned_tx
      if layout.split and isinstance(tx, ViewsFromInit):
        rest_tx = tx.with_views(_split_views(views, layout, params))
      layouts[key] = layout, rest_tx
    return layouts[key]

  def init_fn(params):
    params = linalg.variable_values(params)   # the tree update gets (nnx.Optimizer)
    layout, rest_tx = layout_of(params)
    return _init(owned_tx, rest_tx, layout, mesh, jax.tree_util.tree_leaves(params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "shard_update needs the current params: call tx.update(updates, state, params)")
    layout, rest_tx = layout_of(params)
    if not isinstance(state, ShardedUpdateState) or state.layout != layout:
      raise ValueError("shard_update: the state was not made by this transformation's init for "
                       "these params (convert a replicated state with oj.optim.sharded_state)")
    return _update(owned_tx, rest_tx, layout, mesh, updates, state, params)

  sharded = optax.GradientTransformation(init_fn, update_fn)
  return keeping(sharded) if keeps_manifold(owned_tx) else sharded


def _init(tx: optax.GradientTransformation, rest_tx: optax.GradientTransformation,
          layout: UpdateLayout, mesh: Any, leaves: Sequence[Any]) -> ShardedUpdateState:
  """Each owner's state of its pieces, packed into its row; the rest's as ``rest_tx``'s."""
  rows: dict[str, list[Any]] = {d: [] for d, _ in layout.state_lengths}
  for j, mine in enumerate(layout.pieces):
    state = tx.init(layout.piece_tree(leaves, mine))
    for dtype, row in pack_state(layout, j, flatten(state)[0]).items():
      rows[dtype].append(row)
  owned = {d: _place(jnp.stack(r), NamedSharding(mesh, P(layout.axes)))
           for d, r in rows.items()}
  rest = _constrain_split(layout, mesh, rest_tx.init(layout.replicated_tree(leaves)))
  return ShardedUpdateState(owned, rest, layout)


def _update(tx: optax.GradientTransformation, rest_tx: optax.GradientTransformation,
            layout: UpdateLayout, mesh: Any, updates: Any, state: ShardedUpdateState,
            params: Any) -> tuple[Any, ShardedUpdateState]:
  """The replicated leaves' update as ``rest_tx``'s, the owners' (``tx``) in a
  ``shard_map``, merged."""
  g_leaves, p_leaves = _leaves_in(layout, mesh, updates, params)
  moved = [s for s in layout.split if s.moved]
  rest_updates, rest_state = rest_tx.update(
      layout.replicated_tree(_move_leaves(moved, g_leaves)),
      _move_state(layout, moved, _constrain_split(layout, mesh, state.replicated)),
      layout.replicated_tree(_move_leaves(moved, p_leaves)))
  rest_state = _constrain_split(layout, mesh, _move_state(layout, moved, rest_state, back=True))
  out = _move_leaves(moved, layout.params_treedef.flatten_up_to(rest_updates), back=True)
  owned_updates, rows = _owners_update(tx, layout, mesh, g_leaves, p_leaves, state.owned)
  for leaf, u in zip(layout.leaves, owned_updates):
    out[leaf.index] = u
  return layout.params_treedef.unflatten(out), ShardedUpdateState(rows, rest_state, layout)


def _move_leaves(moved: Sequence[Any], leaves: Sequence[Any], back: bool = False
                 ) -> list[Any]:
  """``leaves`` with each moved split matrix's split axis at the front of its side (the
  rows permuted, split in blocks: :func:`orthojax.optim.plan`), or ``back``."""
  out = list(leaves)
  for s in moved:
    src, dst = (s.front, s.axis) if back else (s.axis, s.front)
    out[s.index] = jnp.moveaxis(out[s.index], src, dst)
  return out


def _move_state(layout: UpdateLayout, moved: Sequence[Any], rest: Any, back: bool = False
                ) -> Any:
  """The replicated state with the moved split matrices' param-shaped state moved like
  them (:func:`_move_leaves`)."""
  if not moved:
    return rest
  by_index = {s.index: s for s in moved}
  positions = {k: by_index[role] for k, role in layout.split_positions().items()
               if role in by_index}
  leaves, treedef = flatten(rest)
  for k, s in positions.items():
    src, dst = (s.front, s.axis) if back else (s.axis, s.front)
    leaves[k] = jnp.moveaxis(leaves[k], src, dst)
  return treedef.unflatten(leaves)


def _leaves_in(layout: UpdateLayout, mesh: Any, updates: Any, params: Any
               ) -> tuple[list[Any], list[Any]]:
  """The gradient and parameter leaves, checked, with the split matrices placed split.

  The compiler partitions the split matrices' updates over the owners. Each enters
  pinned whole first: without the pin the TPU partitioner carries the split back into
  the backward pass (ResNet-50 on v5e:4x4: 132 collective-permutes, +10 % FLOPs).
  """
  p_leaves = list(jax.tree_util.tree_leaves(params))
  g_leaves = list(layout.params_treedef.flatten_up_to(updates))
  for leaf in layout.leaves:
    g, p = g_leaves[leaf.index], p_leaves[leaf.index]
    if g.dtype != p.dtype:
      raise ValueError(f"shard_update: a gradient of dtype {g.dtype} for a parameter of dtype "
                       f"{p.dtype}; cast the gradients to the parameters' dtype first")
  whole = NamedSharding(mesh, P())
  for split in layout.split:
    at = NamedSharding(mesh, layout.split_spec(split.index))
    g_leaves[split.index] = _place(_place(g_leaves[split.index], whole), at)
    p_leaves[split.index] = _place(_place(p_leaves[split.index], whole), at)
  return g_leaves, p_leaves


def _owners_update(tx: optax.GradientTransformation, layout: UpdateLayout, mesh: Any,
                   g_leaves: Sequence[Any], p_leaves: Sequence[Any], rows: dict[str, Any]
                   ) -> tuple[list[Any], dict[str, Any]]:
  """The matrices' updates (in ``layout.leaves`` order) and the owners' new rows."""
  indices = [leaf.index for leaf in layout.leaves]
  specs = tuple(stripes.stack_spec(layout, i) for i in indices)
  body = functools.partial(_owner_body, tx, layout)
  sharded = jax.shard_map(body, mesh=mesh, in_specs=(specs, specs, P(layout.axes)),
                          out_specs=(specs, P(layout.axes)), check_vma=False)
  padded = lambda leaves: tuple(stripes.pad_stack(layout, leaves[i], i) for i in indices)
  full, new_rows = sharded(padded(p_leaves), padded(g_leaves), rows)
  return [stripes.unpad_stack(layout, u, i) for u, i in zip(full, indices)], new_rows


def _owner_body(tx: optax.GradientTransformation, layout: UpdateLayout,
                p_owned: tuple[Any, ...], g_owned: tuple[Any, ...], rows: dict[str, Any]
                ) -> tuple[tuple[Any, ...], dict[str, Any]]:
  """One device's program: its owner's branch, then the sharing of the updates.

  The owners' ops keep the wrapped transformation's own scope names; the sharing
  (all-gather and unpacking) is named ``owner_sharded``.
  """
  j = jax.lax.axis_index(layout.axes)
  rows = {d: r[0] for d, r in rows.items()}
  representative: dict[int, int] = {}
  for owner, b in enumerate(layout.branch):
    representative.setdefault(b, owner)
  starts = np.zeros((layout.num_owners, max(max(len(m) for m in layout.pieces), 1)), np.int32)
  for owner, mine in enumerate(layout.pieces):
    starts[owner, :len(mine)] = [p.start for p in mine]
  bases = np.array([[layout.update_bases(owner)[d] for d, _ in layout.update_lengths]
                    for owner in range(layout.num_owners)], np.int32).reshape(
                        layout.num_owners, len(layout.update_lengths))
  branches = [functools.partial(_owner_step, tx, layout, representative[b])
              for b in range(len(representative))]
  u_packed, u_striped, s_packed = jax.lax.switch(
      jnp.asarray(layout.branch, jnp.int32)[j], branches, p_owned, g_owned, rows,
      jnp.asarray(starts)[j], jnp.asarray(bases)[j])
  with jax.named_scope("owner_sharded"):
    return _share(layout, u_packed, u_striped), {d: s[None] for d, s in s_packed.items()}


def _owner_step(tx: optax.GradientTransformation, layout: UpdateLayout, rep: int,
                p_owned: Sequence[Any], g_owned: Sequence[Any], rows: dict[str, Any],
                my_starts: Any, my_bases: Any
                ) -> tuple[dict[str, Any], tuple[Any, ...], dict[str, Any]]:
  """The program of the owners whose pieces are shaped like owner ``rep``'s: ``tx`` on
  the pieces at ``my_starts``; its packed updates (for ``update_sharing == "sum"`` placed
  at ``my_bases`` in a zero buffer), striped blocks and packed state."""
  p_all = [None] * len(layout.param_avals)
  g_all = [None] * len(layout.param_avals)
  for leaf, p, g in zip(layout.leaves, p_owned, g_owned):
    p_all[leaf.index], g_all[leaf.index] = p, g
  mine = layout.pieces[rep]
  blocked = layout.stripe_share
  starts = [0 if p.index in blocked else my_starts[k] for k, p in enumerate(mine)]
  state = layout.state_treedef.unflatten(unpack_state(layout, rep, rows))
  new_u, new_state = tx.update(layout.piece_tree(g_all, mine, starts), state,
                               layout.piece_tree(p_all, mine, starts))
  u_leaves = layout.params_treedef.flatten_up_to(new_u)
  u_packed = pack([u_leaves[p.index].astype(g_all[p.index].dtype) for p in mine
                   if p.index not in blocked], dict(layout.update_lengths))
  if layout.update_sharing == "sum":
    summed = layout.summed_lengths()
    u_packed = {d: jax.lax.dynamic_update_slice(jnp.zeros([summed[d]], row.dtype), row,
                                                (my_bases[k],))
                for k, (d, row) in enumerate(sorted(u_packed.items()))}
  u_striped = tuple(stripes.block(layout, i, share, mine, u_leaves, g_all[i].dtype)
                    for i, share in layout.striped)
  return u_packed, u_striped, pack_state(layout, rep, flatten(new_state)[0])


def _share(layout: UpdateLayout, u_packed: dict[str, Any], u_striped: Sequence[Any]
           ) -> tuple[Any, ...]:
  """Every matrix's update: the packed ones all-gathered (or summed) and cut out of
  their owners' rows, a striped stack's as this device's block (the out_specs tile the
  blocks)."""
  if layout.update_sharing == "sum":
    summed = {d: jax.lax.psum(v, layout.axes) for d, v in u_packed.items()}
    lengths = dict(layout.update_lengths)
    row = lambda dtype, owner: jax.lax.slice_in_dim(
        summed[dtype], b := layout.update_bases(owner)[dtype], b + lengths[dtype])
  else:
    gathered = {d: jax.lax.all_gather(v, layout.axes) for d, v in u_packed.items()}
    row = lambda dtype, owner: gathered[dtype][owner]
  in_place = {i: u for (i, _), u in zip(layout.striped, u_striped)}
  offsets = [layout.update_offsets(j) for j in range(layout.num_owners)]
  full = []
  for leaf in layout.leaves:
    if leaf.index in in_place:
      full.append(in_place[leaf.index])
      continue
    dtype = layout.param_avals[leaf.index][1]
    parts = []
    for owner, piece in layout.owners_of(leaf.index):
      start = offsets[owner][leaf.index]
      flat = jax.lax.slice_in_dim(row(dtype, owner), start, start + layout.piece_size(piece))
      parts.append(flat.reshape(layout.piece_shape(piece)))
    full.append(parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=leaf.batch_axis))
  return tuple(full)


def _place(x: Any, sharding: NamedSharding) -> Any:
  """``x`` laid out as ``sharding``, on Auto (GSPMD) and Explicit meshes alike."""
  explicit = jax.sharding.AxisType.Explicit
  if any(t == explicit for t in getattr(sharding.mesh, "axis_types", ())):
    return jax.sharding.reshard(x, sharding)
  return jax.lax.with_sharding_constraint(x, sharding)


def _constrain_split(layout: UpdateLayout, mesh: Any, rest: Any) -> Any:
  """The replicated part of the state with the split matrices' state split like them."""
  if not layout.split:
    return rest
  return jax.tree.map(lambda x, at: x if is_masked(x) else _place(x, at),
                      rest, layout.replicated_shardings(mesh), is_leaf=is_masked)
