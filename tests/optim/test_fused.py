"""The fused Stiefel-Adam path of ``radam`` against the composable chain.

``orthojax.optim.radam`` on ``Stiefel(metric="euclidean")`` is
``fused_stiefel_adam``; it must compute what the chain of building blocks
(``project_to_tangent``, ``scale_by_riemannian_adam``,
``scale_by_learning_rate``, ``retract``) computes with the same options, to
float rounding, with the same state structure. Optimisation quality (reaching
the nuclear-norm optimum) is tested in ``test_optimizers.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import orthojax as oj
from orthojax.linalg import MatrixView
from orthojax.manifolds import Oblique, Stiefel
from orthojax.optim._fused import retract_tall

SHAPES = {"tall": (12, 5), "wide": (4, 10), "square": (6, 6), "stack": (2, 9, 4),
          "square_stack": (2, 5, 5), "conv": (3, 3, 2, 6)}
VIEWS = {k: (MatrixView.stacked() if k.endswith("stack") else None) for k in SHAPES}
STEPS = 5


def _chain(lr, manifold, second_moment, nesterov, reorthonormalize_every=None):
  return optax.chain(
      oj.optim.project_to_tangent(manifold, VIEWS),
      oj.optim.scale_by_riemannian_adam(manifold, second_moment=second_moment,
                                        nesterov=nesterov, views=VIEWS),
      optax.scale_by_learning_rate(lr),
      oj.optim.retract(manifold, VIEWS, reorthonormalize_every),
  )


def _problem(dtype=jnp.float32):
  key = jax.random.PRNGKey(0)
  params = {k: Stiefel().random(jax.random.fold_in(key, i), s, dtype, view=VIEWS[k])
            for i, (k, s) in enumerate(SHAPES.items())}
  data = {k: jax.random.normal(jax.random.fold_in(key, 100 + i), s)
          for i, (k, s) in enumerate(SHAPES.items())}

  def loss(p):  # non-linear, so the gradient changes from step to step
    return -sum(jnp.sum(jnp.sin(p[k].astype(jnp.float32)) * data[k]) for k in p)

  return params, loss


def _run_both(tx_a, tx_b, params, loss, steps=STEPS):
  @jax.jit
  def step(pa, sa, pb, sb):
    ua, sa = tx_a.update(jax.grad(loss)(pa), sa, pa)
    ub, sb = tx_b.update(jax.grad(loss)(pb), sb, pb)
    return optax.apply_updates(pa, ua), sa, optax.apply_updates(pb, ub), sb

  pa = pb = params
  sa, sb = tx_a.init(params), tx_b.init(params)
  history = []
  for _ in range(steps):
    pa, sa, pb, sb = step(pa, sa, pb, sb)
    history.append((pa, pb))
  return history, sa, sb


def _scopes(tx, params):
  """The transformation's named scopes in its lowered update (``orthojax.optim._scope``)."""
  grads = jax.tree.map(jnp.ones_like, params)
  text = jax.jit(lambda p, s: tx.update(grads, s, p)).lower(params, tx.init(params)).as_text(
      debug_info=True)
  return {name for name in ("fused_stiefel_adam", "fused_stiefel_momentum",
                            "scale_by_riemannian_adam", "riemannian_momentum") if name in text}


RETRACTIONS = {
    "qr": Stiefel("qr"),
    "cayley-iterative": Stiefel("cayley", cayley_iterations=2),
    "cayley-exact": Stiefel("cayley"),
    "polar": Stiefel("polar"),
    "newton_schulz": Stiefel("newton_schulz"),
}


# The fused update computes the step's statistics (first moment, Nesterov, the second
# moment) and then hands the direction to ``retract_tall``, which depends on the
# retraction alone: the two axes are independent code, so every retraction is checked
# once and every (second moment, Nesterov) pair at least once, not all 20 pairings
# (each is a compile of both paths). The iterative Cayley retraction, the tightest one,
# gets the matrix second moment with Nesterov, and the element-wise one too: with it the
# step hands the retraction its normal part (``xi_perp``) instead of the direction.
RADAM_CASES = [("qr", "elementwise", False), ("cayley-iterative", "matrix", True),
               ("cayley-iterative", "elementwise", False),
               ("cayley-exact", "matrix", False), ("polar", "elementwise", True),
               ("newton_schulz", "matrix", True)]
