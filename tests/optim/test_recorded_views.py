"""``views=None`` on the path the README teaches, ``nnx.Optimizer(model, tx, wrt=nnx.Param)``:
the penalty's mask, Muon's dimension numbers and the Stiefel optimizers' views follow the
views the model's Variables record, exactly as ``views=oj.nn.matrix_views(model)`` does —
for every ``oj.nn`` layer and ``oj.models`` model. A bare array dict keeps inference.

The models are :func:`tests.nn._zoo.miniature` s (their trees and metadata, tiny values),
built once per module; every step runs under ``nnx.jit``, where ``tx.update`` sees the
Variables' bare values only.
"""

from __future__ import annotations

import functools
import warnings

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import orthojax as oj
from tests.nn._zoo import ALL, R, miniature


@functools.cache
def _model(name):
  return miniature(ALL[name])


def _is_variable(x):
  return isinstance(x, nnx.Variable)


def _pure(model):
  return {jax.tree_util.keystr(p): np.asarray(x) for p, x in
          jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(model, nnx.Param)))[0]}


def _not_matrices(model):
  """Names of the parameters whose Variables say ``matrix_view=False``."""
  return {jax.tree_util.keystr(p) for p, v in jax.tree_util.tree_flatten_with_path(
      nnx.state(model, nnx.Param), is_leaf=_is_variable)[0]
          if v.get_metadata().get("matrix_view") is False}


def _records_a_view(name):
  return any(v.ndim >= 2 and v.get_metadata().get("matrix_view") is not None
             for v in jax.tree.leaves(nnx.state(_model(name), nnx.Param), is_leaf=_is_variable))


# The layers and models with a parameter of rank >= 2 that records its view: on the others,
# Muon and the manifold optimizers infer the same views with or without the metadata, and
# there is nothing to compare.
RECORDING = ("GmPDense", "GmPConv", "OrthogonalDense householder", "WeightNormConv", "MLP gmp",
             "DeepMLP euclidean", "DeepMLP stiefel", "DeepMLP oblique", "DeepLinear",
             "ResNet18 gmp_imn", "VGG6 gmp", "VGG6 gmp_imn", "TransformerLM",
             "TransformerLM stiefel")


def test_the_recording_models_are_those_listed():
  assert [name for name in ALL if _records_a_view(name)] == list(RECORDING)


def _grads(model, zero=False):
  state = nnx.state(model, nnx.Param)
  rng = np.random.default_rng(1)
  return jax.tree.map(lambda x: jnp.zeros_like(x) if zero else
                      jnp.asarray(rng.standard_normal(x.shape), x.dtype), state)


@nnx.jit
def _steps(a, opt_a, b, opt_b, grads):
  opt_a.update(a, grads)
  opt_b.update(b, grads)


def _default_and_explicit(name, make, zero_grads=False):
  """One step of ``make(views=None)`` and of ``make(views=oj.nn.matrix_views(model))``
  through ``nnx.Optimizer``; returns (before, default, explicit) parameter dicts."""
  base = _model(name)
  a, b = nnx.clone(base), nnx.clone(base)
  opt_a = nnx.Optimizer(a, make(a, None), wrt=nnx.Param)
  opt_b = nnx.Optimizer(b, make(b, oj.nn.matrix_views(b)), wrt=nnx.Param)
  _steps(a, opt_a, b, opt_b, _grads(base, zero_grads))
  return _pure(base), _pure(a), _pure(b)


def _assert_same(default, explicit):
  for key in explicit:
    np.testing.assert_allclose(default[key], explicit[key], rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("name", list(ALL))
def test_the_penalty_leaves_parameters_that_are_not_matrices_alone(name):
  penalty = lambda model, views: optax.chain(
      oj.optim.add_orthogonality_penalty("so", 1.0, views=views), optax.sgd(1.0))
  before, default, explicit = _default_and_explicit(name, penalty, zero_grads=True)
  for key in _not_matrices(_model(name)):
    np.testing.assert_array_equal(default[key], before[key], err_msg=key)
  _assert_same(default, explicit)


@pytest.mark.parametrize("name", RECORDING)
def test_muon_sends_parameters_that_are_not_matrices_to_adam(name):
  muon = lambda model, views: oj.optim.muon(1e-2, ns_steps=1, views=views)
  _, default, explicit = _default_and_explicit(name, muon)
  _assert_same(default, explicit)


def _matrices_to(tx_for_matrices):
  """Every parameter with >= 2 axes to ``tx_for_matrices`` (those whose view is False
  included: it must pass them through), the rest to SGD."""
  def make(model, views):
    labels = jax.tree.map(lambda v: "matrix" if v.ndim >= 2 else "other",
                          nnx.state(model, nnx.Param), is_leaf=_is_variable)
    return oj.optim.partition(labels, matrix=tx_for_matrices(views), other=optax.sgd(0.1))
  return make


@pytest.mark.parametrize("name", RECORDING)
def test_a_stiefel_optimizer_passes_parameters_that_are_not_matrices_through(name):
  before, default, explicit = _default_and_explicit(
      name, _matrices_to(lambda views: oj.optim.rsgd(0.1, views=views)))
  _assert_same(default, explicit)
  grads = {jax.tree_util.keystr(p): np.asarray(g) for p, g in
           jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(_grads(_model(name))))[0]}
  for key in _not_matrices(_model(name)):   # no projection, no retraction: an SGD step
    np.testing.assert_allclose(default[key], before[key] - 0.1 * grads[key], rtol=1e-6,
                               atol=1e-6, err_msg=key)


