"""Optimizer-state memory: the Stiefel optimizers vs ``optax.adam``.

Measured: bytes of the optimizer state, the sum of ``size * itemsize`` over
the leaves of ``jax.eval_shape(tx.init, params)`` (a count, nothing is
allocated or timed), for

* ResNet-50 (``oj.models.ResNet(50, "bn")``, 25.6 M params): its 53 conv
  kernels routed by ``oj.optim.partition`` to the Stiefel optimizer (each in
  its matrix view ``(kh·kw·cin, cout)``), every other parameter to
  ``optax.adam``; baseline ``optax.adam`` on every parameter;
* the deep MLP's hidden stack ``(200, 400, 400)`` (``MatrixView.stacked()``)
  alone, optimizer vs ``optax.adam`` on the same array.

Optimizers: ``radam`` with each Stiefel retraction (QR, exact Cayley,
iterative Cayley, polar, Newton–Schulz; element-wise second moment) and with
the per-matrix second moment, ``cayley_adam``, ``landing``; Muon is reported.

Target (all backends — a count, not a timing): state
bytes <= 2x Adam's on the same params. Adam keeps two moments (2x the params);
radam keeps the same two (the first transported), plus a step count.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import orthojax as oj
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import row
from orthojax import models

SUITE = "memory"
TARGET = Target("<=", 2.0)
_STACK = oj.linalg.MatrixView.stacked()


def state_bytes(tx: optax.GradientTransformation, params) -> int:
  """Bytes of ``tx.init(params)``, from shapes only (``jax.eval_shape``)."""
  shapes = jax.eval_shape(tx.init, params)
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(shapes) if hasattr(x, "shape"))


def _manifold_optimizers(views, lr=1e-3):
  St = oj.manifolds.Stiefel
  return {
      "radam qr": oj.optim.radam(lr, St("qr"), views=views),
      "radam cayley-exact": oj.optim.radam(lr, St("cayley"), views=views),
      "radam cayley-iterative": oj.optim.radam(lr, St("cayley", cayley_iterations=2),
                                               views=views, reorthonormalize_every=100),
      "radam polar": oj.optim.radam(lr, St("polar"), views=views),
      "radam newton-schulz": oj.optim.radam(lr, St("newton_schulz"), views=views),
      "radam qr, matrix v": oj.optim.radam(lr, St("qr"), views=views, second_moment="matrix"),
      "cayley_adam": oj.optim.cayley_adam(lr, views=views),
      "landing": oj.optim.landing(lr, views=views),
      "muon": oj.optim.muon(lr, views=views),
  }


def _resnet50_params():
  model = models.ResNet(50, "bn", num_classes=1000, rngs=nnx.Rngs(0))
  params = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.split(model, nnx.Param, ...)[1]))
  return params


def _cases(quick: bool):
  # eval_shape only: building ResNet-50's params costs seconds, not memory;
  # quick and full count the same thing.
  del quick
  resnet = _resnet50_params()
  labels = lambda p: jax.tree.map(lambda x: "stiefel" if x.ndim == 4 else "euclidean", p)
  yield ("ResNet-50 (conv kernels on St)", resnet,
         lambda tx: oj.optim.partition(labels, stiefel=tx, euclidean=optax.adam(1e-3)), None)
  stack = {"hidden": jax.ShapeDtypeStruct((200, 400, 400), jnp.float32)}
  yield "deep MLP stack 200x400x400", stack, lambda tx: tx, {"hidden": _STACK}


def run(quick: bool = False) -> list[Row]:
  rows = []
  for name, params, wrap, views in _cases(quick):
    n_params = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    adam = state_bytes(optax.adam(1e-3), params)
    rows.append(row(SUITE, f"adam state, {name}", adam / 2**20, "MiB",
                    note=f"{adam} B; params {n_params} ({4 * n_params} B)"))
    for opt, tx in _manifold_optimizers(views).items():
      b = state_bytes(wrap(tx), params)
      target = None if opt == "muon" else TARGET
      rows.append(row(SUITE, f"{opt} / adam state, {name}", b / adam, "x", target,
                      note=f"{b} B = {b / 2**20:.1f} MiB"))
  return rows
