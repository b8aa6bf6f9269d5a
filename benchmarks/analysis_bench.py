"""Benchmarks for :mod:`orthojax.analysis` on the E5 deep critical tanh network.

The network is :class:`orthojax.models.DeepMLP` at E5's size — 200 hidden
tanh layers of width 400 on CIFAR-10-shaped inputs (3072 features, 10
classes), critical Gaussian initialisation at ``q* = 1/64``; inputs are
scaled so that ``h¹`` has variance ``q*``.

Cases:

* Top-5 singular values of the hidden-stack Jacobian ``J_{h¹}^{h^{L+1}}``
  (400 × 400, one example) by Lanczos on ``JᵀJ`` through jvp/vjp
  (``method="lanczos"``, relative tolerance ``1e-5`` on ``s²``) against the
  dense route (``jax.jacfwd`` + ``jnp.linalg.svd``): both times, interleaved,
  and the relative error of the Lanczos values (target ≤ 1e-3, judged
  everywhere). For one 400-wide example on a CPU the dense route is the
  faster one: its 400 tangents run as matrix–matrix products, while each
  Lanczos step streams all 200 weight matrices for a single vector. Lanczos
  is for Jacobians too large to form (wide or convolutional layers), where
  its memory is ``O(steps × dim)`` instead of ``O(m × n)``.
* λ_max of the Gauss–Newton (= Fisher for softmax cross entropy) matrix at
  batch 1000: the time of one Lanczos step / power iteration divided by the
  time of one training step (forward + backward + Adam update) of the same
  network on the same batch, both timed interleaved. A solver step is one
  Gauss–Newton product (a jvp and a vjp through the batch, i.e. about one
  forward-and-backward pass; the forward is linearised once per solve and
  amortised here over the timed steps), plus Lanczos' Gram–Schmidt sweep
  over the stored basis. Target ≤ 3 (judged in the full run).
* Iterations to reach ``1e-3`` relative accuracy: Lanczos stops when the
  residual bound ``‖G u − θ u‖ ≤ 1e-3 θ`` (so ``θ`` is within 0.1% of an
  eigenvalue); power iteration when the relative change is below ``1e-3``.
  Gauss–Newton and the empirical Fisher (random labels), report-only.

``quick`` shrinks the network (20 layers of width 128, 256 inputs, batch
128) and the repeats; its ratios are then report-only.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import ratio
from benchmarks._harness import row
from benchmarks._harness import time_fns
from orthojax import analysis as oa
from orthojax.models import DeepMLP

SUITE = "analysis"
STEP_RATIO_TARGET = Target("<=", 3.0)
ACCURACY_TARGET = Target("<=", 1e-3)
Q_STAR, CLASSES = 1 / 64, 10
FULL = dict(in_features=3072, depth=200, width=400, batch=1000)
QUICK = dict(in_features=256, depth=20, width=128, batch=128)


def _model_and_data(in_features, depth, width, batch):
  model = DeepMLP(in_features, depth, width, CLASSES, q_star=Q_STAR, rngs=nnx.Rngs(0))
  scale = math.sqrt((Q_STAR - model.sigma_b**2) / model.sigma_w**2)
  rng = np.random.default_rng(0)
  x = jnp.asarray(scale * rng.standard_normal((batch, in_features)), jnp.float32)
  y = jnp.asarray(rng.integers(0, CLASSES, batch))
  return model, x, y


def _jacobian_rows(model: DeepMLP, x: jax.Array, size: str, reps: dict) -> list[Row]:
  graphdef, state = nnx.split(model)
  h1 = model.preactivations(x[:1])[0, 0]          # one example's h¹, (width,)
  width = h1.shape[0]

  def spectrum(method):
    def fn(state, h):
      f = oa.deep_mlp_hidden_map(nnx.merge(graphdef, state), 1)
      res = oa.jacobian_singular_values(f, h, method=method, k=5, per_example=False,
                                        tol=1e-5, max_iters=width)
      return res.largest, res.num_iters, res.converged
    return fn

  fns = {"lanczos": spectrum("lanczos"), "dense": spectrum("exact")}
  times = time_fns(fns, state, h1, **reps)
  lz, iters, ok = jax.jit(fns["lanczos"])(state, h1)
  exact = jax.jit(fns["dense"])(state, h1)[0]
  err = float(jnp.max(jnp.abs(lz - exact) / exact))
  top = ", ".join(f"{v:.3f}" for v in np.asarray(exact))
  return [
      row(SUITE, f"top-5 Jacobian σ, Lanczos (JᵀJ via jvp/vjp), {size}", 1e3 * times["lanczos"],
          "ms", note=f"{int(iters)} steps, converged={bool(ok)}"),
      row(SUITE, f"top-5 Jacobian σ, dense jacfwd + SVD, {size}", 1e3 * times["dense"], "ms",
          note=f"σ_1..5 = {top}"),
      row(SUITE, "Lanczos / dense time (top-5 σ)", ratio(times["lanczos"], times["dense"]), "x"),
      row(SUITE, "top-5 σ relative error, Lanczos vs SVD", err, "rel", ACCURACY_TARGET,
          note="max_i |σ_i(Lanczos) − σ_i(SVD)| / σ_i(SVD)"),
  ]


def _fisher_rows(model: DeepMLP, x: jax.Array, y: jax.Array, size: str, reps: dict,
                 timed_iters: int, max_iters: dict, quick: bool) -> list[Row]:
  apply_fn, params = oa.model_apply(model)
  tx = optax.adam(1e-3)
  opt_state = tx.init(params)

  def train_step(params, opt_state, x, y):
    def loss(p):
      return optax.softmax_cross_entropy_with_integer_labels(apply_fn(p, x), y).mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value

  def solver(method):
    def fn(params, opt_state, x, y):   # tol=0: exactly `timed_iters` products
      return oa.fisher_max_eigenvalue(apply_fn, params, x, method=method, tol=0.0,
                                      max_iters=timed_iters).eigenvalue
    return fn

  times = time_fns({"step": train_step, "lanczos": solver("lanczos"), "power": solver("power")},
                   params, opt_state, x, y, **reps)
  target = None if quick else STEP_RATIO_TARGET
  rows = []
  for method in ("lanczos", "power"):
    per_iter = times[method] / timed_iters
    rows.append(row(
        SUITE, f"Fisher λ_max {method} step / train step, {size}", ratio(per_iter, times["step"]),
        "x", target, note=f"{1e3 * per_iter:.0f} ms per step ({timed_iters} timed) / "
                          f"{1e3 * times['step']:.0f} ms fwd+bwd+adam"))

  results = {}
  for kind, method in (("gauss_newton", "lanczos"), ("gauss_newton", "power"),
                       ("empirical", "lanczos")):
    run = jax.jit(lambda p, x, y, kind=kind, method=method: oa.fisher_max_eigenvalue(
        apply_fn, p, x, y if kind == "empirical" else None, kind=kind, method=method, tol=1e-3,
        max_iters=max_iters[method]))
    res = run(params, x, y)
    results[kind, method] = res
    rows.append(row(SUITE, f"Fisher ({kind}) λ_max {method}: steps to 1e-3", int(res.num_iters),
                    "steps", note=f"λ_max = {float(res.eigenvalue):.4g}, "
                                  f"converged={bool(res.converged)}"))
  a, b = (float(results["gauss_newton", m].eigenvalue) for m in ("lanczos", "power"))
  rows.append(row(SUITE, "Fisher λ_max: |Lanczos − power| / Lanczos", abs(a - b) / a, "rel",
                  note="both at tol 1e-3"))
  return rows


def run(quick: bool = False) -> list[Row]:
  """Run the analysis suite; ``quick`` uses a 20 × 128 network (report-only ratios)."""
  sizes = QUICK if quick else FULL
  reps = dict(warmup=1, repeats=3) if quick else dict(warmup=1, repeats=3)
  model, x, y = _model_and_data(**sizes)
  size = f"{sizes['depth']}x{sizes['width']}"
  rows = _jacobian_rows(model, x, size, reps)
  rows += _fisher_rows(model, x, y, f"{size}, batch {sizes['batch']}", reps,
                       timed_iters=10 if quick else 5,
                       max_iters={"lanczos": 30 if quick else 20, "power": 100 if quick else 40},
                       quick=quick)
  return rows
