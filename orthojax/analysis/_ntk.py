r"""The empirical neural tangent kernel of a small batch, and its tie to the Fisher.

Stack the per-example output Jacobians ``J_i = ∂z_i/∂θ`` (``C × P``) of a
batch into ``J = [J_1; …; J_B]`` (``BC × P``). The empirical NTK (Jacot,
Gabriel & Hongler 2018) is::

    Θ = J Jᵀ            (BC × BC),   Θ_{(i,c),(j,d)} = ∂z_ic/∂θ · ∂z_jd/∂θ,

while the Gauss–Newton / Fisher matrix under MSE (``H = I``, see
:func:`~orthojax.analysis.fisher_matvec`) is::

    G = (1/B) Σ_i J_iᵀ J_i = (1/B) JᵀJ      (P × P).

``J Jᵀ`` and ``JᵀJ`` share their non-zero eigenvalues (Sokol
& Park 2020, Appendix A.7, eq. 48–49, which writes the sum without the
``1/B``), so with orthojax's batch-*averaged* Fisher::

    λ_k(G) = λ_k(Θ) / B     for every non-zero eigenvalue,

and ``G`` has ``P − rank(J)`` further zeros.

References:
  A. Jacot, F. Gabriel, C. Hongler, "Neural tangent kernel: convergence and
  generalization in neural networks", NeurIPS 2018.
  Sokol & Park, "Information geometry of orthogonal initializations and
  training", ICLR 2020, appendix A.7.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from orthojax.analysis._compile import compiled


def _parameter_jacobian(apply_fn: Callable, params: Any, x: Any, who: str):
  flat, unravel = ravel_pytree(params)
  if flat.size == 0:
    raise ValueError(f"{who}: params has no entries")
  out = jax.eval_shape(lambda t: apply_fn(unravel(t), x), flat)
  if len(out.shape) < 1:
    raise ValueError(f"{who}: apply_fn must return (B, ...) outputs, got shape {out.shape}")
  g = lambda t: apply_fn(unravel(t), x).reshape(-1)
  n_out = out.size
  # Reverse mode needs one pass per output, forward one per parameter.
  jac = jax.jacrev(g)(flat) if n_out <= flat.size else jax.jacfwd(g)(flat)
  return jac, out.shape


@compiled("params", "x")
def empirical_ntk(apply_fn: Callable[[Any, Any], jax.Array], params: Any, x: Any, *,
                  flat: bool = True) -> jax.Array:
  r"""The empirical NTK ``Θ = J Jᵀ`` of a (small) batch.

  ``J`` is the ``BC × P`` Jacobian of the flattened outputs with respect to
  the flattened parameters (``jax.jacrev``, or ``jax.jacfwd`` when there are
  more outputs than parameters); memory ``B·C·P``, so keep the batch small.
  Rows are ordered example-major: index ``i·C + c``.

  Args:
    apply_fn: ``apply_fn(params, x) -> (B, C…)`` outputs.
    params: the parameter pytree.
    x: a batch.
    flat: return ``(BC, BC)`` (default) or ``(B, B, C, C)`` with
      ``[i, j, c, d] = Θ_{(i,c),(j,d)}``.

  Returns:
    The kernel matrix (symmetric positive semi-definite).

  References:
    Jacot et al. 2018; Sokol & Park 2020, A.7 (``Θ`` and the MSE Fisher
    ``G = JᵀJ / B`` share their non-zero eigenvalues up to the factor ``B``).
  """
  jac, shape = _parameter_jacobian(apply_fn, params, x, "empirical_ntk")
  ntk = jnp.matmul(jac, jac.T, precision=jax.lax.Precision.HIGHEST)
  if flat:
    return ntk
  b = shape[0]
  c = int(ntk.shape[0] // b)
  return ntk.reshape(b, c, b, c).transpose(0, 2, 1, 3)


def ntk_eigenvalues(apply_fn: Callable[[Any, Any], jax.Array], params: Any, x: Any) -> jax.Array:
  r"""Eigenvalues of the empirical NTK ``Θ = J Jᵀ``, descending.

  Divided by the batch size ``B`` they are the non-zero eigenvalues of the
  MSE Gauss–Newton / Fisher matrix ``G = JᵀJ / B`` of
  :func:`~orthojax.analysis.fisher_max_eigenvalue` (module docstring).

  Args:
    apply_fn: ``apply_fn(params, x) -> (B, C…)`` outputs.
    params: the parameter pytree.
    x: a (small) batch.

  Returns:
    ``(BC,)`` eigenvalues, descending.

  References:
    Sokol & Park 2020, appendix A.7.
  """
  return jnp.linalg.eigvalsh(empirical_ntk(apply_fn, params, x))[::-1]
