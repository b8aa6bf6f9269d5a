"""Owner-sharded updates equal the replicated ones, for every orthogonalizing optimizer.

Every case runs the same transformation twice under ``jax.jit`` on the same
devices — replicated, and wrapped by ``oj.optim.shard_update`` — for two
steps from the same point, and compares the updates and the state
(``oj.optim.replicated_state``) leaf by leaf.
"""

import collections

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

import orthojax as oj
from orthojax.compile import hlo
from orthojax.optim.execution import owners as _owners

STACKED = oj.linalg.MatrixView.stacked()
CONV = oj.linalg.MatrixView.conv(2)
# A wide Dense kernel, a (tall) conv kernel, a stack with fewer layers than
# devices and one whose layer count 8 does not divide.
SHAPES = {"wide": (6, 20), "conv": (3, 3, 4, 8), "few": (3, 16, 12), "odd": (13, 12, 12)}
VIEWS = {"few": STACKED, "odd": STACKED, "even": STACKED, "odd_bf16": STACKED}
# For the mesh cases: a wide kernel and an odd stack (each compile is seconds).
SMALL = {"wide": (6, 20), "odd": (13, 12, 12)}

OPTIMIZERS = {
    "radam-fused-qr": lambda: oj.optim.radam(1e-2, views=VIEWS),
    "radam-fused-cayley": lambda: oj.optim.radam(1e-2, oj.manifolds.Stiefel("cayley"),
                                                 views=VIEWS),
    "radam-chain-canonical": lambda: oj.optim.radam(
        1e-2, oj.manifolds.Stiefel("cayley", metric="canonical"), views=VIEWS),
    "radam-chain-oblique": lambda: oj.optim.radam(1e-2, oj.manifolds.Oblique(), views=VIEWS),
    "rsgd-momentum": lambda: oj.optim.rsgd(1e-2, momentum=0.9, views=VIEWS),
    "cayley_sgd": lambda: oj.optim.cayley_sgd(1e-2, views=VIEWS),
    "cayley_adam": lambda: oj.optim.cayley_adam(1e-2, views=VIEWS),
    "landing": lambda: oj.optim.landing(1e-2, views=VIEWS),
    "projected_gradient": lambda: oj.optim.projected_gradient(optax.adam(1e-2), views=VIEWS),
    "muon": lambda: oj.optim.muon(1e-2, views=VIEWS),
    "stiefel_muon": lambda: oj.optim.stiefel_muon(1e-2, views=VIEWS),
    "manifold_muon": lambda: oj.optim.manifold_muon(1e-2, steps=20, views=VIEWS),
}


def _mesh(data, fsdp=1):
  if jax.device_count() < data * fsdp:
    pytest.skip(f"needs {data * fsdp} (simulated) devices")
  devices = np.array(jax.devices()[:data * fsdp]).reshape(data, fsdp)
  return Mesh(devices, ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2)


def _params(dtype, shapes=SHAPES, manifold=None):
  manifold = manifold or oj.manifolds.Stiefel()
  keys = jax.random.split(jax.random.key(0), len(shapes))
  return {name: manifold.random(k, shape, view=VIEWS.get(name)).astype(dtype)
          for k, (name, shape) in zip(keys, sorted(shapes.items()))}


def _grads(params, step):
  rng = np.random.default_rng(step)
  return {name: jnp.asarray(rng.standard_normal(p.shape), p.dtype)
          for name, p in sorted(params.items())}


def _trajectory(tx, params, mesh, steps=2):
  # Inputs replicated on the mesh as the step's outputs are: one compile per case.
  params = jax.device_put(params, NamedSharding(mesh, P()))

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    # Parameters stay replicated, as a data-parallel trainer keeps them (a split matrix's
    # update comes out split): the second step's inputs are laid out as the first's.
    params = jax.lax.with_sharding_constraint(optax.apply_updates(params, updates),
                                              NamedSharding(mesh, P()))
    return updates, params, state

  # The step's outputs are on the mesh: so are its first inputs (a state leaf init left
  # on one device would compile the step a second time for the second step).
  on_mesh = lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(
      x, NamedSharding(mesh, P()))
  state = jax.tree.map(on_mesh, jax.jit(tx.init)(params))
  out = []
  for i in range(steps):
    grads = jax.device_put(_grads(params, i), NamedSharding(mesh, P()))
    updates, params, state = step(params, state, grads)
    out.append(updates)
  return out, params, state


