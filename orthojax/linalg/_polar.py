"""The exact orthogonal polar factor, by SVD (or by an eigendecomposition).

Every ``X ∈ R^{m×n}`` factors as ``X = Q H`` with ``Q`` having orthonormal
columns (``m ≥ n``) or rows (``m < n``) and ``H`` symmetric positive
semidefinite; from the reduced SVD ``X = U Σ Vᵀ``, ``Q = U Vᵀ`` and
``H = V Σ Vᵀ`` (Higham, *Functions of Matrices*, SIAM 2008, ch. 8). ``Q`` is
the nearest semi-orthogonal matrix to ``X`` in every unitarily invariant norm
(Fan & Hoffman, Proc. AMS 5, 1955) — the *polar retraction* of manifold
optimisation, ``R_W(ξ) = polar(W + ξ)`` (Absil, Mahony & Sepulchre,
*Optimization Algorithms on Matrix Manifolds*, 2008, §4.1.1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthojax.linalg._lapack import per_matrix_on_cpu
from orthojax.linalg._matrix_view import check_float
from orthojax.linalg._matrix_view import compute_dtype
from orthojax.linalg._precision import Precision, at_precision, check_precision

_METHODS = ("svd", "eigh")
# One matrix per LAPACK call on CPU (orthojax.linalg._lapack says why).
_svd = per_matrix_on_cpu(lambda x: jnp.linalg.svd(x, full_matrices=False))
_eigh = per_matrix_on_cpu(jnp.linalg.eigh)


def _polar_svd(x: jax.Array) -> jax.Array:
  u, _, vh = _svd(x)
  return jnp.matmul(u, vh)


def _polar_eigh(x: jax.Array) -> jax.Array:
  """``X (XᵀX)^{-1/2}`` for tall ``X``, via the eigendecomposition of the p×p Gram."""
  gram = jnp.matmul(jnp.swapaxes(x, -1, -2), x)
  w, v = _eigh(gram)
  p = x.shape[-1]
  # Eigenvalues below round-off of the largest are treated as zero: the
  # corresponding directions (rank deficiency) are dropped, not amplified.
  tol = jnp.max(w, axis=-1, keepdims=True) * p * jnp.finfo(x.dtype).eps
  inv_sqrt = jnp.where(w > tol, jax.lax.rsqrt(jnp.where(w > tol, w, 1.0)), 0.0)
  proj = jnp.matmul(v * inv_sqrt[..., None, :], jnp.swapaxes(v, -1, -2))
  return jnp.matmul(x, proj)


def polar(x: jax.Array, *, method: str = "svd", precision: Precision = "highest") -> jax.Array:
  r"""The orthogonal polar factor ``U Vᵀ`` of ``x = U Σ Vᵀ``.

  Matrices lie on the last two axes, leading axes are batch axes (numpy
  convention). Tall inputs give orthonormal columns, wide inputs orthonormal
  rows, square inputs an orthogonal matrix.

  Methods:

  * ``"svd"`` (default) — ``U Vᵀ`` from ``jnp.linalg.svd(x,
    full_matrices=False)``. Backward stable and defined for every input; for a
    rank-deficient ``x`` the factor is not unique and the SVD's choice of
    singular vectors is returned (still semi-orthogonal).
  * ``"eigh"`` — ``X (XᵀX)^{-1/2}`` with ``XᵀX = V Λ Vᵀ`` formed on the small
    side (``p × p`` for an ``n × p`` tall matrix; wide inputs are
    transposed). Cheaper than an SVD of a tall matrix, but forming the Gram
    squares the condition number: the orthonormality error grows like
    ``ε κ(X)²``, so use it only for well-conditioned inputs (e.g.
    ``W + ξ`` near the manifold). Directions with ``λ ≤ p ε λ_max`` are
    dropped, so rank-deficient inputs give a matrix that is *not*
    semi-orthogonal.

  Computation runs in at least float32 (bfloat16/float16 inputs are upcast,
  since their round-off cannot hold orthonormality), with matmuls at ``precision``
  (default float32); the result is cast back to ``x``'s dtype.

  Args:
    x: ``(..., m, n)`` floating array.
    method: ``"svd"`` or ``"eigh"``.
    precision: of the products (:func:`orthojax.linalg.at_precision`).

  Returns:
    Array of ``x``'s shape and dtype.

  Raises:
    TypeError: ``x`` is not floating point.
    ValueError: ``x.ndim < 2`` or an unknown ``method``.
  """
  check_float(x, "polar input")
  x = jnp.asarray(x)
  if x.ndim < 2:
    raise ValueError(f"polar needs a matrix (..., m, n) with ndim >= 2, got shape {x.shape}")
  if method not in _METHODS:
    raise ValueError(f"polar: unknown method={method!r}; choose one of {_METHODS}")
  dtype = x.dtype
  xc = x.astype(compute_dtype(dtype))
  check_precision("polar", precision)
  if method == "svd":
    q = at_precision(_polar_svd, precision)(xc)
  else:
    wide = xc.shape[-2] < xc.shape[-1]
    q = at_precision(_polar_eigh, precision)(jnp.swapaxes(xc, -1, -2) if wide else xc)
    q = jnp.swapaxes(q, -1, -2) if wide else q
  return q.astype(dtype)
