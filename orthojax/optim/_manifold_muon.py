r"""Manifold Muon: steepest descent on the Stiefel manifold under the spectral norm.

At a point ``W`` (the tall ``n × p`` matrix view, ``WᵀW = I``) with gradient ``G`` the
direction solves

    min_A ⟨G, A⟩   subject to   ‖A‖₂ ≤ 1   and   WᵀA + AᵀW = 0

(the steepest descent of the spectral norm within the tangent space: Bernstein,
"Modular Manifolds", Thinking Machines Lab: Connectionism, 2025, "manifold Muon"). With a
symmetric multiplier ``Λ`` for the tangent constraint the Lagrangian is
``⟨G + 2WΛ, A⟩``, minimised over the spectral ball by ``A = −msign(G + 2WΛ)``, so the dual
is ``max_Λ −‖G + 2WΛ‖_*``; its gradient in ``Λ`` is ``−(WᵀA' + A'ᵀW)`` with
``A' = msign(G + 2WΛ)``, the tangent constraint's residual. Dual ascent, as the paper
runs it:

    Λ₀ = −(WᵀG + GᵀW)/4          (so that G + 2WΛ₀ = P_W(G), the tangent projection)
    A'_k = msign(G + 2WΛ_k),   H_k = WᵀA'_k + A'_kᵀW,   Λ_{k+1} = Λ_k − α (1 − k/K) H_k

and the step is ``W ← R_W(−η A'_K)`` (a retraction of the library). ``G`` is scaled to unit
Frobenius norm first — the solution does not change, and the dual step ``α`` then does
not depend on the gradient's scale. ``msign(M) = U Vᵀ`` for ``M = U Σ Vᵀ``: by the SVD
(exact) or by Polar Express Newton–Schulz steps (Amsel et al. 2025; products only).

That subgradient iteration converges slowly where ``p`` is close to ``n`` (a 48 × 40
matrix: a residual ``‖WᵀA' + A'ᵀW‖_max`` of 1e-2 after 300 iterations at the best ``α``,
against 2e-7 after 30 for 96 × 24). The default solver is therefore ADMM on the split
``A = B``, ``A`` tangent and ``B`` in the spectral unit ball (Buchanan proposed ADMM for
this problem; the splitting here is the textbook one of Boyd et al., "Distributed
optimization and statistical learning via the alternating direction method of
multipliers", 2011, §5, not a copy of his):

    A_{k+1} = P_W(B_k − U_k − G/ρ),   B_{k+1} = clip₁(A_{k+1} + U_k),   U_{k+1} = U_k + A_{k+1} − B_{k+1}

with ``P_W`` the tangent projection and ``clip₁`` the singular values clipped at 1
(:func:`clip_spectral`: an SVD, or two ``msign``\ s by Newton–Schulz); it returns the last
``A`` (tangent exactly) scaled into the ball. On the same 48 × 40 problem 100 iterations at
``ρ = 0.3`` land within 1.5e-4 of the objective's value after 300, with ``‖A‖₂ = 1.0000``.

Both measured (2-core AMD EPYC, XLA:CPU, float32, one matrix; the objective's gap to
1,000 ADMM iterations, and the largest tangent residual):

=============  =====================================  ======================================
shape          ADMM, 100 iterations (SVD / NS 8)       dual ascent, 30 (SVD / NS 8)
=============  =====================================  ======================================
48 × 40        20 / 14 ms, gap 1.9e-4, tangent 3e-7    5.7 / 2.7 ms, gap 8.6e-3, tangent 9e-2
96 × 24        13 / 11 ms, gap 1e-7                    3.5 / 2.0 ms, gap 6e-7
576 × 64       206 / 225 ms, gap 2e-7                  51 / 34 ms, gap 7e-7
1024 × 256     2,699 / 3,064 ms, gap 1e-7              805 / 483 ms, gap 1.5e-6, tangent 3e-5
=============  =====================================  ======================================

So dual ascent is 3–6× cheaper where it converges (``n ≥ 2p``) and wrong where it does not.

The dual in ``p × p`` (``solver="reweighted"``): with ``C = WᵀG``, the normal part
``G_⊥ = G − WC`` and ``N = G_⊥ᵀG_⊥``, every ``M = G + 2WΛ`` is ``WK + G_⊥`` with
``K = Ω + Σ``, ``Ω = skew(C)`` fixed and ``Σ`` any symmetric matrix, and since
``WᵀG_⊥ = 0``,

    ‖M‖_* = tr (KᵀK + N)^{1/2},    msign(M) = (WK + G_⊥) S^{-1/2},   S = KᵀK + N,

so the dual is a ``p × p`` problem and only its first and last products touch ``n``. Its
optimality condition is the tangent condition, ``sym(K S^{-1/2}) = 0``. Holding ``S`` fixed
makes that a Lyapunov equation in ``Σ``, solved in the eigenbasis ``S^{-1/2} = Q D Qᵀ`` as
``Σ̃ᵢⱼ = Ω̃ᵢⱼ (dᵢ − dⱼ)/(dᵢ + dⱼ)``; each iteration refreshes ``S`` and solves again (an
iteratively reweighted fixed point, as Weiszfeld's algorithm is for a sum of norms; one
``p × p`` eigendecomposition per iteration). It converges linearly, fast where ``N`` is well
conditioned, i.e. where the normal space has room (``n ≥ 4p``): on 512 × 128, 3.4× per
iteration (gap 7.6e-6, tangent residual 1.2e-5 after 8); on 256 × 128 it stalls (1.7e-2).

=============  ====================================================
shape          reweighted, 8 iterations (gap / tangent residual)
=============  ====================================================
512 × 128      7.6e-6 / 1.2e-5
384 × 128      1.2e-4 / 4.2e-4
96 × 24        1.4e-6 / 1.3e-5
256 × 128      1.7e-2 / 1.3e-2 (does not converge: use ADMM)
=============  ====================================================

``solver="auto"`` (the default) takes the closed form below for square matrices, the
reweighted iteration from ``n ≥ 4p`` on, and ADMM, right for every shape, between, each
chosen from the matrix's own shape. A padded bucket (``bucket="pad"``) holds matrices of
one solver only, so its zero rows change neither ``N`` nor the iterates: a square matrix
padded with taller ones would otherwise lose its closed form for an unconverged
iteration, and its direction would depend on which matrices share its bucket (an
owner-sharded update's owners bucket them differently from the replicated update).

At a square ``W`` the tangent space is ``{WΩ : Ω skew}`` and the problem is
``min ⟨S, Ω⟩`` over skew ``Ω`` with ``‖Ω‖₂ ≤ 1``, ``S = skew(WᵀG)``: the unconstrained
minimiser ``−msign(S)`` is itself skew, so ``A' = W msign(skew(WᵀG))`` in closed form
(for a tangent ``G = WΩ``: ``W msign(Ω)``), which is what a square matrix gets — no dual
iterations, and tangent to rounding (the dual iteration on a square ``W`` converges
slowly: the small singular values of ``S`` make ``msign`` ill-conditioned).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from orthojax import linalg
from orthojax.manifolds import Stiefel
from orthojax.optim._checks import (check_bucket, check_decay, check_matrices, check_rate,
                                    check_static, require_params)
from orthojax.optim._keeps import keeping
from orthojax.optim._recorded import views_from_init
from orthojax.optim._riemannian import retract
from orthojax.optim._scope import scoped


def check_steps(who: str, steps: Any) -> None:
  """One line unless ``steps`` is None or a Python int ≥ 1."""
  check_static(who, steps, "steps")
  if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                            or steps < 1):
    raise ValueError(f"{who}: steps={steps!r} must be a positive int (the solver's "
                     f"iterations) or None (the solver's default)")


def check_solver(who: str, solver: Any) -> None:
  if solver not in SOLVERS:
    raise ValueError(f"{who}: solver={solver!r} is not a solver; use one of {SOLVERS}")


def msign(m: jax.Array, steps: int | None = None) -> jax.Array:
  """``U Vᵀ`` of ``m = U Σ Vᵀ`` (the polar factor): by the SVD for ``steps=None``, else by
  ``steps`` Polar Express Newton–Schulz steps (:func:`orthojax.linalg.newton_schulz`)."""
  if steps is None:
    return linalg.polar(m)
  return linalg.newton_schulz(m, steps, "polar_express")


SOLVERS = ("auto", "admm", "dual", "reweighted")
"""Accepted ``solver`` names (module docstring)."""

DEFAULT_STEPS = {"admm": 100, "dual": 30, "reweighted": 10}
"""Each solver's iterations where ``steps=None``."""

