"""Precision: does the constraint hold when the manifold maths runs on tensor cores?

    python -m benchmarks --only precision [--quick] [--strict]

For each precision of :data:`orthojax.linalg.PRECISIONS` — float32 products, three
bfloat16 passes (what ``precision=None`` compiles to on a GPU or TPU) and one — the
largest ``‖WᵀW − I‖_F`` after ``N`` updates on random gradients (one scanned program), for
radam (iterative Cayley, 2 iterations, a Newton–Schulz step after each: the ResNet recipe),
rsgd (one CholeskyQR pass) and ``stiefel_muon``, on ResNet-18's conv kernels (``--quick``) or
ResNet-50's, and on an E5-shaped stack (the 3072 × 400 input kernel and ``depth``
400 × 400 hidden matrices: 4 with ``--quick``, 200 without). Off a GPU the reduced
products are emulated exactly (:func:`orthojax.linalg.at_precision`), so the rows are
the tensor cores' numbers on any machine.

Targets: ≤ 1e-5 (float32 rounding) for ``"highest"`` and for ``"bf16x3"``, the
accelerators' default; one bfloat16 pass is reported beside them (Muon's choice, which
holds no constraint).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

import orthojax as oj
from benchmarks._harness import Row
from benchmarks._harness import Target
from benchmarks._harness import row
from benchmarks.retraction_bench import resnet_conv_kernels

SUITE = "precision"
HELD = Target("<=", 1e-5)
TARGETS = {"highest": HELD, "bf16x3": HELD, "bf16": None}


def optimizers(precision: str, views: Any = None) -> dict[str, optax.GradientTransformation]:
  """The three manifold optimizers at ``precision`` (module docstring)."""
  cayley = oj.manifolds.Stiefel("cayley", cayley_iterations=2, precision=precision)
  return {
      "radam": oj.optim.radam(1e-3, cayley, reorthonormalize_every=1, views=views),
      "rsgd": oj.optim.rsgd(1e-2, oj.manifolds.Stiefel(precision=precision), momentum=0.9,
                            views=views),
      "stiefel_muon": oj.optim.stiefel_muon(0.02, precision=precision, views=views),
  }


def resnet_kernels(depth: int) -> dict[str, jax.Array]:
  """A ResNet's conv kernels, each a random point of the Stiefel manifold."""
  return resnet_conv_kernels(depth, jax.random.key(0))


def e5_stack(depth: int) -> tuple[dict[str, jax.Array], dict[str, Any]]:
  """E5's Stiefel matrices: the 3072 × 400 input kernel and a ``depth`` × 400 × 400 stack
  (with its view: one matrix per layer)."""
  k1, k2 = jax.random.split(jax.random.key(0))
  stiefel = oj.manifolds.Stiefel()
  views = {"input": oj.linalg.MatrixView.dense(), "stack": oj.linalg.MatrixView.stacked()}
  params = {"input": stiefel.random(k1, (3072, 400)),
            "stack": stiefel.random(k2, (depth, 400, 400), view=views["stack"])}
  return params, views


def defect_after(tx: optax.GradientTransformation, params: dict[str, jax.Array],
                 steps: int, views: Any = None) -> Callable[[], float]:
  """The largest ``‖WᵀW − I‖_F`` after ``steps`` updates of ``tx`` on gradients of
  standard deviation 0.01 (one scanned, compiled program)."""
  stiefel = oj.manifolds.Stiefel()

  def run(params):
    def body(carry, key):
      p, s = carry
      g = jax.tree.map(lambda x, k: 0.01 * jax.random.normal(k, x.shape),
                       p, dict(zip(p, jax.random.split(key, len(p)))))
      u, s = tx.update(g, s, p)
      return (optax.apply_updates(p, u), s), None

    keys = jax.random.split(jax.random.key(1), steps)
    (p, _), _ = jax.lax.scan(body, (params, tx.init(params)), keys)
    return jnp.max(jnp.stack([jnp.max(stiefel.defect(x, view=None if views is None
                                                     else views[name]))
                              for name, x in p.items()]))

  compiled = jax.jit(run).lower(params).compile()
  return lambda: float(compiled(params))


def run(quick: bool = False) -> list[Row]:
  steps = 10 if quick else 1000
  resnet_depth, e5_depth = (18, 4) if quick else (50, 200)
  kernels = resnet_kernels(resnet_depth)
  e5, e5_views = e5_stack(e5_depth)
  problems = {f"ResNet-{resnet_depth}'s {len(kernels)} conv kernels": (kernels, None),
              f"E5 stack 3072 × 400 + {e5_depth} × 400 × 400": (e5, e5_views)}
  rows: list[Row] = []
  for problem, (params, views) in problems.items():
    for precision, target in TARGETS.items():
      for name, tx in optimizers(precision, views).items():
        start = time.perf_counter()
        defect = defect_after(tx, params, steps, views)()
        how = "emulated" if jax.default_backend() == "cpu" and precision != "highest" else ""
        new = row(SUITE, f"{name} {precision}: defect after {steps} steps, {problem}", defect,
                  "", target, f"{how} {time.perf_counter() - start:.0f} s".strip())
        print(f"# {SUITE}: {new.case}: {new.value:.3g} [{new.status}] {new.note}", flush=True)
        rows.append(new)
  return rows

