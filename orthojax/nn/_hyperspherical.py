"""Hyperspherical coordinates: angles θ ∈ R^{n−1} <-> unit directions u ∈ S^{n−1}.

The geometric parameterization (GmP) of a ReLU unit writes its weight
direction in hyperspherical coordinates (Chen & Ge, "Neural characteristic
activation value analysis for improved ReLU network feature learning",
eq. 10 and appendix eq. 17)::

  u_1 = cos θ_1
  u_k = (∏_{j<k} sin θ_j) cos θ_k        1 < k < n
  u_n =  ∏_{j<n} sin θ_j

Angles lie along one axis (``axis``, default the last); every other axis is a
batch axis. :func:`angles_to_direction` maps ``(..., n−1)`` angles to
``(..., n)`` directions, :func:`direction_to_angles` the reverse, with
θ_1..θ_{n−2} ∈ [0, π] and the last angle θ_{n−1} ∈ (−π, π] covering the whole
circle.

Numerics (fan-in up to thousands, e.g. 3·3·512 = 4608 in ResNet-50):

* The prefix product ``P_k = ∏_{j<k} sin θ_j`` (over the *inner* angles
  θ_1..θ_{n−2}; the last angle only ever multiplies once, directly) is
  ``sign_k · exp(Σ_{j<k} log|sin θ_j|)``. Every log-sine is ≤ 0, so the
  absolute error of a partial sum ``L_k`` is ``O(ε |L_k|)`` and that of
  ``exp(L_k)`` is ``O(ε |L_k| e^{L_k}) ≤ O(ε)``: each entry is accurate to a
  few ulps *of the unit vector* at any fan-in, and entries whose exact value
  is below float32's range come out 0 (the correctly rounded answer).
* ``log|sin θ|`` itself: near θ = π/2 (the typical inner angle of a random
  direction in high dimension) ``sin θ`` rounds to within 3e-8 of 1, and the
  log of the rounded value is off by that much *absolutely*; summed over
  4608 angles that costs ~1e-5 in ``‖u‖``. There ``½ log1p(−cos² θ)`` is used
  instead (cos θ is small and accurate), so ``‖u‖ = 1`` holds to float32
  round-off (≈1e-7, tested at fan-in 4608 for random and adversarial angles)
  with no renormalization. A naive float32 ``cumprod`` of sines has the same
  rounding problem (``‖u‖`` off by ~5e-6 for random directions, ~4e-5 for
  angles near π/2 at fan-in 4608), and a naive ``exp(cumsum(log|sin|))``
  also meets ``log 0 = −inf`` and returns NaN gradients at ``sin θ_j = 0``.
* ``|sin θ_j|`` is clamped below at ``sqrt(finfo.tiny)`` (≈1e-19 in float32)
  before the log. This changes the value only where an exact entry is below
  1e-19 (invisible next to the unit norm). It matters for the derivative,
  which is written with the ratio ``u_k / sin θ_j`` so that it is one
  cumulative sum: with the clamp the ratio stays exact, so the gradient is
  *correct*, not only finite, at ``θ_j ∈ {0, π}``, where the true
  derivative ``∂u_k/∂θ_j = cos θ_j ∏_{i<k, i≠j} sin θ_i · cos θ_k`` is
  non-zero. Unclamped, the ratio is 0/0 there: NaN, or zero if guarded, and
  a unit started at ``u = e_1`` (e.g. from a sparse kernel) would never move.
* The derivative is a ``jax.custom_jvp`` (forward and reverse mode, vmap,
  Hessians): ``du_k = u_k Σ_{j<k} (cos θ_j / s̃_j) dθ_j + ∂u_k/∂θ_k dθ_k``
  with ``s̃_j`` the clamped signed sine; dividing by the clamped sine is
  exact in the ratio ``u_k / s̃_j`` because ``u_k`` carries the same factor.
  The tangent is linear and built from the same blocked scan, so JAX's
  transpose (the gradient) is one reverse scan: O(n) per unit, like the value.
* Speed. GmPDense is benchmarked against a Dense layer on CPU, where the
  direction map's O(mn) memory passes compete with an O(Bmn) matmul.
  XLA:CPU evaluates ``sin``/``cos`` as scalar library calls (≈10 ns per
  element — for a 1024² angle matrix as much as the whole 256×1024×1024
  matmul) and ``cumsum`` as a rewritten ``reduce_window`` (~8× a memory
  pass). So float32 angles use a vectorizable ``sincos`` (Cody–Waite
  reduction by π/2 and the classic minimax polynomials; ``|error| ≤ 1e-7`` for
  ``|θ| ≤ 8192``, tested; beyond, about ``|θ|·3e-11``, below the float32 spacing of
  θ there), and cumulative sums are blocked triangular matmuls
  (``_cumsum``; full float32 precision requested so TPUs/GPUs do not
  round through bf16/TF32). Padding is applied at the start of elementwise
  chains, never the end, which XLA:CPU would evaluate unvectorized. float64
  (``jax_enable_x64``) uses ``jnp.sin``/``jnp.cos``.

Fan-in 1: ``S^0 = {−1, +1}`` has no angles. With zero angles the formula
gives ``u_1 = ∏_{j<1} sin θ_j = 1`` (the empty product); callers that need a
sign (``GmPDense`` with ``in_features=1``) keep it as a separate, fixed
sign — the paper's 1-D units likewise have θ ∈ {0, π} only.

References:
  Wenlin Chen and Hong Ge, "Neural characteristic activation value analysis
  for improved ReLU network feature learning" (GmP), eq. 10, 15, Theorem 3
  and appendix B.
  W. J. Cody and W. Waite, "Software Manual for the Elementary Functions",
  Prentice-Hall, 1980 (argument reduction).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_BLOCK = 16  # block length of the blocked cumulative sum
_DENSE_BLOCKS = 256  # up to this many blocks, block offsets by one dense matmul

# Cody-Waite split of pi/2: the first two parts have few significant bits, so
# ``j * _PIO2_A`` and ``j * _PIO2_B`` are exact for |j| < 2^12 (|theta| < 6400)
# and nearly so up to 8192.
_PIO2_A = np.float32(1.5703125)
_PIO2_B = np.float32(4.837512969970703125e-4)
_PIO2_C = np.float32(7.54978995489188216e-8)
_TWO_OVER_PI = np.float32(2.0 / np.pi)
# Minimax polynomials on [-pi/4, pi/4]: sin r = r + r^3 S(r^2), cos r = 1 - r^2/2 + r^4 C(r^2).
_S = tuple(np.float32(c) for c in (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4))
_C = tuple(np.float32(c) for c in (4.166664568298827e-2, -1.388731625493765e-3,
                                   2.443315711809948e-5))


def _compute_dtype(dtype) -> jnp.dtype:
  """At least float32: bf16/f16 angles lose too much (ulp(π/2) ≈ 1e-2)."""
  return jnp.promote_types(dtype, jnp.float32)


def sincos(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(sin x, cos x)``; vectorizable polynomials for float32 (see module doc).

  For float32 the absolute error is ≤ 1e-7 for |x| ≤ 8192. Other dtypes use
  ``jnp.sin``/``jnp.cos``.
  """
  if x.dtype != jnp.float32:
    return jnp.sin(x), jnp.cos(x)
  j = jnp.round(x * _TWO_OVER_PI)
  r = ((x - j * _PIO2_A) - j * _PIO2_B) - j * _PIO2_C  # r in [-pi/4, pi/4]
  z = r * r
  s = r + r * z * (_S[0] + z * (_S[1] + z * _S[2]))
  c = 1.0 - 0.5 * z + z * z * (_C[0] + z * (_C[1] + z * _C[2]))
  q = j.astype(jnp.int32)
  swap = (q & 1) == 1  # odd quadrant: sin <-> cos
  sin = jnp.where(swap, c, s)
  cos = jnp.where(swap, s, c)
  sin = jnp.where((q & 2) == 2, -sin, sin)  # quadrants 2, 3
  cos = jnp.where(((q + 1) & 2) == 2, -cos, cos)  # quadrants 1, 2
  return sin, cos


