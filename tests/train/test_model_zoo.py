"""The model zoo: the critical deep MLP starts at its fixed point from the first layer."""

from __future__ import annotations

import jax
import jax.extend
import numpy as np
import pytest
from flax import nnx

import orthojax as oj
from orthojax.train import model_zoo
from orthojax.train.config import Config
from orthojax.train.data import DatasetInfo


@pytest.mark.parametrize("q_star", [1 / 64, 0.5])
@pytest.mark.parametrize("init", ["gaussian", "orthogonal"])
def test_critical_deep_mlp_inputs_are_scaled_to_q_star(q_star, init):
  info = DatasetInfo(name="toy", task="classification", input_shape=(16, 16), num_classes=10,
                     num_train=1, num_eval=1)
  config = Config(model={"name": "DeepMLP", "depth": 3, "width": 2000, "q_star": q_star,
                         "init": init, "activation": "tanh"}, num_steps=1)
  model = model_zoo.build(config, info, nnx.Rngs(0))
  mlp = model.model
  assert model.scale == pytest.approx(np.sqrt(q_star - mlp.sigma_b ** 2) / mlp.sigma_w)
  x = jax.random.normal(jax.random.key(1), (256, 16, 16))       # standardised inputs
  h = mlp.preactivations(model.scale * x.reshape(256, -1))
  # h¹ and every later layer have variance q* (finite width: ~3 % sampling error).
  np.testing.assert_allclose(np.var(np.asarray(h), axis=(1, 2)), q_star, rtol=0.06)


def test_input_scale_needs_q_star_above_bias_variance():
  mlp = nnx.eval_shape(lambda: oj.models.DeepMLP(4, 2, 8, 2, sigma_w=1.0, sigma_b=0.2,
                                                 rngs=nnx.Rngs(0)))
  assert mlp.input_scale == 1.0   # no q_star: inputs as they are
  mlp.q_star = 0.01
  with pytest.raises(ValueError, match="must exceed sigma_b"):
    mlp.input_scale  # pylint: disable=pointless-statement


@pytest.mark.parametrize("name, kind", [("MLP", "flat"), ("DeepMLP", "flat"),
                                        ("DeepLinear", "flat"), ("SequenceRNN", "sequence"),
                                        ("ResNet", "image"), ("ResNet50", "image"),
                                        ("VGG6", "image"), ("Sequential", None)])
def test_input_kind_is_the_models_metadata(name, kind):
  assert model_zoo.input_kind(name) == kind


def test_penalty_mask_follows_the_models_penalized_leaves():
  rnn = nnx.eval_shape(lambda: oj.models.SequenceRNN(4, 8, rngs=nnx.Rngs(0)))
  params = nnx.to_pure_dict(nnx.state(rnn, nnx.Param))
  mask = model_zoo.penalty_mask(rnn, params)
  on = sorted(jax.tree_util.keystr(p) for p, v in jax.tree_util.tree_leaves_with_path(mask) if v)
  assert on and all("recurrent_kernel" in p for p in on)
  mlp = nnx.eval_shape(lambda: oj.models.MLP(3, 5, 1, variant="gmp", rngs=nnx.Rngs(0)))
  params = nnx.to_pure_dict(nnx.state(mlp, nnx.Param))
  mask = model_zoo.penalty_mask(mlp, params)
  flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(mask)}
  assert not any(v for k, v in flat.items() if "theta" in k)   # angles are not matrices


_IMAGE = DatasetInfo(name="fake", task="classification", input_shape=(16, 16, 3), num_classes=10,
                     num_train=64, num_eval=16)
_FLAT = DatasetInfo(name="toy", task="regression", input_shape=(6,), num_classes=None,
                    num_train=64, num_eval=16)
_SEQ = DatasetInfo(name="seq", task="classification", input_shape=(5, 4), num_classes=10,
                   num_train=64, num_eval=16)
