"""Newton–Schulz iterations for the orthogonal polar factor, matmuls only.

For ``X = U Σ Vᵀ`` (reduced SVD), the polar factor is ``polar(X) = U Vᵀ``: the
nearest matrix with orthonormal columns (tall X) or rows (wide X). An odd
polynomial ``p(x) = a x + b x³ + c x⁵`` acts on a matrix through its singular
values,

    p(X) = a X + b (X Xᵀ) X + c (X Xᵀ)² X = U p(Σ) Vᵀ,

so composing polynomials that drive every ``σ ∈ (0, 1]`` towards 1 drives X
towards ``U Vᵀ`` using only matrix products — no SVD, QR or inverse — which is
what accelerators do best (Higham, *Functions of Matrices*, SIAM 2008, ch. 8;
Björck & Bowie, SIAM J. Numer. Anal. 8(2), 1971).
"""

from __future__ import annotations

import functools
import numbers
import types
from typing import Any, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from orthojax.linalg._gram import SYMMETRIC_FROM, gram
from orthojax.linalg._matrix_view import check_float
from orthojax.linalg._matrix_view import compute_dtype
from orthojax.linalg._precision import at_precision, check_precision

Coeffs = tuple[float, float, float]
CoeffsLike = Union[str, Sequence[float], Sequence[Sequence[float]]]


class NSPreset(NamedTuple):
  """A named Newton–Schulz schedule.

  Attributes:
    coeffs: per-step ``(a, b, c)`` triples; step ``k`` uses
      ``coeffs[min(k, len(coeffs) - 1)]``, so the last triple repeats.
    steps: the default number of steps.
  """

  coeffs: tuple[Coeffs, ...]
  steps: int


# Polar Express, degree 5 (Amsel, Persson, Musco & Gower, "The Polar Express:
# Optimal Matrix Sign Methods and Their Application to the Muon Algorithm",
# arXiv:2505.16932, 2025, Algorithm 1). Each polynomial is the minimax-optimal
# odd quintic approximation of sign(x) on the interval the previous ones leave,
# starting from [1e-3, 1]; the last is the convergent (15x - 10x³ + 3x⁵)/8.
_PE_PUBLISHED = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
# Algorithm 1's safety factor 1.01: every polynomial but the last is evaluated
# at x / 1.01, i.e. (a, b, c) -> (a/1.01, b/1.01³, c/1.01⁵). Algorithm 1 also
# divides the input by 1.01 ‖X‖_F; that extra 1.01 is folded into the first
# step here (x / 1.01² in p₁) so that the Frobenius normalisation of
# :func:`newton_schulz` reproduces Algorithm 1 exactly.
_PE_SAFETY = 1.01


def _scaled(abc: Coeffs, s: float) -> Coeffs:
  a, b, c = abc
  return (a / s, b / s**3, c / s**5)


_POLAR_EXPRESS = (
    (_scaled(_PE_PUBLISHED[0], _PE_SAFETY**2),)
    + tuple(_scaled(abc, _PE_SAFETY) for abc in _PE_PUBLISHED[1:-1])
    + (_PE_PUBLISHED[-1],))

# Cubic: 24 steps. From Frobenius normalisation the smallest singular value
# starts at σ₀ = σ_min / ‖X‖_F ≥ 1 / (κ √p); the cubic grows small values by
# 1.5× per step and then converges quadratically. Reaching |σ − 1| < 1e-7
# (float32 round-off) takes 10 steps from σ₀ = 1e-1, 16 from 1e-2, 21 from
# 1e-3 and 27 from 1e-4; 24 steps cover σ₀ ≳ 3e-4, e.g. κ ≤ 100 at p = 100 or
# κ ≤ 10 at p = 1024.
NS_PRESETS: types.MappingProxyType[str, NSPreset] = types.MappingProxyType({
    # Keller Jordan (Muon, 2024): maximises p'(0) while keeping the iteration
    # bounded; does NOT converge — singular values end in ≈ [0.68, 1.2].
    "quintic": NSPreset(coeffs=((3.4445, -4.7750, 2.0315),), steps=5),
    # Classic Newton–Schulz p(x) = (3x − x³)/2: converges (quadratically near
    # 1) to the exact polar factor for σ ∈ (0, √3).
    "cubic": NSPreset(coeffs=((1.5, -0.5, 0.0),), steps=24),
    # Polar Express (see above): converges, and is the worst-case optimal
    # composition at every step count.
    "polar_express": NSPreset(coeffs=_POLAR_EXPRESS, steps=5),
})

