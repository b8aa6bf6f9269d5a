"""The run's optax chain from the config: weight decay on kernels only, manifold routing."""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import orthojax as oj
from orthojax.train import data as data_lib
from orthojax.train import model_zoo
from orthojax.train import optimizers
from orthojax.train import program as program_lib
from orthojax.train.config import Config
from orthojax.train.config import ConfigError
from tests.jaxpr_counts import update_primitives


def _params(config):
  info = data_lib.dataset_info(config.data["name"])
  model = model_zoo.build(config, info, nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  return (nnx.to_pure_dict(state), nnx.to_pure_dict(oj.nn.manifold_labels(state)),
          nnx.to_pure_dict(oj.nn.matrix_views(state)))


def _decayed(path) -> bool:
  key = jax.tree_util.keystr(path)
  return "kernel" in key and "'theta'" not in key


_GMP_MLP = {"name": "MLP", "variant": "gmp", "hidden": 8}


@pytest.mark.parametrize("optimizer,decay", [
    ({"name": "sgd", "momentum": 0.9}, {"weight_decay": 0.01}),
    ({"name": "sgd"}, {"weight_decay": 0.01}),
    ({"name": "adamw", "weight_decay": 0.01}, {}),      # AdamW's own, decoupled
])
def test_zero_gradient_update_is_the_decay_of_the_kernels(optimizer, decay):
  config = Config(model=_GMP_MLP, num_steps=10,
                  optimizer={"euclidean": {**optimizer, "learning_rate": 0.5}}, **decay)
  params, _, _ = _params(config)
  assert any("theta" in jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_flatten_with_path(params)[0])
  tx = optimizers.build(config, total_steps=10)
  updates, _ = tx.update(jax.tree.map(np.zeros_like, params), tx.init(params), params)

  def check(path, u, p):
    want = -0.5 * 0.01 * np.asarray(p) if _decayed(path) else np.zeros_like(p)
    np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-9, err_msg=jax.tree_util.keystr(path))

  jax.tree_util.tree_map_with_path(check, updates, params)


# The leaves weight decay acts on, by name: each layer's matrices, embeddings and head; not
# a bias or a normalisation scale, whether one layer's (d,) or a scanned stack's (L, d).
_SCANNED = {
    "DeepMLP": (lambda: oj.models.DeepMLP(4, 3, 8, 2, rngs=nnx.Rngs(0)),
                {"in_kernel", "kernels", "kernel"}),
    "TransformerLM": (lambda: oj.models.TransformerLM(11, depth=2, width=8, heads=2,
                                                      qk_norm=True, rngs=nnx.Rngs(0)),
                      {"qkv", "attn_out", "mlp_in", "mlp_out", "embed", "head"}),
}


@pytest.mark.parametrize("model", list(_SCANNED))
@pytest.mark.parametrize("optimizer,decay", [
    ({"name": "sgd"}, {"weight_decay": 0.01}),
    ({"name": "adamw", "weight_decay": 0.01}, {}),
])
def test_a_scanned_stacks_biases_and_scales_are_not_decayed(model, optimizer, decay):
  build, decayed = _SCANNED[model]
  model = build()
  # Shifted off zero: a bias that starts at 0 would not show its decay.
  params = jax.tree.map(lambda x: x + 0.5, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  config = Config(num_steps=10, optimizer={"euclidean": {**optimizer, "learning_rate": 0.5}},
                  **decay)
  tx = optimizers.build(config, total_steps=10, axes=model_zoo.axes_by_path(model))
  updates, _ = tx.update(jax.tree.map(np.zeros_like, params), tx.init(params), params)
  stacked = []

  def check(path, u, p):
    name = path[-1].key
    stacked.append(p.ndim >= 2 and name not in decayed)
    want = -0.5 * 0.01 * np.asarray(p) if name in decayed else np.zeros_like(p)
    np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-9, err_msg=jax.tree_util.keystr(path))

  jax.tree_util.tree_map_with_path(check, updates, params)
  assert any(stacked)     # the model has a stacked bias or scale: the rank alone would decay it


def test_a_run_decays_by_the_axes_its_model_records():
  """The trainer's program passes the model's recorded axes: a DeepMLP's stacked biases
  (L, width) are not decayed."""
  config = Config(model={"name": "DeepMLP", "depth": 3, "width": 8}, batch_size=8,
                  data={"name": "digits", "flatten": True}, num_steps=10, weight_decay=0.01,
                  optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.5}})
  program = program_lib.build_program(config, program_lib.dataset_info(config),
                                      devices=jax.devices()[:1])
  params = jax.tree.map(lambda s: np.full(s.shape, 0.5, s.dtype), program.abstract_state().params)
  updates, _ = program.tx.update(jax.tree.map(np.zeros_like, params), program.tx.init(params),
                                 params)
  model = updates["model"]
  np.testing.assert_array_equal(model["biases"], 0.0)
  np.testing.assert_allclose(model["kernels"], -0.5 * 0.01 * 0.5, rtol=1e-6)


