"""Every parameter of every ``oj.nn`` layer and ``oj.models`` model says whether it is a
matrix: a kernel (its axes have ``fan_in`` and ``fan_out``) or ``matrix_view=False`` (a
bias, a scale, GmP's angles and radii, a generator) — and Muon, the zoo's penalty mask
and the views tree follow it."""

from __future__ import annotations

from flax import nnx
import jax
import pytest

import orthojax as oj
from orthojax.nn import sharding
from orthojax.train import model_zoo
from tests.nn._zoo import LAYERS, MODELS, R


def _params(module):
  flat = nnx.to_flat_state(nnx.state(module, nnx.Param))
  return {path: variable for path, variable in flat}


@pytest.mark.parametrize("build", [*LAYERS.values(), *MODELS.values()],
                         ids=[*LAYERS, *MODELS])
def test_every_parameter_says_whether_it_is_a_matrix(build):
  module = nnx.eval_shape(build)
  for path, variable in _params(module).items():
    meta = variable.get_metadata()
    axes = meta.get("out_sharding") or ()
    kernel = (sharding.FAN_IN in axes and sharding.FAN_OUT in axes) or isinstance(
        variable, oj.nn.ManifoldParam) or (not axes and variable.ndim in (2, 4)
                                           and path[-1] in ("kernel",))
    view = meta.get("matrix_view")
    name = "/".join(map(str, path))
    if kernel:
      assert view is not False, f"{name}: a kernel marked not-a-matrix"
      oj.linalg.layout(variable.shape, view, name)   # recorded, or inferable (not a 1-D conv's)
    else:
      assert view is False or variable.ndim < 2, (
          f"{name} {variable.shape} axes {axes}: not a matrix, but its metadata does not "
          f"say so (matrix_view=False)")


@pytest.mark.parametrize("build", [MODELS["MLP gmp"], MODELS["DeepMLP stiefel"],
                                   MODELS["ResNet18 gmp_imn"], MODELS["TransformerLM"]],
                         ids=["MLP gmp", "DeepMLP", "ResNet18 gmp_imn", "TransformerLM"])
def test_muon_and_the_penalty_mask_leave_non_matrices_alone(build):
  model = nnx.eval_shape(build)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  views = oj.nn.matrix_views(model)
  dims = oj.optim.muon_dimension_numbers(params, views)
  mask = model_zoo.penalty_mask(model, params)
  marked = dict(jax.tree_util.tree_flatten_with_path(
      views, is_leaf=lambda v: v is None or v is False or oj.linalg.is_view(v))[0])
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    dim = _get(dims, path)
    if marked[path] is False:
      assert dim is None and not _get(mask, path), jax.tree_util.keystr(path)
    elif leaf.ndim >= 2:
      assert dim is not None and _get(mask, path), jax.tree_util.keystr(path)
  if "theta" in str(jax.tree_util.tree_structure(params)):
    assert any(v is False for p, v in marked.items() if "theta" in jax.tree_util.keystr(p))


def _get(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def test_the_penalty_leaves_gmp_angles_alone_given_the_models_views():
  model = oj.models.MLP(3, 4, 2, variant="gmp", rngs=R())
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  zeros = jax.tree.map(jax.numpy.zeros_like, params)
  with_views = oj.optim.add_orthogonality_penalty("so", 1.0, views=oj.nn.matrix_views(model))
  updates, _ = with_views.update(zeros, with_views.init(params), params)
  assert not jax.numpy.any(updates["hidden"]["layer"]["theta"])
  assert jax.numpy.any(updates["out"]["kernel"])   # the kernel is still penalised
  bare = oj.optim.add_orthogonality_penalty("so", 1.0)   # arrays alone cannot say it
  updates, _ = bare.update(zeros, bare.init(params), params)
  assert jax.numpy.any(updates["hidden"]["layer"]["theta"])