def _close(a, b, dtype, atol=2e-6, split=()):
  """Leaf by leaf; bfloat16 leaves (whatever ``dtype``) to one bfloat16 ulp, the leaves
  (and their state) named in ``split`` to ``atol``, the others to 2e-6 (or ``atol`` if
  ``split`` is empty)."""
  def check(path, x, y):
    names = {k.key for k in path if isinstance(k, jax.tree_util.DictKey)}
    if dtype == jnp.bfloat16 or jnp.dtype(y.dtype) == jnp.bfloat16:
      # float32 arithmetic rounded to bfloat16: one ulp apart at most
      kw = dict(rtol=2 ** -7, atol=2 ** -7)
    else:
      kw = dict(rtol=2e-5, atol=atol if not split or names & set(split) else 2e-6)
    np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                               err_msg=jax.tree_util.keystr(path), **kw)
  jax.tree_util.tree_map_with_path(check, a, b)


def _compare(make, mesh, dtype, params=None, shapes=SHAPES, split_above=None, atol=2e-6,
             make_sharded=None, split=()):
  params = _params(dtype, shapes) if params is None else params
  replicated = make()
  shard = lambda tx: oj.optim.shard_update(tx, mesh, views=VIEWS, split_above=split_above)
  sharded = shard(make()) if make_sharded is None else make_sharded(shard)
  ref_updates, ref_params, ref_state = _trajectory(replicated, params, mesh)
  got_updates, got_params, got_state = _trajectory(sharded, params, mesh)
  is_sharded = lambda x: isinstance(x, oj.optim.ShardedUpdateState)
  assert any(map(is_sharded, jax.tree.leaves(got_state, is_leaf=is_sharded)))
  for ref, got in zip(ref_updates, got_updates):
    _close(got, ref, dtype, atol, split)
  _close(got_params, ref_params, dtype, atol, split)
  _close(jax.jit(oj.optim.replicated_state)(got_state), ref_state, dtype, atol, split)
  return got_state


@pytest.mark.parametrize("data,fsdp", [(1, 8), (2, 4)])
@pytest.mark.parametrize("name", ["radam-fused-qr", "muon"])
def test_fsdp_and_data_times_fsdp_meshes(name, data, fsdp):
  _compare(OPTIMIZERS[name], _mesh(data, fsdp), jnp.float32, shapes=SMALL)


@pytest.mark.parametrize("name,data,fsdp", [("radam-fused-qr", 2, 4), ("muon", 8, 1)])
def test_an_evenly_split_stack_enters_and_leaves_in_its_layout(name, data, fsdp):
  """E5's case: a stack alone, 2 layers per owner in owner order (on data x fsdp too)."""
  state = _compare(OPTIMIZERS[name], _mesh(data, fsdp), jnp.float32, shapes={"even": (16, 12, 12)})
  (node,) = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(
      x, oj.optim.ShardedUpdateState)) if isinstance(x, oj.optim.ShardedUpdateState)]
  assert node.layout.striped == ((0, 2),) and node.layout.update_lengths == ()


@pytest.mark.parametrize("name", ["radam-fused-qr", "muon"])
def test_a_striped_stack_with_a_short_tail_beside_a_matrix(name):
  """E5's tree in small: the kernel on the last owner, the stack in 2-layer blocks
  (owners 0-5 two layers, owner 6 the last one, owner 7 none of it)."""
  shapes = {"odd": (13, 12, 12), "tall": (40, 12)}
  state = _compare(OPTIMIZERS[name], _mesh(8), jnp.float32, shapes=shapes)
  (node,) = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(
      x, oj.optim.ShardedUpdateState)) if isinstance(x, oj.optim.ShardedUpdateState)]
  odd = sorted(shapes).index("odd")
  assert dict(node.layout.striped) == {odd: 2}


