"""Buckets (every optimizer's ``bucket`` keyword, ``oj.linalg.map_views(bucket=...)``): one
batched chain of kernels per bucket of same-shape or zero-padded matrices equals one chain
per leaf, and the state stays per leaf."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import orthojax as oj
from tests.jaxpr_counts import update_primitives

STIEFEL, OBLIQUE = oj.manifolds.Stiefel(), oj.manifolds.Oblique()
CONV = oj.linalg.MatrixView.conv(2)
STACK = oj.linalg.MatrixView.stacked()

# ResNet-18's kernel shapes in miniature (repeated 3 × 3 kernels, a 1 × 1 projection, a
# stem), a Dense head and a scanned stack: 11 leaves in 7 buckets.
SHAPES = {"stem": (3, 3, 3, 8), "a1": (3, 3, 8, 8), "a2": (3, 3, 8, 8), "a3": (3, 3, 8, 8),
          "b1": (3, 3, 8, 16), "proj": (1, 1, 8, 16), "b2": (3, 3, 16, 16),
          "b3": (3, 3, 16, 16), "head": (16, 10), "head2": (16, 10), "stack": (4, 12, 12)}
VIEWS = {"stack": STACK}
# For the equality of the updates (a compile of each path per optimizer): the same kinds
# of leaves, fewer of each — a stem, two same-shape 3 × 3 kernels, a 1 × 1 projection,
# two Dense heads and the scanned stack: 7 leaves in 5 buckets, two of them of 2 leaves.
SMALL = {name: SHAPES[name] for name in ("stem", "a1", "a2", "proj", "head", "head2", "stack")}


def _tree(key, manifold, shapes=SHAPES):
  keys = dict(zip(shapes, jax.random.split(key, len(shapes))))
  params = {}
  for name, shape in shapes.items():
    params[name] = manifold.random(keys[name], shape, view=VIEWS.get(name))
  gkey = jax.random.fold_in(key, 10_000)   # not the params' draws (a gradient ∥ W is normal)
  grads = {n: 0.1 * jax.random.normal(jax.random.fold_in(gkey, i), s)
           for i, (n, s) in enumerate(shapes.items())}
  return params, grads


OPTIMIZERS = {   # each a function of the bucket keyword
    "radam_qr": lambda bucket="pad": oj.optim.radam(1e-2, STIEFEL, views=VIEWS, bucket=bucket),
    # The fused path's retraction and its second moment are independent code
    # (tests/optim/test_fused.py): the Cayley retraction with the matrix second moment.
    "radam_cayley_matrix_nu": lambda bucket="pad": oj.optim.radam(
        1e-2, oj.manifolds.Stiefel("cayley"), second_moment="matrix", views=VIEWS,
        bucket=bucket),
    "radam_oblique": lambda bucket="pad": oj.optim.radam(   # the chain path
        1e-2, OBLIQUE, views=VIEWS, bucket=bucket),
    "rsgd_momentum": lambda bucket="pad": oj.optim.rsgd(
        1e-2, STIEFEL, momentum=0.9, nesterov=True, views=VIEWS, bucket=bucket),
    "cayley_sgd": lambda bucket="pad": oj.optim.cayley_sgd(1e-2, views=VIEWS, bucket=bucket),
    "cayley_adam": lambda bucket="pad": oj.optim.cayley_adam(1e-2, views=VIEWS, bucket=bucket),
    "landing": lambda bucket="pad": oj.optim.landing(1e-2, views=VIEWS, bucket=bucket),
    "projected_gradient": lambda bucket="pad": oj.optim.projected_gradient(
        1e-2, STIEFEL, views=VIEWS, bucket=bucket),
    "muon": lambda bucket="pad": oj.optim.muon(1e-2, views=VIEWS, bucket=bucket),
    "muon_polar_express": lambda bucket="pad": oj.optim.muon(
        1e-2, ns_coeffs="polar_express", views=VIEWS, bucket=bucket),
    "stiefel_muon": lambda bucket="pad": oj.optim.stiefel_muon(1e-2, views=VIEWS,
                                                                bucket=bucket),
}


def _steps(tx, params, grads, steps=3):
  state = tx.init(params)
  step = jax.jit(tx.update)
  out = []
  for k in range(steps):
    updates, state = step(jax.tree.map(lambda g: g * (1 + k), grads), state, params)
    params = jax.tree.map(jnp.add, params, updates)
    out.append(updates)
  return out, state


@pytest.mark.parametrize("name, bucket", [(name, "pad") for name in sorted(OPTIMIZERS)] + [
    ("radam_qr", "shape"), ("radam_oblique", "shape"), ("landing", "shape")])
def test_bucketed_update_equals_the_per_leaf_update(name, bucket):
  manifold = OBLIQUE if name == "radam_oblique" else STIEFEL
  params, grads = _tree(jax.random.PRNGKey(0), manifold, SMALL)
  bucketed, state_b = _steps(OPTIMIZERS[name](bucket), params, grads)
  per_leaf, state_l = _steps(OPTIMIZERS[name]("per_leaf"), params, grads)
  assert jax.tree.structure(state_b) == jax.tree.structure(state_l)
  for b, l in zip(bucketed, per_leaf):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6), b, l)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6),
               state_b, state_l)




@pytest.mark.parametrize("name", ["radam_qr", "muon", "stiefel_muon"])
def test_one_chain_of_products_per_bucket_not_per_leaf(name):
  """11 leaves in 7 buckets (stem, a × 3, b1, proj, b × 2, head × 2, stack): the traced
  update holds the stacking (the members' tall matrices concatenated) and the per-bucket
  products, far fewer than per leaf."""
  params, grads = _tree(jax.random.PRNGKey(1), STIEFEL)
  bucketed = update_primitives(OPTIMIZERS[name](), params, grads)
  per_leaf = update_primitives(OPTIMIZERS[name]("per_leaf"), params, grads)
  assert "concatenate" not in per_leaf and bucketed["concatenate"] > 0
  assert bucketed["dot_general"] * 11 <= per_leaf["dot_general"] * 7 + 11 * 11


def test_map_views_buckets_only_where_asked():
  """A penalty sums over a leaf's matrices: without ``bucket`` it sees each leaf alone."""
  params = {"a": jnp.ones((4, 3)), "b": 2 * jnp.ones((4, 3))}
  seen = []
  oj.linalg.map_views(lambda w, view: seen.append(w.shape) or jnp.sum(w), params)
  assert seen == [(4, 3), (4, 3)]
  seen.clear()
  out = oj.linalg.map_views(lambda w, view: seen.append(w.shape) or 2 * w, params,
                            bucket="shape")
  assert seen == [(2, 4, 3)]
  np.testing.assert_array_equal(out["b"], 4 * jnp.ones((4, 3)))


@pytest.mark.parametrize("make", [
    lambda bucket: oj.optim.radam(1e-2, views=VIEWS, bucket=bucket),
    lambda bucket: oj.linalg.map_views(lambda w, view: w, {"a": jnp.ones((2, 2))},
                                       bucket=bucket)])
def test_an_unknown_bucket_is_refused_in_one_line(make):
  with pytest.raises(ValueError, match=r"bucket='padded'; choose one of "
                     r"\('pad', 'shape', 'per_leaf'\)"):
    make("padded")


def test_the_bucket_keyword_is_the_whole_switch():
  """``bucket="per_leaf"`` traces one chain per leaf, ``"pad"`` stacks; the keyword alone
  decides (no ambient switch), and either way radam keeps its manifold."""
  params, grads = _tree(jax.random.PRNGKey(1), STIEFEL)
  per_leaf = update_primitives(OPTIMIZERS["radam_qr"]("per_leaf"), params, grads)
  padded = update_primitives(OPTIMIZERS["radam_qr"]("pad"), params, grads)
  assert "concatenate" not in per_leaf and padded["concatenate"] > 0
  assert padded == update_primitives(OPTIMIZERS["radam_qr"](), params, grads)   # the default
  assert oj.optim.keeps_manifold(OPTIMIZERS["radam_qr"]("per_leaf"))


def _recording_newton_schulz(seen):
  """Newton–Schulz on each call's tall matrices, recording the shape it is called on."""
  def orthogonalize(w, view):
    seen.append(w.shape)
    lo = oj.linalg.layout(w.shape, view)
    return lo.from_tall(oj.linalg.newton_schulz(lo.to_tall(w), coeffs="cubic", steps=30))
  return orthogonalize


def _normal(**shapes) -> dict[str, jnp.ndarray]:
  """A standard normal leaf of each shape, the i-th drawn from ``PRNGKey(i)``."""
  return {name: jax.random.normal(jax.random.PRNGKey(i), shape)
          for i, (name, shape) in enumerate(shapes.items())}


def test_padded_buckets_stack_matrices_that_share_their_small_side():
  """``bucket="pad"``: a 3 × 3 × 8 × 8 kernel (72 × 8), a 68 × 8 Dense kernel and a wide
  8 × 70 one (tall 70 × 8) are one call on their tall matrices padded to 72 rows (210
  rows of their own, 216 padded: 1.03×); Newton–Schulz ignores zero rows, so each result
  equals its own; a leaf whose state is shaped otherwise is not padded."""
  params = _normal(a=(3, 3, 8, 8), dense=(68, 8), wide=(8, 70))
  seen = []
  orthogonalize = _recording_newton_schulz(seen)

  padded = oj.linalg.map_views(orthogonalize, params, bucket="pad")
  assert seen == [(3, 72, 8)]
  seen.clear()
  alone = oj.linalg.map_views(orthogonalize, params, bucket="per_leaf")
  assert len(seen) == 3
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
               padded, alone)
  seen.clear()
  per_matrix = {k: jnp.ones(()) for k in params}
  oj.linalg.map_views(lambda w, s, view: (orthogonalize(w, view), s), params, per_matrix,
                      bucket="pad")
  assert sorted(seen) == sorted([(3, 3, 8, 8), (68, 8), (8, 70)])


