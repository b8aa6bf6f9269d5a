"""ResNet and VGG6 with ``weights="stiefel"``: every conv kernel on the Stiefel manifold,
routed to the Stiefel group's optimizer, and kept there by training."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import orthojax as oj
from orthojax import models
from orthojax.models import _resnet
from orthojax.train import Config
from orthojax.train import train


def _defect(kernel) -> float:
  """‖VᵀV − I‖_max on the tall side of the ``(kh·kw·in, out)`` view."""
  view = np.asarray(kernel, np.float64).reshape(-1, kernel.shape[-1])
  view = view if view.shape[0] >= view.shape[1] else view.T
  return float(np.abs(view.T @ view - np.eye(view.shape[1])).max())


def _kernels(model):
  return [(p, v) for p, v in jax.tree_util.tree_flatten_with_path(
      nnx.state(model, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable))[0]]


# ResNet-18's layout (stem, identity and strided 1x1 projection shortcuts, tall and wide
# kernel views) with its last three stages 128 wide: the widths are not what these tests
# check, and each distinct kernel shape costs a compile of the orthogonal initialisation
# (6 shapes instead of 11).
_FEW_SHAPES = (64, 128, 128, 128)


@pytest.fixture(scope="module")
def small_resnets():
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(_resnet, "_WIDTHS", _FEW_SHAPES)
    yield


@pytest.mark.parametrize("build", [
    lambda w: models.ResNet(18, "bn", 10, weights=w, rngs=nnx.Rngs(0)),
    lambda w: models.ResNet(18, "none", 10, weights=w, rngs=nnx.Rngs(0)),
    lambda w: models.VGG6("bn", 10, widths=(8, 16, 32), weights=w, rngs=nnx.Rngs(0)),
], ids=["resnet18-bn", "resnet18-none", "vgg6-bn"])
def test_exactly_the_conv_kernels_are_on_the_manifold(build, small_resnets):
  model = build("stiefel")
  plain = nnx.eval_shape(lambda: build("euclidean"))   # its kernels' ranks and metadata
  labels = oj.nn.manifold_labels(model)
  stiefel = [v for (_, v), label in zip(_kernels(model), jax.tree.leaves(labels))
             if label == "stiefel"]
  convs = [v for _, v in _kernels(plain) if len(v.shape) == 4]
  assert len(stiefel) == len(convs) > 0
  assert all(v[...].ndim == 4 and isinstance(v, oj.nn.StiefelParam) for v in stiefel)
  assert max(_defect(v[...]) for v in stiefel) < 1e-5
  # The sharding metadata of a conv kernel is kept.
  assert all(v.get_metadata().get("out_sharding") == c.get_metadata().get("out_sharding")
             for v, c in zip(stiefel, convs))
  assert model(jnp.ones((2, 8, 8, 3))).shape == (2, 10)


@pytest.mark.parametrize("build,message", [
    (lambda: models.ResNet(18, "gmp_imn", weights="stiefel", rngs=nnx.Rngs(0)),
     "ResNet: weights='stiefel' needs plain conv kernels"),
    (lambda: models.VGG6("wn", weights="stiefel", rngs=nnx.Rngs(0)),
     "VGG6: weights='stiefel' needs plain conv kernels"),
    (lambda: models.ResNet(18, weights="oblique", rngs=nnx.Rngs(0)),
     "ResNet: unknown weights='oblique'"),
])
def test_bad_weights_are_one_line(build, message):
  with pytest.raises(ValueError, match=message):
    build()


def test_trainer_keeps_the_conv_kernels_on_the_manifold(tmp_path):
  """The flagfile route: model.weights='stiefel' and a Stiefel optimizer group."""
  config = Config(
      model={"name": "VGG6", "variant": "bn", "widths": (8, 16, 32), "weights": "stiefel"},
      data={"name": "fake", "height": 32, "width": 32, "num_classes": 10, "num_train": 64,
            "num_eval": 16, "pool": 8},
      batch_size=16, num_steps=4, log_every=2, workdir=str(tmp_path / "run"),
      optimizer={"euclidean": {"name": "sgd", "learning_rate": 0.1, "momentum": 0.9},
                 "stiefel": {"name": "radam", "learning_rate": 0.05,
                             "manifold": {"name": "Stiefel", "retraction": "cayley"}}})
  result = train(config, print_fn=lambda line: None)
  assert result.final_step == 4
  kernels = [np.asarray(x) for x in jax.tree.leaves(result.state.params) if np.ndim(x) == 4]
  assert len(kernels) == 6
  assert max(_defect(k) for k in kernels) < 1e-4
  start = models.VGG6("bn", 10, widths=(8, 16, 32), weights="stiefel", rngs=nnx.Rngs(0))
  assert not np.allclose(kernels[0], [v[...] for _, v in _kernels(start)
                                      if v[...].ndim == 4][0])   # they moved
