"""The constructor registry (orthojax.train.registry): every keyword of every public
constructor can be set from a config section, and bad sections are one line naming the key."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import orthojax as oj
from orthojax.train import registry
from orthojax.train.config import ConfigError

# Public orthojax callables that are not whole optimizers / layers / models, and why a
# config does not name them: building blocks are composed in code (optax.chain), the
# routing and the penalty link are built by the trainer from their own sections.
NOT_IN_A_REGISTRY = {
    "project_to_tangent": "building block of a chain",
    "riemannian_momentum": "building block of a chain",
    "scale_by_riemannian_adam": "building block of a chain",
    "scale_by_muon": "building block of a chain (muon, stiefel_muon)",
    "retract": "building block of a chain",
    "scale_by_muon": "building block of a chain",
    "keeps_manifold": "a question about a transformation, not one",
    "optimizer_entry": "a question about an optimizer's name, not one",
    "shard_update": "a wrapper the trainer applies (config.mesh.shard_update)",
    "replicated_state": "a state conversion",
    "sharded_state": "a state conversion",
    "num_owners": "a mesh query",
    "plan": "the sharded update's plan (config.mesh.shard_update)",
    "assign_owners": "the owner assignment",
    "split_matrices": "the owner assignment (config.mesh.split_above)",
    "split_cost": "the owner assignment's cost model",
    "partition": "the trainer routes manifold parameters itself",
    "muon_dimension_numbers": "a helper, not an optimizer",
    "to_muon": "a helper, not an optimizer",
    "add_orthogonality_penalty": "the penalty section (registry.PENALTIES)",
    "scale_by_manifold_muon": "building block of a chain (manifold_muon)",
    "manifold_muon_direction": "the direction of one matrix, not an optimizer",
    "msign": "a matrix function, not an optimizer",
    "clip_spectral": "a matrix function, not an optimizer",
}
TRAINER_OWNED = ("rngs",)


def _public(module):
  return getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]


def _public_optimizers():
  for name in _public(oj.optim):
    fn = getattr(oj.optim, name)
    if inspect.isfunction(fn) and name not in NOT_IN_A_REGISTRY:
      yield name, fn


def _public_modules(module):
  for name in _public(module):
    obj = getattr(module, name)
    if inspect.isclass(obj) and issubclass(obj, nnx.Module):
      yield name, obj


def _every_constructor():
  for kind in ("model", "layers", "optimizer", "manifold", "penalty", "kernel_init"):
    for name, fn in sorted(registry.REGISTRIES[kind].items()):
      if fn is nnx.Sequential or getattr(fn, "__module__", "").startswith(("optax", "flax", "jax")):
        continue   # third-party signatures: reachable the same way, not ours to walk
      yield kind, name, fn


def test_every_public_optimizer_is_registered_under_its_own_name():
  for name, fn in _public_optimizers():
    assert registry.OPTIMIZERS.get(name) is fn, name


@pytest.mark.parametrize("module", [oj.models, oj.nn], ids=["models", "nn"])
def test_every_public_model_and_layer_is_registered_under_its_own_name(module):
  for name, cls in _public_modules(module):
    assert registry.MODELS.get(name) is cls or registry.LAYERS.get(name) is cls, name


def test_every_manifold_and_penalty_kind_is_reachable():
  for name in _public(oj.manifolds):
    obj = getattr(oj.manifolds, name)
    if inspect.isclass(obj) and issubclass(obj, oj.manifolds.Manifold) and obj is not \
        oj.manifolds.Manifold:
      assert registry.MANIFOLDS[name] is obj
  kinds = inspect.signature(oj.optim.add_orthogonality_penalty).parameters
  assert "kind" in kinds and set(oj.penalties.PENALTIES) == {
      "so", "half_so", "dso", "mc", "srip", "gain_adjusted_so"}
  # Each named penalty's own keywords reach it through the penalty section.
  section_keys = set(registry.keywords(oj.optim.add_orthogonality_penalty))
  for kind, fn in oj.penalties.PENALTIES.items():
    own = {k for k, p in inspect.signature(fn).parameters.items()
           if p.kind == p.KEYWORD_ONLY and k not in ("view", "vector", "key", "return_vector")}
    assert own <= section_keys, (kind, own - section_keys)


@pytest.mark.parametrize("kind,name,fn", list(_every_constructor()),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_every_keyword_passes_through_unchanged(kind, name, fn, monkeypatch):
  """A spy with the constructor's signature receives every keyword the section sets."""
  params = registry.keywords(fn)
  received = {}
  signature = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn)
  signature = signature.replace(parameters=[p for n, p in signature.parameters.items()
                                            if n != "self"])

  def spy(*args, **kwargs):
    received.update(signature.bind(*args, **kwargs).arguments)
    return "built"
  spy.__signature__ = signature
  monkeypatch.setitem(registry.REGISTRIES[kind], name, spy)
  sentinels = {k: object() for k in params if k not in TRAINER_OWNED}
  supplied = registry.Supplied({"rngs": "the trainer's rngs"}, owned=TRAINER_OWNED)
  assert registry.build(kind, {"name": name, **sentinels}, supplied=supplied) == "built"
  for k, value in sentinels.items():
    assert received[k] is value, (name, k)
  # A keyword that needs a callable has a registry, so a flagfile can name one.
  for k, p in params.items():
    if k in TRAINER_OWNED or k in ("mask", "views", "dtype", "param_dtype", "activation",
                                   "precision", "axis_name", "accumulator_dtype",
                                   "mu_dtype", "learning_rate", "optimizer"):
      continue
    if callable(p.default) and not isinstance(p.default, type):
      assert k in registry.REGISTRIES, (name, k)