assert {r for r, _, _ in RADAM_CASES} == set(RETRACTIONS)
assert len({(m, n) for _, m, n in RADAM_CASES}) == 4


@pytest.mark.parametrize(
    "retraction, second_moment, nesterov", RADAM_CASES,
    ids=[f"{r}-{m}-{'nesterov' if n else 'adam'}" for r, m, n in RADAM_CASES])
def test_radam_equals_the_chain(retraction, second_moment, nesterov):
  manifold = RETRACTIONS[retraction]
  # lr 0.01: the 2-iteration Cayley fixed point leaves a defect ~1e-5 per step
  # and the two paths differ by O(defect * step) there (module docstring).
  lr = optax.cosine_decay_schedule(0.01, 20)
  params, loss = _problem()
  fused = oj.optim.radam(lr, manifold, second_moment=second_moment, nesterov=nesterov,
                         views=VIEWS, reorthonormalize_every=3)
  chain = _chain(lr, manifold, second_moment, nesterov, reorthonormalize_every=3)
  history, s_chain, s_fused = _run_both(chain, fused, params, loss)
  for t, (pa, pb) in enumerate(history):
    for k in SHAPES:
      np.testing.assert_allclose(pb[k], pa[k], atol=1e-5, err_msg=f"step {t}, {k}")
  assert jax.tree.structure(s_fused) == jax.tree.structure(s_chain)
  for a, b in zip(jax.tree.leaves(s_chain), jax.tree.leaves(s_fused)):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-4)
  last = history[-1][1]
  for k in SHAPES:
    defect = Stiefel().defect(last[k], view=VIEWS[k])
    assert np.all(np.asarray(defect) < 1e-5), (k, defect)


@pytest.mark.parametrize("second_moment", ["elementwise", "matrix"])
def test_radam_equals_the_chain_bfloat16(second_moment):
  lr = 0.01
  params, loss = _problem(jnp.bfloat16)
  manifold = Stiefel("qr")
  fused = oj.optim.radam(lr, manifold, second_moment=second_moment, views=VIEWS)
  chain = _chain(lr, manifold, second_moment, False)
  history, s_chain, s_fused = _run_both(chain, fused, params, loss, steps=3)
  assert jax.tree.structure(s_fused) == jax.tree.structure(s_chain)
  for a, b in zip(jax.tree.leaves(s_chain), jax.tree.leaves(s_fused)):
    assert a.dtype == b.dtype
  for pa, pb in history:
    for k in SHAPES:
      assert pb[k].dtype == jnp.bfloat16
      # bfloat16 rounding: the chain rounds between its links, the fused path once.
      np.testing.assert_allclose(np.float32(pb[k]), np.float32(pa[k]), atol=2e-2)


def test_radam_is_fused_only_where_it_applies():
  params, _ = _problem()
  fused = oj.optim.radam(0.1, views=VIEWS)
  assert isinstance(fused.init(params)[1], oj.optim.ScaleByRiemannianAdamState)
  assert _scopes(fused, params) == {"fused_stiefel_adam"}
  # The chain (and its state) is unchanged for the other manifolds / metrics.
  for manifold in (Stiefel(metric="canonical"), Oblique()):
    tx = oj.optim.radam(0.1, manifold)
    assert isinstance(tx.init({"w": jnp.ones((4, 3))})[1], oj.optim.ScaleByRiemannianAdamState)
    assert _scopes(tx, {"w": Stiefel().random(jax.random.PRNGKey(0), (4, 3))}) == {
        "scale_by_riemannian_adam"}


