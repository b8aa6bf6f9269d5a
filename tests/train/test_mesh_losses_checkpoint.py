"""Mesh construction, sharding rules, losses, and Orbax save/restore across meshes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import orthojax as oj
from orthojax.train import checkpoint as ckpt_lib
from orthojax.train import losses
from orthojax.train import mesh as mesh_lib


@pytest.mark.parametrize("sizes,shape", [
    (dict(), (8, 1, 1)), (dict(data=2, fsdp=-1), (2, 4, 1)), (dict(data=-1, fsdp=2), (4, 2, 1)),
    (dict(data=1, fsdp=8), (1, 8, 1)), (dict(data=2, fsdp=2, model=2), (2, 2, 2))])
def test_make_mesh_fills(sizes, shape):
  mesh = mesh_lib.make_mesh(**sizes)
  assert tuple(mesh.shape[a] for a in mesh_lib.AXES) == shape


@pytest.mark.parametrize("sizes,fragment", [
    (dict(data=3), "data*fsdp*model = 3"), (dict(data=-1, fsdp=-1), "only one axis"),
    (dict(data=0), "config.mesh.data=0"), (dict(data=-1, fsdp=3), "cannot be split")])
def test_make_mesh_errors(sizes, fragment):
  with pytest.raises(ValueError, match=fragment.replace("*", r"\*")):
    mesh_lib.make_mesh(**sizes)


def test_global_batch_checks_and_assembly():
  mesh = mesh_lib.make_mesh(data=2, fsdp=4)
  with pytest.raises(ValueError, match="not divisible by the 8"):
    mesh_lib.check_global_batch(12, mesh)
  assert mesh_lib.check_global_batch(16, mesh) == 16
  x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
  g = mesh_lib.global_batch({"x": x}, mesh)["x"]
  assert g.sharding.spec == P(("data", "fsdp"))
  np.testing.assert_array_equal(np.asarray(g), x)


def test_param_shardings_rules_heuristic_and_divisibility():
  mesh = mesh_lib.make_mesh(data=2, fsdp=4)
  model = nnx.Sequential(oj.nn.GmPDense(16, 12, rngs=nnx.Rngs(0)),   # 12 % 4 == 0
                         oj.nn.GmPDense(12, 6, rngs=nnx.Rngs(0)),    # 6 % 4 != 0: replicate
                         nnx.Linear(6, 64, rngs=nnx.Rngs(1)))        # no names: heuristic
  specs = jax.tree.map(lambda s: s.spec, mesh_lib.param_shardings(
      nnx.state(model, nnx.Param), mesh, min_fsdp_size=65),
      is_leaf=lambda x: hasattr(x, "spec"))
  assert specs["layers"][0]["theta"] == P("fsdp", None)
  assert specs["layers"][1]["theta"] == P(None, None)
  assert specs["layers"][2]["kernel"] == P(None, "fsdp")     # largest divisible axis
  assert specs["layers"][2]["bias"] == P()                   # below min size
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  opt = mesh_lib.opt_state_shardings(optax.adam(1e-3), params, mesh_lib.param_shardings(
      nnx.state(model, nnx.Param), mesh, min_fsdp_size=65), mesh)
  assert opt[0].mu["layers"][0]["theta"].spec == P("fsdp", None)
  assert opt[0].count.spec == P()


def test_state_of_another_shape_is_replicated_not_given_the_params_sharding():
  """Riemannian Adam's matrix second moment holds one scalar per matrix: it has the
  params' tree structure but not their shapes, so it cannot take their sharding
  (it used to, and the jitted init failed on any fsdp mesh)."""
  mesh = mesh_lib.make_mesh(data=2, fsdp=4)
  w = oj.manifolds.Stiefel().random(jax.random.PRNGKey(0), (16, 8))
  params = {"w": w}
  shardings = {"w": NamedSharding(mesh, P(None, "fsdp"))}
  tx = oj.optim.radam(1e-3, oj.manifolds.Stiefel(), second_moment="matrix")
  opt = mesh_lib.opt_state_shardings(tx, params, shardings, mesh)
  specs = {jax.tree_util.keystr(k): v.spec for k, v in
           jax.tree_util.tree_flatten_with_path(opt, is_leaf=lambda x: hasattr(x, "spec"))[0]}
  assert any(k.endswith(".mu['w']") and v == P(None, "fsdp") for k, v in specs.items()), specs
  assert any(k.endswith(".nu['w']") and v == P() for k, v in specs.items()), specs
  state = jax.jit(tx.init, out_shardings=opt)(params)   # compiles: the bug's symptom
  assert state is not None


def test_owner_sharded_state_keeps_the_fsdp_sharding_of_the_leaves_every_device_updates():
  """Muon's AdamW group (an embedding here) sits in the owner-sharded state's replicated
  part; its moments must follow the param's FSDP sharding, not fill every chip."""
  mesh = mesh_lib.make_mesh(data=2, fsdp=4)
  params = {"embed": jnp.ones((32, 16)), "w": jnp.ones((16, 16))}
  views = {"embed": False, "w": None}
  shardings = {"embed": NamedSharding(mesh, P(None, "fsdp")),
               "w": NamedSharding(mesh, P(None, "fsdp"))}
  tx = oj.optim.shard_update(oj.optim.muon(1e-2, views=views), mesh, views=views)
  opt = mesh_lib.opt_state_shardings(tx, params, shardings, mesh)
  specs = {jax.tree_util.keystr(k): v.spec for k, v in
           jax.tree_util.tree_flatten_with_path(opt, is_leaf=lambda x: hasattr(x, "spec"))[0]}
  embed = {k: v for k, v in specs.items() if k.endswith("['embed']")}
  assert embed and all(v == P(None, "fsdp") for v in embed.values()), specs
  state = jax.jit(tx.init, out_shardings=opt)(params)
  updates, _ = jax.jit(tx.update)(params, state, params)
  reference, _ = oj.optim.muon(1e-2, views=views).update(params, oj.optim.muon(
      1e-2, views=views).init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               updates, reference)