_BATCH = 7  # a prime no weight dimension shares: marks the ops that touch activations


def _activation_ops(jaxpr, found):
  """(primitive, input dtypes) of every dot/conv whose lhs leads with the batch axis."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
      lhs = eqn.invars[0].aval
      if lhs.shape and lhs.shape[0] == _BATCH:
        found.append((eqn.primitive.name, tuple(str(v.aval.dtype) for v in eqn.invars)))
  for sub in jax.extend.core.subjaxprs(jaxpr):  # scan / cond / custom_jvp / pjit bodies
    _activation_ops(sub, found)
  return found


@pytest.mark.parametrize("model, info", [
    ({"name": "ResNet", "depth": 18, "norm": "bn"}, _IMAGE),
    ({"name": "ResNet", "depth": 18, "norm": "gmp_imn"}, _IMAGE),
    ({"name": "ResNet", "depth": 18, "norm": "wn_mbn"}, _IMAGE),
    ({"name": "VGG6", "variant": "bn"}, _IMAGE),
    ({"name": "MLP", "variant": "bn", "hidden": 8}, _FLAT),
    ({"name": "MLP", "variant": "gmp", "hidden": 8}, _FLAT),
    ({"name": "DeepMLP", "depth": 3, "width": 8, "q_star": 0.5, "init": "orthogonal",
      "activation": "tanh"}, _FLAT),
    ({"name": "DeepLinear", "depth": 3, "width": 8}, _FLAT),
    ({"name": "SequenceRNN", "hidden": 8}, _SEQ),
    ({"name": "Sequential", "layers": [
        {"name": "OrthogonalConv", "in_features": 3, "out_features": 4, "kernel_size": (3, 3)},
        {"name": "relu"}, {"name": "GmPConv", "in_features": 4, "out_features": 10,
                           "kernel_size": (3, 3)},
        {"name": "global_average_pool"}]}, _IMAGE),
])
def test_bfloat16_compute_reaches_every_layer(model, info):
  """With --compute_dtype=bfloat16 every matmul/conv on activations runs in bfloat16.

  Regression: normalisation layers built with ``dtype=None`` promoted their
  output with their float32 statistics, so a BN ResNet trained "in bfloat16"
  ran every conv after the stem in float32.
  """
  import jax.numpy as jnp
  from orthojax.train import losses
  from orthojax.train import optimizers
  from orthojax.train.step import TrainState
  from orthojax.train.step import make_train_step

  config = Config(model=model, compute_dtype="bfloat16", num_steps=10,
                  optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9}},
                  loss="cross_entropy" if info.task == "classification" else "mse")
  # Shapes and dtypes are all a jaxpr needs: the model and the optimizer state are built
  # abstractly (no initialisation runs).
  model = nnx.eval_shape(lambda: model_zoo.build(config, info, nnx.Rngs(0)))
  model.train()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = nnx.to_pure_dict(params)
  tx = optimizers.build(config, total_steps=10)
  state = jax.eval_shape(lambda p, r: TrainState.create(p, r, tx), params,
                         nnx.to_pure_dict(rest))
  classification = info.task == "classification"
  y = (jnp.zeros((_BATCH,), jnp.int32) if classification else jnp.zeros((_BATCH,), jnp.float32))
  batch = {"x": jnp.ones((_BATCH,) + info.input_shape, jnp.float32), "y": y}
  step = make_train_step(graphdef, tx, losses.get_loss(config.loss),
                         classification=classification, compute_dtype=jnp.bfloat16)
  ops = _activation_ops(jax.make_jaxpr(step)(state, batch).jaxpr, [])
  assert ops, "no batch-leading dot/conv found: the detector is broken"
  float32_ops = [op for op in ops if "bfloat16" not in op[1] or "float32" in op[1]]
  assert not float32_ops, f"{len(float32_ops)} of {len(ops)} ops not in bfloat16: {float32_ops[:3]}"