# One tree per optimizer for three concerns, each a property of its own leaves (owners
# update whole leaves alone; the split ones are shared by all, the compiler partitioning
# their products; owner buffers are packed per dtype), so they share one compile of
# each path instead of three:
# - owner-sharded equals replicated (SHAPES: a wide Dense kernel, a conv kernel, a stack
#   with fewer layers than devices, one whose 13 layers 8 does not divide), to 2e-6;
# - split matrices equal replicated (SPLIT: a tall Dense kernel split along its rows, a
#   wide 1 x 1 conv kernel along its output channels, a 3 x 3 conv kernel along its input
#   channels, moved to the front for the update: its rows permuted), to 1e-5: partial sums over 8
#   devices round differently, and after two Cayley / QR retractions entries of size ~0.1
#   differ by a few 1e-6;
# - bfloat16 (a wide kernel and an odd stack in bfloat16), to one bfloat16 ulp.
# split_above=1 splits only the two large kernels (the layout is checked below); the
# whole leaves take the owner path the default (no split) takes.
SPLIT = {"tall": (128, 16), "wide_conv": (1, 1, 16, 96), "k3": (3, 3, 16, 16)}
MIXED = {**SHAPES, **SPLIT}
BF16 = {"wide_bf16": (6, 20), "odd_bf16": (13, 12, 12)}