REWEIGHTED_FROM = 4
"""``solver="auto"`` runs the reweighted iteration on ``n × p`` matrices from ``n ≥ 4p``."""


def chosen_solver(solver: str, n: int, p: int) -> str:
  """The solver ``solver`` names for a tall ``n × p`` matrix (``"auto"``: module docstring;
  a square matrix takes the closed form whatever the solver)."""
  if solver != "auto":
    return solver
  return "reweighted" if n >= REWEIGHTED_FROM * p else "admm"


def _solver_for(solver: str, x: Any, view: Any) -> str | None:
  """What solves a leaf's direction: ``"square"`` (the closed form), the solver
  :func:`chosen_solver` names for its tall ``n × p`` view, or None (no matrix view)."""
  if view is False or jnp.ndim(x) < 2:
    return None
  lo = linalg.layout(jnp.shape(x), view)
  return "square" if lo.n == lo.p else chosen_solver(solver, lo.n, lo.p)


def manifold_muon_direction(w: jax.Array, g: jax.Array, *, solver: str = "auto",
                            steps: int | None = None, dual_rate: float = 0.05,
                            rho: float = 0.3, msign_steps: int | None = None) -> jax.Array:
  """``A'`` of the module docstring for tall ``w`` (``n × p``, orthonormal columns) and
  ``g``: the step is ``−η A'``, ``‖A'‖₂ ≤ 1`` and ``A'`` tangent at ``w`` (to the
  solver's convergence). Batched over leading axes.

  Args:
    w, g: the point and the gradient (or its momentum), tall.
    solver: ``"auto"`` (default), ``"admm"``, ``"dual"`` (dual ascent, the paper's) or
      ``"reweighted"`` (the ``p × p`` fixed point).
    steps: the solver's iterations (None: 100 for ADMM, 30 for dual ascent, 10 for the
      reweighted iteration).
    dual_rate: dual ascent's ``α``; rho: ADMM's ``ρ`` (both for ``g`` at unit Frobenius
      norm).
    msign_steps: the solvers' ``msign`` (dual ascent's, and ADMM's projection onto the
      spectral ball, :func:`clip_spectral`): None for the SVD, else Polar Express steps.
  """
  t = lambda x: jnp.swapaxes(x, -1, -2)
  if w.shape[-1] == w.shape[-2]:   # closed form (module docstring)
    return w @ linalg.skew(msign(linalg.skew(t(w) @ g), msign_steps))
  g = g / (jnp.linalg.norm(g, axis=(-2, -1), keepdims=True) + 1e-30)   # the steps' scale
  solver = chosen_solver(solver, w.shape[-2], w.shape[-1])
  steps = DEFAULT_STEPS[solver] if steps is None else steps
  if solver == "admm":
    return _admm(w, g, steps, rho, msign_steps)
  if solver == "reweighted":
    return _reweighted(w, g, steps)
  dual_steps = steps
  lam = -0.25 * (t(w) @ g + t(g) @ w)

  def ascend(k, lam):
    a = msign(g + 2.0 * w @ lam, msign_steps)
    h = t(w) @ a + t(a) @ w
    return lam - dual_rate * (1.0 - k / dual_steps) * h

  lam = jax.lax.fori_loop(0, dual_steps, ascend, lam)
  return msign(g + 2.0 * w @ lam, msign_steps)


