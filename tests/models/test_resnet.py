"""ResNet (orthojax.models._resnet): parameter counts, variants, modes, closed forms.

Big nets are only built abstractly (``nnx.eval_shape``); real forward passes
use ResNet-18 on 32×32 images or single blocks with few channels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from orthojax import models
from orthojax.models._resnet import BasicBlock
from orthojax.models._resnet import Bottleneck
from orthojax.models._variants import Unit
from orthojax.nn import GmPConv
from orthojax.nn import GmPDense
from orthojax.nn import InputMeanNorm
from orthojax.nn import MeanOnlyBatchNorm
from orthojax.nn import WeightNormConv

# torchvision.models.resnet{18,34,50,101}(): sum(p.numel() for p in m.parameters()).
_TORCHVISION_PARAMS = {18: 11_689_512, 34: 21_797_672, 50: 25_557_032, 101: 44_549_160}


def _param_count(model) -> int:
  return sum(int(np.prod(v.shape)) for v in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _modules(model, cls):
  return [m for _, m in nnx.iter_modules(model) if isinstance(m, cls)]


def _normal(seed, *shape):
  # numpy, not jax.random: each new jax.random shape compiles a threefry kernel
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _images(seed=0, batch=2, size=32, channels=3):
  return _normal(seed, batch, size, size, channels)


def _host_init(seed=0):
  """A LeCun-normal kernel initializer drawn in numpy (``key`` unused).

  ``nnx.Conv``'s default draws a truncated normal on the device, which XLA
  compiles once per kernel shape (~0.7 s each here); the models' own init
  paths are covered by the abstract (``eval_shape``) tests.
  """
  rng = np.random.default_rng(seed)

  def init(key, shape, dtype=jnp.float32):
    del key
    fan_in = int(np.prod(shape[:-1]))
    return jnp.asarray(rng.normal(size=shape) / np.sqrt(fan_in), dtype)

  return init


def _uniform_gmp_state(model, seed=0):
  """Real values for an abstract (``nnx.eval_shape``) model, without its init code.

  GmP angles are those of Gaussian kernel samples (directions uniform on the
  sphere), computed on the host in numpy — what ``GmPConv``'s init computes,
  without compiling its direction-to-angles map once per kernel shape (~3 s
  each on a small CPU); r = 1, λ = 0; other kernels LeCun normal, biases and
  running means 0, running variances 1. Keeps the GmP ResNet-18 forward
  test cheap; the init itself is tested in tests/nn.
  """
  rng = np.random.default_rng(seed)
  graphdef, state = nnx.split(model)
  pure = nnx.to_pure_dict(state)

  def angles(n_out, n_in):
    u = rng.normal(size=(n_out, n_in))
    tail = np.sqrt(np.cumsum(u[:, ::-1] ** 2, axis=1)[:, ::-1])  # ‖u_{k:}‖
    theta = np.arctan2(tail[:, 1:-1], u[:, :-2])
    last = np.arctan2(u[:, -1], u[:, -2])[:, None]
    return np.concatenate([theta, last], axis=1)

  def value(path, leaf):
    name = str(path[-1].key)
    if name == "theta":
      return angles(leaf.shape[0], leaf.shape[1] + 1).astype(leaf.dtype)
    if name in ("r", "scale", "var"):
      return np.ones(leaf.shape, leaf.dtype)
    if name == "kernel":
      fan_in = int(np.prod(leaf.shape[:-1]))
      return (rng.normal(size=leaf.shape) / np.sqrt(fan_in)).astype(leaf.dtype)
    return np.zeros(leaf.shape, leaf.dtype)

  nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(value, pure))
  return nnx.merge(graphdef, state)


@pytest.fixture(scope="module")
def resnet18():
  """ResNet-18 per norm (5 classes), built once for the module.

  bn / wn_mbn / none use the real initialisation; gmp_imn is built
  abstractly and given values by :func:`_uniform_gmp_state`.
  """
  cache = {}

  def get(norm):
    if norm not in cache:
      build = lambda: models.ResNet18(norm, num_classes=5, kernel_init=_host_init(),
                                      rngs=nnx.Rngs(0))
      cache[norm] = (_uniform_gmp_state(nnx.eval_shape(build)) if norm == "gmp_imn"
                     else build())
    return cache[norm]

  return get


@pytest.fixture(scope="module")
def abstract():
  """``get(depth, norm, apply)``: an ``nnx.eval_shape`` ResNet (1000 classes),
  and its logits for (3, 64, 64, 3) images when ``apply``; cached."""
  cache = {}

  def get(depth, norm, apply=False):
    if (depth, norm, apply) not in cache:
      def build():
        model = models.ResNet(depth, norm, rngs=nnx.Rngs(0))
        return model, (model(jnp.zeros((3, 64, 64, 3))) if apply else None)

      cache[depth, norm, apply] = nnx.eval_shape(build)
    return cache[depth, norm, apply]

  return get


_forward = nnx.jit(lambda model, x: model(x))


# ------------------------------------------------------------ shapes / counts


@pytest.mark.parametrize("depth", sorted(_TORCHVISION_PARAMS))
def test_bn_param_count_matches_torchvision(abstract, depth):
  model, _ = abstract(depth, "bn", apply=depth == 50)
  assert _param_count(model) == _TORCHVISION_PARAMS[depth]
  # running statistics are BatchStats, not Params: 2 per BN channel
  n_bn = sum(m.num_features for m in _modules(model, nnx.BatchNorm))
  stats = jax.tree.leaves(nnx.state(model, nnx.BatchStat))
  assert sum(int(np.prod(v.shape)) for v in stats) == 2 * n_bn


def test_named_constructors_are_resnet_of_that_depth():
  model = nnx.eval_shape(lambda: models.ResNet18("bn", num_classes=10, rngs=nnx.Rngs(0)))
  assert isinstance(model, models.ResNet) and model.depth == 18 and model.norm == "bn"
  assert _param_count(model) == _TORCHVISION_PARAMS[18] - 990 * 512 - 990
  for depth, build in [(34, models.ResNet34), (50, models.ResNet50), (101, models.ResNet101)]:
    assert build.__name__ == f"ResNet{depth}"
    assert build.__doc__.startswith(f"ResNet-{depth}")


@pytest.mark.parametrize("norm", models.ResNet.NORMS)
def test_resnet50_each_norm_maps_images_to_logits(abstract, norm):
  model, out = abstract(50, norm, apply=True)
  assert model.num_features == 2048
  assert out.shape == (3, 1000) and out.dtype == jnp.float32


@pytest.mark.parametrize("norm", models.ResNet.NORMS)
def test_resnet18_forward_is_finite(resnet18, norm):
  model = resnet18(norm)
  y = _forward(model, _images())
  assert y.shape == (2, 5) and y.dtype == jnp.float32
  assert np.all(np.isfinite(y))
  assert float(jnp.max(jnp.abs(y[0] - y[1]))) > 0  # depends on the input


_NORM_LAYER = {"bn": nnx.BatchNorm, "wn_mbn": MeanOnlyBatchNorm, "gmp_imn": InputMeanNorm}


@pytest.mark.parametrize("norm", models.ResNet.NORMS)
def test_bfloat16_sharding_axes_and_modes(norm):
  def build_and_apply():
    model = models.ResNet18(norm, num_classes=5, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    return model, model.features(_images()), model(_images())

  model, feats, logits = nnx.eval_shape(build_and_apply)
  # bfloat16 compute, float32 parameters and logits
  assert feats.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  params = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert {p.dtype for p in params} == {jnp.dtype(jnp.float32)}
  # every variable carries logical axes of its rank, not sharded eagerly
  leaves = jax.tree.leaves(nnx.state(model), is_leaf=lambda x: isinstance(x, nnx.Variable))
  for var in leaves:
    names = var.get_metadata().get("out_sharding")
    assert names is not None and len(names) == len(var.shape), (type(var).__name__, var.shape)
    assert var.get_metadata().get("eager_sharding") is False
  # model.train() / model.eval() reach every normalisation layer
  layers = _modules(model, _NORM_LAYER[norm]) if norm in _NORM_LAYER else []
  assert bool(layers) == (norm != "none")
  assert all(m.use_running_average is False for m in layers)
  model.eval()
  assert all(m.use_running_average is True for m in layers)
  model.train()
  assert all(m.use_running_average is False for m in layers)


# ------------------------------------------------------------- the variants


def test_gmp_imn_structure(abstract):
  model, _ = abstract(50, "gmp_imn", apply=True)
  assert not _modules(model, nnx.BatchNorm) and not _modules(model, MeanOnlyBatchNorm)
  assert not _modules(model, nnx.Conv) and not _modules(model, WeightNormConv)
  assert not _modules(model, GmPDense)
  gmp = _modules(model, GmPConv)
  assert len(gmp) == 1 + 16 * 3 + 4  # stem, 16 bottlenecks, 4 projections
  assert len(_modules(model, InputMeanNorm)) == len(gmp) - 1
  assert model.stem.imn is None and model.stem.layer.activation is jax.nn.relu
  assert type(model.classifier) is nnx.Linear
  for stage in model.layers:
    for block in stage:
      assert block.conv1.imn is not None and block.conv1.layer.activation is jax.nn.relu
      assert block.conv2.layer.activation is jax.nn.relu
      assert block.conv3.layer.activation is None  # ReLU after the addition
      if block.proj is not None:
        assert block.proj.imn is not None and block.proj.layer.activation is None


def test_wn_mbn_structure(abstract):
  model, _ = abstract(50, "wn_mbn", apply=True)
  convs = _modules(model, WeightNormConv)
  assert len(convs) == 1 + 16 * 3 + 4 and all(c.bias is None for c in convs)
  assert len(_modules(model, MeanOnlyBatchNorm)) == len(convs)
  assert all(m.bias is not None for m in _modules(model, MeanOnlyBatchNorm))
  assert not _modules(model, nnx.BatchNorm) and not _modules(model, nnx.Conv)
  assert not _modules(model, InputMeanNorm) and type(model.classifier) is nnx.Linear


def test_bn_structure_zero_inits_last_bn_of_each_branch(resnet18):
  model = resnet18("bn")
  assert all(not m.use_bias for m in _modules(model, nnx.Conv))
  np.testing.assert_array_equal(model.stem.norm.scale[...], 1.0)
  for stage in model.layers:
    for block in stage:
      np.testing.assert_array_equal(block.conv1.norm.scale[...], 1.0)
      np.testing.assert_array_equal(block.conv2.norm.scale[...], 0.0)
      if block.proj is not None:
        np.testing.assert_array_equal(block.proj.norm.scale[...], 1.0)


def test_bn_running_statistics_update_only_in_train_mode(resnet18):
  model = nnx.clone(resnet18("bn"))
  x = _images(1) + 0.5
  stats = lambda: [np.array(v) for v in jax.tree.leaves(nnx.state(model, nnx.BatchStat))]
  before = stats()
  model.eval()
  y_eval = _forward(model, x)
  for a, b in zip(before, stats()):
    np.testing.assert_array_equal(a, b)
  model.train()
  y_train = _forward(model, x)
  assert any(not np.array_equal(a, b) for a, b in zip(before, stats()))
  assert not np.allclose(y_eval, y_train, atol=1e-4)


# ------------------------------------------------------------- closed forms


def _conv(x, kernel, bias, stride):
  pad = kernel.shape[0] // 2
  y = lax.conv_general_dilated(x, kernel, (stride, stride), [(pad, pad)] * 2,
                               dimension_numbers=("NHWC", "HWIO", "NHWC"),
                               precision=lax.Precision.HIGHEST)
  return y + bias


def _kb(unit):
  return unit.layer.kernel[...], unit.layer.bias[...]


def test_none_basic_blocks_equal_hand_computation(resnet18):
  model = resnet18("none")
  relu = jax.nn.relu
  x = _normal(2, 2, 8, 8, 64)
  block = model.layers[0][0]  # 64 -> 64, identity shortcut
  assert block.proj is None
  want = relu(_conv(relu(_conv(x, *_kb(block.conv1), 1)), *_kb(block.conv2), 1) + x)
  np.testing.assert_allclose(_forward(block, x), want, atol=2e-5, rtol=1e-5)
  block = model.layers[1][0]  # 64 -> 128, stride 2, projection shortcut
  want = relu(_conv(relu(_conv(x, *_kb(block.conv1), 2)), *_kb(block.conv2), 1)
              + _conv(x, *_kb(block.proj), 2))
  assert want.shape == (2, 4, 4, 128)
  np.testing.assert_allclose(_forward(block, x), want, atol=2e-5, rtol=1e-5)


@nnx.jit
def _blocks(model, h):
  for stage in model.layers:
    for block in stage:
      h = block(h)
  return h


def test_none_stem_and_head_equal_hand_computation(resnet18):
  model = resnet18("none")
  x = _images(3)
  h = jax.nn.relu(_conv(x, *_kb(model.stem), 2))
  h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                        [(0, 0), (1, 1), (1, 1), (0, 0)])
  assert h.shape == (2, 8, 8, 64)
  h = _blocks(model, h)
  assert h.shape == (2, 1, 1, 512)
  want = jnp.mean(h, axis=(1, 2)) @ model.classifier.kernel[...] + model.classifier.bias[...]
  np.testing.assert_allclose(_forward(model, x), want, atol=1e-4, rtol=1e-4)


def _block_maker(variant):
  rngs = nnx.Rngs(1)
  init = _host_init(1)
  return lambda cin, cout, k, s, **kw: Unit(variant, cin, cout, k, s, kernel_init=init,
                                            gmp_init_direction=init, rngs=rngs, **kw)


def test_bottleneck_is_v1_5_and_equals_hand_computation():
  block = Bottleneck(16, 8, 2, _block_maker("sp"))
  assert block.conv1.layer.strides == 1 and block.conv2.layer.strides == 2
  assert block.conv3.layer.kernel.shape == (1, 1, 8, 32)
  relu = jax.nn.relu
  x = _normal(4, 2, 8, 8, 16)
  h = relu(_conv(x, *_kb(block.conv1), 1))
  h = relu(_conv(h, *_kb(block.conv2), 2))
  want = relu(_conv(h, *_kb(block.conv3), 1) + _conv(x, *_kb(block.proj), 2))
  np.testing.assert_allclose(_forward(block, x), want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("block_cls", [BasicBlock, Bottleneck])
def test_gmp_block_from_standard_kernels_equals_standard_block(block_cls):
  """GmP units built ``from_dense`` from an sp block's kernels reproduce it.

  In eval mode at init the IMNs subtract a zero running mean, so the GmP
  block must equal the standard block exactly: identity-activation GmP
  convs before the addition, the ReLU after it.
  """
  std = block_cls(4, 8, 2, _block_maker("sp"))
  gmp = block_cls(4, 8, 2, _block_maker("gmp_imn"))
  names = ("conv1", "conv2", "conv3", "proj") if block_cls is Bottleneck else ("conv1", "conv2",
                                                                               "proj")
  for name in names:
    s, g = getattr(std, name), getattr(gmp, name)
    assert g.imn is not None
    g.layer = GmPConv.from_dense(*_kb(s), activation=g.layer.activation, strides=g.layer.strides,
                                 padding=g.layer.padding)
  gmp.eval()
  x = _normal(5, 2, 8, 8, 4)
  y_std = _forward(std, x)
  assert float(jnp.mean(y_std == 0)) > 0.1  # the output ReLU is active somewhere
  np.testing.assert_allclose(_forward(gmp, x), y_std, atol=1e-5, rtol=1e-5)
  # in train mode the IMNs centre each GmP input by its batch mean
  gmp.train()
  assert not np.allclose(_forward(gmp, x + 1.0), _forward(std, x + 1.0), atol=1e-3)


# ------------------------------------------------------------------ errors


def test_unknown_names_raise_with_choices():
  with pytest.raises(ValueError, match=r"depth=20.*\[18, 34, 50, 101\]"):
    models.ResNet(20, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"norm='gn'.*'bn', 'wn_mbn', 'gmp_imn', 'none'"):
    models.ResNet(18, "gn", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"norm='sp'"):
    models.ResNet50("sp", rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"variant='ln'.*'gmp_imn'"):
    Unit("ln", 3, 4, (3, 3), rngs=nnx.Rngs(0))
