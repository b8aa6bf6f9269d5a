"""VGG-6 (orthojax.models._vgg) and the one-hidden-layer MLP (orthojax.models._mlp)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from orthojax import models
from orthojax.nn import GmPConv
from orthojax.nn import GmPDense
from orthojax.nn import InputMeanNorm
from orthojax.nn import MeanOnlyBatchNorm
from orthojax.nn import WeightNormConv
from orthojax.nn import WeightNormDense


def _normal(seed, *shape):
  # numpy, not jax.random: each new jax.random shape compiles a threefry kernel
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _host_init(seed=0):
  """Glorot-normal-ish kernels drawn in numpy (no per-shape XLA compile)."""
  rng = np.random.default_rng(seed)

  def init(key, shape, dtype=jnp.float32):
    del key
    fan_in, fan_out = int(np.prod(shape[:-1])), shape[-1]
    return jnp.asarray(rng.normal(size=shape) * np.sqrt(2 / (fan_in + fan_out)), dtype)

  return init


def _modules(model, cls):
  return [m for _, m in nnx.iter_modules(model) if isinstance(m, cls)]


def _param_count(model) -> int:
  return sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


_forward = nnx.jit(lambda model, x: model(x))
_WIDTHS = (4, 4, 4)


def _vgg(variant, **kw):
  init = _host_init()
  return models.VGG6(variant, num_classes=10, widths=_WIDTHS, kernel_init=init,
                     gmp_init_direction=init, rngs=nnx.Rngs(0), **kw)


# ------------------------------------------------------------------- VGG-6


def test_vgg6_layout_and_parameter_count():
  model = nnx.eval_shape(lambda: models.VGG6("sp", rngs=nnx.Rngs(0)))
  kernels = [c.layer.kernel.shape for c in model.convs]
  assert kernels == [(3, 3, 3, 128), (3, 3, 128, 128), (3, 3, 128, 256), (3, 3, 256, 256),
                     (3, 3, 256, 512), (3, 3, 512, 512)]
  assert model.classifier.kernel.shape == (512, 1000)
  conv = sum(9 * cin * cout + cout for cin, cout in
             [(3, 128), (128, 128), (128, 256), (256, 256), (256, 512), (512, 512)])
  assert conv == 4_576_384
  assert _param_count(model) == conv + 512 * 1000 + 1000 == 5_089_384


@pytest.mark.parametrize("variant", models.VGG6.VARIANTS)
def test_vgg6_each_variant_maps_32x32_images_to_logits(variant):
  model = _vgg(variant)
  y = _forward(model, _normal(0, 2, 32, 32, 3))
  assert y.shape == (2, 10) and y.dtype == jnp.float32
  assert np.all(np.isfinite(y)) and float(jnp.max(jnp.abs(y[0] - y[1]))) > 0


@pytest.mark.parametrize("variant", models.VGG6.VARIANTS)
def test_vgg6_variant_structure(variant):
  model = nnx.eval_shape(lambda: models.VGG6(variant, rngs=nnx.Rngs(0)))
  n_gmp = len(_modules(model, GmPConv))
  n_imn = len(_modules(model, InputMeanNorm))
  assert n_gmp == (6 if variant.startswith("gmp") else 0)
  assert n_imn == (5 if variant == "gmp_imn" else 0)
  if variant == "gmp_imn":
    assert model.convs[0].imn is None and all(c.imn is not None for c in model.convs[1:])
  assert len(_modules(model, nnx.BatchNorm)) == (6 if variant == "bn" else 0)
  assert len(_modules(model, MeanOnlyBatchNorm)) == (6 if variant == "wn_mbn" else 0)
  assert len(_modules(model, WeightNormConv)) == (6 if variant.startswith("wn") else 0)
  if variant.startswith("wn"):
    assert type(model.classifier) is WeightNormDense
  else:
    assert type(model.classifier) is nnx.Linear  # never GmP: the output layer


def test_vgg6_sp_equals_hand_computation():
  model = _vgg("sp")
  x = _normal(1, 2, 32, 32, 3)
  h = x
  for i, unit in enumerate(model.convs):
    h = lax.conv_general_dilated(h, unit.layer.kernel[...], (1, 1), "SAME",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 precision=lax.Precision.HIGHEST)
    h = jax.nn.relu(h + unit.layer.bias[...])
    if i % 2:
      h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
  assert h.shape == (2, 4, 4, 4)
  want = jnp.mean(h, axis=(1, 2)) @ model.classifier.kernel[...] + model.classifier.bias[...]
  np.testing.assert_allclose(_forward(model, x), want, atol=1e-5, rtol=1e-5)


def test_vgg6_gmp_imn_modes():
  model = _vgg("gmp_imn")
  x = _normal(2, 4, 32, 32, 3) + 1.0
  stats = lambda: [np.array(v) for v in jax.tree.leaves(nnx.state(model, nnx.BatchStat))]
  assert all(np.all(s == 0) for s in stats())
  model.eval()
  y_eval = _forward(model, x)
  assert all(np.all(s == 0) for s in stats())
  model.train()
  y_train = _forward(model, x)
  assert all(np.any(s != 0) for s in stats())
  assert not np.allclose(y_eval, y_train, atol=1e-5)


# ------------------------------------------------------------------- MLP


def _mlp(variant, **kw):
  init = _host_init(1)
  return models.MLP(7, hidden=16, out_features=3, variant=variant, kernel_init=init,
                    gmp_init_direction=init, rngs=nnx.Rngs(0), **kw)


@pytest.mark.parametrize("variant", models.MLP.VARIANTS)
def test_mlp_each_variant_shape_and_structure(variant):
  model = _mlp(variant)
  y = model(_normal(3, 5, 7))
  assert y.shape == (5, 3) and np.all(np.isfinite(y))
  assert isinstance(model.hidden.layer, GmPDense) == (variant == "gmp")
  assert not _modules(model, InputMeanNorm)  # the hidden layer reads the data
  assert isinstance(model.hidden.layer, WeightNormDense) == (variant == "wn")
  assert isinstance(model.hidden.norm, nnx.BatchNorm) == (variant == "bn")
  assert type(model.out) is (WeightNormDense if variant == "wn" else nnx.Linear)
  assert models.MLP(4, rngs=nnx.Rngs(0)).hidden.layer.kernel.shape == (4, 100)


def test_mlp_sp_equals_hand_computation():
  model = _mlp("sp")
  x = _normal(4, 5, 7)
  w1, b1 = model.hidden.layer.kernel[...], model.hidden.layer.bias[...]
  w2, b2 = model.out.kernel[...], model.out.bias[...]
  assert np.all(np.asarray(b1) == 0)  # zero-initialised biases
  b1, b2 = b1 + 0.3, b2 - 0.2  # make the biases count
  model.hidden.layer.bias[...], model.out.bias[...] = b1, b2
  want = jnp.maximum(x @ w1 + b1, 0) @ w2 + b2
  np.testing.assert_allclose(model(x), want, atol=1e-6, rtol=1e-6)
  model = _mlp("sp", activation="tanh")
  w1, b1 = model.hidden.layer.kernel[...], model.hidden.layer.bias[...]
  np.testing.assert_allclose(model(x), jnp.tanh(x @ w1 + b1) @ model.out.kernel[...]
                             + model.out.bias[...], atol=1e-6, rtol=1e-6)


def test_mlp_gmp_from_sp_weights_equals_sp():
  sp = _mlp("sp")
  sp.hidden.layer.bias[...] = _normal(5, 16) * 0.5
  gmp = _mlp("gmp")
  gmp.hidden.layer = GmPDense.from_dense(sp.hidden.layer.kernel[...], sp.hidden.layer.bias[...])
  gmp.out.kernel[...], gmp.out.bias[...] = sp.out.kernel[...], sp.out.bias[...]
  x = _normal(6, 32, 7)
  y_sp = sp(x)
  assert float(jnp.mean(sp.hidden(x) == 0)) > 0.1  # some ReLUs are off
  np.testing.assert_allclose(gmp(x), y_sp, atol=1e-5, rtol=1e-5)


def test_mlp_bn_train_and_eval_differ():
  model = _mlp("bn")
  x = _normal(7, 8, 7) + 2.0
  model.eval()
  y_eval = model(x)
  np.testing.assert_array_equal(model.hidden.norm.mean[...], 0.0)
  model.train()
  y_train = model(x)
  assert np.all(np.asarray(model.hidden.norm.mean[...]) != 0)
  assert not np.allclose(y_eval, y_train, atol=1e-4)


# ------------------------------------------------------------------ errors


def test_unknown_variants_raise_with_choices():
  with pytest.raises(ValueError, match=r"variant='gmp_bn'.*'sp', 'wn', 'wn_mbn', 'bn', 'gmp'"):
    models.VGG6("gmp_bn", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"variant='gmp_imn'.*\['sp', 'wn', 'bn', 'gmp'\]"):
    models.MLP(3, variant="gmp_imn", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"activation='rleu'"):
    models.MLP(3, activation="rleu", rngs=nnx.Rngs(0))