def clip_spectral(x: jax.Array, msign_steps: int | None = None) -> jax.Array:
  r"""``U min(Σ, 1) Vᵀ`` for ``x = U Σ Vᵀ``: the projection onto the spectral unit ball.

  By the SVD for ``msign_steps=None``; else from products and two ``msign``\ s:
  with ``Q = msign(x)`` and ``Y = x − Q = U (Σ − I) Vᵀ``, ``min(σ, 1) = (σ + 1 − |σ − 1|)/2``
  gives ``clip = (x + Q − msign(Y) Yᵀ Q) / 2``, since ``msign(Y) Yᵀ Q = U |Σ − I| Vᵀ``.
  """
  if msign_steps is None:
    u, s, vt = jnp.linalg.svd(x, full_matrices=False)
    return (u * jnp.minimum(s, 1.0)[..., None, :]) @ vt
  q = msign(x, msign_steps)
  y = x - q
  return 0.5 * (x + q - msign(y, msign_steps) @ (jnp.swapaxes(y, -1, -2) @ q))


def _reweighted(w, g, steps):
  """The ``p × p`` dual by the reweighted fixed point (module docstring): ``msign(M)`` at
  the last ``Σ``.

  ``(MᵀM)^{-1/2}`` comes from the eigenvalues of ``MᵀM``, floored at their rounding
  level, ``p ε`` times the largest. Below it an eigenvalue is noise (a direction the
  gradient leaves empty): the floor maps such a direction to a singular value below 1,
  as Newton–Schulz does, where inverting the noise's square root gave a rank-1 gradient
  a direction of spectral norm 3.5e13, which the retraction then collapsed (E8's
  ``manifold_muon`` and ``stiefel_mlp`` arms each lost a matrix to it). Above the floor
  nothing changes.
  """
  t = lambda x: jnp.swapaxes(x, -1, -2)
  c = t(w) @ g
  normal = g - w @ c
  n_gram = t(normal) @ normal
  omega = linalg.skew(c)

  def inverse_sqrt(k):
    e, q = jnp.linalg.eigh(t(k) @ k + n_gram)
    floor = jnp.max(e, axis=-1, keepdims=True) * e.shape[-1] * jnp.finfo(e.dtype).eps
    return q, jax.lax.rsqrt(jnp.maximum(e, jnp.maximum(floor, jnp.finfo(e.dtype).tiny)))

  def iterate(_, sigma):
    q, d = inverse_sqrt(omega + sigma)
    weight = (d[..., :, None] - d[..., None, :]) / (d[..., :, None] + d[..., None, :])
    return q @ ((t(q) @ omega @ q) * weight) @ t(q)

  sigma = jax.lax.fori_loop(0, steps, iterate, jnp.zeros_like(omega))
  k = omega + sigma
  q, d = inverse_sqrt(k)
  return (w @ k + normal) @ ((q * d[..., None, :]) @ t(q))


