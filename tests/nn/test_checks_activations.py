"""check_choice (the one "unknown name" message) and the one activation registry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import orthojax as oj
from orthojax import nn as onn
from orthojax.nn import initializers as oi


def test_check_choice_returns_the_value():
  assert onn.check_choice("b", ("a", "b"), "kind") == "b"
  assert onn.check_choice(50, (18, 34, 50, 101), "depth") == 50


@pytest.mark.parametrize("kwargs,message", [
    (dict(), "unknown kind='c'; valid: ['a', 'b']"),
    (dict(where="Layer"), "Layer: unknown kind='c'; valid: ['a', 'b']"),
    (dict(where="Layer", also="a callable"),
     "Layer: unknown kind='c'; valid: ['a', 'b'] or a callable"),
])
def test_check_choice_message_names_argument_value_and_choices(kwargs, message):
  with pytest.raises(ValueError) as info:
    onn.check_choice("c", ("a", "b"), "kind", **kwargs)
  assert str(info.value) == message


def test_check_choice_rejects_values_without_a_plain_equality():
  with pytest.raises(ValueError, match=r"unknown kind=Array"):
    onn.check_choice(jnp.ones(3), ("a", "b"), "kind")
  with pytest.raises(ValueError, match="unknown depth=None"):
    onn.check_choice(None, (18, 34), "depth")


@pytest.mark.parametrize("make", [
    lambda: oj.nn.OrthogonalDense(4, 3, init="haar", rngs=nnx.Rngs(0)),
    lambda: oj.nn.GmPDense(4, 3, init_radius="unit", rngs=nnx.Rngs(0)),
    lambda: oj.nn.WeightNormDense(4, 3, init_scale="unit", rngs=nnx.Rngs(0)),
    lambda: oj.nn.ManifoldLinear(4, 3, manifold="sphere", rngs=nnx.Rngs(0)),
    lambda: oj.models.VGG6("gmp_bn", rngs=nnx.Rngs(0)),
    lambda: oj.models.ResNet50(norm="gn", rngs=nnx.Rngs(0)),
    lambda: oj.models.DeepMLP(6, 2, 12, 3, init="xavier", rngs=nnx.Rngs(0)),
    lambda: oj.models.DeepLinear(3, 8, init="identity", rngs=nnx.Rngs(0)),
    lambda: oj.models.SequenceRNN(1, recurrent="oblique", rngs=nnx.Rngs(0)),
])
def test_layers_and_models_share_the_message_format(make):
  with pytest.raises(ValueError, match=r"unknown \w+='\w+'; valid: \["):
    make()


def test_one_activation_registry():
  assert oi.ACTIVATIONS is onn.ACTIVATIONS
  assert oj.analysis.mean_field.ACTIVATIONS is onn.ACTIVATIONS
  assert onn.ACTIVATIONS["identity"] is None and onn.ACTIVATIONS["linear"] is None
  assert onn.activation_fn("relu") is jax.nn.relu
  assert onn.activation_fn("linear") is None and onn.activation_fn(None) is None
  assert onn.activation_fn(jnp.sin) is jnp.sin
  with pytest.raises(ValueError, match=r"unknown activation='rleu'; valid: \[.*\] or a callable"):
    onn.activation_fn("rleu")
  with pytest.raises(TypeError, match="activation must be"):
    onn.activation_fn(3)


@pytest.mark.parametrize("name", sorted(onn.ACTIVATIONS))
def test_every_registry_name_works_everywhere(name):
  """Layers, models and the mean-field functions accept every registered name."""
  x = jnp.linspace(-2.0, 2.0, 7)
  phi = onn.ACTIVATIONS[name]
  want = x if phi is None else phi(x)
  mlp = oj.models.DeepMLP(3, 1, 4, 2, activation=name, sigma_w=1.0, rngs=nnx.Rngs(0))
  np.testing.assert_allclose(mlp.activation(x), want)
  layer = oj.nn.GmPDense(3, 2, activation=name, rngs=nnx.Rngs(0))
  assert layer.activation is phi
  act = oi.resolve_activation(name)
  np.testing.assert_allclose(act.phi(np.asarray(x, np.float64)), want, rtol=1e-6, atol=1e-6)
  assert np.isfinite(oi.chi(1.0, 0.5, name))
