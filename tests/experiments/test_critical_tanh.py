"""E5: the diagnostics against dense references, the epoch schedule, and the smoke run."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from experiments import critical_tanh
from orthojax.train import data as data_lib
from orthojax.train.config import Config
from tests.experiments import _cli

@pytest.fixture(scope="module")
def diagnostics():
  config = Config(model="deep_mlp", depth=2, width=8, q_star=0.5, init="orthogonal",
                  weights="stiefel", dataset="digits", batch_size=32, num_epochs=1,
                  optimizer="radam", seed=4)
  info = data_lib.dataset_info("digits")
  return critical_tanh.Diagnostics(config, info, batch=16, jacobian_examples=3, lanczos_iters=40)


def test_fisher_and_jacobian_match_dense_references(diagnostics):
  d = diagnostics
  params = d.init_params
  got = d(params, mse=True)
  flat, unravel = ravel_pytree(params)

  def losses(theta):   # per-example cross entropy
    logits = d.apply(unravel(theta), d.x)
    return -jax.nn.log_softmax(logits)[jnp.arange(len(d.y)), d.y]

  g = np.asarray(jax.jit(jax.jacrev(losses))(flat), np.float64)            # (B, P)
  empirical = g.T @ g / len(d.y)
  assert got["fisher_lambda_max"] == pytest.approx(np.linalg.eigvalsh(empirical)[-1], rel=1e-3)

  j_out = np.asarray(jax.jit(jax.jacrev(lambda t: d.apply(unravel(t), d.x)))(flat),
                     np.float64)
  gn = np.einsum("bkp,bkq->pq", j_out, j_out) / len(d.y)           # MSE Gauss-Newton
  assert got["fisher_mse_lambda_max"] == pytest.approx(np.linalg.eigvalsh(gn)[-1], rel=1e-3)

  # J from the *scaled* input x⁰ = c·x to the last hidden layer, per example.
  mlp = d.model.model
  jac = jax.jit(jax.vmap(jax.jacfwd(mlp.features)))(d.scale * d.x[:3])       # (3, width, 64)
  sigmas = np.linalg.svd(np.asarray(jac, np.float64), compute_uv=False)[:, 0]
  assert got["jacobian_sigma_max"] == pytest.approx(np.mean(sigmas), rel=1e-4)
  assert got["jacobian_sigma_max_sq"] == pytest.approx(np.mean(np.square(sigmas)), rel=1e-4)


def test_hook_measures_only_on_its_epochs(diagnostics):
  hook = diagnostics.hook(steps_per_epoch=10, epochs={2, 5})
  params = diagnostics.init_params
  assert hook(10, params) == {} and hook(25, params) == {}
  out = hook(20, params)
  assert out["epoch"] == 2 and out["fisher_lambda_max"] > 0


def test_smoke_flagfile_reports_rho_beside_the_paper(tmp_path):
  workdir = tmp_path / "e5"
  proc = _cli.run("critical_tanh", "--flagfile=experiments/flags/critical_tanh_smoke.flags",
                  f"--workdir={workdir}")
  results = json.loads((workdir / "results.json").read_text())
  rho = {r["setting"]["quantity"]: r for r in results["rows"] if "quantity" in r["setting"]}
  assert [r["paper"] for r in rho.values()] == [0.64, 0.81]
  assert all(-1 <= r["mean"] <= 1 for r in rho.values())
  kinds = {r["setting"]["weights"] for r in results["rows"] if "weights" in r["setting"]}
  assert kinds == {"euclidean", "stiefel"}
  record = json.loads((workdir / "runs/q_star=0.5/weights=stiefel/seed=0/result.json").read_text())
  assert [d["epoch"] for d in record["diagnostics"]] == [0, 2]
  assert all(d["fisher_lambda_max"] > 0 and math.isfinite(d["jacobian_sigma_max"])
             for d in record["diagnostics"])
  assert 0.0 <= record["test"]["top1"] <= 1.0
  for name in ("fisher_vs_jacobian.png", "fisher_over_training.png", "train_loss.png"):
    assert (workdir / name).stat().st_size > 1000
  assert "Report: " in proc.stdout


@pytest.mark.parametrize("flag, message", [
    ("--weight_kinds=euclidean,sphere", "--weight_kinds=euclidean,sphere: unknown 'sphere'"),
    ("--q_stars=0.5,-1", "--q_stars=0.5,-1: positive values expected"),
    ("--manifold_optimizer=sgd", "--manifold_optimizer=sgd: unknown"),
    ("--diagnostic_batch=100000", "--diagnostic_batch=100000: the training split has only"),
])
def test_bad_flags_fail_fast_with_one_line(tmp_path, flag, message):
  proc = _cli.run("critical_tanh", "--flagfile=experiments/flags/critical_tanh_smoke.flags",
                  f"--workdir={tmp_path}", flag, check=False, timeout=120)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {message}")
