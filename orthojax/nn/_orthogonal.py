"""Orthogonal layers by parametrization: ``W = g · Q(θ) · D``, rebuilt each call.

The kernel is never stored. An unconstrained (Euclidean) *generator* θ is
mapped onto the orthogonal group O(n) on every call, so any optimizer (SGD,
Adam, ...) trains the layer while ``W`` stays exactly orthogonal (up to
round-off), with no projection, retraction or penalty. This is the
alternative to :class:`orthojax.nn.StiefelParam` + a Riemannian optimizer:
it pays the map θ ↦ Q per forward/backward pass instead of a retraction per
optimizer step.

Shapes (the matrix-view convention of :mod:`orthojax.linalg`): the kernel's
matrix view is ``(fan_in, fan_out)`` — Dense ``(in, out)``; Conv
``(*kernel_size, cin, cout)`` → ``(prod(kernel_size)·cin, cout)``. With
``n = max(fan_in, fan_out)`` and ``p = min(fan_in, fan_out)`` the layer
builds the first ``p`` columns of an ``n × n`` orthogonal ``Q`` and uses them
on the tall side: the view is
``Q[:, :p]`` (orthonormal *columns*, ``WᵀW = g² I``) when ``fan_in ≥ fan_out``
and ``Q[:, :p]ᵀ`` (orthonormal *rows*, ``WWᵀ = g² I``) otherwise.

Parametrizations (``A`` is the skew matrix whose strictly-upper triangle is
θ, ``D = diag(signs)`` a fixed ±1 diagonal, see below):

* ``"cayley"``: ``Q = (I + A)⁻¹ (I − A) D``, one LU solve with ``p``
  right-hand sides (never an explicit inverse). ``I + A`` is invertible for
  every skew ``A`` (eigenvalues ``1 + iλ``), but the Cayley map alone cannot
  reach orthogonal matrices with eigenvalue −1; the fixed ``D`` (Helfrich et
  al.'s *scaled* Cayley transform) makes them reachable: ``Q`` is reached
  iff ``QD⁻¹`` has no eigenvalue −1. Cost per call
  O(n³) (LU) + O(n² p). Gradients fade as an eigenvalue of ``QD⁻¹``
  approaches −1 (``‖A‖ → ∞``).
* ``"expm"``: ``Q = expm(A) D`` (:func:`jax.scipy.linalg.expm`, Padé with
  scaling and squaring). ``expm`` maps so(n) onto SO(n), with no
  singularity; ``D`` picks the component of O(n) for square layers. Cost per
  call O(n³) times a small constant (about 6–10 n×n matmuls plus one solve,
  more squarings as ‖A‖ grows); the most expensive map here, with the best
  behaved gradients (expRNN).
* ``"householder"``: ``Q = H_1 H_2 ⋯ H_k D`` with ``H_i = I − 2 v_i v_iᵀ /
  ‖v_i‖²`` (``v_i`` = row i of the generator; a zero row acts as ``I``).
  Applied right to left to the ``p`` needed columns of ``D``, O(n p) per
  reflection: O(k n p) per call, never an n×n product. ``k`` =
  ``num_reflections``, default ``p`` — enough to reach every ``n × p``
  matrix with orthonormal columns (Householder QR of one needs ``p``
  reflections); for square layers products of ``n`` reflections have
  determinant (−1)ⁿ and ``D`` picks the component. ``k`` steps run in
  sequence (latency-bound on accelerators for large ``k``).
* ``"givens"``: ``Q = R_m ⋯ R_2 R_1 D``, one rotation per pair ``i < j``
  (n(n−1)/2 angles) grouped into ``m`` rounds of disjoint pairs by the
  round-robin tournament (circle) schedule — see ``givens_rounds``;
  the rotations inside a round commute and run as one vectorised gather.
  The rotation of pair ``(i, j)`` by ``t`` maps ``e_i ↦ cos t e_i + sin t
  e_j``, ``e_j ↦ −sin t e_i + cos t e_j``. Cost per call O(n² p) in ``m =
  n − 1`` (n even) or ``n`` (n odd) sequential rounds. Every pair appears
  once, so the parameter count is dim SO(n) and the map has a full-rank
  Jacobian at generic angles; random SO(n) targets were all reached by
  least squares in our checks (n ≤ 6), but unlike the sequential
  Euler-angle order we have no proof that this order covers all of SO(n).
  Products of rotations lie in SO(n); ``D`` picks the component.

The sequential maps (Householder, Givens) are differentiated through a
√k-block checkpointed scan: backward memory O(√k · n p) instead of
O(k · n p), at the price of one extra forward pass. All maps support forward
and reverse mode and run in at least float32.

Parameters (all Euclidean — none of them has a matrix view, so do not give
them to Stiefel/Oblique optimizers or orthogonality penalties; train them
with any optax optimizer as ordinary ``nnx.Param`` leaves):

* ``generator``: cayley / expm: ``(n(n−1)/2,)``, the strictly-upper triangle
  of ``A`` in row-major order (``np.triu_indices(n, 1)``), so every degree of
  freedom of so(n) is stored once (no dead lower half). givens: the same
  length and pair order, entry ``k`` the angle of pair
  ``np.triu_indices(n, 1)[·][k]``. householder: ``(k, n)``, one reflection
  vector per row.
* ``signs``: ``D``'s diagonal, ``(n,)``, a fixed ±1 ``nnx.Variable`` (not
  trained — a sign cannot move continuously); only its first ``p`` entries
  act.
* ``gain``: scalar ``g``: an ``nnx.Param`` when ``learn_gain=True``, else a
  fixed ``nnx.Variable``.
* ``bias``: ``(fan_out,)`` ``nnx.Param`` (zeros), when ``use_bias``.

Logical sharding (:mod:`orthojax.nn.sharding`): generators and signs are
replicated (``None`` axes): every call needs the whole generator (one solve,
one exponential, one sequential product), so sharding it buys nothing; the
bias is ``("fan_out",)``.

Initialization (``init="random"``, default) — Haar-distributed ``Q`` in
each parametrization's coordinates, ``W`` below a Haar sample
(:func:`orthojax.linalg.qr_orthonormalize` of a Gaussian):

* cayley: ``D`` by Kahan's sign rule (the pivots of ``D + W`` in unpivoted
  Gaussian elimination are chosen ≥ 1 in magnitude, so ``I + WD = (D + W)D``
  is safely invertible) and ``A = (I + WD)⁻¹(I − WD)``: exact, ``Q = W``.
* expm: ``A = U blockdiag(θ_k J) Uᵀ`` with ``θ_k`` the eigenangles of a Haar
  rotation and ``U`` an independent Haar sample, ``D = diag(1, …, 1, ±1)``
  with a fair random sign: ``Q`` is exactly Haar-distributed on O(n) (Haar
  measure on SO(n) is invariant under conjugation), though not equal to a
  given sample — a matrix logarithm of one is ill-conditioned near
  eigenvalue −1 and is avoided.
* householder: the Householder QR of ``W``'s first ``max(k, p)`` columns
  (``v_i = x + sign(x_i)‖x‖e_i``, always a genuine reflection), ``D`` the
  resulting ±1 diagonal: the first ``min(k, p)`` columns equal ``W``'s —
  exact for the default ``k = p``.
* givens: angles uniform in [−π, π) and ``D = diag(1, …, 1, ±1)`` with a
  fair random sign: a random orthogonal matrix that is *not* Haar (for
  n = 3 its entry law is visibly off; n − 1 rounds of random rotations mix
  toward Haar as n grows).

``init="identity"``: ``Q = I`` (zero generators, ``D = I``; Householder:
``v_i = e_i`` and ``D = diag(−1 (k times), 1, …)``).

When to use which: ``expm`` for the best-conditioned optimisation at
moderate n (matmul-heavy, accelerator friendly); ``cayley`` for the same
coverage at about half the cost (one LU), when eigenvalues near −1 are not
needed (``D`` fixed); ``householder`` for tall layers with small ``p`` (O(n
p²) at ``k = p``) or a cheap low-``k`` subset of O(n); ``givens`` when a
rotation-angle parametrization is wanted (EUNN-style), with n − 1 parallel
rounds instead of ``k`` sequential reflections.

References:
  Kyle Helfrich, Devin Willmott and Qiang Ye, "Orthogonal recurrent neural
  networks with scaled Cayley transform", ICML 2018 (scaled Cayley, ``D``).
  Mario Lezcano-Casado and David Martínez-Rubio, "Cheap orthogonal
  constraints in neural networks: a simple parametrization of the orthogonal
  and unitary group", ICML 2019 (expRNN, ``expm`` of a skew matrix).
  Zakaria Mhammedi, Andrew Hellicar, Ashfaqur Rahman and James Bailey,
  "Efficient orthogonal parametrisation of recurrent neural networks using
  Householder reflections", ICML 2017.
  Li Jing, Yichen Shen, Tena Dubček, John Peurifoy, Scott Skirlo, Yann LeCun,
  Max Tegmark and Marin Soljačić, "Tunable efficient unitary neural networks
  (EUNN) and their application to RNNs", ICML 2017 (Givens rotations).
  William Kahan, "Is there a small skew Cayley transform with zero
  diagonal?", Linear Algebra Appl. 417 (2006) (the sign rule for ``D``).
  G. W. Stewart, "The efficient generation of random orthogonal matrices
  with an application to condition estimators", SIAM J. Numer. Anal. 17(3),
  1980 (Haar samples through Householder reflections).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.nn import dtypes
from jax import lax

from orthojax import linalg
from orthojax.nn import _conv
from orthojax.nn import sharding
from orthojax.nn._checks import check_choice
from orthojax.nn._checks import check_positive_int

PARAMETRIZATIONS = ("cayley", "expm", "householder", "givens")
"""Accepted ``parametrization`` names."""

INITS = ("random", "identity")
"""Accepted ``init`` names."""

_REPLICATED1 = (None,)


# ----------------------------------------------------------------- validation


def _num_reflections(num_reflections: int | None, parametrization: str, n: int, p: int) -> int:
  if parametrization != "householder":
    if num_reflections is not None:
      raise ValueError(f"num_reflections applies to parametrization='householder' only, "
                       f"got num_reflections={num_reflections!r} with "
                       f"parametrization={parametrization!r}")
    return 0
  if num_reflections is None:
    return p
  k = check_positive_int(num_reflections, "num_reflections")
  if k > n:
    raise ValueError(f"num_reflections={k} exceeds n = max(fan_in, fan_out) = {n}: products of "
                     "more than n reflections add nothing (Cartan–Dieudonné)")
  return k


# ------------------------------------------------------------- the four maps


def num_generators(parametrization: str, n: int, k: int = 0) -> tuple[int, ...]:
  """Shape of the generator for an ``n × n`` orthogonal ``Q`` (``k`` reflections)."""
  check_choice(parametrization, PARAMETRIZATIONS, "parametrization")
  if parametrization == "householder":
    return (k, n)
  return (n * (n - 1) // 2,)


def skew_from_packed(theta: jax.Array, n: int) -> jax.Array:
  """The skew ``n × n`` matrix ``A`` with ``A[triu_indices(n, 1)] = θ``."""
  rows, cols = np.triu_indices(n, 1)
  upper = jnp.zeros((n, n), theta.dtype).at[rows, cols].set(theta)
  return upper - upper.T


def packed_from_skew(a: jax.Array) -> jax.Array:
  """The strictly-upper triangle of ``a`` (row-major), inverse of :func:`skew_from_packed`."""
  rows, cols = np.triu_indices(a.shape[-1], 1)
  return a[rows, cols]


def cayley_columns(theta: jax.Array, signs: jax.Array, p: int) -> jax.Array:
  """First ``p`` columns of ``(I + A)⁻¹(I − A) D`` by one LU solve: ``(n, p)``."""
  n = signs.shape[0]
  a = skew_from_packed(theta, n)
  eye = jnp.eye(n, dtype=a.dtype)
  q = jnp.linalg.solve(eye + a, eye[:, :p] - a[:, :p])
  return q * signs[:p]


def expm_columns(theta: jax.Array, signs: jax.Array, p: int) -> jax.Array:
  """First ``p`` columns of ``expm(A) D``: ``(n, p)``."""
  n = signs.shape[0]
  q = jax.scipy.linalg.expm(skew_from_packed(theta, n))
  return q[:, :p] * signs[:p]


def _remat_scan(step, carry: jax.Array, xs: Any, identity: Any) -> jax.Array:
  """``lax.scan(step, carry, xs)`` (final carry only) with √m-block checkpointing.

  The m steps are grouped in ~√m blocks whose inner scans are rematerialised
  in the backward pass, so only the ~√m block boundaries are stored. ``xs``
  is padded with ``identity`` (a step that leaves the carry unchanged).
  """
  m = jax.tree.leaves(xs)[0].shape[0]

  def body(c, x):
    return step(c, x), None

  if m <= 4:
    return lax.scan(body, carry, xs)[0]
  block = math.isqrt(m - 1) + 1
  blocks = -(-m // block)
  pad = blocks * block - m

  def padded(x, e):
    x = jnp.concatenate([x, jnp.broadcast_to(jnp.asarray(e, x.dtype), (pad,) + x.shape[1:])])
    return x.reshape((blocks, block) + x.shape[1:])

  xs = jax.tree.map(padded, xs, identity)

  @functools.partial(jax.checkpoint, prevent_cse=False)
  def outer(c, blk):
    return lax.scan(body, c, blk)[0], None

  return lax.scan(outer, carry, xs)[0]


def _reflect(x: jax.Array, v: jax.Array) -> jax.Array:
  """``(I − 2 v vᵀ/‖v‖²) x``; ``v = 0`` acts as the identity (no NaN, zero gradient)."""
  vv = jnp.sum(v * v)
  nonzero = vv > 0
  coef = jnp.where(nonzero, 2.0 / jnp.where(nonzero, vv, 1.0), 0.0)
  return x - (coef * v)[:, None] * (v @ x)[None, :]


def householder_columns(vectors: jax.Array, signs: jax.Array, p: int) -> jax.Array:
  """First ``p`` columns of ``H_1 ⋯ H_k D`` (``H_i`` from row i of ``vectors``): ``(n, p)``.

  Applied right to left to ``D``'s first ``p`` columns, O(n p) per reflection.
  """
  n = signs.shape[0]
  x = jnp.eye(n, p, dtype=vectors.dtype) * signs[:p]
  return _remat_scan(_reflect, x, vectors[::-1], jnp.zeros((n,), vectors.dtype))


@functools.lru_cache(maxsize=None)
def givens_rounds(n: int) -> tuple[tuple[tuple[int, int], ...], ...]:
  """The documented Givens order: round-robin tournament rounds of disjoint pairs.

  With ``n' = n + (n mod 2)`` players, round ``r = 0, …, n' − 2`` holds the
  pair ``{r, n' − 1}`` and the pairs ``{a, b}`` of players ``a, b < n' − 1``
  with ``a + b ≡ 2r (mod n' − 1)`` — the circle method; pairs with the dummy
  player ``n`` (n odd) are dropped. Every pair ``i < j < n`` occurs in exactly
  one round and ``Q = R_{m} ⋯ R_1 D`` applies round 0 first.

  Returns:
    One tuple of ``(i, j)`` pairs (``i < j``, sorted) per round.
  """
  players = n + n % 2
  mod = players - 1
  rounds = []
  for r in range(mod):
    pairs = [(r, players - 1)]
    for step in range(1, players // 2):
      pairs.append(((r + step) % mod, (r - step) % mod))
    pairs = sorted((min(a, b), max(a, b)) for a, b in pairs if max(a, b) < n)
    rounds.append(tuple(pairs))
  return tuple(rounds)


@functools.lru_cache(maxsize=None)
def _givens_tables(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per round and row: the partner row, the angle's packed index, the sine's sign.

  Rows with no partner in a round point at themselves and at the extra zero
  angle (index n(n−1)/2), so they are left unchanged.
  """
  rounds = givens_rounds(n)
  index = {pair: k for k, pair in enumerate(zip(*np.triu_indices(n, 1)))}
  m = len(rounds)
  partner = np.tile(np.arange(n, dtype=np.int32), (m, 1))
  angle = np.full((m, n), n * (n - 1) // 2, dtype=np.int32)
  sign = np.zeros((m, n), dtype=np.float32)
  for r, pairs in enumerate(rounds):
    for i, j in pairs:
      partner[r, i], partner[r, j] = j, i
      angle[r, i] = angle[r, j] = index[(int(i), int(j))]
      sign[r, i], sign[r, j] = -1.0, 1.0
  return partner, angle, sign


def givens_columns(angles: jax.Array, signs: jax.Array, p: int) -> jax.Array:
  """First ``p`` columns of ``R_m ⋯ R_1 D`` (:func:`givens_rounds`): ``(n, p)``."""
  n = signs.shape[0]
  x = jnp.eye(n, p, dtype=angles.dtype) * signs[:p]
  if n == 1:
    return x
  partner, angle, sign = _givens_tables(n)
  t = jnp.concatenate([angles, jnp.zeros((1,), angles.dtype)])[angle]
  cos, sin = jnp.cos(t), jnp.sin(t) * sign.astype(angles.dtype)

  def rotate(x, round_):
    c, s, j = round_
    return c[:, None] * x + s[:, None] * x[j]

  identity = (jnp.ones((n,), angles.dtype), jnp.zeros((n,), angles.dtype),
              np.arange(n, dtype=np.int32))
  return _remat_scan(rotate, x, (cos, sin, jnp.asarray(partner)), identity)


_COLUMNS = {
    "cayley": cayley_columns,
    "expm": expm_columns,
    "householder": householder_columns,
    "givens": givens_columns,
}


def orthogonal_columns(parametrization: str, generator: jax.Array, signs: jax.Array,
                       p: int) -> jax.Array:
  """First ``p`` columns ``(n, p)`` of the ``n × n`` orthogonal ``Q`` of a generator.

  ``n = len(signs)``; see the module docstring for the maps and the
  generator layouts.
  """
  check_choice(parametrization, PARAMETRIZATIONS, "parametrization")
  return _COLUMNS[parametrization](generator, signs, p)


# ------------------------------------------------------------ initialization


def _kahan_signs(w: jax.Array) -> jax.Array:
  """±1 signs d with every pivot of ``diag(d) + w`` (no pivoting) at least 1 in magnitude."""
  n = w.shape[0]
  idx = jnp.arange(n)

  def body(k, carry):
    s, d = carry
    pivot_w = s[k, k]
    dk = jnp.where(pivot_w >= 0, 1.0, -1.0).astype(s.dtype)
    below = idx > k
    col = jnp.where(below, s[:, k], 0.0)
    row = jnp.where(below, s[k, :], 0.0)
    s = s - jnp.outer(col, row) / (pivot_w + dk)
    return s, d.at[k].set(dk)

  return lax.fori_loop(0, n, body, (w, jnp.ones((n,), w.dtype)))[1]


def _haar_rotation_generator(key: jax.Array, n: int, dtype: Any) -> jax.Array:
  """A skew ``A`` with ``expm(A)`` Haar-distributed on SO(n).

  The eigenangles ``θ_k ∈ [0, π]`` of a Haar rotation ``V`` (from the paired
  eigenvalues ``cos θ_k`` of its symmetric part; an odd ``n`` adds a lone +1)
  are placed in 2×2 blocks ``θ_k J`` and conjugated by an independent Haar
  ``U ∈ O(n)``: ``A = U blockdiag(θ_k J) Uᵀ``. Haar measure on SO(n) is
  invariant under conjugation by O(n), so it is the law of a uniformly
  conjugated ``blockdiag(R(θ_k))`` with ``V``'s eigenangles — no matrix
  logarithm (ill-conditioned near eigenvalue −1) is needed.
  """
  v_key, u_key = jax.random.split(key)
  v = linalg.qr_orthonormalize(jax.random.normal(v_key, (n, n), dtype))
  det_sign = jnp.where(jnp.linalg.slogdet(v)[0] < 0, -1.0, 1.0).astype(dtype)
  v = v.at[:, -1].multiply(det_sign)  # Haar on O(n) -> Haar on SO(n)
  cos = jnp.linalg.eigvalsh(0.5 * (v + v.T))[:2 * (n // 2)]  # drop the lone +1 (largest)
  theta = jnp.arccos(jnp.clip(cos.reshape(-1, 2).mean(axis=1), -1.0, 1.0))
  even, odd = 2 * np.arange(n // 2), 2 * np.arange(n // 2) + 1
  blocks = jnp.zeros((n, n), dtype).at[odd, even].set(theta).at[even, odd].set(-theta)
  u = linalg.qr_orthonormalize(jax.random.normal(u_key, (n, n), dtype))
  return u @ blocks @ u.T


def _householder_qr(w: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """``k`` steps of Householder QR of orthonormal columns ``w`` ``(n, m)``.

  Returns reflection vectors ``(k, n)`` (``v_i`` zero above row i) and the
  ±1 diagonal of the reduced matrix for its first ``min(k, m)`` columns,
  so ``w[:, i] = r_i H_1 ⋯ H_i e_i``.
  """
  n, m = w.shape
  idx = jnp.arange(n)

  def body(i, carry):
    x_all, vs, r = carry
    col = x_all[:, jnp.minimum(i, m - 1)]
    x = jnp.where(idx >= i, col, 0.0)
    xi = x[i]
    sgn = jnp.where(xi >= 0, 1.0, -1.0).astype(w.dtype)
    norm = jnp.linalg.norm(x)
    # A degenerate column (i ≥ m, or x = 0) gets v = e_i: a genuine reflection still.
    v = jnp.where(norm > 0, x + sgn * norm * (idx == i), (idx == i).astype(w.dtype))
    x_all = _reflect(x_all, v)
    return x_all, vs.at[i].set(v), r.at[i].set(-sgn)

  init = (w, jnp.zeros((k, n), w.dtype), jnp.ones((k,), w.dtype))
  _, vs, r = lax.fori_loop(0, k, body, init)
  return vs, r


@functools.partial(jax.jit, static_argnames=("parametrization", "n", "p", "k", "dtype"))
def _random_generator(key: jax.Array, *, parametrization: str, n: int, p: int, k: int,
                      dtype: Any) -> tuple[jax.Array, jax.Array]:
  """``(generator, signs)`` of ``init="random"`` in the compute ``dtype``."""
  ones = jnp.ones((n,), dtype)
  w_key, sign_key = jax.random.split(key)
  fair_sign = jnp.where(jax.random.bernoulli(sign_key), 1.0, -1.0).astype(dtype)
  if parametrization == "givens":
    angles = jax.random.uniform(w_key, num_generators("givens", n), dtype, -jnp.pi, jnp.pi)
    return angles, ones.at[-1].set(fair_sign)
  if parametrization == "expm":
    a = _haar_rotation_generator(w_key, n, dtype)
    return packed_from_skew(linalg.skew(a)), ones.at[-1].set(fair_sign)
  if parametrization == "householder":
    w = linalg.qr_orthonormalize(jax.random.normal(w_key, (n, max(k, p)), dtype))
    vectors, r = _householder_qr(w, k)
    return vectors, ones.at[:min(k, p)].set(r[:min(k, p)])
  # cayley
  w = linalg.qr_orthonormalize(jax.random.normal(w_key, (n, n), dtype))
  eye = jnp.eye(n, dtype=dtype)
  signs = _kahan_signs(w)
  wd = w * signs
  a = jnp.linalg.solve(eye + wd, eye - wd)
  return packed_from_skew(linalg.skew(a)), signs


def initial_generator(key: jax.Array, parametrization: str, init: str, n: int, p: int,
                      k: int = 0, dtype: Any = jnp.float32) -> tuple[jax.Array, jax.Array]:
  """``(generator, signs)`` for ``init`` (see the module docstring), cast to ``dtype``.

  Computed in at least float32. ``p`` (kept columns) and ``k`` (reflections)
  matter for Householder only.
  """
  check_choice(parametrization, PARAMETRIZATIONS, "parametrization")
  check_choice(init, INITS, "init")
  cdtype = linalg.compute_dtype(dtype)
  if init == "identity":
    ones = jnp.ones((n,), cdtype)
    if parametrization == "householder":
      generator, signs = jnp.eye(k, n, dtype=cdtype), ones.at[:k].set(-1.0)
    else:
      generator, signs = jnp.zeros(num_generators(parametrization, n), cdtype), ones
  else:
    householder = parametrization == "householder"
    generator, signs = _random_generator(key, parametrization=parametrization, n=n,
                                         p=p if householder else 0, k=k if householder else 0,
                                         dtype=cdtype)
  return generator.astype(dtype), signs.astype(dtype)


# -------------------------------------------------------------------- layers


@functools.partial(jax.jit, static_argnames=("parametrization", "p"))
def _columns(generator, signs, *, parametrization, p):
  return orthogonal_columns(parametrization, generator, signs, p)


class _OrthogonalBase(nnx.Module):
  """Parameters, initialization and kernel assembly shared by the layers."""

  def _init_params(self, fan_in: int, fan_out: int, kernel_shape: tuple[int, ...], *,
                   parametrization: str, num_reflections: int | None, init: str, gain: float,
                   learn_gain: bool, use_bias: bool, param_dtype: Any, rngs: nnx.Rngs) -> None:
    self.parametrization = check_choice(parametrization, PARAMETRIZATIONS, "parametrization")
    self.init = check_choice(init, INITS, "init")
    self.fan_in, self.fan_out = fan_in, fan_out
    self.n, self.p = max(fan_in, fan_out), min(fan_in, fan_out)
    self.num_reflections = _num_reflections(num_reflections, parametrization, self.n, self.p)
    self.kernel_shape = tuple(kernel_shape)
    self.learn_gain = bool(learn_gain)
    self.use_bias = bool(use_bias)
    self.param_dtype = param_dtype
    generator, signs = initial_generator(rngs.params(), parametrization, init, self.n, self.p,
                                         self.num_reflections, param_dtype)
    self.generator = nnx.Param(generator,
                               **sharding.metadata((None,) * generator.ndim))
    self.signs = nnx.Variable(signs, **sharding.metadata(_REPLICATED1))
    gain_cls = nnx.Param if learn_gain else nnx.Variable
    self.gain = gain_cls(jnp.asarray(gain, param_dtype), **sharding.metadata(()))
    self.bias = (nnx.Param(jnp.zeros((fan_out,), param_dtype), **sharding.metadata(sharding.BIAS))
                 if use_bias else nnx.data(None))

  def matrix(self) -> jax.Array:
    """The kernel's matrix view ``(fan_in, fan_out)``: ``g · Q[:, :p]`` or its transpose."""
    cdtype = linalg.compute_dtype(self.param_dtype)
    q = _columns(self.generator[...].astype(cdtype), self.signs[...].astype(cdtype),
                 parametrization=self.parametrization, p=self.p)
    w = self.gain[...].astype(cdtype) * (q.T if self.fan_in < self.fan_out else q)
    return w.astype(self.param_dtype)

  def kernel(self) -> jax.Array:
    """``W = g · Q`` in the kernel's shape (Dense ``(in, out)``, Conv ``(*k, in, out)``)."""
    return self.matrix().reshape(self.kernel_shape)


class OrthogonalDense(_OrthogonalBase):
  """Dense layer ``y = x W + b`` with ``W = g · Q(θ) D`` orthogonal on its tall side.

  ``W`` (``(in_features, out_features)``) has orthonormal columns scaled by
  ``g`` when ``in ≥ out`` and orthonormal rows otherwise; it is rebuilt from
  the Euclidean generator each call (see the module docstring for the maps,
  costs and parameter layouts). Read it with :meth:`kernel`.

  Example::

    >>> from flax import nnx
    >>> import jax.numpy as jnp
    >>> layer = OrthogonalDense(8, 5, parametrization="cayley", rngs=nnx.Rngs(0))
    >>> layer(jnp.ones((2, 8))).shape
    (2, 5)
    >>> layer.generator.shape, layer.kernel().shape
    ((28,), (8, 5))

  Args:
    in_features: fan-in.
    out_features: fan-out.
    parametrization: ``"cayley"`` (default), ``"expm"``, ``"householder"``
      or ``"givens"``.
    num_reflections: Householder only: the number k of reflections, 1 ≤ k ≤
      n (default ``min(in, out)``, which reaches every kernel).
    init: ``"random"`` (a Haar sample; random but not Haar for Givens) or
      ``"identity"`` (``Q = I``).
    gain: the scale g (``W = g·Q``), initial value when learned.
    learn_gain: train g (an ``nnx.Param`` scalar) or keep it fixed (an
      ``nnx.Variable``).
    use_bias: add a Euclidean bias (zeros init).
    dtype: computation dtype (default: inferred from input and params, as
      in flax). The orthogonal map always runs in at least float32.
    param_dtype: parameter dtype.
    precision: matmul precision (``jax.lax.Precision``).
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Raises:
    ValueError: unknown ``parametrization`` or ``init``, non-positive sizes,
      ``num_reflections`` out of range or given for another parametrization.
  """

  def __init__(self, in_features: int, out_features: int, *,
               parametrization: str = "cayley",
               num_reflections: int | None = None,
               init: str = "random",
               gain: float = 1.0,
               learn_gain: bool = False,
               use_bias: bool = True,
               dtype: Any = None,
               param_dtype: Any = jnp.float32,
               precision: Any = None,
               rngs: nnx.Rngs):
    self.in_features = check_positive_int(in_features, "in_features")
    self.out_features = check_positive_int(out_features, "out_features")
    self.dtype = dtype
    self.precision = precision
    self._init_params(self.in_features, self.out_features,
                      (self.in_features, self.out_features),
                      parametrization=parametrization, num_reflections=num_reflections,
                      init=init, gain=gain, learn_gain=learn_gain, use_bias=use_bias,
                      param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """``x @ W + b`` over the last axis of ``x``."""
    bias = self.bias[...] if self.bias is not None else None
    x, kernel, bias = dtypes.promote_dtype((x, self.kernel(), bias), dtype=self.dtype)
    y = lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=self.precision)
    return y if bias is None else y + bias


class OrthogonalConv(_OrthogonalBase):
  """Convolution with an orthogonal kernel ``W = g · Q(θ) D`` (``nnx.Conv`` conventions).

  The kernel ``(*kernel_size, in/groups, out)`` (HWIO) has the matrix view
  ``(prod(kernel_size)·in/groups, out)``, orthonormal on its tall side
  (columns when the window's fan-in ≥ out, rows otherwise) — the flattened
  window map is orthogonal, not the full convolution operator. Inputs are
  channels-last (NWC / NHWC / NDHWC) with any number of leading batch axes
  (or none), as ``nnx.Conv``; ``kernel_size`` an int means a 1-D kernel.

  Args:
    in_features: input channels.
    out_features: output channels.
    kernel_size: spatial window, an int (1-D) or a 1/2/3-tuple.
    strides: int or one per spatial axis.
    padding: ``"SAME"`` (default), ``"VALID"``, an int, or (low, high) pairs.
    kernel_dilation: int or one per spatial axis.
    feature_group_count: grouped convolution (fan-in ``prod(k)·in/groups``).
    parametrization, num_reflections, init, gain: as in :class:`OrthogonalDense`.
    learn_gain, use_bias, dtype, param_dtype, precision, rngs: as in
      :class:`OrthogonalDense`.

  Raises:
    ValueError: as :class:`OrthogonalDense`, plus bad ``kernel_size``,
      ``strides``, ``padding`` or group counts.
  """

  def __init__(self, in_features: int, out_features: int,
               kernel_size: int | Sequence[int],
               strides: int | Sequence[int] = 1, *,
               padding: Any = "SAME",
               kernel_dilation: int | Sequence[int] = 1,
               feature_group_count: int = 1,
               parametrization: str = "cayley",
               num_reflections: int | None = None,
               init: str = "random",
               gain: float = 1.0,
               learn_gain: bool = False,
               use_bias: bool = True,
               dtype: Any = None,
               param_dtype: Any = jnp.float32,
               precision: Any = None,
               rngs: nnx.Rngs):
    _conv.set_geometry(self, _conv.conv_geometry(in_features, out_features, kernel_size, strides,
                                                 padding, kernel_dilation, feature_group_count))
    self.dtype = dtype
    self.precision = precision
    self._init_params(self.geometry.fan_in, self.out_features, self.geometry.kernel_shape,
                      parametrization=parametrization, num_reflections=num_reflections,
                      init=init, gain=gain, learn_gain=learn_gain, use_bias=use_bias,
                      param_dtype=param_dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    """``conv(x, W) + b``, channels-last, as ``nnx.Conv``."""
    bias = self.bias[...] if self.bias is not None else None
    x, kernel, bias = dtypes.promote_dtype((x, self.kernel(), bias), dtype=self.dtype)
    y = _conv.conv(x, kernel, self.geometry, precision=self.precision)
    return y if bias is None else y + bias