def _admm(w, g, steps, rho, msign_steps):
  """ADMM on ``A = B`` (module docstring): ``A' = −A``, the last tangent ``A`` scaled into
  the ball (``A`` minimises ``⟨G, A⟩``; the step is ``−η A' = η A``)."""
  project = lambda x: x - w @ linalg.sym(jnp.swapaxes(w, -1, -2) @ x)
  clip = lambda x: clip_spectral(x, msign_steps)

  def iterate(_, state):
    b, u = state
    a = project(b - u - g / rho)
    b = clip(a + u)
    return b, u + a - b

  zeros = jnp.zeros_like(g)
  b, u = jax.lax.fori_loop(0, steps, iterate, (zeros, zeros))
  a = project(b - u - g / rho)
  norm = jnp.linalg.norm(a, ord=2, axis=(-2, -1))[..., None, None]
  return -a / jnp.maximum(norm, 1.0)


def scale_by_manifold_muon(*, solver: str = "auto", steps: int | None = None,
                           dual_rate: float = 0.05, rho: float = 0.3,
                           msign_steps: int | None = None, views: Any = None,
                           bucket: str = "pad") -> optax.GradientTransformation:
  """The direction ``A'`` of each matrix (module docstring) in place of its update; the
  arguments are :func:`manifold_muon_direction`'s."""
  check_solver("scale_by_manifold_muon", solver)
  check_steps("scale_by_manifold_muon", steps)
  check_bucket("scale_by_manifold_muon", bucket)

  def build(views):
    def update_fn(updates, state, params=None):
      require_params("scale_by_manifold_muon", params)

      def solving(chosen):
        def leaf(w, g, view):
          lo = linalg.layout(w.shape, view)
          dtype = linalg.compute_dtype(jnp.result_type(w, g))
          a = manifold_muon_direction(lo.to_tall(w.astype(dtype)),
                                      lo.to_tall(g.astype(dtype)), solver=chosen,
                                      steps=steps, dual_rate=dual_rate, rho=rho,
                                      msign_steps=msign_steps)
          return lo.from_tall(a).astype(g.dtype)
        return leaf

      # The solver follows each matrix's own shape, so a padded bucket never mixes two:
      # one map per solver (a square matrix padded into a taller bucket would lose its
      # closed form, and the result would depend on which matrices share its bucket).
      leaves, treedef = jax.tree_util.tree_flatten(params)
      chosen = [_solver_for(solver, x, view)
                for x, view in zip(leaves, linalg.views_for(params, views))]
      out = updates
      with jax.default_matmul_precision("highest"):
        for name in sorted(set(chosen) - {None}):
          mask = treedef.unflatten([c == name for c in chosen])
          out = linalg.map_views(solving(solver if name == "square" else name), params, out,
                                 views=views, mask=mask, bucket=bucket)
      return out, state

    def init_fn(params):
      check_matrices("scale_by_manifold_muon", params, views)
      return optax.EmptyState()

    return optax.GradientTransformation(init_fn, scoped("scale_by_manifold_muon", update_fn))

  return views_from_init(build, views)