def test_adam_l2_touches_kernels_only_and_none_without_decay():
  config = Config(model={"name": "MLP", "hidden": 8}, num_steps=10,
                  optimizer={"euclidean": {"name": "adam", "learning_rate": 0.1}},
                  weight_decay=0.01)
  params, _, _ = _params(config)
  zeros = jax.tree.map(np.zeros_like, params)
  for wd in (0.01, 0.0):
    tx = optimizers.build(config.replace(weight_decay=wd), total_steps=10)
    updates, _ = tx.update(zeros, tx.init(params), params)
    jax.tree_util.tree_map_with_path(
        lambda path, u: np.testing.assert_equal(bool(np.any(u != 0)),
                                                wd > 0 and _decayed(path)), updates)


def test_manifold_run_decays_the_euclidean_kernels_not_the_manifold_ones():
  config = Config(model={"name": "DeepMLP", "depth": 2, "width": 8, "q_star": 0.5,
                         "init": "orthogonal", "weights": "stiefel"},
                  num_steps=10,
                  optimizer={"stiefel": {"name": "radam", "learning_rate": 0.1},
                             "euclidean": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9}},
                  weight_decay=0.01)
  params, labels, views = _params(config)
  tx = optimizers.build(config, total_steps=10, labels=labels, views=views)
  updates, _ = tx.update(jax.tree.map(np.zeros_like, params), tx.init(params), params)
  readout = updates["model"]["readout"]
  np.testing.assert_allclose(readout["kernel"],
                             -0.1 * 0.01 * np.asarray(params["model"]["readout"]["kernel"]),
                             rtol=1e-6)
  np.testing.assert_array_equal(readout["bias"], 0.0)
  # Stiefel, zero gradient: only the retraction's re-orthonormalisation (float32 rounding).
  np.testing.assert_allclose(updates["model"]["kernels"], 0.0, atol=1e-6)


_STIEFEL_MLP = {"name": "DeepMLP", "depth": 2, "width": 8, "q_star": 0.5, "init": "orthogonal",
                "weights": "stiefel"}


_ADAM = {"name": "adam", "learning_rate": 0.1}
_RADAM = {"name": "radam", "learning_rate": 0.1}


@pytest.mark.parametrize("changes,message", [
    (dict(model={"name": "MLP", "hidden": 8}, optimizer={"euclidean": _RADAM}),
     "config.optimizer.euclidean.name='radam': a manifold optimizer, for manifold parameters"),
    (dict(model=_STIEFEL_MLP, optimizer={"stiefel": _RADAM}),
     "config.optimizer.euclidean: missing; the model's parameters off a manifold"),
    (dict(model=_STIEFEL_MLP, optimizer={"euclidean": _ADAM}),
     "config.optimizer.stiefel: missing; the model's stiefel parameters need an optimizer"),
    (dict(model=_STIEFEL_MLP, optimizer={"euclidean": _RADAM, "stiefel": _RADAM}),
     "config.optimizer.euclidean.name='radam': a manifold optimizer, for manifold parameters "
     "(the model's manifold parameters are config.optimizer.stiefel)"),
    (dict(model={**_STIEFEL_MLP, "weights": "oblique"},
          optimizer={"oblique": {**_RADAM, "manifold": {"name": "Stiefel"}}, "euclidean": _ADAM}),
     "config.optimizer.oblique.manifold.name='Stiefel': the group's parameters are oblique"),
    (dict(model={**_STIEFEL_MLP, "weights": "oblique"},
          optimizer={"oblique": {"name": "cayley_adam", "learning_rate": 0.1},
                     "euclidean": _ADAM}),
     "config.optimizer.oblique.name='cayley_adam': Stiefel-only"),
    (dict(model=_STIEFEL_MLP, optimizer={"stiefel": _RADAM, "euclidean": _ADAM},
          schedule="plateau", eval_every=1),
     "config.schedule='plateau': not available with the manifold"),
])
def test_routing_errors_are_one_line_naming_the_key(changes, message):
  config = Config(num_steps=10, **changes)
  params, labels, views = _params(config)
  labels = None if all(l == "euclidean" for l in jax.tree.leaves(labels)) else labels
  with pytest.raises(ConfigError) as e:
    optimizers.build(config, total_steps=10, labels=labels, views=views)
  assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize("kind,manifold", [("stiefel", oj.manifolds.Stiefel("cayley")),
                                           ("oblique", oj.manifolds.Oblique())])
