"""Optimizers from flags: weight decay acts on kernels only, for every Euclidean optimizer."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx

import orthojax as oj
from orthojax.train import data as data_lib
from orthojax.train import model_zoo
from orthojax.train import optimizers
from orthojax.train.config import Config


def _params(config):
  info = data_lib.dataset_info(config.dataset)
  model = model_zoo.build(config, info, nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  return (nnx.to_pure_dict(state), nnx.to_pure_dict(oj.nn.manifold_labels(state)),
          nnx.to_pure_dict(oj.nn.matrix_views(state)))


def _decayed(path) -> bool:
  key = jax.tree_util.keystr(path)
  return "kernel" in key and "'theta'" not in key


@pytest.mark.parametrize("optimizer", ["momentum", "sgd", "adamw"])
def test_zero_gradient_update_is_the_decay_of_the_kernels(optimizer):
  config = Config(model="mlp", variant="gmp", width=8, dataset="digits", num_steps=10,
                  optimizer=optimizer, lr=0.5, weight_decay=0.01)
  params, _, _ = _params(config)
  assert any("theta" in jax.tree_util.keystr(p) for p, _ in
             jax.tree_util.tree_flatten_with_path(params)[0])
  tx = optimizers.build(config, total_steps=10)
  updates, _ = tx.update(jax.tree.map(np.zeros_like, params), tx.init(params), params)

  def check(path, u, p):
    want = -0.5 * 0.01 * np.asarray(p) if _decayed(path) else np.zeros_like(p)
    np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-9, err_msg=jax.tree_util.keystr(path))

  jax.tree_util.tree_map_with_path(check, updates, params)


def test_adam_l2_touches_kernels_only_and_none_without_decay():
  config = Config(model="mlp", variant="sp", width=8, dataset="digits", num_steps=10,
                  optimizer="adam", lr=0.1, weight_decay=0.01)
  params, _, _ = _params(config)
  zeros = jax.tree.map(np.zeros_like, params)
  for wd in (0.01, 0.0):
    tx = optimizers.build(config.replace(weight_decay=wd), total_steps=10)
    updates, _ = tx.update(zeros, tx.init(params), params)
    jax.tree_util.tree_map_with_path(
        lambda path, u: np.testing.assert_equal(bool(np.any(u != 0)),
                                                wd > 0 and _decayed(path)), updates)


def test_manifold_run_decays_the_euclidean_kernels_not_the_manifold_ones():
  config = Config(model="deep_mlp", depth=2, width=8, q_star=0.5, init="orthogonal",
                  weights="stiefel", dataset="digits", num_steps=10, optimizer="radam",
                  euclidean_optimizer="momentum", lr=0.1, weight_decay=0.01)
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
