r"""Matrix-free symmetric eigensolvers: Lanczos, power iteration, SLQ densities.

Every function here sees a symmetric linear operator ``A`` of size ``dim``
only through ``matvec(v) = A v`` on flat vectors ``(dim,)``, so Jacobian
Gram matrices, Gauss–Newton / Fisher matrices and NTKs are never built. All
of them are pure jax (``jax.lax.fori_loop`` / ``while_loop`` with fixed
shapes): they run under ``jax.jit`` and ``jax.vmap``.

Lanczos (Lanczos 1950; Golub & Van Loan, *Matrix Computations*, §10.1) builds
an orthonormal basis ``V = [v_0, …, v_{m−1}]`` of the Krylov space
``span{v_0, A v_0, …, A^{m−1} v_0}`` in which ``A`` is tridiagonal::

    A V = V T + β_{m−1} v_m e_mᵀ,   T = tridiag(β, α, β),
    α_j = v_jᵀ A v_j,   β_j v_{j+1} = A v_j − α_j v_j − β_{j−1} v_{j−1}.

The eigenvalues ``θ_i`` of ``T`` (Ritz values) approximate the extreme
eigenvalues of ``A`` first; a Ritz pair ``(θ_i, V s_i)`` has residual
``‖A V s_i − θ_i V s_i‖ = |β_{m−1}| |e_mᵀ s_i|``, and some eigenvalue
``λ`` of ``A`` satisfies ``|λ − θ_i| ≤`` that residual. In floating point the
three-term recurrence loses orthogonality as Ritz values converge, so every
new vector is orthogonalised again against the whole stored basis (classical
Gram–Schmidt, repeated once when the DGKS criterion asks for it: "twice is
enough"). When ``β_j`` vanishes the
Krylov space is invariant; the iteration then restarts from a random vector
orthogonal to the basis with ``β_j = 0``, so ``T`` becomes block diagonal and
the remaining eigenvalues are still found.

Memory: the stored basis is ``num_iters × dim`` numbers (e.g. 30 Lanczos
steps on a 33 M-parameter Fisher matrix hold 4 GB in float32).

References:
  C. Lanczos, "An iteration method for the solution of the eigenvalue
  problem of linear differential and integral operators", J. Res. Nat. Bur.
  Standards 45, 1950.
  G. H. Golub, C. F. Van Loan, *Matrix Computations*, 4th ed., 2013, §10.1–10.3.
  Y. Saad, *Numerical Methods for Large Eigenvalue Problems*, 2nd ed., 2011, ch. 6.
  S. Ubaru, J. Chen, Y. Saad, "Fast estimation of tr(f(A)) via stochastic
  Lanczos quadrature", SIAM J. Matrix Anal. Appl. 38(4), 2017.
  B. Ghorbani, S. Krishnan, Y. Xiao, "An investigation into neural net
  optimization via Hessian eigenvalue density", ICML 2019.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from orthojax.analysis._compile import compiled
from orthojax.nn import check_choice

Matvec = Callable[[jax.Array], jax.Array]
WHICH = ("largest", "smallest", "both")

# β below this multiple of eps·‖T‖ is an invariant subspace (restart).
_BREAKDOWN = 100.0
# Reorthogonalise twice when one pass shrinks the vector below this fraction.
_DGKS = 1.0 / np.sqrt(2.0)


# ------------------------------------------------------------------------------
# Argument checks
# ------------------------------------------------------------------------------


def _check_dim(dim: Any, who: str) -> int:
  if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
    raise ValueError(f"{who}: dim must be a positive int, got {dim!r}")
  return int(dim)


def _check_iters(num_iters: Any, dim: int, who: str, what: str = "num_iters") -> int:
  if isinstance(num_iters, bool) or not isinstance(num_iters, (int, np.integer)):
    raise TypeError(f"{who}: {what} must be an int, got {num_iters!r}")
  if not 1 <= num_iters <= dim:
    raise ValueError(f"{who}: {what} must be in [1, dim={dim}] (a Krylov space of an operator "
                     f"of size {dim} has at most {dim} dimensions), got {num_iters}")
  return int(num_iters)


def _check_k(k: Any, dim: int, who: str) -> int:
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"{who}: k must be a positive int, got {k!r}")
  if k > dim:
    raise ValueError(f"{who}: k={k} eigenvalues requested but the operator has dimension {dim}")
  return int(k)


def _check_tol(tol: Any, who: str) -> Any:
  if isinstance(tol, jax.core.Tracer):
    return tol  # traced under jit: checked by the caller's own logic
  tol = float(tol)
  if not tol >= 0.0:
    raise ValueError(f"{who}: tol must be >= 0, got {tol}")
  return tol


def _start_vector(dim: int, key: Any, v0: Any, dtype: Any, who: str) -> jax.Array:
  """A unit start vector: ``v0`` normalised, or a Gaussian draw from ``key``."""
  if v0 is not None:
    v0 = jnp.asarray(v0, dtype)
    if v0.shape != (dim,):
      raise ValueError(f"{who}: v0 must have shape ({dim},), got {v0.shape}")
  else:
    key = jax.random.key(0) if key is None else key
    v0 = jax.random.normal(key, (dim,), dtype)
  return v0 / jnp.linalg.norm(v0)


def _apply(matvec: Matvec, v: jax.Array, who: str) -> jax.Array:
  w = jnp.asarray(matvec(v))
  if w.shape != v.shape:
    raise ValueError(f"{who}: matvec must map shape {v.shape} to itself, got {w.shape}")
  return w.astype(v.dtype)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
  """``a @ b`` at full float32 precision (no TF32/bf16 passes on GPU/TPU), so
  that reorthogonalisation keeps the basis orthonormal to float32 round-off."""
  return jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)


def _dtype(dtype: Any) -> Any:
  dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"dtype must be a floating dtype, got {dtype}")
  return jax.dtypes.canonicalize_dtype(dtype)


# ------------------------------------------------------------------------------
# The Lanczos step
# ------------------------------------------------------------------------------


class _State(NamedTuple):
  basis: jax.Array      # (m, dim); rows 0..j filled
  alpha: jax.Array      # (m,)
  beta: jax.Array       # (m,); beta[j] couples v_j and v_{j+1}
  norm: jax.Array       # running estimate of ‖A‖ (max |α| + 2 max |β|)


def _orthogonalise(w: jax.Array, basis: jax.Array) -> jax.Array:
  """``w`` minus its projection on the rows of ``basis`` (classical Gram–Schmidt).

  A second pass runs only when the first removed a large part of ``w``
  (``‖w'‖ < ‖w‖/√2``, the Daniel–Gragg–Kaufman–Stewart criterion, "twice is
  enough"); in Lanczos the three-term recurrence has already removed almost
  everything, so one pass over the stored basis is the rule.
  """
  project = lambda u: u - _dot(basis.T, _dot(basis, u))
  once = project(w)
  again = jnp.linalg.norm(once) < _DGKS * jnp.linalg.norm(w)
  return jax.lax.cond(again, project, lambda u: u, once)


def _step(matvec: Matvec, state: _State, j: jax.Array, key: jax.Array,
          reorthogonalize: bool, who: str) -> _State:
  """Lanczos step ``j``: fills ``alpha[j]``, ``beta[j]`` and (if room) row ``j + 1``."""
  basis, alpha, beta, norm = state
  m, dim = basis.shape
  v = basis[j]
  w = _apply(matvec, v, who)
  a = _dot(v, w)
  b_prev = jnp.where(j > 0, beta[jnp.maximum(j - 1, 0)], 0.0)
  w = w - a * v - b_prev * basis[jnp.maximum(j - 1, 0)]
  if reorthogonalize:
    w = _orthogonalise(w, basis)
  b = jnp.linalg.norm(w)
  norm = jnp.maximum(norm, jnp.abs(a) + 2.0 * jnp.maximum(b, b_prev))
  eps = jnp.finfo(w.dtype).eps
  breakdown = b <= _BREAKDOWN * eps * jnp.maximum(norm, jnp.finfo(w.dtype).tiny)

  def restart(_):
    r = jax.random.normal(jax.random.fold_in(key, j), (dim,), w.dtype)
    r = _orthogonalise(r, basis) if reorthogonalize else r
    return r / jnp.linalg.norm(r)

  nxt = jax.lax.cond(breakdown, restart, lambda _: w / jnp.where(breakdown, 1.0, b), None)
  b = jnp.where(breakdown, 0.0, b)
  if m > 1:
    row = jnp.minimum(j + 1, m - 1)
    keep = j + 1 < m
    basis = basis.at[row].set(jnp.where(keep, nxt, basis[row]))
  return _State(basis, alpha.at[j].set(a), beta.at[j].set(b), norm)


def _init_state(v0: jax.Array, m: int) -> _State:
  basis = jnp.zeros((m,) + v0.shape, v0.dtype).at[0].set(v0)
  zeros = jnp.zeros((m,), v0.dtype)
  return _State(basis, zeros, zeros, jnp.zeros((), v0.dtype))


def tridiagonal(alpha: jax.Array, beta: jax.Array) -> jax.Array:
  """The dense symmetric tridiagonal ``T`` with diagonal ``alpha`` and off-diagonal ``beta``.

  Args:
    alpha: ``(m,)`` diagonal.
    beta: ``(m − 1,)`` off-diagonal, or ``(m,)`` (the last entry, the
      residual coupling of a :class:`LanczosResult`, is dropped).

  Returns:
    ``(m, m)`` array.
  """
  m = alpha.shape[-1]
  off = beta[..., : m - 1]
  return jnp.diag(alpha) + jnp.diag(off, 1) + jnp.diag(off, -1)


def _padded_eigh(alpha, beta, n, norm):
  """Eigen-decomposition of ``T_n`` (the leading ``n × n`` block) at fixed size ``m``.

  Rows ``≥ n`` are decoupled and given a diagonal above every eigenvalue of
  ``T_n`` (Gershgorin), so the ``n`` real Ritz values come first in the
  ascending order of ``eigh``; their eigenvector entries in the padding are
  zeroed.
  """
  m = alpha.shape[0]
  idx = jnp.arange(m)
  pad = jnp.max(jnp.abs(alpha)) + 2.0 * jnp.max(jnp.abs(beta)) + norm + 1.0
  diag = jnp.where(idx < n, alpha, pad)
  off = jnp.where(idx[:-1] < n - 1, beta[:-1], 0.0)
  theta, s = jnp.linalg.eigh(jnp.diag(diag) + jnp.diag(off, 1) + jnp.diag(off, -1))
  s = jnp.where((idx < n)[:, None], s, 0.0)
  return theta, s


# ------------------------------------------------------------------------------
# Lanczos with a fixed number of steps
# ------------------------------------------------------------------------------


class LanczosResult(NamedTuple):
  """The output of :func:`lanczos`.

  Attributes:
    alpha: ``(m,)`` diagonal of ``T``.
    beta: ``(m,)``: ``beta[:m−1]`` is the off-diagonal of ``T``; ``beta[m−1]``
      the residual norm coupling the last basis vector to the next one.
    basis: ``(m, dim)`` the orthonormal Lanczos vectors, one per row.
    ritz_values: ``(m,)`` eigenvalues of ``T``, ascending.
    ritz_coefficients: ``(m, m)`` eigenvectors of ``T`` (columns), so the
      Ritz vectors are ``basis.T @ ritz_coefficients``.
    residuals: ``(m,)`` ``|beta[m−1]| |ritz_coefficients[m−1, i]|``: the
      residual norm ``‖A u_i − θ_i u_i‖`` of each Ritz pair, a bound on its
      distance to the spectrum of ``A``.
  """

  alpha: jax.Array
  beta: jax.Array
  basis: jax.Array
  ritz_values: jax.Array
  ritz_coefficients: jax.Array
  residuals: jax.Array

  def ritz_vectors(self) -> jax.Array:
    """``(m, dim)`` Ritz vectors ``u_i = V s_i``, one per row, ascending ``θ_i``."""
    return _dot(self.ritz_coefficients.T, self.basis)


@compiled("key", "v0")
def lanczos(matvec: Matvec, dim: int, num_iters: int, key: Any = None, *, v0: Any = None,
            dtype: Any = None, reorthogonalize: bool = True) -> LanczosResult:
  r"""``num_iters`` steps of symmetric Lanczos with full reorthogonalisation.

  ``A V = V T + β_{m−1} v_m e_mᵀ`` with ``V`` orthonormal and ``T``
  tridiagonal (module docstring). Jit-able; ``matvec`` is traced once.

  Args:
    matvec: ``v ↦ A v`` for a symmetric ``A``, on ``(dim,)`` vectors.
    dim: the size of ``A``.
    num_iters: the Krylov dimension ``m``, ``1 ≤ m ≤ dim``.
    key: PRNG key for the start vector and for restarts after an invariant
      subspace is found (default ``jax.random.key(0)``).
    v0: an explicit start vector ``(dim,)`` (normalised here).
    dtype: floating dtype of the vectors (default float32).
    reorthogonalize: re-orthogonalise every new vector against the stored
      basis (default); False runs the bare three-term recurrence (Ritz values
      then acquire spurious copies once they converge).

  Returns:
    A :class:`LanczosResult`.

  Raises:
    ValueError: ``dim`` or ``num_iters`` out of range, or ``matvec`` changes
      the vector's shape.

  References:
    Golub & Van Loan, *Matrix Computations*, §10.1; Saad 2011, ch. 6.
  """
  who = "lanczos"
  dim = _check_dim(dim, who)
  m = _check_iters(num_iters, dim, who)
  dtype = _dtype(dtype)
  key = jax.random.key(0) if key is None else key
  start_key, restart_key = jax.random.split(key)
  v0 = _start_vector(dim, start_key, v0, dtype, who)
  state = jax.lax.fori_loop(
      0, m, lambda j, s: _step(matvec, s, j, restart_key, reorthogonalize, who),
      _init_state(v0, m))
  theta, s = jnp.linalg.eigh(tridiagonal(state.alpha, state.beta))
  residuals = jnp.abs(state.beta[m - 1] * s[m - 1])
  return LanczosResult(state.alpha, state.beta, state.basis, theta, s, residuals)


# ------------------------------------------------------------------------------
# Extreme eigenvalues to a tolerance
# ------------------------------------------------------------------------------


class EigenResult(NamedTuple):
  """The output of :func:`top_eigenvalues`.

  ``which="both"`` gives ``(2, k)`` values (row 0 largest, row 1 smallest),
  ``(2, k, dim)`` vectors and ``(2, k)`` residuals.

  Attributes:
    values: ``(k,)`` eigenvalue estimates: descending for ``"largest"``,
      ascending for ``"smallest"``.
    vectors: ``(k, dim)`` unit Ritz vectors, one per row.
    residuals: ``(k,)`` ``‖A u − θ u‖`` of each pair; some eigenvalue of ``A``
      lies within it (and within ``residual²/gap`` once separated).
    num_iters: Lanczos steps (matrix-vector products) used.
    converged: whether every requested pair met the tolerance.
  """

  values: jax.Array
  vectors: jax.Array
  residuals: jax.Array
  num_iters: jax.Array
  converged: jax.Array


def _select(theta, s, residual_norm, n, k, which):
  """Indices of the wanted Ritz values among the first ``n`` (ascending) of ``theta``."""
  lo = jnp.arange(k)
  hi = n - 1 - jnp.arange(k)               # descending from the largest
  hi = jnp.maximum(hi, 0)
  out = {"smallest": lo, "largest": hi}
  picks = [out["largest"], out["smallest"]] if which == "both" else [out[which]]
  idx = jnp.stack(picks)                    # (w, k)
  vals = theta[idx]
  res = jnp.abs(residual_norm * s[jnp.maximum(n - 1, 0)][idx])
  return idx, vals, res


@compiled("key", "v0")
def top_eigenvalues(matvec: Matvec, dim: int, k: int = 1, *, which: str = "largest",
                    tol: float = 1e-6, atol: float | None = None, max_iters: int | None = None,
                    key: Any = None, v0: Any = None, dtype: Any = None,
                    reorthogonalize: bool = True) -> EigenResult:
  r"""The ``k`` extreme eigenpairs of a symmetric operator by Lanczos, to a tolerance.

  Runs Lanczos (full reorthogonalisation, :func:`lanczos`) inside a
  ``jax.lax.while_loop`` and after every step takes the Ritz pairs of the
  current ``T_j``; it stops as soon as every requested pair has residual::

      ‖A u_i − θ_i u_i‖ = |β_j| |e_jᵀ s_i|  ≤  tol · |θ_i| + atol,

  which bounds the distance from ``θ_i`` to an eigenvalue of ``A``, so
  ``tol`` is a relative accuracy of the eigenvalues (rigorous, stronger than
  a small relative change between iterations), or after ``max_iters`` steps.
  At ``max_iters = dim`` the Krylov space is the whole space and the result
  is exact up to round-off.

  Repeated eigenvalues: a single start vector sees each *distinct*
  eigenvalue once. When the Krylov space becomes invariant (``β = 0``) the
  iteration restarts orthogonally to it and does not stop there, so
  multiplicities (the identity, low-rank matrices) are found — convergence
  is declared after a breakdown only once a restart step has left the
  wanted values unchanged, or the whole space is spanned; but a
  multiple eigenvalue inside the requested ``k`` of a matrix whose Krylov
  space never closes may be reported once before convergence is declared —
  the usual limit of single-vector Lanczos (use ``tol=0`` to run all
  ``max_iters`` steps). Continuous spectra (Jacobians, Fisher matrices of
  random networks) are not affected.

  Args:
    matvec: ``v ↦ A v`` for a symmetric ``A`` on ``(dim,)`` vectors.
    dim: the size of ``A``.
    k: number of eigenpairs at each requested end, ``1 ≤ k ≤ dim``.
    which: ``"largest"`` (algebraically), ``"smallest"`` or ``"both"``.
    tol: relative residual tolerance (0: run all ``max_iters`` steps).
    atol: absolute residual floor; default ``sqrt(eps)·tol·‖T‖`` so that
      eigenvalues near zero (rank-deficient Gram matrices) can converge.
    max_iters: cap on Lanczos steps; default ``min(dim, max(2k + 40, 4k))``
      (must be ``≥ k``, and at most ``dim``).
    key: PRNG key (start vector, restarts); default ``jax.random.key(0)``.
    v0: explicit start vector.
    dtype: floating dtype (default float32).
    reorthogonalize: full reorthogonalisation (default; memory
      ``max_iters × dim``).

  Returns:
    An :class:`EigenResult`.

  Raises:
    ValueError: ``k > dim``, ``max_iters`` outside ``[k, dim]``, unknown
      ``which``, negative ``tol``.

  References:
    Golub & Van Loan, *Matrix Computations*, §10.1; Saad 2011, §6.3–6.4.
  """
  who = "top_eigenvalues"
  dim = _check_dim(dim, who)
  k = _check_k(k, dim, who)
  which = check_choice(which, WHICH, "which", where=who)
  tol = _check_tol(tol, who)
  if max_iters is None:
    max_iters = min(dim, max(2 * k + 40, 4 * k))
  m = _check_iters(max_iters, dim, who, "max_iters")
  if m < k:
    raise ValueError(f"{who}: max_iters={m} must be >= k={k}")
  dtype = _dtype(dtype)
  key = jax.random.key(0) if key is None else key
  start_key, restart_key = jax.random.split(key)
  v0 = _start_vector(dim, start_key, v0, dtype, who)
  width = 2 if which == "both" else 1
  eps = float(jnp.finfo(dtype).eps)

  def ritz(state: _State, n, prev_vals):
    theta, s = _padded_eigh(state.alpha, state.beta, n, state.norm)
    idx, vals, res = _select(theta, s, state.beta[n - 1], n, k, which)
    floor = np.sqrt(eps) * tol * state.norm if atol is None else atol
    small = jnp.all(res <= tol * jnp.abs(vals) + floor)
    # After a breakdown (β = 0 exactly) the Ritz values are exact but the rest of
    # the space is unexplored (repeated eigenvalues, low rank): the step after it
    # restarts in the complement, and only if that changed none of the wanted
    # values (or the whole space is spanned) may the iteration stop.
    stable = (n - 1 >= k) & jnp.all(jnp.abs(vals - prev_vals) <= tol * jnp.abs(vals) + floor)
    restarted = (n >= 2) & (state.beta[jnp.maximum(n - 2, 0)] == 0)
    explored = (state.beta[n - 1] != 0) | (n == dim) | (restarted & stable)
    return idx, vals, res, s, (n >= k) & explored & small

  def cond(carry):
    _, n, ok, _ = carry
    return (n < m) & ~ok

  def body(carry):
    state, n, _, prev_vals = carry
    state = _step(matvec, state, n, restart_key, reorthogonalize, who)
    n = n + 1
    _, vals, _, _, ok = ritz(state, n, prev_vals)
    return state, n, ok, vals

  init = (_init_state(v0, m), jnp.int32(0), jnp.asarray(False),
          jnp.zeros((width, k), dtype))
  state, n, ok, _ = jax.lax.while_loop(cond, body, init)
  idx, vals, res, s, _ = ritz(state, n, jnp.zeros((width, k), dtype))
  # Rows >= n of the basis hold the next Lanczos vector or zeros: mask them.
  basis = jnp.where((jnp.arange(m) < n)[:, None], state.basis, 0.0)
  coeffs = jnp.moveaxis(s[:, idx], 0, -1)          # (w, k, m)
  vecs = _dot(coeffs, basis)                        # (w, k, dim)
  if width == 1:
    vals, vecs, res = vals[0], vecs[0], res[0]
  return EigenResult(vals, vecs, res, n, ok)


# ------------------------------------------------------------------------------
# Power iteration
# ------------------------------------------------------------------------------


class PowerResult(NamedTuple):
  """The output of :func:`power_iteration`.

  Attributes:
    eigenvalue: the Rayleigh quotient ``vᵀ A v`` at the final unit ``v``.
    vector: the final unit vector ``(dim,)``.
    num_iters: matrix-vector products used.
    converged: whether the relative change fell below ``tol``.
    residual: ``‖A v − λ v‖`` of the returned pair.
  """

  eigenvalue: jax.Array
  vector: jax.Array
  num_iters: jax.Array
  converged: jax.Array
  residual: jax.Array


@compiled("key", "v0")
def power_iteration(matvec: Matvec, dim: int, *, max_iters: int = 100, tol: float = 1e-6,
                    key: Any = None, v0: Any = None, dtype: Any = None) -> PowerResult:
  r"""The dominant eigenpair by power iteration, to a relative change ``tol``.

  ``w = A v_t``,  ``λ_t = v_tᵀ w`` (Rayleigh quotient),  ``v_{t+1} = w/‖w‖``;
  stops when ``|λ_t − λ_{t−1}| ≤ tol |λ_t|`` or after ``max_iters`` products
  (``tol = 0``: always ``max_iters``, unless ``A v = 0`` exactly).
  Converges to the eigenvalue of largest modulus (``λ_max`` for a positive
  semi-definite ``A`` such as a Gram, Gauss–Newton or Fisher matrix) at the
  rate ``(λ_2/λ_1)^{2t}`` for the Rayleigh quotient; a small relative change
  is a heuristic, not a bound (see ``residual``).

  Args:
    matvec: ``v ↦ A v`` for a symmetric ``A`` on ``(dim,)`` vectors.
    dim: the size of ``A``.
    max_iters: cap on the number of products, ``≥ 1``.
    tol: relative change tolerance.
    key: PRNG key for the start vector (default ``jax.random.key(0)``).
    v0: explicit start vector.
    dtype: floating dtype (default float32).

  Returns:
    A :class:`PowerResult`.

  References:
    Golub & Van Loan, *Matrix Computations*, §8.2.1 (the power method).
  """
  who = "power_iteration"
  dim = _check_dim(dim, who)
  if isinstance(max_iters, bool) or not isinstance(max_iters, (int, np.integer)) or max_iters < 1:
    raise ValueError(f"{who}: max_iters must be a positive int, got {max_iters!r}")
  tol = _check_tol(tol, who)
  dtype = _dtype(dtype)
  v = _start_vector(dim, key, v0, dtype, who)
  tiny = jnp.finfo(dtype).tiny

  def cond(carry):
    _, _, t, ok, _, _ = carry
    return (t < max_iters) & ~ok

  def body(carry):
    v, lam_prev, t, _, _, _ = carry
    w = _apply(matvec, v, who)
    lam = _dot(v, w)
    residual = jnp.linalg.norm(w - lam * v)
    norm = jnp.linalg.norm(w)
    ok = (t > 0) & (tol > 0) & (jnp.abs(lam - lam_prev) <= tol * jnp.abs(lam))
    # When A v = 0 the Rayleigh quotient 0 is exact: stop there.
    ok = ok | (norm <= tiny)
    v_new = jnp.where(norm > tiny, w / jnp.where(norm > tiny, norm, 1.0), v)
    return v_new, lam, t + 1, ok, v, residual

  zero = jnp.zeros((), dtype)
  init = (v, zero, jnp.int32(0), jnp.asarray(False), v, zero)
  _, lam, t, ok, v_used, residual = jax.lax.while_loop(cond, body, init)
  return PowerResult(lam, v_used, t, ok, residual)


# ------------------------------------------------------------------------------
# Stochastic Lanczos quadrature
# ------------------------------------------------------------------------------


class SpectralDensity(NamedTuple):
  """The output of :func:`spectral_density`.

  Attributes:
    grid: ``(num_points,)`` where the density is evaluated.
    density: ``(num_points,)`` the smoothed spectral density (integrates to
      about 1 over a grid covering the nodes).
    nodes: ``(num_probes, m)`` Ritz values of each probe (quadrature nodes).
    weights: ``(num_probes, m)`` squared first components of the Ritz
      vectors of ``T`` (Gauss quadrature weights; each row sums to 1).
    sigma: the Gaussian kernel width used.
  """

  grid: jax.Array
  density: jax.Array
  nodes: jax.Array
  weights: jax.Array
  sigma: jax.Array


@compiled("key", "grid")
def spectral_density(matvec: Matvec, dim: int, *, num_iters: int = 30, num_probes: int = 8,
                     key: Any = None, grid: Any = None, num_points: int = 256,
                     sigma: float | None = None, dtype: Any = None) -> SpectralDensity:
  r"""Spectral density of a symmetric operator by stochastic Lanczos quadrature.

  For a unit probe ``v``, Lanczos from ``v`` gives Ritz values ``θ_i`` and
  first components ``τ_i = (e_1ᵀ s_i)²``, the nodes and weights of the Gauss
  quadrature of the measure ``Σ_j (vᵀ q_j)² δ_{λ_j}``. With random probes
  ``E[(vᵀ q_j)²] = 1/dim``, so averaging over probes estimates the
  eigenvalue density ``φ(t) = (1/dim) Σ_j δ(t − λ_j)``, smoothed by a
  Gaussian of width ``sigma``::

      φ̂(t) = (1/n_v) Σ_probes Σ_i τ_i N(t; θ_i, σ²).

  Args:
    matvec: ``v ↦ A v`` for a symmetric ``A`` on ``(dim,)`` vectors.
    dim: the size of ``A``.
    num_iters: Lanczos steps per probe, ``≤ dim``.
    num_probes: number of Rademacher probes, ``≥ 1``.
    key: PRNG key (default ``jax.random.key(0)``).
    grid: evaluation points; default ``num_points`` points from
      ``min θ − 3σ`` to ``max θ + 3σ``.
    num_points: size of the default grid.
    sigma: kernel width; default 1% of the Ritz value range (``≥ tiny``).
    dtype: floating dtype (default float32).

  Returns:
    A :class:`SpectralDensity`.

  References:
    Ubaru, Chen & Saad 2017; Ghorbani, Krishnan & Xiao 2019.
  """
  who = "spectral_density"
  dim = _check_dim(dim, who)
  m = _check_iters(num_iters, dim, who)
  if isinstance(num_probes, bool) or not isinstance(num_probes, (int, np.integer)) \
      or num_probes < 1:
    raise ValueError(f"{who}: num_probes must be a positive int, got {num_probes!r}")
  dtype = _dtype(dtype)
  key = jax.random.key(0) if key is None else key
  probe_keys = jax.random.split(key, num_probes)

  def one(pkey):
    sign_key, run_key = jax.random.split(pkey)
    v0 = jax.random.rademacher(sign_key, (dim,), dtype)
    res = lanczos(matvec, dim, m, run_key, v0=v0, dtype=dtype)
    return res.ritz_values, jnp.square(res.ritz_coefficients[0])

  nodes, weights = jax.vmap(one)(probe_keys)
  lo, hi = jnp.min(nodes), jnp.max(nodes)
  tiny = jnp.finfo(dtype).tiny
  if sigma is None:
    sig = jnp.maximum(0.01 * (hi - lo), jnp.maximum(1e-3 * jnp.abs(hi), tiny))
  else:
    if not float(sigma) > 0:
      raise ValueError(f"{who}: sigma must be > 0, got {sigma}")
    sig = jnp.asarray(sigma, dtype)
  if grid is None:
    grid = jnp.linspace(lo - 3 * sig, hi + 3 * sig, num_points, dtype=dtype)
  grid = jnp.asarray(grid, dtype)
  z = (grid[:, None, None] - nodes[None]) / sig
  kernel = jnp.exp(-0.5 * z * z) / (sig * np.sqrt(2 * np.pi))
  density = jnp.sum(kernel * weights[None], axis=(1, 2)) / num_probes
  return SpectralDensity(grid, density, nodes, weights, sig)