def test_manifold_section_builds_the_same_optimizer_as_by_hand(kind, manifold):
  """radam + Stiefel('cayley') from the config = the same chain written in code."""
  section = {"name": type(manifold).__name__}
  if kind == "stiefel":
    section["retraction"] = "cayley"
  config = Config(model={**_STIEFEL_MLP, "weights": kind}, num_steps=10,
                  optimizer={kind: {"name": "radam", "learning_rate": 0.1, "manifold": section},
                             "euclidean": {"name": "adam", "learning_rate": 0.01}})
  params, labels, views = _params(config)
  tx = optimizers.build(config, total_steps=10, labels=labels, views=views)
  by_hand = oj.optim.partition(labels, **{kind: oj.optim.radam(0.1, manifold, views=views),
                                          "euclidean": optax.adam(0.01)})
  grads = jax.tree.map(lambda p: np.ones_like(p) * 0.1, params)
  u1, _ = tx.update(grads, tx.init(params), params)
  u2, _ = by_hand.update(grads, by_hand.init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), u1, u2)


def test_groups_the_model_does_not_have_are_not_built():
  """E5's config names all three groups; a Euclidean network uses only one."""
  config = Config(model={"name": "MLP", "hidden": 8}, num_steps=10,
                  optimizer={"euclidean": _ADAM, "stiefel": _RADAM,
                             "oblique": {**_RADAM, "manifold": {"name": "Oblique"}}})
  params, _, _ = _params(config)
  tx = optimizers.build(config, total_steps=10)
  by_hand = optax.adam(0.1)
  grads = jax.tree.map(lambda p: np.ones_like(p) * 0.1, params)
  u1, _ = tx.update(grads, tx.init(params), params)
  u2, _ = by_hand.update(grads, by_hand.init(params), params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), u1, u2)


def test_a_manifold_group_without_a_manifold_section_gets_its_groups_manifold():
  """radam leaves the manifold out: the oblique group's is Oblique(), not Stiefel()."""
  model = {**_STIEFEL_MLP, "weights": "oblique"}
  config = Config(model=model, num_steps=10, optimizer={"oblique": _RADAM, "euclidean": _ADAM})
  explicit = config.replace(optimizer={"oblique": {"manifold": {"name": "Oblique"}}})
  params, labels, views = _params(config)
  grads = jax.tree.map(lambda p: np.ones_like(p) * 0.1, params)
  updates = []
  for c in (config, explicit):
    tx = optimizers.build(c, total_steps=10, labels=labels, views=views)
    updates.append(tx.update(grads, tx.init(params), params)[0])
  jax.tree.map(np.testing.assert_array_equal, *updates)


def test_muons_adamw_rate_follows_the_schedule_like_its_muon_rate():
  """With a cosine schedule both of Muon's rates decay: the AdamW group's update (a bias,
  Adam with b1 = 0: -lr * sign(g)) at step k is adam_learning_rate * cos-schedule(k)."""
  config = Config(optimizer={"euclidean": {"name": "muon", "learning_rate": 0.02,
                                           "adam_learning_rate": 3e-3, "beta": 0.0,
                                           "adam_b1": 0.0, "nesterov": False}},
                  schedule="cosine", num_steps=10)
  tx = optimizers.build(config, total_steps=10)
  params = {"w": jax.numpy.zeros((4, 3)), "b": jax.numpy.zeros((3,))}
  grads = {"w": jax.numpy.ones((4, 3)), "b": jax.numpy.ones((3,))}
  state = tx.init(params)
  rates = []
  for _ in range(4):
    updates, state = tx.update(grads, state, params)
    rates.append(-float(updates["b"][0]))
  expected = [3e-3 * optax.cosine_decay_schedule(1.0, 10)(k) for k in range(4)]
  np.testing.assert_allclose(rates, expected, rtol=1e-4)
  with pytest.raises(ConfigError, match=r"adam_learning_rate=-0.1: must be > 0"):
    optimizers.build(Config(optimizer={"euclidean": {"name": "muon", "learning_rate": 0.02,
                                                     "adam_learning_rate": -0.1}}),
                     total_steps=10)


def test_the_config_says_how_the_update_runs_over_many_matrices():
  """``bucket``, a keyword of every library optimizer, is a key of each group's section:
  ``"pad"`` by default (two matrices of one small side, 100 and 96 rows, stacked into one
  program), ``"per_leaf"`` one program per leaf; a value that is none of them is refused
  in one line naming the key."""
  params = {"a": np.ones((100, 8), np.float32), "b": np.ones((96, 8), np.float32),
            "bias": np.ones((8,), np.float32)}
  build = lambda section: optimizers.build(
      Config(num_steps=10,
             optimizer={"euclidean": {"name": "muon", "learning_rate": 0.1, **section}}),
      total_steps=10)
  zeros = jax.tree.map(np.zeros_like, params)
  assert "concatenate" in update_primitives(build({}), params, zeros)
  assert "concatenate" not in update_primitives(build({"bucket": "per_leaf"}), params, zeros)
  with pytest.raises(ConfigError, match=r"^config\.optimizer\.euclidean.*bucket='padded'; "
                     r"choose one of \('pad', 'shape', 'per_leaf'\)"):
    build({"bucket": "padded"})