def test_radam_fused_large_run_stays_on_manifold():
  """200 steps on a (3, 40, 40) stack and a tall (60, 20): defect ~1e-6."""
  key = jax.random.PRNGKey(3)
  views = {"s": MatrixView.stacked(), "t": None}
  params = {"s": Stiefel().random(key, (3, 40, 40), view=views["s"]),
            "t": Stiefel().random(jax.random.fold_in(key, 1), (60, 20))}
  c = {k: jax.random.normal(jax.random.fold_in(key, 2 + i), v.shape)
       for i, (k, v) in enumerate(params.items())}
  loss = lambda p: -sum(jnp.sum(p[k] * c[k]) for k in p)
  # The drift off the manifold is the retraction's (and the reorthonormalization's): each
  # retraction once, with each second moment once (independent code: RADAM_CASES).
  for manifold, second_moment in ((Stiefel("qr"), "elementwise"),
                                  (Stiefel("cayley", cayley_iterations=2), "matrix")):
    tx = oj.optim.radam(optax.cosine_decay_schedule(0.01, 200), manifold,
                        second_moment=second_moment, views=views, reorthonormalize_every=50)

    @jax.jit
    def run(p):
      def step(carry, _):
        p, s = carry
        u, s = tx.update(jax.grad(loss)(p), s, p)
        return (optax.apply_updates(p, u), s), None
      return jax.lax.scan(step, (p, tx.init(p)), None, length=200)[0][0]

    out = run(params)
    for k in out:
      defect = np.asarray(Stiefel().defect(out[k], view=views[k]))
      assert np.all(defect < 1e-5), (manifold, second_moment, k, defect)


@pytest.mark.parametrize("n, p", [(12, 5), (7, 7), (10, 4)])
@pytest.mark.parametrize("iterations", [None, 1, 2, 5])
def test_cayley_coordinates_equal_the_manifolds_retraction(n, p, iterations):
  """The fused retraction, from ``omega`` (and the normal part where given), equals
  ``Stiefel("cayley", cayley_iterations=…).retract`` of the tangent step; given the
  normal part it does not read ``xi``."""
  manifold = Stiefel("cayley", cayley_iterations=iterations)
  x = Stiefel().random(jax.random.PRNGKey(0), (2, n, p), view=MatrixView.stacked())
  g = 0.3 * jax.random.normal(jax.random.PRNGKey(1), (2, n, p))
  xi = Stiefel().project(x, g, view=MatrixView.stacked())
  omega = jnp.swapaxes(x, -1, -2) @ xi
  omega = 0.5 * (omega - jnp.swapaxes(omega, -1, -2))
  retract = lambda xi, xi_perp=None: retract_tall(manifold, x, xi, omega, jnp.float32, 1,
                                                  None, xi_perp)
  with jax.default_matmul_precision("highest"):
    got = retract(xi)
    normal = xi - jnp.einsum("bnp,bpq->bnq", x, omega, precision="highest")
    given = retract(jnp.full_like(xi, jnp.nan), normal)
  want = manifold.retract(x, xi, view=MatrixView.stacked())
  np.testing.assert_allclose(got, want, atol=2e-6)
  np.testing.assert_allclose(given, want, atol=2e-6)   # xi itself is not read


# ------------------------------------------- rsgd's fused momentum path ---

def _momentum_chain(lr, manifold, momentum, nesterov, reorthonormalize_every=None):
  return optax.chain(
      oj.optim.project_to_tangent(manifold, VIEWS),
      oj.optim.riemannian_momentum(manifold, momentum, nesterov, VIEWS),
      optax.scale_by_learning_rate(lr),
      oj.optim.retract(manifold, VIEWS, reorthonormalize_every),
  )


# As for radam (RADAM_CASES): the momentum and the retraction are independent code, so
# every retraction once and both momentum variants, not all 10 pairings.
RSGD_CASES = [("qr", False), ("cayley-iterative", True), ("cayley-exact", False),
              ("polar", True), ("newton_schulz", False)]
assert {r for r, _ in RSGD_CASES} == set(RETRACTIONS)