_DEFAULT_TUPLE_STEPS = 5
# Python-unrolled up to this many steps (XLA sees straight-line matmuls);
# longer constant schedules run in a lax.fori_loop to keep compile time flat.
_MAX_UNROLL = 8


def _preset_names() -> str:
  return ", ".join(repr(k) for k in NS_PRESETS)


def _check_steps(steps: Any) -> int:
  if isinstance(steps, bool) or not isinstance(steps, numbers.Integral):
    raise TypeError(f"newton_schulz: steps must be a positive int or None, got {steps!r}")
  if steps < 1:
    raise ValueError(f"newton_schulz: steps must be >= 1, got {steps}")
  return int(steps)


def resolve_coeffs(coeffs: CoeffsLike = "quintic", steps: int | None = None) -> tuple[Coeffs, ...]:
  """The per-step ``(a, b, c)`` schedule that :func:`newton_schulz` runs.

  Args:
    coeffs: a name in :data:`NS_PRESETS`, one ``(a, b, c)`` triple (used at
      every step) or a sequence of triples (one per step). Must be concrete
      Python/numpy numbers (they are compiled in), not traced arrays.
    steps: number of steps; None for the preset's default (5 for a single
      user triple). For a sequence of triples it must be None or its length.

  Returns:
    A tuple of ``steps`` triples of Python floats.

  Raises:
    ValueError: unknown preset, malformed coefficients, steps inconsistent
      with a per-step sequence.
    TypeError: ``steps`` is not an int.
  """
  if steps is not None:
    steps = _check_steps(steps)
  if isinstance(coeffs, str):
    if coeffs not in NS_PRESETS:
      raise ValueError(
          f"newton_schulz: unknown coeffs={coeffs!r}; presets are {_preset_names()}, "
          "or pass an (a, b, c) tuple or a sequence of them (one per step).")
    preset = NS_PRESETS[coeffs]
    steps = preset.steps if steps is None else steps
    table = preset.coeffs
    return tuple(table[min(k, len(table) - 1)] for k in range(steps))
  try:
    arr = np.asarray(coeffs, dtype=np.float64)
  except (TypeError, ValueError) as e:
    raise ValueError(
        f"newton_schulz: coeffs must be a preset name ({_preset_names()}), an (a, b, c) "
        f"tuple or a sequence of (a, b, c) tuples; got {coeffs!r}") from e
  if arr.ndim == 1 and arr.shape[0] == 3:
    if not np.all(np.isfinite(arr)):
      raise ValueError(f"newton_schulz: coeffs must be finite, got {coeffs!r}")
    steps = _DEFAULT_TUPLE_STEPS if steps is None else steps
    return (tuple(float(v) for v in arr),) * steps
  if arr.ndim == 2 and arr.shape[1] == 3 and arr.shape[0] >= 1:
    if not np.all(np.isfinite(arr)):
      raise ValueError(f"newton_schulz: coeffs must be finite, got {coeffs!r}")
    if steps is not None and steps != arr.shape[0]:
      raise ValueError(
          f"newton_schulz: coeffs gives {arr.shape[0]} per-step triples but steps={steps}; "
          "pass steps=None or steps equal to the number of triples.")
    return tuple(tuple(float(v) for v in row) for row in arr)
  raise ValueError(
      f"newton_schulz: coeffs must have shape (3,) or (steps, 3), got shape {arr.shape}; "
      f"or use a preset: {_preset_names()}.")