def manifold_muon(
    learning_rate: optax.ScalarOrSchedule,
    *,
    beta: float = 0.95,
    nesterov: bool = True,
    solver: str = "auto",
    steps: int | None = None,
    dual_rate: float = 0.05,
    rho: float = 0.3,
    msign_steps: int | None = None,
    retraction: str = "polar",
    views: Any = None,
    bucket: str = "pad",
) -> optax.GradientTransformation:
  """Manifold Muon: momentum, the spectral-norm steepest descent direction in the tangent
  space (:func:`manifold_muon_direction`), the rate, a retraction.

  ``W ← R_W(−η A'(W, m))`` per matrix, ``m`` the gradient's momentum
  (``optax.trace``: ``m ← β m + G``, Nesterov's look-ahead by default, as Muon).

  Args:
    learning_rate: ``η``, a float or an Optax schedule: the step's spectral norm.
    beta, nesterov: the momentum (``optax.trace``'s ``decay`` and ``nesterov``).
    solver: ``"auto"`` (default: the reweighted ``p × p`` iteration from ``n ≥ 4p`` on,
      ADMM below), ``"admm"`` (converges for every shape), ``"dual"`` (the paper's dual
      ascent; slow where ``p`` is near ``n``) or ``"reweighted"``. Square matrices take
      the closed form.
    steps: the solver's iterations (None: 100 for ADMM, 30 for dual ascent, 10 for the
      reweighted iteration).
    dual_rate: dual ascent's step ``α`` (for the gradient scaled to unit norm), decayed
      linearly to 0 over the iterations as in Bernstein (2025).
    rho: ADMM's penalty ``ρ`` (same scale).
    msign_steps: the solvers' ``msign`` (and ADMM's ball projection): None for the SVD
      (exact), else Polar Express Newton–Schulz steps (products only, for accelerators,
      where an SVD is a long iterative program).
    retraction: the :class:`~orthojax.manifolds.Stiefel` retraction (default ``"polar"``,
      the paper's).
    views: per-leaf matrix views; None: those the parameters' Variables record, read at
      ``init`` on the ``nnx.Optimizer`` path, else inferred.
    bucket: how the matrices are stacked (:data:`orthojax.linalg.BUCKETS`).

  Returns:
    A :class:`orthojax.optim.ManifoldTransformation`.
  """
  check_rate("manifold_muon", learning_rate)
  check_decay("manifold_muon", beta, "beta")
  check_solver("manifold_muon", solver)
  check_steps("manifold_muon", steps)
  check_bucket("manifold_muon", bucket)
  if msign_steps is not None:
    check_static("manifold_muon", msign_steps, "msign_steps")
  manifold = Stiefel(retraction)

  def build(views):
    def init_fn(params):   # before the momentum: name the optimizer the user called
      check_matrices("manifold_muon", params, views)
      return chain.init(params)

    chain = optax.chain(
        optax.trace(decay=beta, nesterov=nesterov),
        scale_by_manifold_muon(solver=solver, steps=steps, dual_rate=dual_rate, rho=rho,
                               msign_steps=msign_steps, views=views, bucket=bucket),
        optax.scale_by_learning_rate(learning_rate),
        retract(manifold, views, bucket=bucket))
    return keeping(optax.GradientTransformation(init_fn, chain.update))

  return views_from_init(build, views)
