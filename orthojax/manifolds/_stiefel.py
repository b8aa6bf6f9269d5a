"""The Stiefel manifold St(n, p) = {W in R^{n x p} : W^T W = I_p}, n >= p.

Parameters are seen through their tall matrix view (columns orthonormal when
fan_in >= fan_out, rows otherwise), batched over leading axes.

Tangent space at W: {V : W^T V + V^T W = 0}.

* Projection (Euclidean metric; Edelman, Arias & Smith 1998, eq. 2.3; Sokol & Park,
  ICLR 2020, Appendix A.6.2):
  ``P_W(G) = G - W sym(W^T G) = (I - W W^T) G + W skew(W^T G)``.
* Riemannian gradient, canonical metric: ``G - W G^T W``. (Not a projection:
  it is idempotent only on the normal space's complement; transport always
  uses the Euclidean projection.)
* Retractions of a tangent V at W:

  - ``"qr"``: ``qf(W + V)``, the sign-fixed Q factor, from matrix products by one
    CholeskyQR pass (:func:`orthojax.linalg.cholesky_qr`: ``W + V`` has every singular
    value at least 1, so the same Q as Householder QR to rounding, with no
    conditional), by the guarded CholeskyQR2 (``qr_algorithm="cholesky_qr2"``) or by
    LAPACK's Householder QR (``qr_algorithm="householder"``);
  - ``"polar"``: ``polar(W + V) = U V^T`` of the SVD (the metric projection);
  - ``"newton_schulz"``: the same polar factor by cubic Newton–Schulz steps
    ``X <- X (3I - X^T X) / 2`` (matmuls only), run to a tolerance. No
    Frobenius normalisation: for tangent V the singular values of ``W + V``
    are ``sqrt(1 + s_i^2)`` (s_i those of V), already next to 1, and the cubic
    map takes a Gram defect ``delta = ||X^T X - I||`` to about
    ``3/4 delta^2``, so an optimizer step of spectral size 0.05 converges in
    two iterations (4 matmuls). ``W + V`` is scaled down only when
    ``1 + ||V||_F > 1.7``, keeping every singular value below sqrt(3), where
    the iteration converges. A ``lax.while_loop`` stops once the predicted
    next defect is below ``ns_tol`` (or after ``ns_steps``), so it is not
    reverse-mode differentiable: use "polar" or "qr" to differentiate through
    a retraction;
  - ``"cayley"``: ``(I - A/2)^{-1} (I + A/2) W`` with the skew generator
    ``A = Vh W^T - W Vh^T``, ``Vh = V - W (W^T V)/2`` (Wen & Yin 2013), which
    satisfies ``A W = P_W(V)``. Computed in ``p x p`` coordinates
    (:func:`orthojax.linalg.cayley_in_coordinates`): ``A`` maps ``W`` and the step's
    normal part ``N = V - W W^T V`` into their own span, so the result is
    ``W + (W C + N) M^{-1}`` with ``M = I - Omega/2 + N^T N/4``,
    ``C = Omega - N^T N/2``, ``Omega = skew(W^T V)``: the ``p x p`` inverse and five
    ``n x p x p`` products (``W^T V``, ``N``, ``N^T N``, and the two with ``M^{-1}``; a
    square ``W`` takes two and a ``p x p`` solve), where the generator's 2p x 2p
    Woodbury form took about twice the arithmetic and its dense form an ``n x n``
    solve. With ``cayley_iterations=k`` by Li et al.'s fixed point (matmuls only,
    approximately orthogonal: see :func:`orthojax.linalg.cayley_transform`): in
    coordinates for a square ``W``, and on the generator's low-rank or dense form for a
    tall one, whose iterates drift off the manifold between clean-ups, where the
    coordinates' ``W^T W = I`` does not hold.

* Transport: projection onto the new tangent space (base class).
* Parameters stored in bfloat16/float16: the maths runs in float32, and the
  Cayley retraction's result is passed through :func:`polish` (Newton–Schulz
  steps, usually one) before it is rounded, so the stored points stay at
  rounding-level distance from the manifold (the other retractions land on
  it in float32 on their own).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from orthojax import linalg
from orthojax.manifolds._base import Manifold, gaussian, on_tall


def cayley_generator(w, v, dense: bool | None = None):
  """The skew ``A`` with ``A W = P_W(V)`` (Wen & Yin 2013), low-rank or dense.

  Args:
    w: (..., n, p) tall matrix with orthonormal columns.
    v: (..., n, p) direction (a tangent vector, or an ambient gradient).
    dense: force the dense (n x n) or low-rank form; None picks dense when
      n < 2p, where forming A is cheaper than applying its factors.

  Returns:
    ``A`` as an (..., n, n) array or a :class:`orthojax.linalg.LowRank`.
  """
  vh = v - 0.5 * (w @ (w.mT @ v))
  n, p = w.shape[-2], w.shape[-1]
  if dense is None:
    dense = n < 2 * p
  if dense:
    a = vh @ w.mT
    return a - a.mT
  return linalg.LowRank(u=jnp.concatenate([vh, w], -1), v=jnp.concatenate([w, -vh], -1))


def polish(y, dtype):
  """Removes the defect a low-precision point carries: Newton–Schulz steps.

  For a tall ``y`` (float32 or wider) about to be stored in ``dtype``:
  ``y`` itself when ``dtype`` is float32 or wider (nothing changes there);
  for bfloat16 and float16, cubic Newton–Schulz steps towards the polar
  factor (Björck & Bowie, SIAM J. Numer. Anal. 8(2), 1971; Higham,
  *Functions of Matrices*, SIAM 2008, §8.3),

      Y <- Y (3I - Y^T Y) / 2,

  by ``polar_newton_schulz`` (this module) until the predicted defect
  ``3/4 ||Y^T Y - I||_F^2`` is below the unit roundoff ``u`` of ``dtype``:
  one step (two ``n x p x p`` products) for a defect up to ``sqrt(4u/3)``
  (0.07 in bfloat16), two for the larger ones an infeasible method such as
  landing leaves. The map is the identity on the manifold, so it changes a
  retraction only by rounding. Like the "newton_schulz" retraction it runs
  in a ``lax.while_loop`` (not reverse-mode differentiable).

  Why it is needed: rounding an orthonormal matrix to unit roundoff ``u``
  (2^-8 for bfloat16, 2^-11 for float16) leaves
  ``||W^T W - I||_F <= 2 u ||W||_F = 2 u sqrt(p)`` to first order. The QR,
  polar and Newton–Schulz retractions map ``W + xi`` onto the manifold in
  float32, so every step starts over from that level. The Cayley transform
  ``Y = Q W`` (``Q`` orthogonal) keeps ``Y^T Y = W^T W`` (exactly as ``Q W``; to
  ``O(defect ||V||)`` as computed in coordinates for a tall ``W``): it carries
  each step's rounding error into the next, and the defect grows without
  bound (a 16 x 8 bfloat16 matrix chasing a moving target: 0.007 -> 2.8 in
  10^4 rsgd or radam steps, exact or iterative; landing, whose attraction
  falls below half an ulp near the manifold, to 0.25; Li et al.'s Cayley
  optimizers to 0.3 between their re-orthonormalisations). Computing the
  step in float32 cannot help: the error sits in the stored ``W``. Polishing
  before rounding brings every stored point back to rounding level;
  re-orthonormalising (``reorthonormalize_every``) would have to run at every
  step, or let the defect grow in between.

  Args:
    y: ``(..., n, p)`` tall matrix near the manifold (singular values in
      ``(0, sqrt(3))``), float32 or wider.
    dtype: the dtype the point will be stored in.

  Returns:
    ``y`` or its polished version, same shape and dtype.
  """
  if jnp.dtype(linalg.compute_dtype(dtype)) == jnp.dtype(dtype):
    return y
  return polar_newton_schulz(y, tol=0.5 * float(jnp.finfo(dtype).eps))


def polar_newton_schulz(x, tol=None, max_steps=12):
  """Polar factor of a near-orthonormal tall ``x`` by cubic Newton–Schulz, to ``tol``.

  Each step ``X <- X (3I - S) / 2`` with ``S = X^T X`` maps the defect
  ``delta = ||S - I||_F`` to ``~3/4 delta^2``; the loop stops once that
  prediction is below ``tol`` (per batch: when every matrix is done), after
  the step, so no Gram matrix is formed only to be checked. Needs every
  singular value of ``x`` in (0, sqrt(3)).

  The iterates are those of :func:`orthojax.linalg.newton_schulz` with
  ``coeffs="cubic", normalize=False`` (Björck & Bowie, SIAM J. Numer. Anal.
  8(2), 1971). That function is not called here because it runs a fixed,
  compiled schedule (what Muon needs) and does not expose the step's Gram
  matrix: testing convergence there would cost a third product per
  iteration, and a fixed count would waste iterations on small steps.
  """
  p = x.shape[-1]
  eye = jnp.eye(p, dtype=x.dtype)
  if tol is None:
    tol = float(jnp.finfo(x.dtype).eps) * p ** 0.5

  def cond(state):
    k, _, delta = state
    return (k < max_steps) & (delta > tol)

  def body(state):
    k, x, _ = state
    s = x.mT @ x
    delta = 0.75 * jnp.max(jnp.linalg.matrix_norm(s - eye)) ** 2
    return k + 1, x @ (1.5 * eye - 0.5 * s), delta

  _, x, _ = jax.lax.while_loop(cond, body, (0, x, jnp.asarray(jnp.inf, x.dtype)))
  return x


def newton_schulz_step(x):
  """One cubic Newton–Schulz step towards the polar factor, ``X (3I − XᵀX) / 2``.

  Two ``n × p × p`` products, no loop and no branch. Near the manifold it maps a defect
  ``δ = ‖XᵀX − I‖_F`` to about ``3/4 δ²`` (Björck & Bowie, SIAM J. Numer. Anal. 8(2),
  1971; Higham, *Functions of Matrices*, SIAM 2008, §8.3), so applied after every step of
  a retraction that does not land on the manifold exactly (iterative Cayley) it holds
  the iterate at rounding level: the clean-up of ``reorthonormalize_every=1``.
  """
  eye = jnp.eye(x.shape[-1], dtype=x.dtype)
  return x @ (1.5 * eye - 0.5 * (x.mT @ x))


def corrected_newton_schulz_step(x, precision):
  """The float32 correction of a point ``x`` computed with reduced-precision products:
  the Newton–Schulz step of :func:`newton_schulz_step` written as
  ``X + X (I − XᵀX) / 2``, its Gram matrix ``XᵀX`` at float32 and the product with the
  small ``(I − XᵀX) / 2`` at ``precision``.

  A defect ``δ`` of ``x`` becomes ``~3/4 δ²`` plus the Gram matrix's float32 rounding,
  and the reduced product's error is its relative rounding times ``δ`` (three
  bfloat16 passes: ``2⁻¹⁷ δ``), so a point from three-pass products (``δ ≈ 1e-5``) lands
  at float32 rounding: one ``n × p × p`` product at float32, against the maths' own
  several at tensor-core rates.
  """
  eye = jnp.eye(x.shape[-1], dtype=x.dtype)
  gram = linalg.at_precision(lambda y: y.mT @ y, "highest")(x)
  return x + linalg.at_precision(lambda y, e: y @ e, precision)(x, 0.5 * (eye - gram))


def reorthonormalize_newton_schulz(x, max_steps=30):
  """The polar factor of a full-rank tall ``x`` by scaled cubic Newton–Schulz.

  The iteration is ``Y <- Y (3I - Y^T Y) / 2`` until the predicted defect
  ``3/4 ||Y^T Y - I||_F^2`` is below ``sqrt(p)`` times the dtype's epsilon (the
  loop of :func:`polish`), which converges for singular values in
  ``(0, sqrt(3))``. So ``x`` is first divided by
  ``c = max(1, sqrt(||X^T X||_1))``; ``||X^T X||_1``, the largest absolute
  column sum, bounds ``sigma_max^2``, so every singular value then lies in
  ``(0, 1]``. The polar factor does not change under a positive scale. Near
  the manifold (``c = 1``) two or three steps remove the defect a hundred
  iterative Cayley steps leave. A singular value ``s`` far below 1 grows about
  1.5x per step, so ``max_steps=30`` reaches rounding level from
  ``s >= 1e-4``. Below that (a numerically rank-deficient ``x``) the result
  is not orthonormal; there the SVD of :func:`orthojax.linalg.polar` picks
  some completion.

  Why not the SVD: for the inputs an optimizer's periodic clean-up
  (``reorthonormalize_every``) sees, this is the same point to rounding, in
  matrix products only. On TPU the SVD is a long iterative program: ResNet-18's
  radam-Cayley step with ``reorthonormalize_every=100``, owner-sharded and
  compiled for ``v5e:4x4``, took 442 s to compile with the SVD, 207 s with
  this and 191 s with no clean-up.

  Higham, *Functions of Matrices*, SIAM 2008, §8.3 and Theorem 8.12.
  """
  s = x.mT @ x
  c = jnp.sqrt(jnp.max(jnp.sum(jnp.abs(s), axis=-2), axis=-1))
  x = x / jnp.maximum(c, 1.0)[..., None, None]
  return polar_newton_schulz(x, max_steps=max_steps)


class Stiefel(Manifold):
  """Orthonormal columns of the tall matrix view.

  Args:
    retraction: "qr" (default), "cayley", "polar" or "newton_schulz".
    metric: "euclidean" (default; the embedded metric) or "canonical" — only
      changes :meth:`~Manifold.egrad_to_rgrad`.
    cayley_iterations: None for the exact Cayley transform, or the number of
      Li et al. fixed-point iterations (2 in the paper).
    ns_steps: most cubic Newton–Schulz steps of the "newton_schulz" retraction.
    ns_tol: its stopping tolerance on the predicted ``||X^T X - I||_F`` (None:
      ``sqrt(p)`` times the dtype's epsilon).
    qr_algorithm: how the "qr" retraction factors: "cholesky_qr" (default;
      :func:`orthojax.linalg.cholesky_qr`: a Gram product, a Cholesky factor and a
      triangular solve, no conditional), "cholesky_qr2" (the same pass, a second one and
      Householder behind ``lax.cond`` guards: :func:`orthojax.linalg.cholesky_qr2`) or
      "householder" (LAPACK's QR). The same point to rounding for a step of spectral
      norm up to 1 (``κ(W + V)² ≤ 1 + ‖V‖₂²``; a longer one leaves ``κ²`` times
      rounding in one pass, which the next retraction removes). The Cholesky forms are
      the faster on a CPU (26–37 % per Riemannian Adam step, 2 cores) and are
      matrix-product work on accelerators; the one pass also compiles without the
      guards' branches, which a GPU would wait on every step.
    precision: of the matrix products (:data:`orthojax.linalg.PRECISIONS`). None
      (default): per backend (:data:`orthojax.linalg.MANIFOLD_PRECISION`): float32 on a
      CPU, three bfloat16 passes on a GPU's or TPU's tensor cores, each point then
      corrected at float32 (:func:`corrected_newton_schulz_step`), which holds
      ``‖WᵀW − I‖`` at float32 rounding. On a TPU the one-pass QR retraction runs at
      float32 instead, with no correction: the cheaper there (``Stiefel.retract``).
      ``"bf16x3"`` or ``"bf16"`` on a CPU emulate the tensor cores' numbers exactly
      (:func:`orthojax.linalg.at_precision`).
  """

  RETRACTIONS = ("qr", "cayley", "polar", "newton_schulz")
  """Accepted ``retraction`` names."""
  METRICS = ("euclidean", "canonical")
  """Accepted ``metric`` names."""
  QR_ALGORITHMS = ("cholesky_qr", "cholesky_qr2", "householder")
  """Accepted ``qr_algorithm`` names."""

  def __init__(self, retraction: str = "qr", metric: str = "euclidean",
               cayley_iterations: int | None = None, ns_steps: int = 12,
               ns_tol: float | None = None, qr_algorithm: str = "cholesky_qr",
               precision: str | None = None):
    if retraction not in self.RETRACTIONS:
      raise ValueError(f"Stiefel: unknown retraction={retraction!r}; choose one of {self.RETRACTIONS}")
    if metric not in self.METRICS:
      raise ValueError(f"Stiefel: unknown metric={metric!r}; choose one of {self.METRICS}")
    if cayley_iterations is not None and int(cayley_iterations) < 1:
      raise ValueError(f"Stiefel: cayley_iterations must be None or >= 1, got {cayley_iterations}")
    if int(ns_steps) < 1:
      raise ValueError(f"Stiefel: ns_steps must be >= 1, got {ns_steps}")
    if qr_algorithm not in self.QR_ALGORITHMS:
      raise ValueError(f"Stiefel: unknown qr_algorithm={qr_algorithm!r}; choose one of "
                       f"{self.QR_ALGORITHMS}")
    self.retraction = retraction
    self.metric = metric
    self.cayley_iterations = None if cayley_iterations is None else int(cayley_iterations)
    self.ns_steps = int(ns_steps)
    self.ns_tol = None if ns_tol is None else float(ns_tol)
    self.qr_algorithm = qr_algorithm
    linalg.check_precision("Stiefel", precision)
    self.precision = precision

  def _project(self, w, v):
    return v - w @ linalg.sym(w.mT @ v)

  def _egrad_to_rgrad(self, w, g):
    if self.metric == "canonical":
      return g - w @ (g.mT @ w)
    return self._project(w, g)

  def retract(self, w, v, *, view=None, stored_dtype=None):
    """:meth:`orthojax.manifolds.Manifold.retract`. The one-pass QR retraction on a TPU,
    where this manifold's products are three bfloat16 passes, runs its two products (the
    Gram matrix and the product with ``R⁻¹``) at float32 — six passes on a TPU's matrix
    unit — and needs no correction: its point is float32's to rounding. Three passes and
    the correction would cost 3 + 3 + 6 + 3 = 15 passes of an ``n × p × p`` product and four
    products counted; float32 costs 12 passes and two (E5's step on ``v5e:2x4``: 2.42× →
    2.16× the Euclidean step's FLOPs, 6.2× → 5.8× its matrix-unit work, docs/scale.md).
    A GPU keeps the three passes and the correction: its float32 products run on the
    CUDA cores, at a fifth of the three-pass rate on an H100. A point stored in bfloat16
    keeps the three passes too: its own rounding is far above either."""
    reduced = lambda w, v: super(Stiefel, self).retract(w, v, view=view,
                                                        stored_dtype=stored_dtype)
    stored = jnp.result_type(w) if stored_dtype is None else jnp.dtype(stored_dtype)
    if ((self.retraction, self.qr_algorithm) != ("qr", "cholesky_qr")
        or linalg.on_accelerators(self.precision) != "bf16x3"
        or not jnp.issubdtype(stored, jnp.floating)   # the base class names the error
        or jnp.finfo(stored).bits < 32):   # a bfloat16 point: float32 maths would be lost
      return reduced(w, v)
    exact = lambda w, v: on_tall(lambda a, b: linalg.cholesky_qr(a + b), view,
                                 jnp.result_type(w, v), w, v)   # float32: both defaults
    return linalg.platform_dependent(w, v, tpu=exact, default=reduced)

  def _retract(self, w, v):
    if self.retraction == "qr":
      if self.qr_algorithm == "householder":
        return linalg.qr_orthonormalize(w + v)
      if self.qr_algorithm == "cholesky_qr2":
        return linalg.cholesky_qr2(w + v, precision=self.precision)
      return linalg.cholesky_qr(w + v, precision=self.precision)
    if self.retraction == "polar":
      return linalg.polar(w + v, precision=self.precision)
    if self.retraction == "newton_schulz":
      # Scale only when 1 + ||V||_F > 1.7 (keeps sigma_max < sqrt(3)); the where
      # keeps the gradient finite at V = 0.
      sq = jnp.sum(jnp.square(v), axis=(-2, -1), keepdims=True)
      norm = jnp.where(sq > 0, jnp.sqrt(jnp.where(sq > 0, sq, 1.0)), 0.0)
      x = (w + v) / jnp.maximum(1.0, (1.0 + norm) / 1.7)
      return polar_newton_schulz(x, self.ns_tol, self.ns_steps)
    square = w.shape[-2] == w.shape[-1]
    if self.cayley_iterations is not None and not square:
      # Li et al.'s iterates drift off the manifold between clean-ups, where the
      # coordinates' identities (Wᵀ W = I) no longer hold: the generator's own form.
      return linalg.cayley_transform(cayley_generator(w, v), w, method="iterative",
                                     iterations=self.cayley_iterations)
    c = w.mT @ v
    # A square W has no normal part: W Wᵀ V = V.
    return self.cayley_in_coordinates(w, linalg.skew(c), None if square else v - w @ c)

  def cayley_in_coordinates(self, w, omega, normal=None):
    """This manifold's Cayley retraction (exact, or its ``cayley_iterations``) of a step
    given as ``omega = skew(Wᵀ V)`` and its normal part ``normal = V − W Wᵀ V`` (None
    for a square ``W``), on tall ``(..., n, p)`` matrices:
    :func:`orthojax.linalg.cayley_in_coordinates`. For callers that know ``omega`` (the
    fused Riemannian Adam); no polish or float32 correction (``retract`` adds them)."""
    how = (dict(method="exact") if self.cayley_iterations is None else
           dict(method="iterative", iterations=self.cayley_iterations))
    return linalg.cayley_in_coordinates(w, omega, normal, **how)

  def _retract_for(self, w, v, dtype):
    y = self._retract(w, v)
    # QR, polar and Newton–Schulz project onto the manifold whatever w's
    # defect; the Cayley transform keeps it (see polish).
    return polish(y, dtype) if self.retraction == "cayley" else y

  def _defect(self, w):
    eye = jnp.eye(w.shape[-1], dtype=w.dtype)
    return jnp.linalg.matrix_norm(w.mT @ w - eye)

  def _random(self, key, batch_shape, n, p, dtype):
    return linalg.qr_orthonormalize(gaussian(key, batch_shape, n, p, dtype))

  def _closest(self, w):
    return linalg.polar(w, precision=self.precision)

  def _reorthonormalize(self, w):
    return reorthonormalize_newton_schulz(w)

  def _reorthonormalize_step(self, w):
    return newton_schulz_step(w)

  def _correct(self, w):
    return corrected_newton_schulz_step(w, self.precision)
