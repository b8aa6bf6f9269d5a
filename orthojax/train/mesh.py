"""Device mesh, sharding rules and global batches.

One mesh with three named axes (big_vision / MaxText naming):

* ``data`` — pure data parallelism (parameters replicated);
* ``fsdp`` — data parallelism with parameters and optimizer state sharded
  (ZeRO-3 style: XLA all-gathers a weight where it is used);
* ``model`` — tensor parallelism (reserved; the paper models are small
  enough that no rule uses it by default).

The batch dimension is split over ``("data", "fsdp")``. Parameters are
sharded by **rules**, not in model code: orthojax layers record logical axis
names (``fan_in``, ``fan_out``, ``layers``, … — :mod:`orthojax.nn.sharding`)
and :data:`DEFAULT_RULES` map them to mesh axes. A parameter without logical
names (a plain ``nnx.Linear`` kernel, BatchNorm scale) falls back to the
big_vision FSDP heuristic: its largest axis divisible by the ``fsdp`` size is
sharded, if it has at least ``min_fsdp_size`` entries. A logical axis whose
dimension is not divisible by its mesh axes is replicated instead of failing.
The same rules place the models' activations (:func:`with_activation_sharding`), and
the train state's checkpointed form is laid out here too (:func:`saved_form`).
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from flax.core import spmd
from jax.experimental import mesh_utils
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from orthojax import optim as oj_optim
from orthojax.nn import sharding as nn_sharding

AXES = ("data", "fsdp", "model")
BATCH_AXES = ("data", "fsdp")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("fan_out", "fsdp"),
    ("fan_in", None),
    ("spatial", None),
    ("angles", None),
    ("layers", None),
    ("qkv", None),
    ("embed", "fsdp"),
    ("vocab", None),
    ("batch", BATCH_AXES),   # activations' leading axis (orthojax.nn.sharding.constrain)
)


def make_mesh(data: int = -1, fsdp: int = 1, model: int = 1,
              devices: Sequence[jax.Device] | None = None, *, num_slices: int = 1) -> Mesh:
  """A ``(data, fsdp, model)`` mesh over ``devices`` (default: all devices).

  With ``num_slices > 1`` (TPU multi-slice) the mesh is *hybrid*: the
  ``data`` axis runs across the slices over the data-centre network (DCN),
  one gradient all-reduce per step, while ``fsdp`` and ``model`` — whose
  collectives are many and on the critical path — stay inside a slice on the
  chips' interconnect (ICI); ``jax.experimental.mesh_utils.
  create_hybrid_device_mesh`` lays the devices out. Axis names and sizes are
  global, so sharding rules do not change with the number of slices.

  Args:
    data, fsdp, model: axis sizes; one of them may be −1 to take the devices
      left over.
    num_slices: slices the devices form (each device's ``slice_index``).

  Raises:
    ValueError: a size that is 0 or below −1, more than one −1, sizes whose
      product is not the number of devices, or a slice count that does not
      divide the ``data`` axis.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = {"data": data, "fsdp": fsdp, "model": model}
  for name, size in sizes.items():
    if not isinstance(size, (int, np.integer)) or size == 0 or size < -1:
      raise ValueError(f"mesh: config.mesh.{name}={size} must be a positive integer or -1 (fill)")
  fill = [name for name, size in sizes.items() if size == -1]
  if len(fill) > 1:
    raise ValueError(f"mesh: only one axis may be -1 (fill), got {fill}")
  known = math.prod(size for size in sizes.values() if size != -1)
  if fill:
    if len(devices) % known:
      raise ValueError(f"mesh: {len(devices)} devices cannot be split with "
                       f"{', '.join(f'{k}={v}' for k, v in sizes.items())}")
    sizes[fill[0]] = len(devices) // known
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(f"mesh: data*fsdp*model = {math.prod(sizes.values())} but there are "
                     f"{len(devices)} devices; use -1 on one axis to fill")
  shape = tuple(sizes[a] for a in AXES)
  # Auto axes: XLA's sharding propagation places intermediates (GSPMD), so
  # model code needs no sharding annotations.
  axis_types = (AxisType.Auto,) * len(AXES)
  if num_slices == 1:
    return jax.make_mesh(shape, AXES, axis_types=axis_types, devices=devices)
  return Mesh(_hybrid_devices(shape, num_slices, devices), AXES, axis_types=axis_types)


def _hybrid_devices(shape: tuple[int, ...], num_slices: int,
                    devices: Sequence[jax.Device]) -> np.ndarray:
  """Devices laid out for a hybrid mesh: ``data`` across slices, the rest within one."""
  if num_slices < 1:
    raise ValueError(f"mesh: config.mesh.num_slices={num_slices} must be >= 1")
  slices = {getattr(d, "slice_index", None) for d in devices}
  if None in slices or len(slices) != num_slices:
    found = "no slice index" if None in slices else f"{len(slices)} slice(s)"
    raise ValueError(f"mesh: config.mesh.num_slices={num_slices} but the {len(devices)} "
                     f"devices have {found}; multi-slice needs TPU slices (or "
                     f"--compile_for=TOPOLOGY with config.mesh.num_slices={num_slices})")
  if shape[0] % num_slices:
    raise ValueError(f"mesh: config.mesh.data={shape[0]} is not divisible by "
                     f"config.mesh.num_slices={num_slices}: data parallelism spans the slices, "
                     f"fsdp and model stay "
                     f"inside one ({len(devices) // num_slices} devices)")
  ici = (shape[0] // num_slices,) + shape[1:]
  dcn = (num_slices,) + (1,) * (len(shape) - 1)
  return mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)


def batch_parallelism(mesh: Mesh) -> int:
  """How many ways a batch is split: ``data × fsdp``."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis over ``("data", "fsdp")``, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_global_batch(global_batch: int, mesh: Mesh, flag: str = "config.batch_size", *,
                       num_processes: int | None = None) -> int:
  """Validate a global batch against devices and processes; returns the per-process batch.

  ``num_processes`` defaults to ``jax.process_count()`` (the pod compile check
  passes the target's host count).
  """
  ways = batch_parallelism(mesh)
  procs = jax.process_count() if num_processes is None else num_processes
  if global_batch <= 0:
    raise ValueError(f"{flag}={global_batch} must be positive")
  if global_batch % ways:
    raise ValueError(f"{flag}={global_batch} is not divisible by the {ways} data-parallel "
                     f"devices (mesh data×fsdp); use a multiple of {ways}")
  if global_batch % procs:
    raise ValueError(f"{flag}={global_batch} is not divisible by the {procs} processes")
  return global_batch // procs


def global_batch(local: Any, mesh: Mesh) -> Any:
  """Assemble per-process numpy batches into global arrays split over the batch axes."""
  sharding = batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)),
                      local)


def prefetch_to_mesh(local_batches: Iterator[Any], mesh: Mesh, size: int = 2) -> Iterator[Any]:
  """Global batches from per-process ones, ``size`` ahead of the consumer.

  ``jax.make_array_from_process_local_data`` starts the host-to-device copies
  asynchronously, so building the next batches while the current step runs
  overlaps the transfers with compute (what ``flax.jax_utils.prefetch_to_device``
  does for ``pmap``, here for a mesh). Batches held in the queue are not
  consumed: a trainer that counts the batches it *stepped on* resumes exactly.
  """
  if size < 1:
    raise ValueError(f"prefetch size must be >= 1, got {size}")
  queue: collections.deque = collections.deque()

  def fill(n: int) -> None:
    for local in itertools.islice(local_batches, n):
      queue.append(global_batch(local, mesh))

  fill(size)
  while queue:
    batch = queue.popleft()
    fill(1)   # before handing out the batch: `size` stay in flight during its step
    yield batch


def activation_resolver(mesh: Mesh, rules: Sequence[tuple[str, Any]] = DEFAULT_RULES
                        ) -> Callable[[tuple[str | None, ...], tuple[int, ...]], NamedSharding]:
  """Logical activation axes → a NamedSharding on ``mesh`` by ``rules``
  (``orthojax.nn.sharding.activation_sharding``). An axis is replicated when its mesh axes do
  not divide it or an earlier axis took them (``("batch", "embed")`` shards the batch)."""
  def resolve(names, shape):
    spec, taken = [], set()
    for axes in _divisible(tuple(spmd.from_sharding_rules(tuple(names), list(rules))), shape,
                           mesh):
      mesh_axes = {axes} if isinstance(axes, str) else set(axes or ())
      spec.append(None if mesh_axes & taken else axes)
      taken |= mesh_axes
    return NamedSharding(mesh, P(*spec))
  return resolve


def with_activation_sharding(fn: Callable[..., Any], mesh: Mesh,
                             rules: Sequence[tuple[str, Any]] = DEFAULT_RULES
                             ) -> Callable[..., Any]:
  """``fn`` traced under ``mesh``'s activation rules (:func:`activation_resolver`), so
  that the models' activations keep the batch's sharding
  (``orthojax.nn.sharding.constrain``)."""
  resolve = activation_resolver(mesh, rules)

  @functools.wraps(fn)
  def traced(*args, **kwargs):
    with nn_sharding.activation_sharding(resolve):
      return fn(*args, **kwargs)
  return traced


def _divisible(spec: tuple[Any, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
  out = []
  for axes, dim in zip(spec, shape):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[n] for n in names)
    out.append(axes if names and dim % size == 0 else None)
  return P(*out)


def _fsdp_heuristic(shape: tuple[int, ...], mesh: Mesh, min_size: int) -> P:
  ways = mesh.shape["fsdp"]
  if ways == 1 or math.prod(shape) < min_size:
    return P()
  for axis in sorted(range(len(shape)), key=lambda a: -shape[a]):
    if shape[axis] % ways == 0:
      spec = [None] * len(shape)
      spec[axis] = "fsdp"
      return P(*spec)
  return P()


def param_shardings(state: Any, mesh: Mesh, rules: Sequence[tuple[str, Any]] = DEFAULT_RULES,
                    min_fsdp_size: int = 2 ** 14) -> Any:
  """NamedShardings for an ``nnx.State`` (concrete or abstract), as a pure dict tree.

  Logical names from Variable metadata go through ``rules``; Variables
  without names use the FSDP heuristic; scalars are replicated.
  """
  def one(var):
    shape = tuple(np.shape(var.get_value()))
    names = var.get_metadata().get("out_sharding")
    if names and len(names) == len(shape):
      spec = _divisible(tuple(spmd.from_sharding_rules(tuple(names), list(rules))), shape, mesh)
    else:
      spec = _fsdp_heuristic(shape, mesh, min_fsdp_size)
    return NamedSharding(mesh, spec)

  tree = jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  return nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree


def opt_state_shardings(tx: optax.GradientTransformation, abstract_params: Any,
                        params_shardings: Any, mesh: Mesh) -> Any:
  """Optimizer-state shardings of ``tx`` for these params (:func:`state_shardings`)."""
  return state_shardings(jax.eval_shape(tx.init, abstract_params), abstract_params,
                         params_shardings, mesh)


def state_shardings(abstract_state: Any, abstract_params: Any, params_shardings: Any,
                    mesh: Mesh) -> Any:
  """Shardings of an optimizer state: param-shaped leaves follow their param, owners' rows
  are split over the owner axes, the rest replicate.

  A state leaf follows the param whose key path ends its own (``state.mu['dense']['kernel']``
  follows ``['dense']['kernel']``) when their shapes agree; a leaf of another shape
  (Riemannian Adam's ``second_moment="matrix"``: one scalar per matrix) is replicated.
  The rows of an :class:`orthojax.optim.ShardedUpdateState` (one per owner device) are
  split over the owner axes; in its replicated part, the param-shaped state of the leaves
  every device updates follows its param, the state of the matrices it splits over all
  owners (``split_above``) is split like them, and the rest is replicated.
  ``optax.MaskedNode`` s (a partitioned or masked transformation's placeholders) stay as
  they are.
  """
  flat = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
  follow = {tuple(path): (sharding, tuple(leaf.shape))
            for (path, leaf), sharding in zip(flat, jax.tree.leaves(params_shardings))}
  rep = replicated(mesh)

  def leaf_sharding(path, leaf):
    path = tuple(path)
    for start in range(len(path) + 1):
      found = follow.get(path[start:])
      if found is not None and found[1] == tuple(leaf.shape):
        return found[0]
    return rep

  def node(path, x):
    if isinstance(x, oj_optim.ShardedUpdateState):
      rows = NamedSharding(mesh, P(x.layout.axes))
      return oj_optim.ShardedUpdateState(
          {d: rows for d in x.owned},
          x.layout.replicated_shardings(mesh, jax.tree.leaves(params_shardings)), x.layout)
    return leaf_sharding(path, x)

  return jax.tree_util.tree_map_with_path(
      node, abstract_state, is_leaf=lambda x: isinstance(x, oj_optim.ShardedUpdateState))



def saved_form(abstract_opt_state: Any, abstract_params: Any, params_shardings: Any,
               state_sharding: Any, mesh: Mesh
               ) -> tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]:
  """The train state as checkpoints hold it: its shardings and the conversions to and from it.

  An owner-sharded optimizer state (:class:`orthojax.optim.ShardedUpdateState`) is saved in
  the replicated layout (:func:`orthojax.optim.replicated_state`), so that a checkpoint
  restores on any device count, with or without owner sharding.

  Args:
    abstract_opt_state: the optimizer state, abstract (``jax.eval_shape`` of ``tx.init``).
    abstract_params: the pure parameter tree, abstract.
    params_shardings: the parameters' shardings (:func:`param_shardings`).
    state_sharding: the train state's shardings (a NamedTuple with an ``opt_state``).
    mesh: the mesh.

  Returns:
    ``(saved_sharding, to_saved, from_saved)``: the saved state's shardings, a jitted
    ``state -> saved state`` and its inverse onto ``state_sharding`` (all three the
    identity's when nothing is owner-sharded).
  """
  is_sharded = lambda x: isinstance(x, oj_optim.ShardedUpdateState)
  if not any(map(is_sharded, jax.tree.leaves(abstract_opt_state, is_leaf=is_sharded))):
    return state_sharding, lambda state: state, lambda state: state
  saved_opt = jax.eval_shape(oj_optim.replicated_state, abstract_opt_state)
  saved_sharding = state_sharding._replace(
      opt_state=state_shardings(saved_opt, abstract_params, params_shardings, mesh))
  to_saved = jax.jit(
      lambda s: s._replace(opt_state=oj_optim.replicated_state(s.opt_state)),
      out_shardings=saved_sharding)
  from_saved = jax.jit(
      lambda s: s._replace(opt_state=oj_optim.sharded_state(s.opt_state, abstract_opt_state)),
      out_shardings=state_sharding)
  return saved_sharding, to_saved, from_saved
