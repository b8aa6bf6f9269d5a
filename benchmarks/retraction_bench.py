"""Cost of one Stiefel step: the retractions side by side, and landing.

Measured: wall time of one jitted step from a point ``W`` on the Stiefel
manifold along a given tangent step ``V = P_W(-G)`` (``G`` a Gaussian
direction of Frobenius size 0.05 per matrix):

* ``Stiefel(r).retract(W, V)`` for ``r`` in QR (one CholeskyQR pass, the default, and
  Householder: ``qr_algorithm="householder"``), exact Cayley (Woodbury /
  dense solve), iterative Cayley (Li et al., 2 fixed-point iterations,
  matmuls only), polar (SVD) and Newton–Schulz (cubic, to tolerance);
* one landing update ``W - eta Lambda(W)`` of the gradient ``G``
  (``oj.optim.landing(1.0)``, safe step; no retraction, matmuls only).

Shapes: 400x400, 1024x1024, 4096x1024, and a ResNet-50's full set of conv
kernels at once (the 53 kernels of ``oj.models.ResNet(50, "bn")``, each in
its matrix view ``(kh·kw·cin, cout)``, tall side first), in float32 and
bfloat16 (parameters and steps in bfloat16; the manifold maths runs in
float32, as everywhere in orthojax). All methods of one shape and dtype are
timed interleaved (:func:`benchmarks._harness.time_fns`); the note gives the
ratio to QR. ``quick`` (CPU smoke run) drops 4096x1024 and 1024x1024 and uses
ResNet-18's kernels.

Targets: none — this is the cost table (report only, every backend).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import orthojax as oj
from benchmarks._harness import Row
from benchmarks._harness import ratio
from benchmarks._harness import row
from benchmarks._harness import time_fns
from orthojax import models

SUITE = "retraction"
_St = oj.manifolds.Stiefel
METHODS = {
    "qr": _St("qr"),
    "qr (householder)": _St("qr", qr_algorithm="householder"),
    "cayley-exact": _St("cayley"),
    "cayley-iterative": _St("cayley", cayley_iterations=2),
    "polar (svd)": _St("polar"),
    "newton-schulz": _St("newton_schulz"),
}


def resnet_conv_kernels(depth: int, key) -> dict[str, jax.Array]:
  """Random Stiefel points with the shapes of a ResNet's conv kernels, by path."""
  model = models.ResNet(depth, "bn", num_classes=1000, rngs=nnx.Rngs(0))
  shapes = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[1]))
  flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
  kernels = [(jax.tree_util.keystr(p), s.shape) for p, s in flat if len(s.shape) == 4]
  keys = jax.random.split(key, len(kernels))
  return {name: _St().random(k, shape) for (name, shape), k in zip(kernels, keys)}


def _inputs(w_tree, key, dtype):
  """``(W, V, G)`` trees: ``V = P_W(-G)``, ``||G||_F = 0.05`` per leaf."""
  leaves, treedef = jax.tree.flatten(w_tree)
  keys = jax.random.split(key, len(leaves))
  gs = []
  for w, k in zip(leaves, keys):
    g = jax.random.normal(k, w.shape)
    gs.append(0.05 * g / jnp.linalg.norm(g))
  g_tree = treedef.unflatten(gs)
  v_tree = jax.tree.map(lambda w, g: _St().project(w, -g), w_tree, g_tree)
  cast = lambda t: jax.tree.map(lambda x: x.astype(dtype), t)
  return cast(w_tree), cast(v_tree), cast(g_tree)


def _fns():
  fns = {}
  for name, st in METHODS.items():
    fns[name] = (lambda st: lambda w, v, g: jax.tree.map(st.retract, w, v))(st)
  landing = oj.optim.landing(1.0)

  def landing_step(w, v, g):
    updates, _ = landing.update(g, landing.init(w), w)
    return optax.apply_updates(w, updates)

  fns["landing"] = landing_step
  return fns


def _cases(quick: bool):
  key = jax.random.key(0)
  square = lambda n, m: {"w": _St().random(key, (n, m))}
  if quick:
    yield "400x400", square(400, 400)
    yield "ResNet-18 conv kernels (20)", resnet_conv_kernels(18, key)
  else:
    yield "400x400", square(400, 400)
    yield "1024x1024", square(1024, 1024)
    yield "4096x1024", square(4096, 1024)
    yield "ResNet-50 conv kernels (53)", resnet_conv_kernels(50, key)


def run(quick: bool = False) -> list[Row]:
  reps = dict(warmup=1, repeats=3) if quick else dict(warmup=2, repeats=5)
  rows = []
  fns = _fns()
  for shape, w in _cases(quick):
    for dtype in (jnp.float32, jnp.bfloat16):
      args = _inputs(w, jax.random.key(1), dtype)
      t = time_fns(fns, *args, **reps)
      dname = jnp.dtype(dtype).name
      for name, s in t.items():
        what = "landing update" if name == "landing" else f"{name} retraction"
        rows.append(row(SUITE, f"{what}, {shape}, {dname}", 1e3 * s, "ms",
                        note=f"{ratio(s, t['qr']):.2f}x QR"))
  return rows
