"""Where the ``optim`` suite's step time goes: per-layer pieces, report-only.

Splits the ``optim`` suite's training step (200 × 400² tanh MLP, batch 1000,
hidden stack on the Stiefel manifold) into forward + backward and the update
alone for each optimizer, next to the two primitives the updates are made of:
one n × n × n matrix product and one LAPACK QR of an n × n matrix. All are
timed interleaved on the same stack and reported in ms *per layer*, so the
overhead of an optimizer reads directly as "so many products plus a QR".

No targets: this suite explains the ``optim`` ratios (docs/performance.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from benchmarks import _harness
from benchmarks import optim_bench

SUITE = "optim_profile"
_OPTIMIZERS = ("adam", "radam qr", "radam qr, matrix v", "radam cayley-iterative", "landing")


def run(quick: bool) -> list[_harness.Row]:
  depth, width, batch = (20, 400, 1000) if quick else (200, 400, 1000)
  params = optim_bench._init(jax.random.PRNGKey(0), depth, width, 10)
  x = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
  y = jax.random.randint(jax.random.PRNGKey(2), (batch,), 0, 10)
  grads = jax.jit(jax.grad(optim_bench._loss))(params, x, y)
  optimizers = optim_bench._optimizers()

  fns = {
      "forward + backward": lambda p: jax.grad(optim_bench._loss)(p, x, y),
      "one n^3 product (W @ W)": lambda p: p["hidden"] @ p["hidden"],
      "LAPACK QR of W": lambda p: jnp.linalg.qr(p["hidden"])[0],
  }
  for name in _OPTIMIZERS:
    tx = optimizers[name]
    fns[f"update alone, {name}"] = _update(tx, tx.init(params), grads)
  times = _harness.time_fns(fns, params, warmup=2, repeats=3 if quick else 5)
  note = f"{depth}x{width}^2 stack, batch {batch}"
  return [_harness.row(SUITE, f"{name}, per layer", 1e3 * t / depth, "ms", note=note)
          for name, t in times.items()]


def _update(tx, state, grads):
  """``params -> new params`` for one update from fixed gradients and state."""
  return lambda params: optax.apply_updates(params, tx.update(grads, state, params)[0])
