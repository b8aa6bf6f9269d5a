"""Manifold Muon's direction: tangent, in the spectral unit ball, at least as steep as
``stiefel_muon``'s made tangent, the square closed form, the dual iteration's convergence;
and the optimizer: on the manifold, bucketed = per leaf."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import orthojax as oj
from orthojax.manifolds import Stiefel
from orthojax.optim._manifold_muon import manifold_muon_direction

SHAPES = {"tall": (96, 24), "tall batched": (3, 64, 16), "near square": (48, 40),
          "square": (32, 32), "square batched": (2, 24, 24)}


def _problem(shape, seed=0):
  kw, kg = jax.random.split(jax.random.key(seed))
  view = oj.linalg.MatrixView.stacked() if len(shape) == 3 else None
  return Stiefel().random(kw, shape, view=view), jax.random.normal(kg, shape)


def _direction(w, g, **kw):
  return jax.jit(lambda w, g: manifold_muon_direction(w, g, **kw))(w, g)


def _t(x):
  return jnp.swapaxes(x, -1, -2)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_direction_is_tangent_and_in_the_spectral_unit_ball(shape):
  w, g = _problem(SHAPES[shape])
  a = _direction(w, g)
  residual = _t(w) @ a + _t(a) @ w
  assert float(jnp.max(jnp.abs(residual))) < 1e-4
  spectral = np.linalg.svd(np.asarray(a, np.float64), compute_uv=False).max()
  assert spectral <= 1 + 1e-5


@pytest.mark.parametrize("solver", ["reweighted", "admm"])
@pytest.mark.parametrize("rank", [1, 4, 24])
def test_a_rank_deficient_gradient_gets_a_bounded_direction(rank, solver):
  """A gradient of rank below ``p`` (some directions of ``M`` are null): the direction stays
  in the unit ball, tangent to 1e-2, and within 5 % as steep as a long ADMM solve. The
  reweighted solver used to invert the null directions' rounding noise: spectral norm
  1e14 (E8's ``manifold_muon`` and ``stiefel_mlp`` arms each lost a matrix to it)."""
  kw, ku, kv = jax.random.split(jax.random.key(rank), 3)
  w = Stiefel().random(kw, (256, 32))
  g = jax.random.normal(ku, (256, rank)) @ jax.random.normal(kv, (rank, 32))
  a = _direction(w, g, solver=solver, steps=10)
  assert bool(jnp.all(jnp.isfinite(a)))
  assert np.linalg.svd(np.asarray(a, np.float64), compute_uv=False).max() <= 1.01
  assert float(jnp.max(jnp.abs(_t(w) @ a + _t(a) @ w))) < 1e-2
  best = _direction(w, g, solver="admm", steps=2000)
  inner = lambda x: float(jnp.vdot(g, x))
  assert inner(a) >= inner(best) * 0.95


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_it_descends_at_least_as_steeply_as_stiefel_muons_direction_made_tangent(shape):
  """``⟨G, −A'⟩`` no larger than that of Muon's direction ``msign(G)`` projected onto the
  tangent space and scaled to spectral norm 1 (both feasible; manifold Muon's optimal)."""
  w, g = _problem(SHAPES[shape], seed=1)
  ours = -_direction(w, g)
  theirs = Stiefel().project(w, -oj.linalg.polar(g), view=oj.linalg.MatrixView.stacked()
                             if g.ndim == 3 else None)
  theirs = theirs / np.linalg.svd(np.asarray(theirs), compute_uv=False).max(-1)[..., None, None]
  inner = lambda a: np.sum(np.asarray(g, np.float64) * np.asarray(a, np.float64),
                           axis=(-2, -1))
  assert np.all(inner(ours) <= inner(theirs) + 1e-4), (inner(ours), inner(theirs))
  assert np.all(inner(ours) < inner(theirs) - 1e-3)   # strictly steeper on these


@pytest.mark.parametrize("n", [8, 32])
def test_square_closed_form_for_a_tangent_gradient(n):
  """``G = WΩ`` (``Ω`` skew): the direction is ``W msign(Ω)``, from an independent SVD."""
  kw, ko = jax.random.split(jax.random.key(2))
  w = Stiefel().random(kw, (n, n))
  omega = oj.linalg.skew(jax.random.normal(ko, (n, n)))
  u, _, vt = np.linalg.svd(np.asarray(omega, np.float64))
  want = np.asarray(w, np.float64) @ (u @ vt)
  np.testing.assert_allclose(_direction(w, w @ omega), want, atol=2e-5)


@pytest.mark.parametrize("shape", ["tall", "near square", "tall batched"])
def test_admm_converges_to_a_long_solve(shape):
  """ADMM's objective at its default iterations within 1e-3 (relative) of 2,000
  iterations'; 3 are worse."""
  w, g = _problem(SHAPES[shape], seed=3)
  value = lambda a: float(jnp.sum(g * a))
  long = value(_direction(w, g, solver="admm", steps=2000))
  assert abs(value(_direction(w, g, solver="admm")) - long) <= 1e-3 * abs(long)
  assert abs(value(_direction(w, g, solver="admm", steps=3)) - long) > 1e-3 * abs(long)


def test_the_dual_ascent_agrees_with_admm_where_it_converges():
  """The paper's dual ascent on a tall-thin matrix: tangent to 1e-5 after 30 iterations,
  and the same direction as ADMM's."""
  w, g = _problem(SHAPES["tall"], seed=4)
  dual = _direction(w, g, solver="dual", steps=30)
  assert float(jnp.max(jnp.abs(_t(w) @ dual + _t(dual) @ w))) < 1e-5
  np.testing.assert_allclose(dual, _direction(w, g, solver="admm", steps=300), atol=2e-3)
  np.testing.assert_allclose(_direction(w, g, solver="dual", steps=30, msign_steps=10), dual,
                             atol=5e-3)


@pytest.mark.parametrize("shape", [(512, 128), (96, 24), (3, 80, 16)])
def test_the_reweighted_p_by_p_iteration_agrees_with_admm_where_the_normal_space_has_room(shape):
  """``n ≥ 4p``: 10 reweighted iterations (only ``p × p`` eigendecompositions between the
  first and last products) tangent to 1e-4 and the objective within 2e-5 of 1,000 ADMM
  iterations'; the default solver takes it there; 2 iterations are not enough."""
  w, g = _problem(shape, seed=8)
  g = g + 3.0 * jnp.mean(g, axis=-1, keepdims=True)      # a dominant direction, as momenta
  value = lambda a: np.sum(np.asarray(g / jnp.linalg.norm(g, axis=(-2, -1), keepdims=True),
                                      np.float64) * np.asarray(a, np.float64), axis=(-2, -1))
  long = value(_direction(w, g, solver="admm", steps=1000))
  ours = _direction(w, g, solver="reweighted")
  assert float(jnp.max(jnp.abs(_t(w) @ ours + _t(ours) @ w))) < 1e-4
  assert np.linalg.svd(np.asarray(ours, np.float64), compute_uv=False).max() <= 1 + 1e-5
  np.testing.assert_allclose(value(ours), long, atol=2e-5)
  np.testing.assert_array_equal(_direction(w, g), ours)           # "auto" chose it
  assert np.max(np.abs(value(_direction(w, g, solver="reweighted", steps=2)) - long)) > 1e-4


def test_auto_takes_admm_where_the_normal_space_is_narrow():
  from orthojax.optim._manifold_muon import chosen_solver
  assert [chosen_solver("auto", n, 128) for n in (512, 511, 256)] == [
      "reweighted", "admm", "admm"]
  w, g = _problem(SHAPES["near square"], seed=9)
  np.testing.assert_array_equal(_direction(w, g), _direction(w, g, solver="admm"))


def _params():
  keys = jax.random.split(jax.random.key(5), 3)
  return {"a": Stiefel().random(keys[0], (64, 16)),
          "b": Stiefel().random(keys[1], (64, 16)),
          "c": Stiefel().random(keys[2], (3, 3, 4, 8))}


def _run(tx, params, steps=20):
  state = tx.init(params)
  for i in range(steps):
    g = jax.tree.map(lambda p, k: jax.random.normal(k, p.shape), params,
                     dict(zip(params, jax.random.split(jax.random.key(i), 3))))
    u, state = jax.jit(tx.update)(g, state, params)
    params = optax.apply_updates(params, u)
  return params


def test_the_optimizer_keeps_the_manifold_and_buckets_equal_per_leaf():
  params = _params()
  pad = _run(oj.optim.manifold_muon(0.05), params)
  leaf = _run(oj.optim.manifold_muon(0.05, bucket="per_leaf"), params)
  for k in params:
    assert float(jnp.max(Stiefel().defect(pad[k]))) < 1e-5
    np.testing.assert_allclose(pad[k], leaf[k], atol=2e-5)
  assert oj.optim.keeps_manifold(oj.optim.manifold_muon(0.05))


@pytest.mark.parametrize("shapes", [((12, 12), (13, 12)), ((47, 12), (48, 12))],
                         ids=["square-beside-admm", "admm-beside-reweighted"])
def test_a_padded_bucket_never_mixes_solvers(shapes):
  """Two matrices of one small side, close enough to share a padded bucket, whose own
  shapes choose different solvers (the closed form and ADMM; ADMM below n = 4p, the
  reweighted iteration from it): each keeps its own, so the padded run equals the
  per-leaf one to rounding at 3 iterations, far from converged (mixed, the square one
  was off by 0.44)."""
  keys = jax.random.split(jax.random.key(7), 4)
  params = {"first": Stiefel().random(keys[0], shapes[0]),
            "second": Stiefel().random(keys[1], shapes[1])}
  grads = {k: jax.random.normal(key, p.shape) for (k, p), key in zip(params.items(), keys[2:])}
  run = lambda bucket: oj.optim.scale_by_manifold_muon(steps=3, bucket=bucket).update(
      grads, optax.EmptyState(), params)[0]
  pad, leaf = run("pad"), run("per_leaf")
  for k in params:
    np.testing.assert_allclose(pad[k], leaf[k], rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_one_line():
  with pytest.raises(ValueError, match="^manifold_muon: .*beta"):
    oj.optim.manifold_muon(0.1, beta=1.5)
  with pytest.raises(ValueError, match="^manifold_muon: solver='newton' is not a solver"):
    oj.optim.manifold_muon(0.1, solver="newton")
  for steps in (0, -3, 2.5):
    with pytest.raises(ValueError, match=f"^manifold_muon: steps={steps!r} must be a positive"):
      oj.optim.manifold_muon(0.1, steps=steps)
  with pytest.raises(ValueError, match="^manifold_muon: leaves .* are not matrices"):
    _run(oj.optim.manifold_muon(0.1, views={"a": False, "b": None, "c": None}), _params(), 1)


def test_it_is_chosen_from_the_config_for_the_stiefel_group():
  from orthojax.train import registry
  assert registry.OPTIMIZERS["manifold_muon"] is oj.optim.manifold_muon
  assert "manifold_muon" in registry.MANIFOLD_OPTIMIZERS


@pytest.mark.parametrize("shape", [(64, 32), (2, 40, 40)])
def test_the_spectral_ball_projection_from_products_equals_the_svds(shape):
  x = 0.2 * jax.random.normal(jax.random.key(6), shape)
  exact = oj.optim.clip_spectral(x)
  assert np.linalg.svd(np.asarray(exact), compute_uv=False).max() <= 1 + 1e-5
  assert np.linalg.svd(np.asarray(x), compute_uv=False).max() > 1.05   # something clipped
  np.testing.assert_allclose(oj.optim.clip_spectral(x, 8), exact, atol=2e-5)
  w, g = _problem(SHAPES["near square"], seed=7)
  np.testing.assert_allclose(_direction(w, g, msign_steps=8), _direction(w, g), atol=1e-3)