@pytest.mark.parametrize(
    "retraction, nesterov", RSGD_CASES,
    ids=[f"{r}-{'nesterov' if n else 'heavy_ball'}" for r, n in RSGD_CASES])
def test_rsgd_momentum_equals_the_chain(retraction, nesterov):
  manifold = RETRACTIONS[retraction]
  # lr 0.005: with momentum 0.9 the steps grow to ~10 lr |G|; the 2-iteration Cayley
  # fixed point's defect and the paths' O(defect * step) difference grow with them.
  lr = optax.cosine_decay_schedule(0.005, 20)
  params, loss = _problem()
  fused = oj.optim.rsgd(lr, manifold, momentum=0.9, nesterov=nesterov, views=VIEWS,
                        reorthonormalize_every=3)
  assert isinstance(fused.init(params)[1], oj.optim.RiemannianMomentumState)
  chain = _momentum_chain(lr, manifold, 0.9, nesterov, reorthonormalize_every=3)
  history, s_chain, s_fused = _run_both(chain, fused, params, loss)
  for t, (pa, pb) in enumerate(history):
    for k in SHAPES:
      np.testing.assert_allclose(pb[k], pa[k], atol=1e-5, err_msg=f"step {t}, {k}")
  # The run moved well beyond the tolerance.
  assert max(float(jnp.abs(history[-1][0][k] - params[k]).max()) for k in SHAPES) > 1e-2
  assert jax.tree.structure(s_fused) == jax.tree.structure(s_chain)
  for a, b in zip(jax.tree.leaves(s_chain), jax.tree.leaves(s_fused)):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_allclose(b, a, atol=2e-5, rtol=1e-4)
  # The fused path stays as close to the manifold as the chain (the 2-iteration Cayley
  # fixed point leaves a defect of O(step^3) in both).
  for k in SHAPES:
    defects = [np.max(np.asarray(Stiefel().defect(p[k], view=VIEWS[k])))
               for p in history[-1]]
    assert defects[1] < max(1e-5, 1.1 * defects[0]), (k, defects)


@pytest.mark.parametrize("dtype, atol", [(jnp.bfloat16, 2e-2), (jnp.float64, 1e-12)],
                         ids=["bfloat16", "float64"])
def test_rsgd_momentum_equals_the_chain_in_other_dtypes(dtype, atol):
  with jax.enable_x64(dtype == jnp.float64):
    params, loss = _problem(dtype)
    manifold = Stiefel("qr")
    fused = oj.optim.rsgd(0.02, manifold, momentum=0.9, views=VIEWS)
    chain = _momentum_chain(0.02, manifold, 0.9, False)
    history, s_chain, s_fused = _run_both(chain, fused, params, loss, steps=3)
    for a, b in zip(jax.tree.leaves(s_chain), jax.tree.leaves(s_fused)):
      assert a.dtype == b.dtype
    for pa, pb in history:
      for k in SHAPES:
        assert pb[k].dtype == dtype
        # bfloat16: the chain rounds between its links, the fused path once.
        np.testing.assert_allclose(np.float64(pb[k]), np.float64(pa[k]), atol=atol)


def test_rsgd_is_fused_only_where_it_applies():
  params, _ = _problem()
  for nesterov in (False, True):
    fused = oj.optim.rsgd(0.1, momentum=0.9, nesterov=nesterov, views=VIEWS)
    assert _scopes(fused, params) == {"fused_stiefel_momentum"}
  plain = oj.optim.rsgd(0.1, momentum=0.0, views=VIEWS)
  assert len(plain.init(params)) == 3 and not _scopes(plain, params)  # no trace, no fusion
  for manifold in (Stiefel(metric="canonical"), Oblique()):
    tx = oj.optim.rsgd(0.1, manifold, momentum=0.9)
    assert isinstance(tx.init({"w": jnp.ones((4, 3))})[1], oj.optim.RiemannianMomentumState)
    assert _scopes(tx, {"w": Stiefel().random(jax.random.PRNGKey(0), (4, 3))}) == {
        "riemannian_momentum"}