def _ns_step(x: jax.Array, abc, precision, skip_quintic: bool, apply_twice: bool = False
             ) -> jax.Array:
  """One step ``X ← a X + (b A + c A²) X`` with ``A = X Xᵀ`` (X wide); ``apply_twice``:
  as ``a X + b (A X) + c A (A X)``, two products with ``X`` in place of ``A²``."""
  a, b, c = abc
  mm = functools.partial(jnp.matmul, precision=precision)
  x_gram, square = _symmetric(precision)
  a_k = x_gram(x)                                       # A = X Xᵀ
  if apply_twice and not skip_quintic:
    ax = mm(a_k, x)
    return a * x + b * ax + c * mm(a_k, ax)
  poly = b * a_k if skip_quintic else b * a_k + c * square(a_k)   # A² = A Aᵀ
  return a * x + mm(poly, x)


def _applies_twice(n: int, p: int, row_blocks: int = 1) -> bool:
  """Whether :func:`newton_schulz` applies ``A`` to ``X`` twice rather than forming
  ``A²``: when one product with a device's block of ``X`` (``p² ⌈n / row_blocks⌉``
  multiply-adds) costs less than the ``p x p`` square that every device repeats. Never
  for a whole matrix (``n ≥ p``); for rows split over more devices than ``n / p``."""
  n, p = max(n, p), min(n, p)
  return p * p * -(-n // row_blocks) < _gram_multiply_adds(p, p)


def _symmetric(precision):
  """``(X ↦ X Xᵀ, A ↦ A²)`` for a symmetric ``A``: :func:`orthojax.linalg.gram`'s three
  blocks (``A² = A Aᵀ``) from :data:`SYMMETRIC_FROM` rows on where ``precision`` is left to
  the enclosing scope (None, or a name applied around the iteration); below, and for a
  ``jax.lax.Precision`` passed per product, the plain products."""
  mm = functools.partial(jnp.matmul, precision=precision)
  blocks = lambda y: precision is None and y.shape[-2] >= SYMMETRIC_FROM
  x_gram = lambda x: gram(x) if blocks(x) else mm(x, jnp.swapaxes(x, -1, -2))
  square = lambda a: gram(a) if blocks(a) else mm(a, a)
  return x_gram, square


def _run_schedule(x, schedule, precision, skip_quintic, apply_twice=False):
  """Apply the steps: short schedules unrolled, long ones in lax loops.

  A schedule is a head of distinct triples followed by a repeated last triple
  (``"polar_express"`` beyond 8 steps, ``"cubic"``, a user triple). Up to
  ``_MAX_UNROLL`` steps in all are unrolled in Python (straight-line matmuls);
  otherwise the head is unrolled (or scanned, if long) and the repeated tail
  runs in a ``lax.fori_loop``, so compile time does not grow with ``steps``.
  """
  step = lambda y, abc: _ns_step(y, abc, precision, skip_quintic, apply_twice)
  if len(schedule) <= _MAX_UNROLL:
    for abc in schedule:
      x = step(x, abc)
    return x
  head = len(schedule)
  while head > 1 and schedule[head - 1] == schedule[head - 2]:
    head -= 1
  head -= 1  # schedule[head:] is the repeated tail (at least one step)
  if head <= _MAX_UNROLL:
    for abc in schedule[:head]:
      x = step(x, abc)
  else:
    table = jnp.asarray(schedule[:head], dtype=x.dtype)
    x, _ = jax.lax.scan(lambda y, abc: (step(y, tuple(abc)), None), x, table)
  return jax.lax.fori_loop(0, len(schedule) - head, lambda _, y: step(y, schedule[-1]), x)


def newton_schulz_multiply_adds(n: int, p: int, steps: int, *, gram: bool = False,
                                restart_every: int | None = None, cubic: bool = False,
                                row_blocks: int = 1) -> int:
  """Multiply-adds of :func:`newton_schulz`'s matrix products on one ``n × p`` matrix
  (either orientation: the iteration runs on its short side ``min(n, p)``), ``steps`` steps
  (``cubic``: no quintic term), as the standard iteration or on the Gram matrix
  (``gram``, ``restart_every``): what decides which of the two costs less. The symmetric
  products ``X Xᵀ`` and ``A²`` count three of their four blocks from
  :data:`~orthojax.linalg.SYMMETRIC_FROM` rows on (:func:`orthojax.linalg.gram`).
  ``row_blocks``: per device, for the rows split in that many blocks (the ``n``-long
  products divided, the ``p x p`` ones repeated, ``A²`` replaced by a second product
  with the block where that costs less)."""
  n, p = max(n, p), min(n, p)
  n = -(-n // row_blocks)                               # one device's rows
  square = 0 if cubic else _gram_multiply_adds(p, p)    # A² per step
  x_gram = _gram_multiply_adds(p, n)                    # A = X Xᵀ
  if not gram:
    return steps * (x_gram + n * p * p + min(square, n * p * p))
  total = x_gram + n * p * p                            # A_0 = X Xᵀ and X_K = Q_K X_0
  for k in range(steps):
    fresh = k == 0 or bool(restart_every and k % restart_every == 0)
    if fresh and k:
      total += n * p * p + x_gram                       # X_k = Q_k X_0 and its Gram anew
    total += square + (0 if fresh else p ** 3)          # A², then P Q (Q = P when fresh)
    if _continues(k + 1, steps, restart_every):
      total += 2 * p ** 3                               # A_{k+1} = P A P
  return total


def _continues(k: int, steps: int, restart_every: int | None) -> bool:
  """Whether step ``k`` of the Gram iteration reads ``A_k = P A P`` from the step before
  (not for the last step's successor, nor a restart, which forms its Gram matrix anew)."""
  return k < steps and not (restart_every and k % restart_every == 0)


def _gram_multiply_adds(m: int, n: int) -> int:
  """Multiply-adds of :func:`orthojax.linalg.gram` of an ``m × n`` matrix."""
  if m < SYMMETRIC_FROM:
    return m * m * n
  top, bottom = m // 2, m - m // 2
  return (top * top + top * bottom + bottom * bottom) * n


def _run_gram(x, schedule, precision, skip_quintic, restart_every):
  """The schedule on the Gram matrix of a wide ``x`` (``m ≤ n``): ``m × m`` products only
  between the first Gram product and the last product with ``x`` (:func:`newton_schulz`,
  ``gram=True``)."""
  mm = functools.partial(jnp.matmul, precision=precision)
  t = lambda y: jnp.swapaxes(y, -1, -2)
  x_gram, square = _symmetric(precision)
  eye = jnp.eye(x.shape[-2], dtype=x.dtype)
  gram, q = x_gram(x), None
  for k, (a, b, c) in enumerate(schedule):
    if restart_every and k and k % restart_every == 0:   # X_k = Q_k X_0 and its Gram anew
      x, q = mm(q, x), None
      gram = x_gram(x)
    poly = b * gram if skip_quintic else b * gram + c * square(gram)
    poly = poly + a * eye                                   # P_k = a I + b A_k + c A_k²
    q = poly if q is None else mm(poly, q)                  # Q_{k+1} = P_k Q_k
    if _continues(k + 1, len(schedule), restart_every):
      gram = mm(poly, mm(gram, poly))                       # A_{k+1} = P_k A_k P_k
  return x if q is None else mm(q, x)


def newton_schulz(
    x: jax.Array,
    steps: int | None = None,
    coeffs: CoeffsLike = "quintic",
    *,
    eps: float = 1e-7,
    normalize: bool = True,
    precision: jax.lax.PrecisionLike = None,
    gram: bool = False,
    restart_every: int | None = None,
    row_blocks: int = 1,
) -> jax.Array:
  r"""Approximate the orthogonal polar factor ``U Vᵀ`` of ``x = U Σ Vᵀ``.

  Matrices lie on the last two axes; leading axes are batch axes (numpy
  convention). Each matrix is first scaled to unit Frobenius norm, so that
  every singular value lies in ``(0, 1]``,

  .. math::
    X_0 = X / (\|X\|_F + \epsilon),

  then each step applies an odd polynomial to the singular values,

  .. math::
    X_{k+1} = a_k X_k + (b_k A_k + c_k A_k^2) X_k, \qquad A_k = X_k X_k^\top,

  i.e. ``σ ← a σ + b σ³ + c σ⁵``. ``A`` is formed on the *smaller* side: a
  tall input is transposed first (the iteration commutes with transposition,
  ``p(Xᵀ) = p(X)ᵀ``), so for an ``n × p`` input with ``n ≥ p`` a step costs
  ``4 n p² + 2 p³`` flops: a ``4096 × 1024`` matrix costs 3× the flops of a
  ``1024 × 1024`` one (``18 p³`` vs ``6 p³``), not the ≈ 32× of forming the
  ``4096 × 4096`` Gram.

  ``gram=True`` runs the same iteration on the ``p × p`` Gram matrix (Gram
  Newton–Schulz: microsoft/dion's default backend; its authors report up to 2× faster
  orthogonalization on rectangular matrices). Every iterate is ``X_k = Q_k X_0`` with
  ``Q_k`` a polynomial in ``A_0 = X_0 X_0ᵀ``, so with ``P_k = a_k I + b_k A_k + c_k A_k²``

  .. math::
    Q_{k+1} = P_k Q_k, \qquad A_{k+1} = P_k A_k P_k, \qquad X_K = Q_K X_0,

  the same iterates in exact arithmetic, for ``2 n p² + (4K − 3) p³`` multiply-adds
  (``Q_1 = P_0``; the last step needs no ``A_K``) instead of ``K (2 n p² + p³)``: fewer
  once ``n`` exceeds ``1.5 p`` for ``K = 5`` (a ``4608 × 512`` conv kernel: 2.7× fewer),
  more for square matrices.
  ``restart_every=r`` forms ``X_k`` and its Gram matrix anew every ``r`` steps, which
  bounds the rounding the ``Q`` products accumulate (the authors restart in bfloat16);
  the step before a restart then skips ``A_{k+1}``. With ``r = 2`` and ``K = 5`` (Muon's) the
  Gram iteration costs less once ``n`` exceeds about ``1.5 p`` (``1.7 p`` from
  :data:`~orthojax.linalg.SYMMETRIC_FROM` columns), 1.46× less on a 3 × 3 conv kernel.

  Presets (:data:`NS_PRESETS`):

  * ``"quintic"`` — Keller Jordan's ``(3.4445, −4.7750, 2.0315)``, 5 steps
    (Jordan et al., "Muon: An optimizer for hidden layers in neural
    networks", 2024). Chosen for a steep slope at 0, it does *not* converge:
    singular values end in about ``[0.68, 1.2]``. Good for Muon updates, not
    for retractions. Identical to ``optax.contrib``'s default
    ``orthogonalize_via_newton_schulz``.
  * ``"cubic"`` — classic Newton–Schulz ``(1.5, −0.5, 0)``,
    ``σ ← (3σ − σ³)/2``; converges to the exact polar factor for every
    ``σ ∈ (0, √3)``, quadratically near 1. Default 24 steps: from Frobenius
    normalisation ``σ_min`` starts at ``≥ 1/(κ √p)``; small values grow by
    1.5× per step, and ``|σ − 1| < 1e-7`` is reached in 16 steps from
    ``1e-2``, 21 from ``1e-3`` and 24 from ``3e-4`` (κ ≲ 100 at p = 100,
    κ ≲ 10 at p = 1024); worse-conditioned inputs need more steps. The
    quintic term is skipped (one matmul per step fewer).
  * ``"polar_express"`` — per-step minimax-optimal quintics of Amsel, Persson,
    Musco & Gower, "The Polar Express" (arXiv:2505.16932, 2025),
    Algorithm 1: the 8 published triples designed for ``σ ∈ [1e-3, 1]``,
    with the paper's safety factor 1.01 (``(a, b, c) → (a/1.01, b/1.01³,
    c/1.01⁵)`` on all but the last triple, and the paper's extra 1/1.01 input
    scaling folded into the first); from step 8 on the last triple
    ``(15, −10, 3)/8`` repeats. Default 5 steps (max ``|σ − 1| ≈ 0.16`` for
    ``σ₀ ≥ 1e-3``, against ``≈ 0.53`` for ``"quintic"``); 7 steps give
    ``≈ 1e-5`` and 8 converge in float32.

  Args:
    x: ``(..., m, n)`` floating array.
    steps: number of iterations; None for the preset's default (5 for a user
      triple). For a per-step sequence, None or its length.
    coeffs: a preset name, one ``(a, b, c)`` triple used at every step, or a
      sequence of triples (one per step). Concrete numbers, not traced.
    eps: added to the Frobenius norm, so a zero matrix maps to zero.
    normalize: scale by the Frobenius norm first. Pass False only when the
      singular values are already in the iteration's basin — for ``"cubic"``
      ``(0, √3)``, e.g. a retraction of ``W + ξ`` with ``W`` orthonormal and a
      small tangent step ``ξ`` (``σ ≈ 1 ± ‖ξ‖₂``), where 3–5 steps reach
      float32 accuracy instead of 20+.
    precision: of the products: a name of :data:`orthojax.linalg.PRECISIONS`
      (:func:`orthojax.linalg.at_precision`: ``"highest"`` when the result must be
      orthonormal to float32 accuracy, ``"bf16"`` as Muon's authors run it on tensor
      cores, emulated on a CPU), or None / a ``jax.lax.Precision`` passed to every
      ``jnp.matmul`` (None: the enclosing default — on GPUs and TPUs the default
      float32 product may use TF32 or bfloat16 passes).
    gram: iterate on the Gram matrix (above); the schedule is unrolled whatever its
      length.
    restart_every: with ``gram``, form the iterate and its Gram matrix anew every this
      many steps (None: never).
    row_blocks: in how many blocks the long side of ``x`` lies on as many devices
      (``MatrixView.row_blocks``; the compiler partitions the
      products, all-reducing ``A``). Where a device's block is shorter than the short
      side (``p² n / row_blocks < p³``), each step computes ``a X + b (A X) + c A (A X)``:
      the same polynomial with two products of the block in place of ``A²``, which
      every device would repeat (``p³`` each, against ``2 p² n / row_blocks``). Not
      used with ``gram``, whose iteration is all ``p x p``.

  Returns:
    Array of ``x``'s shape and dtype. The norm is computed in float32 (or
    wider) for every input dtype; the iteration itself runs in ``x``'s dtype,
    like ``optax.contrib.muon``: bfloat16 inputs iterate with bfloat16
    matmuls (the fast path on accelerators) and are accurate to bfloat16
    round-off (~1e-2), not to the polynomial's convergence — cast to float32
    first for a retraction.

  Raises:
    TypeError: ``x`` is not floating point, or ``steps`` is not an int.
    ValueError: ``x.ndim < 2``, an unknown preset or malformed coefficients.
  """
  check_float(x, "newton_schulz input")
  x = jnp.asarray(x)
  if x.ndim < 2:
    raise ValueError(
        f"newton_schulz needs a matrix (..., m, n) with ndim >= 2, got shape {x.shape}")
  schedule = resolve_coeffs(coeffs, steps)
  dtype = x.dtype
  if normalize:
    xc = x.astype(compute_dtype(dtype))
    norm = jnp.sqrt(jnp.sum(jnp.square(xc), axis=(-2, -1), keepdims=True))
    x = (xc / (norm + eps)).astype(dtype)
  transposed = x.shape[-2] > x.shape[-1]
  if transposed:
    x = jnp.swapaxes(x, -1, -2)
  skip_quintic = all(c == 0.0 for _, _, c in schedule)
  if restart_every is not None and (not gram or int(restart_every) < 1):
    raise ValueError(f"newton_schulz: restart_every={restart_every!r} needs gram=True and "
                     f"an int >= 1")
  if (isinstance(row_blocks, bool) or not isinstance(row_blocks, numbers.Integral)
      or row_blocks < 1):
    raise ValueError(f"newton_schulz: row_blocks={row_blocks!r}; pass a positive int (1 for a "
                     f"whole matrix)")
  twice = _applies_twice(*x.shape[-2:], int(row_blocks))
  if isinstance(precision, str):
    check_precision("newton_schulz", precision)
    run = _run_gram if gram else _run_schedule
    args = (schedule, None, skip_quintic) + ((restart_every,) if gram else (twice,))
    x = at_precision(lambda y: run(y, *args), precision)(x)
  elif gram:
    x = _run_gram(x, schedule, precision, skip_quintic, restart_every)
  else:
    x = _run_schedule(x, schedule, precision, skip_quintic, twice)
  if transposed:
    x = jnp.swapaxes(x, -1, -2)
  return x