def test_losses_against_closed_forms():
  logits = jnp.array([[2.0, 0.5, -1.0], [0.0, 0.0, 3.0]])
  labels = jnp.array([0, 1])
  logp = jax.nn.log_softmax(logits)
  np.testing.assert_allclose(losses.cross_entropy(logits, labels), -logp[jnp.arange(2), labels],
                             rtol=1e-6)
  eps = 0.1
  smooth = (1 - eps) * jax.nn.one_hot(labels, 3) + eps / 3
  np.testing.assert_allclose(losses.cross_entropy(logits, labels, eps),
                             -jnp.sum(smooth * logp, -1), rtol=1e-6)
  out, y = jnp.array([[1.0], [2.0]]), jnp.array([0.5, 4.0])
  np.testing.assert_allclose(losses.mse(out, y), [0.25, 4.0])
  np.testing.assert_allclose(losses.mae(out, y), [0.5, 2.0])
  np.testing.assert_array_equal(losses.topk_correct(logits, labels, 1), [1.0, 0.0])
  np.testing.assert_array_equal(losses.topk_correct(logits, labels, 2), [1.0, 1.0])
  with pytest.raises(ValueError, match="unknown loss"):
    losses.get_loss("hinge")


@pytest.mark.parametrize("restore_sizes", [dict(data=1, fsdp=4), dict(data=1, fsdp=1)])
def test_checkpoint_written_on_8_devices_restores_on_fewer(tmp_path, restore_sizes):
  mesh8 = mesh_lib.make_mesh(data=2, fsdp=4)
  model = oj.nn.GmPDense(32, 16, rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  sh8 = mesh_lib.param_shardings(state, mesh8)
  params = jax.device_put(nnx.to_pure_dict(state), sh8)
  assert params["theta"].sharding.spec == P("fsdp", None)
  ckpt = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1, keep=2)
  ckpt.save(7, params, {"batches_consumed": 7})
  ckpt.close()

  devices = jax.devices()[:restore_sizes["data"] * restore_sizes["fsdp"]]
  mesh = mesh_lib.make_mesh(**restore_sizes, devices=devices)
  sh = mesh_lib.param_shardings(state, mesh)
  ckpt = ckpt_lib.Checkpointer(str(tmp_path), every_steps=1, keep=2)
  assert ckpt.latest_step() == 7
  restored, meta = ckpt.restore(7, ckpt_lib.abstract_like(params, sh))
  ckpt.close()
  assert meta["batches_consumed"] == 7
  assert restored["theta"].sharding.mesh.size == len(devices)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               restored, nnx.to_pure_dict(state))


def test_checkpoint_digest_is_the_standard_crc32(tmp_path):
  """CRC-32's published check value (of b"123456789": 0xCBF43926, the IEEE 802.3 / zlib
  polynomial); a file longer than one read block; a flipped bit changes it."""
  from etils import epath
  short = epath.Path(tmp_path / "check")
  short.write_bytes(b"123456789")
  assert ckpt_lib._digest(short) == "crc32:cbf43926"   # pylint: disable=protected-access
  data = bytearray(np.random.default_rng(0).integers(0, 256, 3 << 20, np.uint8).tobytes())
  long = epath.Path(tmp_path / "long")
  long.write_bytes(bytes(data))
  table = [0] * 256                  # bitwise CRC-32 by the reflected polynomial 0xEDB88320
  for i in range(256):
    c = i
    for _ in range(8):
      c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
    table[i] = c
  crc = 0xFFFFFFFF
  for byte in data[:1 << 16]:        # a 64 KiB prefix by the table: the same as zlib's
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  prefix = epath.Path(tmp_path / "prefix")
  prefix.write_bytes(bytes(data[:1 << 16]))
  assert ckpt_lib._digest(prefix) == f"crc32:{crc ^ 0xFFFFFFFF:08x}"  # pylint: disable=protected-access
  before = ckpt_lib._digest(long)    # pylint: disable=protected-access
  data[(3 << 20) - 5] ^= 0x10        # past the first 1 MiB read block
  long.write_bytes(bytes(data))
  assert ckpt_lib._digest(long) != before   # pylint: disable=protected-access


def test_prefetch_to_mesh_keeps_order_and_runs_ahead():
  from orthojax.train import mesh as mesh_lib
  mesh = mesh_lib.make_mesh(-1)
  pulled = []

  def local():
    for i in range(5):
      pulled.append(i)
      yield {"x": np.full((8, 2), i, np.float32)}

  it = mesh_lib.prefetch_to_mesh(local(), mesh, size=2)
  first = next(it)
  assert pulled == [0, 1, 2]            # the consumer's batch plus two ahead
  assert first["x"].sharding.spec == mesh_lib.batch_sharding(mesh).spec
  rest = [int(b["x"][0, 0]) for b in it]
  assert [int(first["x"][0, 0])] + rest == [0, 1, 2, 3, 4]
  with pytest.raises(ValueError, match="prefetch size"):
    next(mesh_lib.prefetch_to_mesh(local(), mesh, size=0))