def _node(state):
  (node,) = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(
      x, oj.optim.ShardedUpdateState)) if isinstance(x, oj.optim.ShardedUpdateState)]
  return node


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_sharded_and_split_equal_replicated_in_float32_and_bfloat16(name):
  manifold = oj.manifolds.Oblique() if name == "radam-chain-oblique" else None
  params = {**_params(jnp.float32, MIXED, manifold),
            **_params(jnp.bfloat16, BF16, manifold)}
  state = _compare(OPTIMIZERS[name], _mesh(8), jnp.float32, params, split_above=1.0,
                   atol=1e-5, split=tuple(SPLIT))
  layout = _node(state).layout
  names = sorted(params)
  assert {(names[s.index], s.axis, s.front) for s in layout.split} == {
      ("tall", 0, 0), ("wide_conv", 3, 3), ("k3", 2, 0)}
  assert {names[leaf.index] for leaf in layout.leaves} == set(params) - set(SPLIT)
  assert {d for d, _ in layout.state_lengths} >= {"float32", "bfloat16"} or name == "landing"
  # Their param-shaped state (moments, momentum; landing keeps none) is split like
  # them: each device holds 1/8 of it.
  positions = jax.tree.leaves(_node(state).replicated,
                              is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  assert bool(layout.split_positions()) == (name not in ("landing",))
  for k, role in layout.split_positions().items():
    (shard,) = {s.data.shape for s in positions[k].addressable_shards}
    assert np.prod(shard) * 8 == np.prod(layout.param_avals[role][0])


@pytest.mark.parametrize("dtype", [jnp.bfloat16])
@pytest.mark.parametrize("name", ["radam-fused-cayley", "muon"])
def test_split_matrices_in_bfloat16_and_on_data_times_fsdp(name, dtype):
  params = _params(dtype, {"tall": (64, 16), "conv": (3, 3, 4, 8)})
  _compare(OPTIMIZERS[name], _mesh(2, 4), dtype, params, split_above=1.0)


# Muon built without views= follows shard_update's, and a split matrix's view there says
# its rows lie in 8 blocks: where a block is shorter than the short side, Newton–Schulz
# applies A twice to it rather than forming the p x p square on every device.
ROW_BLOCKS = {"tall": (64, 16), "wide_conv": (1, 1, 16, 96), "k3": (3, 3, 16, 16)}
VIEWLESS = {"muon": lambda: oj.optim.muon(1e-2),
            "stiefel_muon": lambda: oj.optim.stiefel_muon(1e-2),
            "radam-fused-qr": lambda: oj.optim.radam(1e-2)}   # row_blocks unread: as before


@pytest.mark.parametrize("name", sorted(VIEWLESS))
def test_split_rows_apply_the_polynomial_to_their_blocks(name):
  """Equal to the replicated update (built with the views), and each device's products
  are the cost model's: ``tall`` (8 rows of 16 each) and ``wide_conv`` (12 of 16) apply
  ``A`` twice, ``k3`` (18 of 16) forms ``A²``; with the views bound at construction the
  split matrices keep the square (more products per device)."""
  params = _params(jnp.float32, ROW_BLOCKS)
  _compare(OPTIMIZERS[name], _mesh(8), jnp.float32, params, split_above=0.01, atol=1e-5,
           make_sharded=lambda shard: shard(VIEWLESS[name]()), split=tuple(ROW_BLOCKS))
  mesh = _mesh(8)
  placed = jax.device_put(params, NamedSharding(mesh, P()))
  flops = {}
  for kind, tx in (("viewless", VIEWLESS[name]()), ("bound", OPTIMIZERS[name]())):
    sharded = oj.optim.shard_update(tx, mesh, views=VIEWS, split_above=0.01)
    state = jax.jit(sharded.init)(placed)
    assert {sorted(params)[s.index] for s in _node(state).layout.split} == set(ROW_BLOCKS)
    if name == "muon":
      compiled = jax.jit(sharded.update).lower(placed, state, placed).compile()
      flops[kind] = hlo.Module.from_text(compiled.as_text()).matmul_flops()
  if name == "muon":
    per_device = sum(oj.linalg.newton_schulz_multiply_adds(n, p, 5, row_blocks=8)
                     for n, p in ((64, 16), (96, 16), (144, 16)))
    assert flops["viewless"] == 2 * per_device
    assert flops["bound"] > flops["viewless"]


def test_the_split_axis_is_on_the_long_side_and_keeps_the_views_reshape_in_blocks():
  """Split by rows: the outermost axis of the view's long side that 8 divides. A 1 x 1
  projection on its output channels (its long side); a 3 x 3 kernel, whose long side
  (3, 3, cin) starts with a 3, on its input channels, moved to the front of that side
  for the update; a kernel with no such axis (its short side would divide) stays whole."""
  params = {name: jax.ShapeDtypeStruct(shape, jnp.float32) for name, shape in
            {"proj": (1, 1, 16, 64), "k3": (3, 3, 16, 16), "odd": (3, 3, 12, 16),
             "tall": (64, 16)}.items()}
  layout = oj.optim.plan(oj.optim.muon(1e-2), params, num_owners=8, split_above=0.01)
  names = sorted(params)
  assert {names[s.index]: (s.axis, s.front) for s in layout.split} == {
      "proj": (3, 3), "k3": (2, 0), "tall": (0, 0)}
  assert [s.moved for s in layout.split if names[s.index] == "k3"] == [True]
  assert layout.split_spec(names.index("k3")) == P(None, None, ("data", "fsdp"), None)


def test_split_above_is_checked():
  with pytest.raises(ValueError, match=r"split_above=0.0; pass a positive multiple"):
    oj.optim.shard_update(oj.optim.muon(1e-2), _mesh(8), split_above=0.0)


def test_state_lives_on_its_owner_and_round_trips():
  mesh = _mesh(8)
  params = _params(jnp.float32)
  tx = oj.optim.shard_update(oj.optim.radam(1e-2, views=VIEWS), mesh, views=VIEWS)
  state = jax.jit(tx.init)(params)
  # One row per owner, split over the devices: each holds its own matrices' moments.
  for buffer in state.owned.values():
    assert buffer.shape[0] == 8
    assert {s.data.shape[0] for s in buffer.addressable_shards} == {1}
  # The owners together hold the replicated state once, plus a copy of the step
  # counters each; each row is as long as the fullest owner's.
  replicated = oj.optim.radam(1e-2, views=VIEWS).init(params)
  nbytes = lambda xs: sum(x.size * x.dtype.itemsize for x in xs)
  layout = state.layout
  held = [sum(int(np.prod(e[0])) * np.dtype(e[1]).itemsize for e in o.entries if e)
          for o in layout.owner_states]
  counters = nbytes([replicated[1].count, replicated[3].count])
  assert sum(held) == nbytes(jax.tree.leaves(replicated)) + 7 * counters
  assert layout.state_bytes_per_owner() == max(held)
  # replicated_state / sharded_state are inverse to each other.
  state = _trajectory(tx, params, mesh)[2]
  again = jax.jit(lambda s: oj.optim.sharded_state(oj.optim.replicated_state(s), s))(state)
  jax.tree.map(np.testing.assert_array_equal, again, state)


def test_resume_on_another_device_count_and_replicated():
  """Two steps on 8 owners, then two on 4 and on 1 (replicated), equal four on 8."""
  params = _params(jnp.float32, SMALL)
  make = OPTIMIZERS["radam-fused-cayley"]
  ref_updates, ref_params, ref_state = _trajectory(
      oj.optim.shard_update(make(), _mesh(8), views=VIEWS), params, _mesh(8), steps=4)
  first = oj.optim.shard_update(make(), _mesh(8), views=VIEWS)
  _, mid_params, mid_state = _trajectory(first, params, _mesh(8), steps=2)
  # As a checkpoint holds it: the replicated layout, as host arrays.
  saved = jax.device_get(jax.jit(oj.optim.replicated_state)(mid_state))
  mid_params = jax.device_get(mid_params)
  for mesh in (_mesh(4), _mesh(1)):
    tx = oj.optim.shard_update(make(), mesh, views=VIEWS)
    like = jax.eval_shape(tx.init, mid_params)
    state = jax.jit(lambda s: oj.optim.sharded_state(s, like))(saved)
    update = jax.jit(tx.update)
    p = mid_params
    for step in range(2, 4):
      updates, state = update(_grads(params, step), state, p)
      p = optax.apply_updates(p, updates)
    _close(p, ref_params, jnp.float32)


def test_partitioned_model_shards_only_the_manifold_group():
  """As the trainer builds it: partition(stiefel=radam (sharded), euclidean=adam)."""
  mesh = _mesh(8)
  params = {**_params(jnp.float32), "bias": jnp.linspace(-1.0, 1.0, 7)}
  labels = {name: "euclidean" if name == "bias" else "stiefel" for name in params}
  make = lambda shard=lambda tx: tx: oj.optim.partition(
      labels, stiefel=shard(oj.optim.radam(1e-2, views=VIEWS)), euclidean=optax.adam(1e-2))
  _compare(make, mesh, jnp.float32, params, make_sharded=make)


def test_a_mesh_without_data_parallel_axes_is_one_line():
  if jax.device_count() < 2:
    pytest.skip("needs 2 devices")
  mesh = Mesh(np.array(jax.devices()[:2]), ("batch",))
  with pytest.raises(ValueError, match=r"neither 'data' nor 'fsdp'; pass axes"):
    oj.optim.shard_update(oj.optim.muon(1e-2), mesh)
  with pytest.raises(ValueError, match=r"axes \['data'\] are not axes"):
    oj.optim.shard_update(oj.optim.muon(1e-2), mesh, axes=("data",))
  assert oj.optim.num_owners(mesh, ("batch",)) == 2


@pytest.mark.parametrize("seed", range(6))
def test_owner_assignment_covers_every_matrix_once_and_balances(seed):
  rng = np.random.default_rng(seed)
  leaves = []
  for i in range(int(rng.integers(1, 30))):
    n, p = sorted(int(x) for x in rng.integers(8, 512, size=2))[::-1]
    layers = int(rng.choice([1, 1, 1, 3, 13, 200]))
    batch = () if layers == 1 else (0,)
    shape = (n, p) if layers == 1 else (layers, n, p)
    leaves.append(_owners.MatrixLeaf(i, shape, batch, _owners.matrix_cost(n, p)))
  for owners in (1, 3, 8, 16, 64):
    pieces = _owners.assign_owners(leaves, owners)
    for leaf in leaves:
      mine = sorted(p for ps in pieces for p in ps if p.index == leaf.index)
      assert mine[0].start == 0 and mine[-1].stop == leaf.length
      assert all(a.stop == b.start for a, b in zip(mine, mine[1:]))   # a partition
    assert all(len({p.index for p in ps}) == len(ps) for ps in pieces)  # one piece per leaf
    loads = _owners.loads(leaves, pieces)
    biggest = max([leaf.matrix_cost for leaf in leaves if leaf.length == 1], default=0)
    layer = max([leaf.matrix_cost for leaf in leaves if leaf.length > 1], default=0)
    # Graham's LPT bound on the single matrices (against the optimum's lower bound
    # max(mean, biggest)), plus less than one layer of water-filling overshoot.
    assert max(loads) <= 4 / 3 * max(sum(loads) / owners, biggest) + layer


def test_splitting_the_largest_kernels_balances_the_owners():
  """ResNet-50's case in small: one kernel carries a fifth of the cost. Whole-matrix
  ownership leaves its owner 3x the mean on 16 owners; split over them all, the most
  loaded owner is within the next kernel's cost of the mean."""
  shapes = [(2048, 1024)] + [(4608, 512)] * 3 + [(2048, 512)] * 6 + [(1152, 128)] * 20
  leaves = [_owners.MatrixLeaf(i, s, (), _owners.matrix_cost(*s)) for i, s in enumerate(shapes)]
  assert _owners.split_matrices(leaves, 16, None) == ()
  assert _owners.split_matrices(leaves, 1, 1.0) == ()
  split = _owners.split_matrices(leaves, 16, 1.0)
  total = sum(leaf.matrix_cost for leaf in leaves)
  assert split == tuple(i for i, leaf in enumerate(leaves) if leaf.matrix_cost > total / 16)
  assert split[0] == 0 and set(split) == {0, 1, 2, 3}
  whole = _owners.loads(leaves, _owners.assign_owners(leaves, 16))
  rest = [leaf for leaf in leaves if leaf.index not in split]
  shared = sum(_owners.split_cost(*leaves[i].shape, 16) for i in split)
  loads = [x + shared for x in _owners.loads(rest, _owners.assign_owners(rest, 16))]
  assert max(whole) / (sum(whole) / 16) > 2.5
  assert max(loads) <= sum(loads) / 16 + leaves[4].matrix_cost
  # Only the allowed (evenly divisible) ones are split.
  assert _owners.split_matrices(leaves, 16, 1.0, splittable=[1, 2]) == (1, 2)


@pytest.mark.parametrize("owners,share,tail", [(8, 26, 18), (16, 13, 5)])
def test_a_lone_stack_is_striped_with_the_single_kernels_last(owners, share, tail):
  """E5: a 3072 x 400 input kernel (7.7 layers' cost) and a 200 x 400 x 400 stack."""
  leaves = [_owners.MatrixLeaf(0, (3072, 400), (), _owners.matrix_cost(3072, 400)),
            _owners.MatrixLeaf(1, (200, 400, 400), (0,), _owners.matrix_cost(400, 400))]
  pieces = _owners.assign_owners(leaves, owners)
  expected = [(_owners.Piece(1, j * share, (j + 1) * share),) for j in range(owners - 1)]
  assert list(pieces[:-1]) == expected
  assert pieces[-1] == (_owners.Piece(0, 0, 1), _owners.Piece(1, 200 - tail, 200))
  loads = _owners.loads(leaves, pieces)   # as balanced as the water-fill's optimum
  assert max(loads) * owners / sum(loads) < 1.002


def test_striped_stacks_move_as_blocks_and_match_the_replicated_update():
  """``stripe_stacks``: every stack striped over the owners, entering and leaving as each
  owner's block of layers (padded to owners × share); the update is unchanged."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (simulated) devices")
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",), axis_types=(AxisType.Auto,))
  stack = oj.linalg.MatrixView.stacked()
  params = {"a": jax.random.normal(jax.random.PRNGKey(0), (5, 12, 8)),   # 5 layers: padded to 8
            "b": jax.random.normal(jax.random.PRNGKey(1), (11, 8, 16)),  # 11: two per owner
            "w": jax.random.normal(jax.random.PRNGKey(2), (16, 8))}      # a single: packed
  grads = jax.tree.map(lambda x: 0.1 * jnp.cos(x), params)
  views = {"a": stack, "b": stack}
  tx = oj.optim.shard_update(oj.optim.muon(0.02, views=views), mesh, views=views,
                             stripe_stacks=True)
  layout = oj.optim.plan(oj.optim.muon(0.02, views=views), params, num_owners=8,
                         views=views, stripe_stacks=True)
  assert dict(layout.striped) == {0: 1, 1: 2}
  state = jax.jit(tx.init)(params)
  updates, _ = jax.jit(tx.update)(grads, state, params)
  reference = oj.optim.muon(0.02, views=views)
  expected, _ = reference.update(grads, reference.init(params), params)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6),
               updates, expected)


def test_on_the_nnx_optimizer_path_the_plan_follows_the_recorded_views():
  """``nnx.Optimizer(model, tx)`` hands ``init`` the Variables and ``update`` their bare
  values: without ``views=``, the owners take the matrices the Variables record (a scanned
  transformer's stacked kernels; not its (L, d) norm scales, embedding or head), and
  the step equals the unsharded one."""
  mesh = _mesh(8)
  make = lambda: oj.models.TransformerLM(11, depth=2, width=8, heads=2, stiefel="attention",
                                         scale="output", rngs=nnx.Rngs(0))
  shard = lambda tx: oj.optim.shard_update(tx, mesh)
  tx = lambda model, wrap: oj.optim.partition(model, stiefel=wrap(oj.optim.radam(1e-2)),
                                              euclidean=wrap(oj.optim.muon(1e-2, ns_steps=2)))
  sharded, replicated = make(), make()
  opt_sharded = nnx.Optimizer(sharded, tx(sharded, shard), wrt=nnx.Param)
  opt_replicated = nnx.Optimizer(replicated, tx(replicated, lambda t: t), wrt=nnx.Param)
  rng = np.random.default_rng(0)
  grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype),
                       nnx.state(sharded, nnx.Param))

  @nnx.jit
  def steps(a, opt_a, b, opt_b, g):
    opt_a.update(a, g)
    opt_b.update(b, g)

  steps(sharded, opt_sharded, replicated, opt_replicated, grads)
  is_sharded = lambda x: isinstance(x, oj.optim.ShardedUpdateState)
  states = jax.tree.leaves(opt_sharded.opt_state, is_leaf=is_sharded)
  owned = sorted(tuple(leaf.shape) for s in states if is_sharded(s) for leaf in s.layout.leaves)
  # qkv and attn_out on the Stiefel manifold; mlp_in and mlp_out to Muon.
  assert owned == [(2, 3, 8, 8), (2, 8, 8), (2, 8, 32), (2, 32, 8)]
  got = nnx.to_pure_dict(nnx.state(sharded, nnx.Param))
  want = nnx.to_pure_dict(nnx.state(replicated, nnx.Param))
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6), got, want)


ROW_SPLIT = {
    **{name: OPTIMIZERS[name] for name in ("radam-fused-qr", "rsgd-momentum",
                                           "radam-fused-cayley", "muon", "stiefel_muon")},
    # The QR retraction; the default polar one takes an SVD, which is not row-local.
    "projected_gradient-qr": lambda: oj.optim.projected_gradient(
        optax.adam(1e-2), oj.manifolds.Stiefel("qr"), views=VIEWS),
}


@pytest.mark.parametrize("name", sorted(ROW_SPLIT))
def test_a_row_split_matrix_is_never_gathered_inside_its_update(name):
  """Split by rows, a tall matrix's update all-reduces ``p x p`` Gram matrices and never
  gathers the matrix (CholeskyQR's triangular solve kept split: linalg._rows); counted in
  the step no guard fires in (Householder's fall-back gathers it, as it must)."""
  mesh = _mesh(8)
  params = jax.device_put(_params(jnp.float32, {"tall": (256, 16), "wide": (6, 20)}),
                          NamedSharding(mesh, P()))
  tx = oj.optim.shard_update(ROW_SPLIT[name](), mesh, views=VIEWS, split_above=1.0)
  state = jax.jit(tx.init)(params)
  text = jax.jit(tx.update).lower(params, state, params).compile().as_text()
  module = hlo.Module.from_text(text, branches="cheapest")
  ops = collections.Counter((ins.op.removesuffix("-start"), ins.type.split("{")[0])
                            for ins, _, _ in module.instructions())
  assert ops[("all-gather", "f32[256,16]")] == 0, ops
  # the Gram matrices, summed (alone or in a tuple the compiler combined)
  assert sum(n for (op, t), n in ops.items() if op == "all-reduce" and "f32[16,16]" in t), ops


# One matrix dominating the owners' updates (its owner's row is 16x the small ones'), in
# float32 beside bfloat16 ones: the padded all-gather would move 8 rows of 16,384 elements
# for 23,552 of updates.
DOMINATED = {"big": (256, 64), **{f"s{i}": (32, 32) for i in range(7)}}
DOMINATED_BF16 = {"b_bf16": (64, 16), "c_bf16": (16, 8)}


@pytest.mark.parametrize("name", ["radam-fused-qr", "muon", "rsgd-momentum", "stiefel_muon"])
def test_a_dominated_plan_shares_the_updates_by_one_exact_sum(name):
  """Where the padded rows of an all-gather would move more than twice the updates, the
  owners write their rows at their own offsets and all-reduce them: the same updates and
  state as the replicated transformation, the all-reduce in the sharing's scope and no
  all-gather."""
  params = {**_params(jnp.float32, DOMINATED), **_params(jnp.bfloat16, DOMINATED_BF16)}
  state = _compare(OPTIMIZERS[name], _mesh(8), jnp.float32, params)
  layout = _node(state).layout
  assert layout.update_sharing == "sum"
  rows = dict(layout.update_lengths)
  assert rows["float32"] == 256 * 64
  bases = [layout.update_bases(j)["float32"] for j in range(8)]
  assert bases == sorted(bases) and bases[-1] + rows["float32"] == (
      layout.summed_lengths()["float32"])
  tx = oj.optim.shard_update(OPTIMIZERS[name](), _mesh(8), views=VIEWS)
  state = jax.jit(tx.init)(params)
  text = jax.jit(tx.update).lower(params, state, params).compile().as_text()
  module = hlo.Module.from_text(text, branches="cheapest")
  every = module.collectives()
  outside_sharing = module.collectives(excluding="owner_sharded")
  # one per dtype, or one that XLA's all-reduce combiner made of the two
  assert every["all-reduce"]["count"] in (1, 2) and "all-gather" not in every, every
  assert "all-reduce" not in outside_sharing, outside_sharing


def test_a_balanced_plan_keeps_the_all_gather():
  params = _params(jnp.float32, {f"m{i}": (32, 16) for i in range(8)})
  state = _compare(OPTIMIZERS["radam-fused-qr"], _mesh(8), jnp.float32, params)
  assert _node(state).layout.update_sharing == "gather"
