"""Compile and step time of the E5 deep critical tanh network's train step.

The network is :class:`orthojax.models.DeepMLP` at E5's size — 200 hidden
tanh layers of width 400 on CIFAR-10-shaped inputs (3072 features, 10
classes), critical orthogonal initialisation at ``q* = 1/64``. The measured
program is the whole jitted train step: forward, backward (softmax
cross-entropy) and the optimizer update, for

* ``euclidean + adam``: every parameter Euclidean, ``optax.adam``;
* ``stiefel + radam``: hidden and input kernels on the Stiefel manifold
  (``W = s·V``), trained by :func:`orthojax.optim.radam` through
  :func:`orthojax.optim.partition`, scales / biases / readout by Adam
  (``oblique + radam`` in the full run too).

Cases per variant:

* compile time: wall clock of ``jax.jit(step).lower(...).compile()``
  (tracing + lowering + XLA compilation). The hidden stack runs under
  ``jax.lax.scan``, so the layer body is compiled once; target ≤ 30 s on CPU
  (judged in ``quick`` mode too: the program is the same, only the batch
  differs);
* step time: median wall time of the compiled step (report-only);
* model construction (200 Haar-orthogonal 400 × 400 draws), report-only.

``quick`` uses batch 100 and two timed steps (under a minute on a small
CPU); the full run E5's batch 1000.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import row
from orthojax import manifolds
from orthojax import nn as onn
from orthojax import optim
from orthojax.models import DeepMLP

SUITE = "deep_mlp"
COMPILE_TARGET = Target("<=", 30.0, backends=("cpu",))
IN_FEATURES, DEPTH, WIDTH, CLASSES = 3072, 200, 400, 10


def _tx(model: DeepMLP, weights: str) -> optax.GradientTransformation:
  if weights == "euclidean":
    return optax.adam(1e-3)
  manifold = manifolds.Stiefel() if weights == "stiefel" else manifolds.Oblique()
  return optim.partition(
      model, **{weights: optim.radam(1e-3, manifold=manifold, views=onn.matrix_views(model))},
      euclidean=optax.adam(1e-3))


def _loss(model, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def _train_step(model: DeepMLP, weights: str):
  """A pure jitted ``(state, x, y) -> (state, loss)`` and the initial state."""
  optimizer = nnx.Optimizer(model, _tx(model, weights), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))

  def step(state, x, y):
    model, optimizer = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(_loss)(model, x, y)
    optimizer.update(model, grads)
    return nnx.state((model, optimizer)), loss

  return jax.jit(step), state


def _variant(weights: str, batch: int, repeats: int) -> list[Row]:
  what = f"{DEPTH}x{WIDTH} tanh, {weights}"
  start = time.perf_counter()
  model = DeepMLP(IN_FEATURES, DEPTH, WIDTH, CLASSES, q_star=1 / 64, init="orthogonal",
                  weights=weights, rngs=nnx.Rngs(0))
  jax.block_until_ready(nnx.state(model))
  t_init = time.perf_counter() - start

  rng = np.random.default_rng(0)
  x = jnp.asarray(0.1 * rng.standard_normal((batch, IN_FEATURES)), jnp.float32)
  y = jnp.asarray(rng.integers(0, CLASSES, batch), jnp.int32)
  step, state = _train_step(model, weights)
  start = time.perf_counter()
  compiled = step.lower(state, x, y).compile()
  t_compile = time.perf_counter() - start

  state, loss = compiled(state, x, y)   # first run (allocations), untimed
  jax.block_until_ready(loss)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, loss = compiled(state, x, y)
    jax.block_until_ready((state, loss))
    times.append(time.perf_counter() - start)
  if not np.isfinite(float(loss)):
    raise FloatingPointError(f"deep_mlp bench: non-finite loss for {weights}")
  opt = "adam" if weights == "euclidean" else "radam"
  return [
      row(SUITE, f"compile train step, {what} + {opt}, batch {batch}", t_compile, "s",
          COMPILE_TARGET, "lower + compile of fwd+bwd+update (scanned stack)"),
      row(SUITE, f"train step, {what} + {opt}, batch {batch}", 1e3 * statistics.median(times),
          "ms", note=f"median of {repeats}"),
      row(SUITE, f"construct model, {what}, orthogonal init", t_init, "s",
          note=f"{DEPTH} Haar {WIDTH}x{WIDTH} draws + input layer"),
  ]


def run(quick: bool = False) -> list[Row]:
  """Run the deep-MLP suite; ``quick``: batch 100, 2 timed steps, no oblique variant."""
  batch, repeats = (100, 2) if quick else (1000, 5)
  variants = ("euclidean", "stiefel") if quick else ("euclidean", "stiefel", "oblique")
  rows: list[Row] = []
  for weights in variants:
    rows += _variant(weights, batch, repeats)
  return rows