def _cumsum(x: jax.Array) -> jax.Array:
  """Inclusive cumulative sum along the last axis of a 2-D array, blocked.

  ``x.shape[1]`` must be at most ``B = _BLOCK`` or a multiple of it. Inside
  blocks: one ``(rows·nb, B) @ (B, B)`` triangular matmul (contracting the
  contiguous axis, so no transposes); the block totals get an exclusive scan
  (a dense strictly-triangular matmul up to 256 blocks, else recursively)
  and are added back. O(B · size) flops and a few passes over memory, built
  from reshapes, matmuls, slices and broadcasts only, so JAX's automatic
  transpose (the reverse-mode scan) is as cheap as the scan itself.
  """
  m, n = x.shape
  hi = lax.Precision.HIGHEST
  if n <= _BLOCK:
    return jnp.matmul(x, jnp.triu(jnp.ones((n, n), x.dtype)), precision=hi)
  if n % _BLOCK:
    raise ValueError(f"_cumsum needs a multiple of {_BLOCK} entries, got {n}")
  nb = n // _BLOCK
  xb = x.reshape(m, nb, _BLOCK)
  within = jnp.matmul(xb, jnp.triu(jnp.ones((_BLOCK, _BLOCK), x.dtype)), precision=hi)
  totals = within[..., -1]  # (a slice of the matmul: cheaper than a reduction on CPU)
  if nb <= _DENSE_BLOCKS:
    offsets = jnp.matmul(totals, jnp.triu(jnp.ones((nb, nb), x.dtype), k=1), precision=hi)
  else:
    padded = jnp.pad(totals, ((0, 0), (0, _padded_length(nb) - nb)))
    offsets = _cumsum(padded)[:, :nb] - totals
  return (within + offsets[..., None]).reshape(m, n)


