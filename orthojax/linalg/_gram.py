"""The Gram matrix ``X Xᵀ`` from three of its four blocks.

XLA has no symmetric rank-k product (BLAS ``syrk``): ``x @ xᵀ`` multiplies out both
triangles. Split the rows, ``X = [X₁; X₂]``: then

    X Xᵀ = [[X₁X₁ᵀ, X₁X₂ᵀ], [(X₁X₂ᵀ)ᵀ, X₂X₂ᵀ]],

three products of a quarter of the arithmetic each instead of four — 3/4 of it, the
lower off-diagonal block being the transpose of the upper (the blocked form of a
symmetric rank-k update: Golub & Van Loan, *Matrix Computations*, 4th ed., §1.3;
flash-muon and modded-nanogpt's symmetric ``X Xᵀ`` kernels compute only one triangle for
the same reason). It pays where the products are large enough to run at the machine's
rate: on a 2-core AMD EPYC (XLA:CPU, float32, 2026-11-29) 0.79–0.87× of ``x @ xᵀ``'s time
for 512 to 1,024 rows, nothing below (0.97–1.05× at 256–384 rows); so it is used from
:data:`SYMMETRIC_FROM` rows on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

SYMMETRIC_FROM = 512
"""The fewest rows of ``x`` for which :func:`gram` forms three blocks (module docstring)."""


def gram(x: jax.Array) -> jax.Array:
  """``x xᵀ`` over the last two axes (batched over leading ones), from three block
  products when ``x`` has at least :data:`SYMMETRIC_FROM` rows (module docstring); the
  products take the enclosing precision (:func:`orthojax.linalg.at_precision`)."""
  m = x.shape[-2]
  t = lambda y: jnp.swapaxes(y, -1, -2)
  if m < SYMMETRIC_FROM:
    return x @ t(x)
  top, bottom = x[..., : m // 2, :], x[..., m // 2:, :]
  upper = top @ t(top)
  off = top @ t(bottom)
  lower = bottom @ t(bottom)
  return jnp.concatenate([jnp.concatenate([upper, off], -1),
                          jnp.concatenate([t(off), lower], -1)], -2)