@pytest.mark.parametrize("make, who", [
    (lambda: oj.optim.radam(0.1), "scale_by_riemannian_adam"),
    (lambda: oj.optim.radam(0.1, oj.manifolds.Oblique()), "scale_by_riemannian_adam"),
    (lambda: oj.optim.rsgd(0.1, momentum=0.9), "riemannian_momentum"),
    (lambda: oj.optim.cayley_sgd(0.1), "cayley_sgd"),
    (lambda: oj.optim.cayley_adam(0.1), "cayley_adam"),
])
def test_a_stiefel_optimizer_with_a_state_per_matrix_refuses_what_is_not_a_matrix(make, who):
  """A moment or a Cayley state is per matrix: a leaf whose Variable says
  ``matrix_view=False`` is refused in one line at ``init``, naming it (it used to index
  into the leaf: an IndexError on a scalar scale, a slice of a bias vector)."""
  model = nnx.clone(_model("DeepMLP stiefel"))
  with pytest.raises(ValueError, match=rf"^{who}: leaves .*\['scales'\].* are not matrices; "
                     "route them to a Euclidean optimizer with orthojax.optim.partition$"):
    nnx.Optimizer(model, make(), wrt=nnx.Param)


@pytest.mark.parametrize("name", ["DeepMLP stiefel", "DeepMLP oblique", "TransformerLM stiefel"])
def test_the_readme_partition_needs_no_views(name):
  """``partition(model, stiefel=radam(...), ...)`` as the README writes it, but without
  ``views=``: scanned stacks (3-D, not inferable) get their recorded views."""
  def make(model, views):
    return oj.optim.partition(
        model, stiefel=oj.optim.radam(1e-2, views=views),
        oblique=oj.optim.radam(1e-2, manifold=oj.manifolds.Oblique(), views=views),
        euclidean=optax.adam(1e-2))
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # radam still counts as keeping its leaves on the manifold
    _, default, explicit = _default_and_explicit(name, make)
  _assert_same(default, explicit)


def _full_size_gmp():
  return oj.models.MLP(6, 8, 3, variant="gmp", rngs=R())


THETA, KERNEL = "['hidden']['layer']['theta']", "['out']['kernel']"


def test_the_penalty_leaves_full_size_gmp_angles_alone():
  """The reported case at full size: one penalty step on zero gradients moved GmP's
  angles ``theta`` (a 2-D array, no matrix)."""
  model = _full_size_gmp()
  before = _pure(model)
  tx = optax.chain(oj.optim.add_orthogonality_penalty("so", 1.0), optax.sgd(1.0))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  nnx.jit(lambda m, o, g: o.update(m, g))(model, optimizer, _grads(model, zero=True))
  after = _pure(model)
  np.testing.assert_array_equal(after[THETA], before[THETA])
  assert not np.array_equal(after[KERNEL], before[KERNEL])   # the kernel is penalised


def test_muon_gives_full_size_gmp_angles_to_adam():
  base = _full_size_gmp()
  grads = _grads(base)

  def run(views):
    model = nnx.clone(base)
    optimizer = nnx.Optimizer(model, oj.optim.muon(1e-2, views=views), wrt=nnx.Param)
    nnx.jit(lambda m, o, g: o.update(m, g))(model, optimizer, grads)
    return _pure(model)

  default, explicit = run(None), run(oj.nn.matrix_views(base))
  orthogonalized = run(oj.linalg.MatrixView.dense())   # every 2-D leaf a matrix
  _assert_same(default, explicit)
  assert not np.allclose(default[THETA], orthogonalized[THETA])
  np.testing.assert_allclose(default[KERNEL], orthogonalized[KERNEL], rtol=1e-6, atol=1e-7)


def test_the_state_keeps_the_views_only_where_the_variables_record_them():
  model = _model("DeepMLP stiefel")
  # rsgd without momentum: no state per matrix, so the biases and scales may pass through.
  recorded = nnx.Optimizer(nnx.clone(model), oj.optim.rsgd(1e-3), wrt=nnx.Param).opt_state
  assert isinstance(recorded, oj.optim.RecordedViewsState)
  assert recorded.views == oj.linalg.recorded_views(nnx.state(model, nnx.Param))
  assert not jax.tree.leaves(recorded.views)   # static: no arrays to save or shard
  explicit = oj.optim.rsgd(1e-3, views=oj.nn.matrix_views(model))
  assert not isinstance(nnx.Optimizer(nnx.clone(model), explicit, wrt=nnx.Param).opt_state,
                        oj.optim.RecordedViewsState)
  plain = nnx.Linear(3, 2, use_bias=False, rngs=R())   # records no view: radam's own state
  assert not isinstance(nnx.Optimizer(plain, oj.optim.radam(1e-3), wrt=nnx.Param).opt_state,
                        oj.optim.RecordedViewsState)
  bare = nnx.to_pure_dict(nnx.state(_model("MLP gmp"), nnx.Param))
  assert not isinstance(oj.optim.muon(1e-2).init(bare), oj.optim.RecordedViewsState)


def test_a_bare_array_dict_keeps_inference():
  """Bare arrays cannot say they are no matrix: Muon orthogonalizes GmP's 2-D angles."""
  model = _model("MLP gmp")
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  grads = nnx.to_pure_dict(_grads(model))
  run = lambda tx: tx.update(grads, tx.init(params), params)[0]["hidden"]["layer"]["theta"]
  inferred = run(oj.optim.muon(1e-2, ns_steps=1))
  assert not np.allclose(inferred, run(oj.optim.muon(1e-2, ns_steps=1,
                                                     views=oj.nn.matrix_views(model))))
  np.testing.assert_array_equal(
      inferred, run(oj.optim.muon(1e-2, ns_steps=1, views=oj.linalg.MatrixView.dense())))
