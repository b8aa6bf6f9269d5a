r"""Matrix-free Fisher information / Gauss–Newton eigenvalues over a batch.

Parameters ``θ`` (any pytree, flattened with ``jax.flatten_util.ravel_pytree``
to ``P`` numbers), a batch ``x_1 … x_B``, outputs ``z_i = f(θ, x_i) ∈ R^C``
(logits for cross entropy, predictions for MSE) and the per-example
parameter Jacobians ``J_i = ∂z_i/∂θ`` (``C × P``).

* Gauss–Newton / true Fisher (``kind="gauss_newton"``; Sokol
  & Park 2020, eq. 6–8; Martens 2020)::

      G = (1/B) Σ_i J_iᵀ H_i J_i,

  ``H_i`` the Hessian of the loss in the outputs: ``diag(p_i) − p_i p_iᵀ``
  with ``p_i = softmax(z_i)`` for cross entropy, the identity for MSE with
  the per-example loss ``½‖z_i − y_i‖²`` (a unit-variance Gaussian
  likelihood). For these canonical-link models the Gauss–Newton matrix *is*
  the Fisher information matrix (expectation over the model's own
  ``y ~ p_θ(y|x)``), and it needs no labels. Applied as
  ``v ↦ (1/B) Jᵀ H (J v)``: one ``jax.linearize`` (a jvp, ``J v``), ``H``
  per example, and its ``jax.linear_transpose`` (a vjp).
* Empirical Fisher (``kind="empirical"``; Kunstner, Hennig & Balles 2019)::

      F = (1/B) Σ_i g_i g_iᵀ,   g_i = ∇_θ ℓ(z_i, y_i),

  with the labels ``y``. Applied without per-example gradients as
  ``v ↦ (1/B) Lᵀ (L v)`` where ``L = ∂(ℓ_1 … ℓ_B)/∂θ`` is the ``B × P``
  Jacobian of the vector of per-example losses (``L v = (g_iᵀ v)_i``).

Both are positive semi-definite, so their largest eigenvalue is found by
Lanczos (:func:`~orthojax.analysis.top_eigenvalues`) or power iteration;
each step costs about one forward-and-backward pass over the batch (plus,
for Lanczos, a Gram–Schmidt sweep over the stored ``steps × P`` basis).

References:
  Sokol & Park, "Information geometry of orthogonal initializations and
  training", ICLR 2020 (the Fisher, its λ_max vs σ_max(J)).
  J. Martens, "New insights and perspectives on the natural gradient
  method", JMLR 21, 2020 (Gauss–Newton = Fisher for canonical links).
  F. Kunstner, P. Hennig, L. Balles, "Limitations of the empirical Fisher
  approximation for natural gradient descent", NeurIPS 2019.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from orthojax.analysis import _lanczos
from orthojax.analysis._compile import compiled
from orthojax.nn import check_choice

LOSSES = ("cross_entropy", "mse")
KINDS = ("gauss_newton", "empirical")
METHODS = ("lanczos", "power")

ApplyFn = Callable[[Any, Any], jax.Array]


def _batch_size(x: Any, who: str) -> int:
  leaves = jax.tree_util.tree_leaves(x)
  if not leaves or jnp.ndim(leaves[0]) < 1:
    raise ValueError(f"{who}: x must carry a leading batch axis")
  b = int(jnp.shape(leaves[0])[0])
  if b < 1:
    raise ValueError(f"{who}: empty batch")
  return b


def per_example_loss(outputs: jax.Array, y: Any, loss: str) -> jax.Array:
  r"""Per-example losses ``ℓ(z_i, y_i)`` of a batch of outputs ``(B, …)``.

  * ``"cross_entropy"``: ``−log softmax(z_i)[y_i]`` for integer labels
    ``(B,)``, or ``−Σ_c y_ic log softmax(z_i)_c`` for one-hot / soft labels
    ``(B, C)`` (softmax over the last axis);
  * ``"mse"``: ``½ ‖z_i − y_i‖²`` (sum over the non-batch axes).

  Returns:
    ``(B,)`` losses.

  Raises:
    ValueError: unknown ``loss``, or label shapes that do not fit.
  """
  check_choice(loss, LOSSES, "loss", where="per_example_loss")
  outputs = jnp.asarray(outputs)
  y = jnp.asarray(y)
  if loss == "mse":
    if y.shape != outputs.shape:
      raise ValueError(f"per_example_loss: mse targets must have the outputs' shape "
                       f"{outputs.shape}, got {y.shape}")
    diff = (outputs - y).reshape(outputs.shape[0], -1)
    return 0.5 * jnp.sum(diff * diff, axis=-1)
  logp = jax.nn.log_softmax(outputs, axis=-1)
  if jnp.issubdtype(y.dtype, jnp.integer):
    if y.shape != outputs.shape[:-1]:
      raise ValueError(f"per_example_loss: integer labels must have shape {outputs.shape[:-1]}, "
                       f"got {y.shape}")
    nll = -jnp.take_along_axis(logp, y[..., None], axis=-1)[..., 0]
  else:
    if y.shape != outputs.shape:
      raise ValueError(f"per_example_loss: one-hot / soft labels must have shape "
                       f"{outputs.shape}, got {y.shape}")
    nll = -jnp.sum(y * logp, axis=-1)
  return nll.reshape(outputs.shape[0], -1).sum(axis=-1)


def _softmax_hessian(z: jax.Array) -> Callable[[jax.Array], jax.Array]:
  """``u ↦ (diag(p) − ppᵀ) u`` per example, ``p = softmax(z)`` over the last axis."""
  p = jax.nn.softmax(z, axis=-1)
  return lambda u: p * u - p * jnp.sum(p * u, axis=-1, keepdims=True)


def fisher_matvec(apply_fn: ApplyFn, params: Any, x: Any, y: Any = None, *,
                  loss: str = "cross_entropy", kind: str = "gauss_newton"
                  ) -> tuple[Callable[[jax.Array], jax.Array], int, Callable[[jax.Array], Any]]:
  r"""The Fisher / Gauss–Newton matrix over a batch as a flat matrix-vector product.

  ``G v = (1/B) Σ_i J_iᵀ H_i J_i v`` (``kind="gauss_newton"``) or
  ``F v = (1/B) Σ_i g_i (g_iᵀ v)`` (``kind="empirical"``); see the module
  docstring. The forward pass is linearised once, here.

  Args:
    apply_fn: ``apply_fn(params, x) -> (B, …)`` outputs (logits over the
      last axis for cross entropy); see :func:`model_apply` for NNX models.
    params: the parameter pytree.
    x: a batch (leading axis ``B``).
    y: labels, needed for ``kind="empirical"`` (integer ``(B,)`` or one-hot
      for cross entropy; targets shaped like the outputs for MSE).
    loss: ``"cross_entropy"`` or ``"mse"``.
    kind: ``"gauss_newton"`` or ``"empirical"``.

  Returns:
    ``(matvec, P, unravel)``: the product on flat ``(P,)`` vectors, the
    number of parameters, and the map from a flat vector back to the
    ``params`` pytree.

  Raises:
    ValueError: unknown ``loss``/``kind``, missing labels, no batch axis.
  """
  who = "fisher_matvec"
  check_choice(loss, LOSSES, "loss", where=who)
  check_choice(kind, KINDS, "kind", where=who)
  batch = _batch_size(x, who)
  flat, unravel = ravel_pytree(params)
  if flat.size == 0:
    raise ValueError(f"{who}: params has no entries")
  if not jnp.issubdtype(flat.dtype, jnp.floating):
    raise TypeError(f"{who}: params must be floating point, got {flat.dtype}")
  outputs = lambda theta: apply_fn(unravel(theta), x)
  if kind == "gauss_newton":
    z, jvp = jax.linearize(outputs, flat)
    if z.ndim < 1 or z.shape[0] != batch:
      raise ValueError(f"{who}: apply_fn must return (B, ...) outputs with B={batch}, "
                       f"got {z.shape}")
    hess = _softmax_hessian(z) if loss == "cross_entropy" else (lambda u: u)
  else:
    if y is None:
      raise ValueError(f"{who}: kind='empirical' needs the labels y (per-example gradients "
                       "of the loss); kind='gauss_newton' does not")
    _, jvp = jax.linearize(lambda theta: per_example_loss(outputs(theta), y, loss), flat)
    hess = lambda u: u
  vjp = jax.linear_transpose(jvp, flat)
  scale = 1.0 / batch

  def matvec(v):
    return vjp(hess(jvp(v.astype(flat.dtype))))[0] * scale

  return matvec, int(flat.size), unravel


class FisherEigen(NamedTuple):
  """The output of :func:`fisher_max_eigenvalue`.

  Attributes:
    eigenvalue: the estimate of ``λ_max``.
    vector: the corresponding unit eigenvector, as a ``params``-shaped pytree.
    num_iters: matrix-vector products (Lanczos steps / power iterations).
    converged: Lanczos: residual ``‖G u − θ u‖ ≤ tol·θ`` (so ``θ`` is within
      relative ``tol`` of an eigenvalue); power: relative change ``< tol``.
    residual: ``‖G u − θ u‖`` of the returned pair.
  """

  eigenvalue: jax.Array
  vector: Any
  num_iters: jax.Array
  converged: jax.Array
  residual: jax.Array


@compiled("params", "x", "y", "key")
def fisher_max_eigenvalue(apply_fn: ApplyFn, params: Any, x: Any, y: Any = None, *,
                          loss: str = "cross_entropy", kind: str = "gauss_newton",
                          method: str = "lanczos", tol: float = 1e-3,
                          max_iters: int | None = None, key: Any = None) -> FisherEigen:
  r"""``λ_max`` of the Fisher / Gauss–Newton matrix over a batch, matrix-free.

  ``G = (1/B) Σ_i J_iᵀ H_i J_i`` (``kind="gauss_newton"``, the true Fisher
  for softmax cross entropy and unit-variance Gaussian MSE) or
  ``F = (1/B) Σ_i g_i g_iᵀ`` (``kind="empirical"``), applied through
  :func:`fisher_matvec` and never formed. Jit-able (``apply_fn`` and the
  keyword options static).

  Args:
    apply_fn: ``apply_fn(params, x) -> (B, …)`` outputs.
    params: the parameter pytree (flattened with ``ravel_pytree``).
    x: a batch with leading axis ``B``.
    y: labels; needed only for ``kind="empirical"``.
    loss: ``"cross_entropy"`` or ``"mse"``.
    kind: ``"gauss_newton"`` or ``"empirical"``.
    method: ``"lanczos"`` (full reorthogonalisation; memory
      ``max_iters × P``) or ``"power"``.
    tol: relative accuracy; see :class:`FisherEigen` ``converged``.
    max_iters: products at most; default 30 (Lanczos) or 200 (power);
      Lanczos is capped at ``P``.
    key: PRNG key of the start vector (default ``jax.random.key(0)``).

  Returns:
    A :class:`FisherEigen`.

  Raises:
    ValueError: unknown ``loss``/``kind``/``method``, missing labels.

  References:
    Sokol & Park 2020 (seed, Definition and eq. 8); Martens 2020;
    Kunstner, Hennig & Balles 2019.
  """
  who = "fisher_max_eigenvalue"
  check_choice(method, METHODS, "method", where=who)
  matvec, dim, unravel = fisher_matvec(apply_fn, params, x, y, loss=loss, kind=kind)
  dtype = ravel_pytree(params)[0].dtype
  if method == "lanczos":
    iters = min(30 if max_iters is None else int(max_iters), dim)
    res = _lanczos.top_eigenvalues(matvec, dim, 1, tol=tol, max_iters=iters, key=key,
                                   dtype=dtype)
    return FisherEigen(res.values[0], unravel(res.vectors[0]), res.num_iters, res.converged,
                       res.residuals[0])
  res = _lanczos.power_iteration(matvec, dim, max_iters=200 if max_iters is None else max_iters,
                                 tol=tol, key=key, dtype=dtype)
  return FisherEigen(res.eigenvalue, unravel(res.vector), res.num_iters, res.converged,
                     res.residual)
