"""Soft-orthogonality penalties on one parameter (Bansal, Chen & Wang 2018).

Every penalty here is a pure, jit-able function of one parameter ``w`` in its
native layout (a Dense kernel ``(in, out)``, a conv kernel
``(kh, kw, cin, cout)``, a stack of either with leading batch axes) and an
optional ``view`` (:class:`orthojax.linalg.MatrixView` or optax's
``MuonDimensionNumbers``; None infers it for 2-D and 4-D arrays, see
:mod:`orthojax.linalg`). The penalty is computed on the *tall* matrix

  ``T = layout(w.shape, view).to_tall(w)``  of shape ``(*batch, n, p)``, n >= p,

so the constraint always sits on the tall side, as everywhere in orthojax: a
tall parameter is pushed towards orthonormal columns (``WᵀW = I``), a wide
one towards orthonormal rows (``WWᵀ = I``). The residual is the symmetric
``p x p`` matrix ``R = TᵀT − I_p``; the ``n x n`` Gram matrix is never formed.

Numerics: the arithmetic runs in :func:`orthojax.linalg.compute_dtype` of the
parameter's dtype (float32 for bfloat16/float16/float32 parameters, float64
for float64 ones), and the Gram matrix is computed at
``jax.lax.Precision.HIGHEST``, so that on TPU ``TᵀT`` is not rounded to
bfloat16 passes (which would leave a ~1e-3 floor on ``‖TᵀT − I‖``). The
returned scalar has that compute dtype.

Reductions. Every penalty takes ``reduction``, ``"sum"`` or ``"mean"``, which
applies twice: within each matrix of the stack and over the stack.

* ``"sum"``: the matrix norm as written in the paper (e.g. the *sum* of the
  squared entries of ``R``), summed over the batch matrices;
* ``"mean"``: the *mean* of the squared entries of ``R`` (``‖R‖_F² / p²``)
  instead of their sum, averaged over the batch matrices. For the max-type
  penalties (:func:`~orthojax.penalties.mc`, :func:`~orthojax.penalties.srip`) the per-matrix value is the same for
  both reductions; only the batch sum becomes a batch mean.

References:
  N. Bansal, X. Chen, Z. Wang. "Can we gain more from orthogonality
  regularizations in training deep CNNs?", NeurIPS 2018 (SO, DSO, MC, SRIP).
  A. Sokol, I. M. Park. "Information geometry of orthogonal initializations
  and training", ICLR 2020 (the halved SO, ``½‖WᵀW − I‖_F²``).
  Ester Hlav, "Dynamic isometry as a consequence of weight orthogonality
  for faster and better convergence" (Columbia University) (see
  the errata in :func:`~orthojax.penalties.gain_adjusted_so`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from orthojax import linalg

REDUCTIONS = ("sum", "mean")


def _check_reduction(reduction: str) -> None:
  if reduction not in REDUCTIONS:
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got reduction={reduction!r}")


def _tall(w: Any, view: Any) -> tuple[jnp.ndarray, linalg.Layout]:
  """``w`` as its tall matrix ``(*batch, n, p)`` in the compute dtype."""
  linalg.check_float(w, "w")
  w = jnp.asarray(w)
  lay = linalg.layout(w.shape, view, "w")
  return lay.to_tall(w).astype(linalg.compute_dtype(w.dtype)), lay


def _gram(t: jnp.ndarray) -> jnp.ndarray:
  """``TᵀT`` of a tall ``(*batch, n, p)`` stack, at full matmul precision."""
  return jnp.einsum("...ni,...nj->...ij", t, t, precision=jax.lax.Precision.HIGHEST)


def _residual(t: jnp.ndarray, scale: Any = 1.0) -> jnp.ndarray:
  """``TᵀT · scale − I_p`` (``scale`` broadcasts over the batch axes)."""
  p = t.shape[-1]
  return _gram(t) * scale - jnp.eye(p, dtype=t.dtype)


def _squared_frobenius(r: jnp.ndarray, reduction: str) -> jnp.ndarray:
  """Sum (or mean) of squared entries per matrix, summed (or averaged) over the stack."""
  per_matrix = jnp.sum(jnp.square(r), axis=(-2, -1))
  if reduction == "mean":
    return jnp.mean(per_matrix / (r.shape[-1] * r.shape[-2]))
  return jnp.sum(per_matrix)


def _over_batch(per_matrix: jnp.ndarray, reduction: str) -> jnp.ndarray:
  return jnp.mean(per_matrix) if reduction == "mean" else jnp.sum(per_matrix)


def so(w: Any, *, view: Any = None, reduction: str = "sum") -> jnp.ndarray:
  r"""Soft orthogonality (SO): ``‖TᵀT − I‖_F²`` (Bansal et al. 2018, eq. 2).

  With ``T`` the tall matrix of ``w`` (see the module docstring),

  .. math:: \mathrm{SO}(W) = \|T^\top T - I_p\|_F^2
            = \sum_i (\sigma_i(T)^2 - 1)^2,

  which is zero exactly when ``T`` has orthonormal columns. Its gradient with
  respect to ``T`` (``reduction="sum"``) is ``4 T (TᵀT − I)``.

  Args:
    w: the parameter, in its native layout, floating dtype.
    view: a ``MatrixView`` / ``MuonDimensionNumbers``, or None to infer.
    reduction: ``"sum"`` (the norm above, summed over stacked matrices) or
      ``"mean"`` (``‖TᵀT − I‖_F² / p²``, averaged over stacked matrices).

  Returns:
    A scalar in the compute dtype (float32 unless ``w`` is float64).

  Raises:
    ValueError: unknown ``reduction``; ``w`` has fewer than 2 axes or an
      ambiguous layout and no ``view``.
    TypeError: ``w`` has an integer dtype.
  """
  _check_reduction(reduction)
  t, _ = _tall(w, view)
  return _squared_frobenius(_residual(t), reduction)


def half_so(w: Any, *, view: Any = None, reduction: str = "sum") -> jnp.ndarray:
  r"""Sokol & Park's halved soft orthogonality ``½‖TᵀT − I‖_F²``.

  Exactly ``so(w, view=view, reduction=reduction) / 2``; its gradient with
  respect to the tall matrix is ``2 T (TᵀT − I)``. See :func:`so`.
  """
  return 0.5 * so(w, view=view, reduction=reduction)


def dso(w: Any, *, view: Any = None, reduction: str = "sum") -> jnp.ndarray:
  r"""Double soft orthogonality (DSO): ``‖TᵀT − I_p‖_F² + ‖TTᵀ − I_n‖_F²``.

  Bansal et al. (2018, eq. 3) add the second term so that one penalty covers
  over- and under-complete matrices alike. The nonzero eigenvalues of
  ``TTᵀ`` are those of ``TᵀT`` and the other ``n − p`` are zero, so

  .. math:: \|TT^\top - I_n\|_F^2 = \|T^\top T\|_F^2 - 2\,\mathrm{tr}(T^\top T) + n
            = \|T^\top T - I_p\|_F^2 + (n - p),

  and this function evaluates the right-hand form: it never forms the
  ``n x n`` matrix, and it avoids the cancellation of the middle form (three
  terms of size ~n whose difference is small) in float32. Consequences worth
  knowing:

  * for a non-square matrix DSO is bounded below by ``n − p`` (the tall side
    can be orthonormal, the wide side cannot), reached exactly at orthonormal
    ``T``; it vanishes only for square matrices;
  * its gradient is exactly twice that of :func:`so`.

  Args:
    w: the parameter, in its native layout, floating dtype.
    view: a ``MatrixView`` / ``MuonDimensionNumbers``, or None to infer.
    reduction: ``"sum"``: the expression above, summed over stacked matrices;
      ``"mean"``: each term is the mean of its residual's squared entries,
      ``‖TᵀT − I‖_F²/p² + ‖TTᵀ − I‖_F²/n²``, averaged over stacked matrices.

  Returns:
    A scalar in the compute dtype.
  """
  _check_reduction(reduction)
  t, lay = _tall(w, view)
  n, p = lay.n, lay.p
  small = jnp.sum(jnp.square(_residual(t)), axis=(-2, -1))
  big = small + (n - p)
  if reduction == "mean":
    return jnp.mean(small / p**2 + big / n**2)
  return jnp.sum(small + big)


def mc(w: Any, *, view: Any = None, reduction: str = "sum") -> jnp.ndarray:
  r"""Mutual coherence (MC): ``‖TᵀT − I‖_∞``, the largest absolute entry.

  Bansal et al. (2018, eq. 4). For orthonormal-ish columns the off-diagonal
  entries of ``TᵀT`` are the pairwise coherences of the columns, and the
  diagonal entries the deviations of their squared norms from one. The
  gradient is a subgradient flowing through the maximising entry only.

  Args:
    w: the parameter, in its native layout, floating dtype.
    view: a ``MatrixView`` / ``MuonDimensionNumbers``, or None to infer.
    reduction: how per-matrix values combine over stacked matrices: ``"sum"``
      or ``"mean"``. (Within a matrix the value is always the max.)

  Returns:
    A scalar in the compute dtype.
  """
  _check_reduction(reduction)
  t, _ = _tall(w, view)
  return _over_batch(jnp.max(jnp.abs(_residual(t)), axis=(-2, -1)), reduction)


def _safe_norm(x: jnp.ndarray) -> jnp.ndarray:
  """Euclidean norm over the last axis, with a zero (not NaN) gradient at 0."""
  sq = jnp.sum(jnp.square(x), axis=-1)
  positive = sq > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)


def _matvec(r: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
  return jnp.einsum("...ij,...j->...i", r, v, precision=jax.lax.Precision.HIGHEST)


def _normalize(x: jnp.ndarray, fallback: jnp.ndarray) -> jnp.ndarray:
  """``x / ‖x‖`` per vector, or ``fallback`` where ``x`` is exactly zero."""
  norm = _safe_norm(x)[..., None]
  return jnp.where(norm > 0, x / jnp.where(norm > 0, norm, 1.0), fallback)


def default_start_vector(
    batch_shape: tuple[int, ...], p: int, dtype: Any = jnp.float32) -> jnp.ndarray:
  """The deterministic power-iteration start of :func:`srip`: unit vectors.

  ``(1 + 0.1·sin(1 + 7.3 i)) / norm`` for ``i = 0..p−1``: nearly the
  all-ones direction, broken by a fixed irregular perturbation so that it is
  not orthogonal to the top eigenvector of a structured residual (e.g. one
  whose columns sum to zero). Shape ``(*batch_shape, p)``.
  """
  i = np.arange(p, dtype=np.float64)
  v = 1.0 + 0.1 * np.sin(1.0 + 7.3 * i)
  v = v / np.linalg.norm(v)
  return jnp.broadcast_to(jnp.asarray(v, dtype), tuple(batch_shape) + (p,))


def srip(
    w: Any,
    *,
    view: Any = None,
    iterations: int = 2,
    vector: Any = None,
    key: Any = None,
    return_vector: bool = False,
    reduction: str = "sum",
) -> jnp.ndarray | tuple[jnp.ndarray, jnp.ndarray]:
  r"""Spectral restricted isometry property (SRIP): ``σ_max(TᵀT − I)``.

  Bansal et al. (2018, eq. 5) penalise the spectral norm of the residual
  ``R = TᵀT − I_p``. ``R`` is symmetric, so ``σ_max(R) = max_i |λ_i(R)| =
  max_i |σ_i(T)² − 1|``: the worst deviation of a squared singular value of
  ``T`` from one. It is estimated by power iteration on the ``p x p`` ``R``:

  .. math:: v_{k+1} = R v_k / \|R v_k\|,\qquad
            \mathrm{SRIP}(W) \approx \|R\, \mathrm{sg}(v_K)\|,

  where ``sg`` is ``jax.lax.stop_gradient``: the iterate is treated as a
  constant and only ``‖R v‖`` is differentiated, as Bansal et al. do. At a
  converged ``v`` (a unit top eigenvector) this *is* the gradient of
  ``σ_max(R)`` (Danskin / Hellmann–Feynman), ``2 s T v vᵀ`` with ``s`` the
  sign of the top eigenvalue; with few iterations it is the gradient of a
  lower bound of ``σ_max(R)``.

  Start vector, in order of precedence:

  * ``vector`` of shape ``(*batch, p)`` (need not be normalised): warm-start
    from the previous step's vector. With ``return_vector=True`` the function
    returns ``(value, v_K)``, ``v_K`` unit-norm and stop-gradient'ed, to be
    carried to the next call; a couple of iterations per training step then
    track the top eigenvector as the weights move;
  * ``key``: a Gaussian start drawn with ``jax.random.normal(key, ...)``;
  * otherwise a fixed deterministic start (nearly the all-ones unit vector),
    so the default is a pure, stateless function of ``w``.

  If ``R v`` is exactly zero (an exactly orthonormal ``T``) the iterate is
  kept and the value and gradient are exactly zero, never NaN.

  Args:
    w: the parameter, in its native layout, floating dtype.
    view: a ``MatrixView`` / ``MuonDimensionNumbers``, or None to infer.
    iterations: number of power iterations (static, >= 0). Bansal et al. use
      2 with a random start each step; use more (or a carried ``vector``)
      when the value itself matters.
    vector: optional start vector(s), shape ``(*batch, p)``.
    key: optional PRNG key for a random start (ignored if ``vector`` given).
    return_vector: also return the final (unit, stop-gradient'ed) vector.
    reduction: how per-matrix values combine over stacked matrices, ``"sum"``
      or ``"mean"``.

  Returns:
    The scalar penalty (compute dtype), or ``(penalty, vector)`` when
    ``return_vector`` is True.

  Raises:
    ValueError: unknown ``reduction``, negative ``iterations``, ``vector`` of
      the wrong shape, or a bad ``w`` shape (see :func:`so`).
    TypeError: ``w`` has an integer dtype.
  """
  _check_reduction(reduction)
  if int(iterations) != iterations or iterations < 0:
    raise ValueError(f"iterations must be a non-negative integer, got iterations={iterations!r}")
  t, lay = _tall(w, view)
  r = _residual(t)
  want = lay.batch_shape + (lay.p,)
  if vector is not None:
    v0 = jnp.asarray(vector, t.dtype)
    if tuple(v0.shape) != want:
      raise ValueError(f"vector must have shape (*batch, p) = {want} for w of shape "
                       f"{tuple(jnp.shape(w))}, got vector of shape {tuple(v0.shape)}")
  elif key is not None:
    v0 = jax.random.normal(key, want, t.dtype)
  else:
    v0 = default_start_vector(lay.batch_shape, lay.p, t.dtype)
  fallback = default_start_vector(lay.batch_shape, lay.p, t.dtype)
  v0 = _normalize(jax.lax.stop_gradient(v0), fallback)

  r_const = jax.lax.stop_gradient(r)

  def step(_, v):
    return _normalize(_matvec(r_const, v), v)

  v = jax.lax.stop_gradient(jax.lax.fori_loop(0, int(iterations), step, v0))
  value = _over_batch(_safe_norm(_matvec(r, v)), reduction)
  return (value, v) if return_vector else value


def _check_gain(gain: Any) -> None:
  """Raise for a non-positive or non-finite gain when it is concrete."""
  if isinstance(gain, jax.core.Tracer):
    return
  g = np.asarray(gain)
  if not np.issubdtype(g.dtype, np.number) or not np.all(np.isfinite(g)) or np.any(g <= 0):
    raise ValueError(f"gain must be a positive finite number, got gain={gain!r}")


def gain_adjusted_so(
    w: Any, gain: Any = 1.0, *, view: Any = None, reduction: str = "sum") -> jnp.ndarray:
  r"""Gain-adjusted soft orthogonality: ``‖TᵀT / g² − I‖_F²`` (Hlav).

  Saxe et al. initialise ``W = g · Q`` with ``Q`` orthonormal and a gain
  ``g`` slightly above 1 to work "beyond the edge of chaos"; plain
  :func:`so` pulls such a ``W`` back to gain 1 during training. This penalty
  keeps the gain: it is zero exactly when ``T = g · (orthonormal columns)``,

  .. math:: \mathrm{SO}_g(W) = \|T^\top T / g^2 - I_p\|_F^2
            = \sum_i (\sigma_i(T)^2 / g^2 - 1)^2,

  and its gradient with respect to the tall matrix (``reduction="sum"``) is

  .. math:: \nabla_T\, \mathrm{SO}_g = \frac{4}{g^2}\, T\,(T^\top T / g^2 - I).

  ``gain=1`` is :func:`so`.

  Errata, relative to Hlav's note (module References):

  * the note states the gradient as ``4λ/g⁴ · W(WWᵀ − I)``. That is not
    the derivative of its own eq. 11: the correct gradient above equals
    ``(4/g⁴) T (TᵀT − g² I)``, and the note has ``I`` where ``g² I``
    belongs, so its "gradient" vanishes at orthonormal ``W`` (gain 1) instead
    of at ``W = g · Q`` — it would undo the gain the penalty is meant to keep;
  * the note's Keras snippet, ``mean(square(dot(Wᵀ, W) / g² − 1))``,
    subtracts the *scalar* 1 from every entry instead of the identity (so it
    pulls the off-diagonal entries towards 1, not 0) and averages instead of
    summing. orthojax subtracts the identity; the average is available as
    ``reduction="mean"``.

  Args:
    w: the parameter, in its native layout, floating dtype.
    gain: ``g > 0``; a scalar, or an array broadcastable to the batch shape
      (one gain per stacked matrix). May be traced (e.g. a learned gain), in
      which case it is not validated.
    view: a ``MatrixView`` / ``MuonDimensionNumbers``, or None to infer.
    reduction: ``"sum"`` or ``"mean"``, as in :func:`so`.

  Returns:
    A scalar in the compute dtype.

  Raises:
    ValueError: concrete ``gain <= 0`` (or non-finite), unknown
      ``reduction``, bad ``w`` shape.
    TypeError: ``w`` has an integer dtype.
  """
  _check_reduction(reduction)
  _check_gain(gain)
  t, _ = _tall(w, view)
  g = jnp.asarray(gain, t.dtype)[..., None, None]
  return _squared_frobenius(_residual(t, 1.0 / jnp.square(g)), reduction)