@pytest.mark.parametrize("shapes, calls", [
    # E5's input kernel and its 400 x 400 stack share their small side: padded together
    # they would cost (1 + 8) x 3072 rows against 3072 + 8 x 400 (4.3x): two calls.
    ({"input": (3072, 400), "stack": (8, 400, 400)}, [(1, 3072, 400), (8, 400, 400)]),
    # ResNet's 3 x 3 x 64 x 64 (576 rows) beside its 1 x 1 x 64 x 64 (64): two calls.
    ({"c3": (3, 3, 64, 64), "c1": (1, 1, 64, 64)}, [(1, 576, 64), (1, 64, 64)]),
    # Within the bound: 100, 96, 92 rows padded to 100 (300 vs 288: 1.04x) — and the next,
    # 80 rows, would take it to 400 vs 368 (1.09x): still in; 40 rows is not (1.27x).
    ({"a": (100, 8), "b": (96, 8), "c": (92, 8), "d": (80, 8), "e": (40, 8)},
     [(4, 100, 8), (1, 40, 8)]),
])
def test_a_padded_bucket_costs_at_most_a_tenth_more_than_its_matrices(shapes, calls):
  """The padded rows of every call stay within ``PADDED_FLOPS`` (1.1) of the matrices'
  own, counted here from the calls ``fn`` receives: a per-matrix update's FLOPs are
  linear in the long side."""
  params = _normal(**shapes)
  views = {"stack": STACK}
  called = []

  def orthogonalize(w, view):   # records each call's (matrices, rows, columns)
    lo = oj.linalg.layout(w.shape, view)
    called.append((math.prod(lo.batch_shape), lo.n, lo.p))
    return lo.from_tall(oj.linalg.newton_schulz(lo.to_tall(w), coeffs="cubic", steps=30))

  padded = oj.linalg.map_views(orthogonalize, params, views=views, bucket="pad")
  assert sorted(called) == sorted(calls)
  own = sum(math.prod(oj.linalg.layout(x.shape, views.get(k)).batch_shape)
            * oj.linalg.layout(x.shape, views.get(k)).n for k, x in params.items())
  assert sum(b * n for b, n, _ in called) <= oj.linalg.PADDED_FLOPS * own
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5),
               padded, {k: orthogonalize(v, views.get(k)) for k, v in params.items()})