def _padded_length(k: int) -> int:
  """Smallest length ``>= k`` that :func:`_cumsum` accepts."""
  return k if k <= _BLOCK else -(-k // _BLOCK) * _BLOCK


def _log_abs_sin(s: jax.Array, c: jax.Array, a: jax.Array) -> jax.Array:
  """``log|sin θ|`` to a few ulps, from sin, cos and ``a = max(|sin θ|, tiny)``.

  Near θ = π/2 (the typical angle of a random direction in high dimension)
  ``sin θ`` rounds to within 3e-8 of 1, and ``log`` of the rounded value is
  off by that much *absolutely* — summed over thousands of angles this costs
  ~1e-5 in ``‖u‖``. There ``log|sin θ| = ½ log1p(−cos² θ)`` is exact to
  round-off because ``cos θ`` is small and accurate. ``log1p`` is written
  with Kahan's trick ``log(y) · z / (y − 1)``, ``y = 1 + z``, since XLA:CPU's
  own ``log1p`` is a slow scalar call; a single ``log`` serves both branches.
  """
  near_half_pi = jnp.abs(c) < jnp.abs(s)
  z = -(c * c)
  y = 1.0 + z  # >= 1/2 on the near_half_pi branch
  y_is_one = y == 1.0
  # Written so that log and the division have one use each: XLA then fuses the
  # whole chain into its consumer instead of materializing it (and
  # recomputing sincos for every materialized piece).
  factor = jnp.where(near_half_pi, 0.5 * z / jnp.where(y_is_one, 1.0, y - 1.0), 1.0)
  lg = jnp.log(jnp.where(near_half_pi, y, a)) * factor
  return jnp.where(near_half_pi & y_is_one, 0.5 * z, lg)


def _forward(theta: jax.Array):
  """Directions and the residuals of their derivative; angles on the last axis.

  ``theta``: ``(m, N)`` with ``N = n − 1 ≥ 1``. Everything runs on one
  column layout of width ``L = _padded_length(n)`` (= n for the usual
  fan-ins, multiples of 16), 0-based column ``c`` standing for ``u_c``:

  * the scan input at column c is ``log|sin θ_{c−1}|`` for the *inner*
    angles (1 ≤ c ≤ N − 1) and 0 elsewhere, so the inclusive scan at c is
    ``log P_c = Σ_{j<c} log|sin θ_j|`` and column N repeats ``P_{N−1}``;
  * the own factor is ``cos θ_c`` (c < N) and ``sin θ_{N−1}`` (c = N):
    ``u_c = P_c · own_c``. The last angle never enters a logarithm or a
    clamp; only the inner ones (in [0, π] after a random init) do.

  Padding is applied to ``theta`` (the *start* of each elementwise chain) and
  the result is sliced at the end: a pad at the *end* of a chain makes
  XLA:CPU evaluate the whole chain unvectorized, several times slower.

  Returns:
    ``u`` (m, n) and the residuals ``(u_ext, w, q)`` on the layout:
    ``w_c = cos θ_{c−1} / s̃_{c−1}`` on inner slots (0 elsewhere) and
    ``q_c = ∂u_c/∂(own angle)`` (``−P_c sin θ_c``, and ``P_{N−1} cos θ_{N−1}``
    at c = N).
  """
  m, big_n = theta.shape
  n = big_n + 1
  width = _padded_length(n)
  col = lax.broadcasted_iota(jnp.int32, (m, width), 1)
  last = col == big_n
  inner = (col >= 1) & (col <= big_n - 1)
  t_shift = jnp.pad(theta, ((0, 0), (1, width - n)))  # column c holds θ_{c−1}
  t_own = jnp.pad(theta, ((0, 0), (0, width - big_n)))  # column c holds θ_c

  s_sh, c_sh = sincos(t_shift)
  tiny = np.sqrt(np.finfo(theta.dtype).tiny).astype(theta.dtype)
  a = jnp.maximum(jnp.abs(s_sh), tiny)
  neg = inner & (s_sh < 0)
  log_p = _cumsum(jnp.where(inner, _log_abs_sin(s_sh, c_sh, a), 0.0))
  w = jnp.where(inner, c_sh / jnp.where(neg, -a, a), 0.0)

  def signs(t_shift):  # (−1)^(number of negative inner sines before c); exact
    c = lax.broadcasted_iota(jnp.int32, t_shift.shape, 1)
    neg = (c >= 1) & (c <= big_n - 1) & (sincos(t_shift)[0] < 0)
    flips = _cumsum(neg.astype(theta.dtype))
    return 1.0 - 2.0 * (flips - 2.0 * jnp.floor(0.5 * flips))

  # Random-direction inits keep θ_1..θ_{n−2} in [0, π] and training rarely
  # leaves it: skip the second scan unless some inner angle comes within 1e-3
  # of [0, π]'s ends or leaves it (a conservative test on θ itself — one
  # reduction, no sines; inside the branch the signs are exact).
  half_pi = np.asarray(np.pi / 2, theta.dtype)
  is_inner = lax.broadcasted_iota(jnp.int32, theta.shape, 1) < big_n - 1
  maybe_neg = jnp.max(jnp.where(is_inner, jnp.abs(theta - half_pi), 0.0)) > half_pi - 1e-3
  sign = lax.cond(maybe_neg, signs, lambda _: jnp.ones_like(log_p), t_shift)

  s_own, c_own = sincos(jnp.where(last, t_shift, t_own))
  p = sign * jnp.exp(log_p)
  u = p * jnp.where(last, s_own, c_own)
  q = p * jnp.where(last, c_own, -s_own)
  return u[:, :n], (u, w, q)


def _tangent(res, dtheta):
  """``dθ -> du`` (linear): ``du_c = u_c Σ_{j<c, inner} w_j dθ_j + q_c dθ_own(c)``."""
  u, w, q = res
  m, big_n = dtheta.shape
  n, width = big_n + 1, u.shape[1]
  last = lax.broadcasted_iota(jnp.int32, (m, width), 1) == big_n
  d_shift = jnp.pad(dtheta, ((0, 0), (1, width - n)))
  d_own = jnp.pad(dtheta, ((0, 0), (0, width - big_n)))
  e = _cumsum(w * d_shift)
  return (u * e + q * jnp.where(last, d_shift, d_own))[:, :n]


@jax.custom_jvp
def _angles_to_direction_2d(theta: jax.Array) -> jax.Array:
  """``(m, n − 1)`` angles -> ``(m, n)`` unit rows (n ≥ 2)."""
  return _forward(theta)[0]


@_angles_to_direction_2d.defjvp
def _angles_to_direction_2d_jvp(primals, tangents):
  (theta,), (dtheta,) = primals, tangents
  u, res = _forward(theta)
  return u, _tangent(res, dtheta)


@functools.partial(jax.jit, static_argnames="axis")
def angles_to_direction(theta: jax.Array, axis: int = -1) -> jax.Array:
  """Unit direction ``u(θ) ∈ S^{n−1}`` from ``n − 1`` hyperspherical angles.

  ``u_1 = cos θ_1``, ``u_k = (∏_{j<k} sin θ_j) cos θ_k`` for ``1 < k < n``,
  ``u_n = ∏_{j<n} sin θ_j`` (GmP paper, eq. 10/17). Stable at any ``n`` in
  float32, exactly unit-norm up to round-off, with correct finite
  derivatives everywhere including ``θ_j ∈ {0, π}``; O(n) per direction
  (see the module docstring for how).

  Args:
    theta: angles, ``n − 1`` of them along ``axis``; other axes are batch
      axes. Any real angle is valid (the map is 2π-periodic in each angle).
      Computed in at least float32; the result has that dtype.
    axis: the angle axis. The direction has ``n`` entries along that axis.

  Returns:
    ``u`` with ``theta``'s shape except ``n`` along ``axis``. With zero
    angles (``n = 1``) this is all ones: the empty product (a sign must be
    kept separately, see the module docstring).
  """
  theta = jnp.asarray(theta)
  if not jnp.issubdtype(theta.dtype, jnp.floating):
    theta = theta.astype(jnp.float32)
  theta = theta.astype(_compute_dtype(theta.dtype))
  if theta.ndim == 0:
    raise ValueError("angles_to_direction needs an array with an angle axis, got a scalar")
  axis = axis % theta.ndim
  if theta.shape[axis] == 0:
    shape = list(theta.shape)
    shape[axis] = 1
    return jnp.ones(shape, theta.dtype)
  theta = jnp.moveaxis(theta, axis, -1)
  batch = theta.shape[:-1]
  u = _angles_to_direction_2d(theta.reshape(-1, theta.shape[-1]))
  return jnp.moveaxis(u.reshape(batch + u.shape[-1:]), -1, axis)


@functools.partial(jax.jit, static_argnames="axis")
def direction_to_angles(u: jax.Array, axis: int = -1) -> jax.Array:
  """Hyperspherical angles of the direction of ``u`` (inverse of :func:`angles_to_direction`).

  ``θ_k = atan2(‖u_{k+1:}‖, u_k)`` for ``k < n − 1`` (in [0, π]) and
  ``θ_{n−1} = atan2(u_n, u_{n−1})`` (in (−π, π], the full circle). ``u``
  need not be normalized: the angles of ``u / ‖u‖`` come out, so a raw
  Gaussian or Glorot sample converts directly. The tail norms
  ``‖u_{k:}‖`` are a reverse cumulative ``hypot`` (a scaled scan), so they
  neither underflow nor overflow where squares would (entries below 1e-19 in
  float32). Where a tail is exactly zero the remaining angles are 0 (any
  value would do; ``u = 0`` gives all-zero angles, i.e. ``e_1``). Meant for
  initialization and conversion; it is differentiable except where a tail
  norm is 0.

  Args:
    u: vectors with ``n`` entries along ``axis``; other axes are batch axes.
    axis: the vector axis.

  Returns:
    angles with ``n − 1`` entries along ``axis`` (none when ``n = 1``: the
    sign of a 1-vector is not an angle).
  """
  u = jnp.asarray(u)
  if u.ndim == 0:
    raise ValueError("direction_to_angles needs an array with a vector axis, got a scalar")
  u = u.astype(_compute_dtype(u.dtype) if jnp.issubdtype(u.dtype, jnp.floating) else jnp.float32)
  u = jnp.moveaxis(u, axis, -1)
  n = u.shape[-1]
  if n <= 1:
    return jnp.moveaxis(u[..., :0], -1, axis)
  tail = lax.associative_scan(jnp.hypot, u, reverse=True, axis=u.ndim - 1)  # ‖u_{k:}‖
  head = jnp.arctan2(tail[..., 1:-1], u[..., :-2])  # θ_1..θ_{n−2}
  last = jnp.arctan2(u[..., -1:], u[..., -2:-1])  # θ_{n−1}
  theta = jnp.concatenate([head, last], axis=-1)
  return jnp.moveaxis(theta, -1, axis)


@functools.partial(jax.jit, static_argnames="axis")
def metric_diagonal(theta: jax.Array, axis: int = -1) -> jax.Array:
  """Diagonal of the metric tensor of the hyperspherical chart (GmP Theorem 3).

  ``M = J_θᵀ J_θ = diag(m_1, …, m_{n−1})`` with ``m_i = ∏_{j<i} sin² θ_j``
  (so ``m_1 = 1`` and ``0 ≤ m_i ≤ 1``); to first order the angle between
  ``u(θ)`` and ``u(θ + ε)`` is ``‖ε‖_M = sqrt(Σ m_i ε_i²) ≤ ‖ε‖₂``.
  **Erratum:** the GmP paper's appendix eq. 19–20 writes ``m_aa`` as a *sum* of
  squared sines; the product (as in its eq. 13 and 21) is correct — a sum
  can exceed 1 and would break the bound.
  """
  theta = jnp.moveaxis(jnp.asarray(theta), axis, -1)
  theta = theta.astype(_compute_dtype(theta.dtype))
  s, _ = sincos(theta)
  m = jnp.cumprod(jnp.concatenate([jnp.ones_like(s[..., :1]), s[..., :-1] ** 2], -1), -1)
  return jnp.moveaxis(m, -1, axis)