def test_nested_sections_build_from_the_registry_their_keyword_names():
  tx = registry.build("optimizer", {
      "name": "radam", "learning_rate": 0.1,
      "manifold": {"name": "Stiefel", "retraction": "cayley", "cayley_iterations": 2}})
  # Same numbers as the constructor called by hand.
  by_hand = oj.optim.radam(0.1, oj.manifolds.Stiefel("cayley", cayley_iterations=2))
  w = oj.manifolds.Stiefel().random(jax.random.PRNGKey(0), (8, 4))
  g = jax.random.normal(jax.random.PRNGKey(1), (8, 4))
  u1, _ = tx.update(g, tx.init(w), w)
  u2, _ = by_hand.update(g, by_hand.init(w), w)
  np.testing.assert_array_equal(u1, u2)
  init = registry.build("kernel_init", {"name": "orthogonal", "gain": 2.0})
  k = init(jax.random.PRNGKey(0), (6, 3))
  np.testing.assert_allclose(k.T @ k, 4.0 * np.eye(3), atol=1e-5)


def test_sequential_model_from_layer_sections():
  model = registry.build("model", {"name": "Sequential", "layers": [
      {"name": "OrthogonalDense", "in_features": 5, "out_features": 5,
       "parametrization": "householder"},
      {"name": "tanh"},
      {"name": "Linear", "in_features": 5, "out_features": 2}]},
      supplied=registry.Supplied({"rngs": nnx.Rngs(0)}, owned=TRAINER_OWNED))
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
  orth, _, head = model.layers
  np.testing.assert_allclose(model(x), head(jnp.tanh(orth(x))), rtol=1e-6)
  w = orth.kernel()
  np.testing.assert_allclose(w.T @ w, np.eye(5), atol=1e-5)


@pytest.mark.parametrize("section,message", [
    ({"name": "radamm", "learning_rate": 1.0}, "config.optimizer.name='radamm': unknown; choose"),
    ({"name": "adam", "learning_rate": 1.0, "betas": (0.9, 0.9)},
     "config.optimizer.betas: adam takes no keyword 'betas'; its keywords are learning_rate, b1"),
    ({"name": "adam"}, "config.optimizer.learning_rate: adam needs it"),
    ({"name": "radam", "learning_rate": 1.0, "manifold": {"name": "Stiefel", "retraction": "qrr"}},
     "config.optimizer.manifold.retraction='qrr': Stiefel: unknown retraction='qrr'"),
    ({"name": "radam", "learning_rate": 1.0, "manifold": {"name": "Sphere"}},
     "config.optimizer.manifold.name='Sphere': unknown; choose one of Oblique, Stiefel"),
    ({"name": "radam", "learning_rate": 1.0, "second_moment": "full"},
     "config.optimizer.second_moment='full'"),
])
def test_bad_sections_are_one_line_naming_the_key(section, message):
  with pytest.raises(ConfigError) as e:
    registry.build("optimizer", section)
  assert str(e.value).startswith(message), str(e.value)
  assert "\n" not in str(e.value)


def test_trainer_owned_keywords_are_refused():
  with pytest.raises(ConfigError, match=r"^config.model.rngs: set by the trainer"):
    registry.build("model", {"name": "MLP", "rngs": 0},
                   supplied=registry.Supplied({"rngs": nnx.Rngs(0)}, owned=TRAINER_OWNED))


def test_radam_means_riemannian_adam_and_optax_radam_stays_reachable():
  assert registry.OPTIMIZERS["radam"] is oj.optim.radam
  assert registry.OPTIMIZERS["optax.radam"] is optax.radam
  assert "lbfgs" not in registry.OPTIMIZERS


def test_describe_lists_keywords_and_defaults():
  text = registry.describe("manifold")
  assert "Stiefel(retraction='qr', metric='euclidean'" in text
