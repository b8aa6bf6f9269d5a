"""The conv set-up shared by GmPConv, OrthogonalConv and WeightNormConv (orthojax.nn._conv)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orthojax.nn import GmPConv
from orthojax.nn import OrthogonalConv
from orthojax.nn import WeightNormConv
from orthojax.nn._conv import conv
from orthojax.nn._conv import conv_geometry

LAYERS = (GmPConv, OrthogonalConv, WeightNormConv)


def test_geometry_is_canonical():
  g = conv_geometry(4, 6, (3, 2), strides=2, padding=1, kernel_dilation=(1, 2),
                    feature_group_count=2)
  assert g.kernel_size == (3, 2) and g.strides == (2, 2) and g.kernel_dilation == (1, 2)
  assert g.padding == ((1, 1), (1, 1)) and g.kernel_shape == (3, 2, 2, 6) and g.fan_in == 12
  assert conv_geometry(4, 6, 3, padding="same").padding == "SAME"
  assert conv_geometry(4, 6, 3).kernel_size == (3,)


@pytest.mark.parametrize("layer_cls", LAYERS)
def test_layers_record_the_same_geometry(layer_cls):
  layer = layer_cls(4, 6, (3, 3), 2, padding=[(1, 0), 1], rngs=nnx.Rngs(0))
  assert layer.geometry == conv_geometry(4, 6, (3, 3), 2, [(1, 0), 1])
  assert (layer.kernel_size, layer.strides, layer.padding) == ((3, 3), (2, 2), ((1, 0), (1, 1)))


@pytest.mark.parametrize("layer_cls", LAYERS)
@pytest.mark.parametrize("kwargs,match", [
    (dict(kernel_size=(3, 0)), "kernel_size must be a positive integer"),
    (dict(kernel_size=(1, 1, 1, 1)), "1, 2 or 3 spatial"),
    (dict(strides=(1, 2, 3)), "strides"),
    (dict(padding="FULL"), "unknown padding='FULL'"),
    (dict(feature_group_count=3), "divisible"),
    (dict(out_features=0), "out_features must be a positive integer"),
])
def test_layers_validate_alike(layer_cls, kwargs, match):
  args = dict(in_features=4, out_features=6, kernel_size=(3, 3)) | kwargs
  with pytest.raises(ValueError, match=match):
    layer_cls(rngs=nnx.Rngs(0), **args)


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)])
def test_conv_matches_lax_in_both_kernel_layouts(batch):
  key_x, key_k = jax.random.split(jax.random.key(0))
  g = conv_geometry(4, 6, (3, 3), strides=(1, 2), padding="SAME", feature_group_count=2)
  x = jax.random.normal(key_x, batch + (7, 8, 4))
  hwio = jax.random.normal(key_k, g.kernel_shape)
  want = jax.lax.conv_general_dilated(
      x.reshape((-1, 7, 8, 4)), hwio, (1, 2), "SAME", feature_group_count=2,
      dimension_numbers=("NHWC", "HWIO", "NHWC"))
  want = want.reshape(batch + want.shape[1:])
  np.testing.assert_allclose(conv(x, hwio, g), want, rtol=1e-5, atol=1e-5)
  ohwi = jnp.moveaxis(hwio, -1, 0)
  np.testing.assert_allclose(conv(x, ohwi, g, kernel_layout="OHWI"), want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="spatial axes"):
    conv(jnp.ones((4,)), hwio, g)
