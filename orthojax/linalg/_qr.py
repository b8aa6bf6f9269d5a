"""Orthonormalisation by the sign-fixed reduced QR decomposition.

For a tall ``X ∈ R^{n×p}`` of full column rank, ``X = Q R`` with ``QᵀQ = I``
and ``R`` upper triangular is unique once ``diag(R) > 0`` is required;
LAPACK-style Householder QR does not impose that, so ``Q`` is multiplied by
``sign(diag R)`` column-wise (Mezzadri, "How to generate random matrices from
the classical compact groups", Notices AMS 54, 2007). The fix makes ``qf`` a
smooth map — the *QR retraction* ``R_W(ξ) = qf(W + ξ)`` of Absil, Mahony &
Sepulchre (*Optimization Algorithms on Matrix Manifolds*, 2008, ex. 4.1.2) —
and, applied to a Gaussian matrix, gives a Haar-distributed ``Q``.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from orthojax.linalg._guard import guarded_cond
from orthojax.linalg._gram import gram
from orthojax.linalg._lapack import per_matrix_on_cpu
from orthojax.linalg._matrix_view import check_float
from orthojax.linalg._matrix_view import compute_dtype
from orthojax.linalg._platform import platform_dependent
from orthojax.linalg._precision import Precision, at_precision, roundoff
from orthojax.linalg._rows import rows_partitioned


def qr_orthonormalize(x: jax.Array) -> jax.Array:
  r"""The ``Q`` factor of ``x``'s reduced QR with the sign fix ``diag(R) ≥ 0``.

  Matrices lie on the last two axes, leading axes are batch axes (numpy
  convention).

  * Tall or square ``x`` (``m ≥ n``): ``Q`` is ``m × n`` with orthonormal
    columns and ``x = Q R``, ``R`` upper triangular with non-negative
    diagonal, i.e. ``Q = Q₀ · diag(sign(diag R₀))`` for the raw QR
    ``x = Q₀ R₀``, with ``sign(0)`` taken as ``+1``.
  * Wide ``x`` (``m < n``): orthonormal *rows*, ``qr_orthonormalize(xᵀ)ᵀ``,
    i.e. ``x = L Q`` with ``L`` lower triangular, non-negative diagonal.

  The columns (rows) are the Gram–Schmidt orthonormalisation of ``x``'s
  columns (rows), in order. Computation runs in at least float32 and the
  result is cast back to ``x``'s dtype.

  Args:
    x: ``(..., m, n)`` floating array.

  Returns:
    Array of ``x``'s shape and dtype.

  Raises:
    TypeError: ``x`` is not floating point.
    ValueError: ``x.ndim < 2``.
  """
  return _on_tall(x, "qr_orthonormalize", _householder_tall)


def _on_tall(x, name: str, factor: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """``factor`` (tall, compute dtype → Q) applied to ``x``'s tall view, in ``x``'s layout
  and dtype; a non-float or non-matrix ``x`` is an error naming ``name``."""
  check_float(x, f"{name} input")
  x = jnp.asarray(x)
  if x.ndim < 2:
    raise ValueError(f"{name} needs a matrix (..., m, n) with ndim >= 2, got shape {x.shape}")
  xc = x.astype(compute_dtype(x.dtype))
  wide = xc.shape[-2] < xc.shape[-1]
  q = factor(jnp.swapaxes(xc, -1, -2) if wide else xc)
  return (jnp.swapaxes(q, -1, -2) if wide else q).astype(x.dtype)


def _householder_tall(x: jax.Array) -> jax.Array:
  """The sign-fixed Q of a tall ``x`` by LAPACK's (Householder) QR.

  ``diag(R)`` is read as ``diag(QᵀX)`` (``R = QᵀX``), the column-wise dot products of
  ``Q`` and ``X``: asking LAPACK for ``R`` too makes XLA:CPU copy the packed
  factorisation and start forming ``Q`` from a worker of its thread pool
  (:mod:`orthojax.linalg._lapack` has why that matters).
  """
  q = _q_factor(x)
  diag = jnp.einsum("...ij,...ij->...j", q, x, precision=jax.lax.Precision.HIGHEST)
  return q * jnp.where(diag < 0, -1.0, 1.0).astype(q.dtype)[..., None, :]


_q_factor = per_matrix_on_cpu(lambda x: jnp.linalg.qr(x, mode="reduced")[0])


def _gram(x: jax.Array) -> jax.Array:
  """``xᵀx`` (at the precision :func:`cholesky_qr2` runs at)."""
  return gram(jnp.swapaxes(x, -1, -2))   # three blocks from 512 columns


def _cholesky_pass(x: jax.Array, gram: jax.Array) -> jax.Array:
  """``x R⁻¹`` for ``gram = xᵀx = RᵀR``: the Cholesky factor and the triangular solve in
  one per-matrix call on CPU (one loop, not two, for the compiler to build)."""
  return _factor_and_solve(gram, x)


def _solve_by_inverse(gram: jax.Array, x: jax.Array) -> jax.Array:
  """``x R⁻¹`` as ``x`` times the ``p × p`` inverse: ``R = Lᵀ`` (``L = chol(gram)``), so
  ``R⁻¹ = (L⁻¹)ᵀ``, ``L⁻¹`` from a triangular solve of the identity."""
  lower = jnp.linalg.cholesky(gram)
  eye = jnp.broadcast_to(jnp.eye(gram.shape[-1], dtype=gram.dtype), gram.shape)
  inverse = jax.lax.linalg.triangular_solve(lower, eye, left_side=True, lower=True)
  return jnp.matmul(x, jnp.swapaxes(inverse, -1, -2))


# A matrix split by rows over devices must stay split through the solve, as it does
# through the Gram product before it; the compiler gathers it for a triangular solve.
# On a CPU: LAPACK's solve, its row locality stated (linalg._rows). On an accelerator:
# a product with the p x p inverse, which the compiler partitions by rows itself (the
# TPU compiler expands its triangular solves into such products anyway, and libtpu's
# compile-only plugin has no partitioner for custom_partitioning's calls). Measured on an
# owner's own (unsplit) matrices too, E5 compiled for v5e:2x4 (docs/scale.md): the product
# moves 0.38 GiB less per step than the compiler's blocked solve (6.63 against 7.01) for
# 5.6 % more counted FLOPs, on a step that is memory-bound thirty times over, so it is
# used for every matrix, split or not.
_solve_on_cpu = rows_partitioned(per_matrix_on_cpu(
    lambda gram, x: jax.lax.linalg.triangular_solve(
        jnp.linalg.cholesky(gram), x, left_side=False, lower=True, transpose_a=True)))


def _factor_and_solve(gram: jax.Array, x: jax.Array) -> jax.Array:
  return platform_dependent(gram, x, cpu=_solve_on_cpu, default=_solve_by_inverse)


_PROBES = 8   # probe vectors of cholesky_qr2's one-pass test


def _orthogonality_estimate(q: jax.Array) -> jax.Array:
  """``‖QᵀQ − I‖_F`` per matrix of a tall ``q``, estimated from fixed ±1 probes ``Z``
  (``p × k``) as ``‖(QᵀQ − I) Z‖_F / √k``; exact (``Z = I``) when ``p ≤ k``."""
  p = q.shape[-1]
  if p <= _PROBES:
    z, k = np.eye(p), 1
  else:   # fixed, so the same input always takes the same branch
    z, k = np.random.default_rng(0).choice([-1.0, 1.0], size=(p, _PROBES)), _PROBES
  z = jnp.asarray(z, q.dtype)
  qz = jnp.einsum("...np,pk->...nk", q, z)
  e = jnp.einsum("...np,...nk->...pk", q, qz) - z
  return jnp.sqrt(jnp.sum(jnp.square(e), axis=(-2, -1)) / k)


def cholesky_qr(x: jax.Array, *, precision: Precision = "highest") -> jax.Array:
  r"""``Q = X R⁻¹`` for ``XᵀX = RᵀR``: one CholeskyQR pass, no conditional.

  For a tall ``X`` (``n ≥ p``): one Gram product, one Cholesky factor and one
  triangular solve (:func:`cholesky_qr2`'s first pass). Its orthogonality error
  ``‖QᵀQ − I‖₂`` is of order ``κ₂(X)² u`` (``u`` the unit roundoff; Yamamoto,
  Nakatsukasa, Yanagisawa & Fukaya, "Roundoff error analysis of the CholeskyQR2
  algorithm", ETNA 44, 2015, §3), and the Cholesky factor exists while ``κ₂(X)² u``
  is well below 1.

  Where it is the whole answer: the QR retraction ``qf(W + ξ)`` at a point ``W``
  (``WᵀW = I``) and a tangent ``ξ`` (``Wᵀξ`` skew) factors
  ``(W + ξ)ᵀ(W + ξ) = I + ξᵀξ``, so ``κ(W + ξ)² ≤ 1 + ‖ξ‖₂²``: every singular value
  is at least 1, the factor always exists, and a step of spectral norm up to 1 keeps
  the error within twice that of an exactly orthonormal input — the same ``Q`` as
  Householder's to rounding (``oj.manifolds.Stiefel(qr_algorithm="cholesky_qr")``, the
  retraction's default). A longer step leaves up to ``κ²`` times rounding, which the next
  retraction removes; :func:`cholesky_qr2` guards arbitrary inputs instead, with
  ``lax.cond``\ s that a GPU waits on and every compile builds.

  Args:
    x: ``(..., m, n)`` floating array (wide: rows, as :func:`qr_orthonormalize`).
    precision: of the products (:func:`orthojax.linalg.at_precision`; default float32).

  Returns:
    Array of ``x``'s shape and dtype.
  """
  return _on_tall(x, "cholesky_qr", at_precision(lambda x: _cholesky_pass(x, _gram(x)),
                                                 precision))


def cholesky_qr2(x: jax.Array, *, tolerance: float = 0.5,
                 precision: Precision = "highest") -> jax.Array:
  r"""The same ``Q`` as :func:`qr_orthonormalize`, from matrix products: CholeskyQR2.

  For a tall ``X`` (``n ≥ p``): ``R₁ = chol(XᵀX)ᵀ``, ``Q₁ = X R₁⁻¹``, then once more on
  ``Q₁``: ``Q = Q₁ R₂⁻¹`` (Fukaya, Nakatsukasa, Yanagisawa & Yamamoto, "CholeskyQR2: a
  simple and communication-avoiding algorithm for computing a tall-skinny QR
  factorization", ScalA 2014; Yamamoto et al., ETNA 44, 2015, Thm. 3.3). ``R = R₂R₁``
  has a positive diagonal by construction, so ``Q`` is the sign-fixed Q factor of
  Householder QR, to rounding. The work is two ``n × p × p`` Gram products, two
  ``p × p`` Cholesky factorisations and two triangular solves — matrix-product work,
  where LAPACK's Householder QR runs far below a CPU's or accelerator's matmul peak.

  The guard: it is accurate to ``O(u)`` while ``κ(X)² u`` is well below 1 (``u`` the
  unit roundoff), which holds for a retraction ``W + ξ`` at a point ``W`` of the
  manifold (its singular values are ``√(1 + sᵢ²)``, ``sᵢ`` those of the tangent ``ξ``).
  The first pass's orthogonality error ``‖Q₁ᵀQ₁ − I‖_F ≈ κ(X)² u`` is read from the
  second pass's own Gram matrix; above ``tolerance`` (or a failed Cholesky) the whole
  batch falls back to :func:`qr_orthonormalize`.

  The one-pass skip: at a retraction point the first pass is already orthonormal to
  rounding (its error is 0.6–1.2× Householder's own, typically ``0.2–0.5 p ε``, ``ε``
  the compute dtype's machine epsilon), and the second pass would move ``Q`` by about
  half that error. So the error is first *estimated*, without the Gram matrix, from
  ``k = 8`` fixed ±1 probe vectors ``Z`` (``p × k``):
  ``‖(Q₁ᵀQ₁ − I) Z‖_F / √k``, whose square is an unbiased estimate of the squared
  Frobenius norm (Gudmundsson, Kenney & Laub, "Small-sample statistical estimates for
  matrix norms", SIAM J. Matrix Anal. Appl. 16(3), 1995), at ``4 n p k`` flops
  against the Gram matrix's ``2 n p²``; for ``p ≤ k`` the probes are the identity and
  the value is exact. At or below ``p ε`` (and ``tolerance``) for the whole batch,
  ``Q₁`` is the result: one Gram product, one Cholesky factorisation and one
  triangular solve, the usual case for a retraction (32 × 400 × 400 on a 2-core CPU:
  96 ms against 130 ms for both passes and 102 ms for LAPACK's Householder; 32 × 1024
  × 256: 115, 177 and 209 ms, measured with the Gram-matrix check the probes replace).
  Measured on retraction points the estimate is 0.7–2× the true error (its own
  rounding adds to it); a miss costs the second pass, never accuracy beyond a few
  ``p ε``. Ill-conditioning from column scales alone trips neither test, rightly:
  Cholesky's rounding is scale invariant. Wide ``x``: rows, as there. Both decisions
  are ``lax.cond``\ s on the whole batch (:func:`orthojax.linalg.guarded_cond`: compile
  reports count the one-pass step): under ``jax.vmap`` they become selects that
  run every branch (both passes and Householder), so batch over leading axes instead.
  Computation in at least float32, products at ``precision``, the result in ``x``'s
  dtype. With reduced-precision products the skip's threshold is their rounding
  (:func:`orthojax.linalg.roundoff`) and the second pass adds nothing a float32
  correction does not (``Stiefel(precision=...)`` applies one), so one pass is the
  usual case there too.

  Args:
    x: ``(..., m, n)`` floating array.
    tolerance: the largest first-pass error ``‖Q₁ᵀQ₁ − I‖_F`` kept.
    precision: of the products (:func:`orthojax.linalg.at_precision`; default float32).

  Returns:
    Array of ``x``'s shape and dtype.
  """
  def tall(x):
    q1 = _cholesky_pass(x, _gram(x))
    p = q1.shape[-1]

    def second_pass():
      gram = _gram(q1)
      error = jnp.linalg.norm(gram - jnp.eye(p, dtype=gram.dtype), axis=(-2, -1))
      q = _cholesky_pass(q1, gram)
      accurate = jnp.all(jnp.isfinite(error) & (error <= tolerance)) & jnp.all(jnp.isfinite(q))
      return guarded_cond(accurate, lambda: q, lambda: _householder_tall(x))

    skip_at = jnp.minimum(p * roundoff(precision, q1.dtype), tolerance)
    rounded = jnp.all(_orthogonality_estimate(q1) <= skip_at)   # NaN: not rounded
    return guarded_cond(rounded, lambda: q1, second_pass)

  return _on_tall(x, "cholesky_qr2", at_precision(tall, precision))
