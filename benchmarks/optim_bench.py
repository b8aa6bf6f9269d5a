"""Full training step of a deep tanh MLP: Stiefel optimizers vs. Adam.

The network of the information-geometry seed (E5): ``depth`` hidden tanh
layers of width ``width`` stacked in one ``(depth, width, width)`` parameter
(``MatrixView.stacked()``, a ``lax.scan`` over layers), batch 1000, softmax
cross-entropy on 10 classes. A step is forward + backward + update, jitted as
one program. Every Stiefel variant routes the hidden stack to the manifold
optimizer and the biases / classifier to Adam (``oj.optim.partition``); the
baseline is ``optax.adam`` on everything. Ratios are step times measured
side by side (interleaved) in one run.

Targets, CPU: each optimizer's step-time ratio to Adam is at most 1.1 × its
FLOP ratio — the step costs what its arithmetic costs, no more. The bound is on
time per FLOP, not on time alone: at this shape the manifold optimizers' own
arithmetic is a multiple of Adam's (docs/performance.md has the profile). FLOPs
are XLA's count of the compiled step on a 4-layer unrolled copy (its cost
analysis counts a scan body once), each guarded conditional at its
cheapest branch (a guard's fall-back left out), plus the LAPACK calls
XLA does not count (:func:`orthojax.compile.hlo.lapack_flops`: QR, Cholesky, triangular
solves). radam runs with its default element-wise second moment
and, in the ", matrix v" rows, with the per-matrix one
(``second_moment="matrix"``), which needs no re-projection of the direction.
Exact Cayley is reported to show what the iterative form buys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

import orthojax as oj
from benchmarks import _harness
from orthojax.compile import hlo

_VIEW = oj.linalg.MatrixView.stacked()


def _init(key, depth, width, classes):
  k_h, k_o = jax.random.split(key)
  return {
      "hidden": oj.manifolds.Stiefel().random(k_h, (depth, width, width), view=_VIEW),
      "bias": jnp.zeros((depth, width)),
      "head": jax.random.normal(k_o, (width, classes)) / jnp.sqrt(width),
  }


def _loss(params, x, y, unroll=1):
  def layer(h, wb):
    w, b = wb
    return jnp.tanh(h @ w + b), None
  h, _ = jax.lax.scan(layer, x, (params["hidden"], params["bias"]), unroll=unroll)
  return optax.softmax_cross_entropy_with_integer_labels(h @ params["head"], y).mean()


def _optimizers(lr=1e-3):
  views = {"hidden": _VIEW}
  labels = lambda p: {k: "stiefel" if k == "hidden" else "euclidean" for k in p}
  on_stiefel = lambda tx: oj.optim.partition(labels, stiefel=tx, euclidean=optax.adam(lr))
  St = oj.manifolds.Stiefel
  return {
      "adam": optax.adam(lr),
      "radam qr": on_stiefel(oj.optim.radam(lr, St("qr"), views=views)),
      "radam cayley-iterative": on_stiefel(
          oj.optim.radam(lr, St("cayley", cayley_iterations=2), views=views,
                         reorthonormalize_every=100)),
      "radam qr, matrix v": on_stiefel(
          oj.optim.radam(lr, St("qr"), views=views, second_moment="matrix")),
      "radam cayley-iterative, matrix v": on_stiefel(
          oj.optim.radam(lr, St("cayley", cayley_iterations=2), views=views,
                         reorthonormalize_every=100, second_moment="matrix")),
      "radam cayley-exact": on_stiefel(oj.optim.radam(lr, St("cayley"), views=views)),
      "radam newton-schulz": on_stiefel(oj.optim.radam(lr, St("newton_schulz"), views=views)),
      "cayley_adam": on_stiefel(oj.optim.cayley_adam(lr, views=views)),
      "landing": on_stiefel(oj.optim.landing(lr, views=views)),
  }


# Time ratio / FLOP ratio, on the CPU: every manifold optimizer.
ARITHMETIC = _harness.Target("<=", 1.1, ("cpu",))
_GPU_TARGETS = {  # on a GPU, a Riemannian step at most 1.3x the Euclidean one
    "radam cayley-iterative": _harness.Target("<=", 1.3, ("gpu",)),
}


def run(quick: bool) -> list[_harness.Row]:
  depth, width, batch = (20, 400, 1000) if quick else (200, 400, 1000)
  key = jax.random.PRNGKey(0)
  params = _init(key, depth, width, 10)
  x = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
  y = jax.random.randint(jax.random.PRNGKey(2), (batch,), 0, 10)
  optimizers = _optimizers()
  bound = {name: _bind_step(tx, params, x, y) for name, tx in optimizers.items()}
  times = _harness.time_fns(bound, params, warmup=2, repeats=3 if quick else 5)
  # XLA's cost analysis counts a scan body once: count FLOPs on a 4-layer
  # unrolled copy instead (every cost here is per layer, so the ratio holds).
  small = _init(key, 4, width, 10)
  flops = {name: _flops(_bind_step(tx, small, x, y, unroll=True), small)
           for name, tx in optimizers.items()}
  shape = f"{depth}x{width}^2 tanh, batch {batch}"
  rows = [_harness.row("optim", "adam step", 1e3 * times["adam"], "ms", note=shape)]
  for name, t in times.items():
    if name == "adam":
      continue
    time_ratio, flop_ratio = _harness.ratio(t, times["adam"]), flops[name] / flops["adam"]
    rows.append(_harness.row("optim", f"{name} / adam step", time_ratio, "x",
                             _GPU_TARGETS.get(name),
                             note=f"{1e3 * t:.0f} ms; FLOP ratio {flop_ratio:.2f}"))
    rows.append(_harness.row("optim", f"{name}: time ratio / FLOP ratio", time_ratio / flop_ratio,
                             "x", ARITHMETIC))
  return rows


def _bind_step(tx, params, x, y, unroll=1):
  """``params -> (params, state)`` for one step from ``tx.init(params)``."""
  state = tx.init(params)

  def step(params):
    grads = jax.grad(_loss)(params, x, y, unroll)
    updates, new_state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), new_state

  return step


def _flops(fn, *args) -> float:
  """FLOPs of the compiled step (load-independent, unlike its time): XLA's count with
  guarded conditionals at their cheapest branch, plus the LAPACK calls it leaves out."""
  compiled = jax.jit(fn).lower(*args).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  module = hlo.Module.from_text(compiled.as_text())
  unguarded = module.with_branches("cheapest")
  xla = float(cost.get("flops", float("nan")))
  return hlo.loop_corrected_flops(xla, module, unguarded) + hlo.lapack_flops(unguarded)
